"""The one rule of every entry point that takes `method=` (function, layer, loss, metric):
what each family accepts is read from its record, and a call outside it is refused with
a message naming the argument, never answered with NaN or garbage. Each test here
failed on the code before the registry (each case is a bug found at a seam)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss

X = np.array([[0.3, -1.2, 2.0, 0.7, -0.1]], np.float32)
MASKABLE = [m for m, f in ss.FAMILIES.items() if f.masks]
TOPK = [m for m, f in ss.FAMILIES.items() if "topk" in f.operations]


@pytest.mark.parametrize("method", TOPK)
def test_k_at_or_above_n_is_refused_by_every_family(method):
    # softsort, neuralsort and sorting_network returned memberships above 1 for k = 10 > n = 5.
    for k in (5, 10):
        with pytest.raises(ValueError, match=r"`k`.*\[1, 5\)|`k`.*\(0, 5\)"):
            ss.soft_topk(X, k, method)
        with pytest.raises(ValueError, match="`k`"):
            ss.TopKLayer(k, method)(X)
    temperature = 0.01 if method != "sorting_network" else 100.0
    membership = ss.soft_topk(X, 4, method, temperature=temperature)
    np.testing.assert_allclose(np.sum(membership), 4.0, atol=1e-3)


@pytest.mark.parametrize("method", MASKABLE)
def test_a_mask_of_another_shape_names_mask_and_both_shapes(method):
    # TensorFlow's "Unable to broadcast" never named `mask`.
    with pytest.raises(ValueError, match=r"`mask` of shape \(2, 5\).*\(1, 5\)"):
        ss.soft_rank(X, method, mask=tf.ones([2, 5], tf.bool))
    with pytest.raises(ValueError, match=r"`mask` of shape \(3,\)"):
        ss.soft_sort(X, method, mask=tf.ones([3], tf.bool))
    ss.soft_rank(X, method, mask=tf.ones([5], tf.bool))  # one flag per list entry


def test_an_unknown_temperature_keyword_names_the_family_temperature():
    # A bare TypeError ("unexpected keyword argument 'epsilon'") before.
    with pytest.raises(ValueError, match=r"`epsilon`.*method='sinkhorn'.*method='lapsum'.*`alpha`"):
        ss.soft_rank(X, "lapsum", epsilon=0.1)
    with pytest.raises(ValueError, match=r"`alpha`.*method='sinkhorn'.*`epsilon`"):
        ss.soft_sort(X, "sinkhorn", alpha=0.1)
    with pytest.raises(ValueError, match=r"`tau`.*method='sorting_network'.*`steepness`"):
        ss.soft_rank(X, "sorting_network", tau=0.1)


@pytest.mark.parametrize("method,temperature", [
    ("sinkhorn", 1e39), ("lapsum", 1e39), ("softsort", 1e-40), ("permutahedron", 1e-40),
    ("neuralsort", 1e39), ("sorting_network", 1e39), ("lapsum", 1e-30),
])
def test_temperatures_the_compute_dtype_cannot_resolve_are_refused(method, temperature):
    # NaN (Sinkhorn, SoftSort, permutahedron) or [-inf, nan, inf] (LapSum sort) before.
    for operation in (ss.soft_rank, ss.soft_sort):
        with pytest.raises(ValueError, match=rf"`temperature`.*{method}.*float32.*must be in"):
            operation(X, method, temperature=temperature)
    # float16 scores compute in float32: float32's range, the same answer.
    with pytest.raises(ValueError, match=r"`temperature`.*float32"):
        ss.soft_rank(X.astype(np.float16), method, temperature=temperature)
    ss.soft_rank(X.astype(np.float64), method, temperature=temperature)  # float64 holds it


@pytest.mark.parametrize("bad", [True, "0.1", b"1"])
def test_bool_and_string_temperatures_and_levels_are_refused(bad):
    # `temperature=True` was 1.0, "0.1" was 0.1, quantiles="0.5" was 0.5.
    for method in ss.FAMILIES:
        with pytest.raises(ValueError, match="`temperature`"):
            ss.soft_rank(X, method, temperature=bad)
    with pytest.raises(ValueError, match="`quantiles`"):
        ss.soft_quantile(X, "0.5", "lapsum")
    with pytest.raises(ValueError, match="`quantiles`"):
        ss.QuantileLayer(["0.2", "0.8"], "lapsum")


def test_a_variable_temperature_is_learnt_or_refused_never_detached():
    # With `temperature=` the variable got no gradient (None), and inside tf.function
    # the call raised AttributeError ('SymbolicTensor' has no attribute 'numpy').
    alpha = tf.Variable(0.5)

    def loss(alpha_):
        return tf.reduce_sum(ss.soft_rank(X, "lapsum", temperature=alpha_) ** 2)

    with tf.GradientTape() as tape:
        value = loss(alpha)
    gradient = tape.gradient(value, alpha)
    assert gradient is not None and np.isfinite(gradient.numpy())
    step = 1e-3
    numeric = (loss(0.5 + step) - loss(0.5 - step)) / (2 * step)
    np.testing.assert_allclose(gradient.numpy(), numeric.numpy(), rtol=2e-2)

    @tf.function
    def graph_gradient():
        with tf.GradientTape() as tape:
            value = loss(alpha)
        return tape.gradient(value, alpha)

    np.testing.assert_allclose(graph_gradient().numpy(), gradient.numpy(), rtol=1e-5)
    keras_alpha = keras.Variable(0.5)  # a Keras variable (a layer's weight) alike
    with tf.GradientTape() as tape:
        value = loss(keras_alpha)
    np.testing.assert_allclose(tape.gradient(value, keras_alpha.value).numpy(),
                               gradient.numpy(), rtol=1e-6)
    for method in [m for m, f in ss.FAMILIES.items() if not f.tensor_temperature]:
        with pytest.raises(ValueError, match=r"`temperature`.*Python number.*no gradient"):
            ss.soft_rank(X, method, temperature=tf.Variable(0.5))
    with pytest.raises(ValueError, match=r"`tau`.*Python number"):
        ss.softsort_permutation_matrix(X, tau=tf.Variable(0.5))


def test_spearman_metric_reads_a_keras_item_mask():
    # InvalidArgumentError before: the item mask became a per-list sample weight.
    y_true = np.array([[1.0, 2.0, 3.0, 0.0], [3.0, 1.0, 2.0, 4.0]], np.float32)
    y_pred = np.array([[1.0, 3.0, 2.0, 9.0], [3.0, 1.0, 2.0, 0.0]], np.float32)
    valid = np.array([[True, True, True, False], [True, True, True, True]])
    metric = ss.SpearmanCorrelation()
    pred = tf.constant(y_pred)
    pred._keras_mask = tf.constant(valid)  # as Keras attaches it to a masked output
    metric.update_state(y_true, pred)
    expected = np.mean([ss.spearman_correlation(y_true[i, valid[i]], y_pred[i, valid[i]],
                                                axis=0).numpy() for i in range(2)])
    np.testing.assert_allclose(metric.result().numpy(), expected, rtol=1e-6)
    assert np.isfinite(metric.result().numpy())


@pytest.mark.parametrize("make", [
    lambda: ss.SinkhornRank(), lambda: ss.SinkhornSort(), lambda: ss.SinkhornCDF(),
    lambda: ss.SinkhornQuantile(0.5), lambda: ss.RankLayer("sinkhorn"),
    lambda: ss.SinkhornPermutation(output_mode="ranks"), lambda: ss.SoftSort(),
    lambda: ss.RankLayer("lapsum"),
])
def test_every_layer_returns_float32_under_a_float16_policy(make):
    # SinkhornRank returned float16 while RankLayer("sinkhorn") returned float32.
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        layer = make()
        out = layer(tf.constant(X, tf.float16))
    finally:
        keras.config.set_dtype_policy(previous)
    assert out.dtype == tf.float32
    assert np.all(np.isfinite(out.numpy()))

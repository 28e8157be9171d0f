"""Tests of `softsort_tf.losses.base`, the Keras wrapper every loss shares, over every
loss: gradients against finite differences, dtypes and mixed precision, XLA, argument
checks, config round trips and saved models, and Keras item masks as list padding."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras_test_layers import SqueezeKeepingMask
from operator_cases import value_and_grad

import softsort_tf as ss
from softsort_tf._keras import get_keras_mask
from softsort_tf.losses.ranking import (
    ListwisePermutationLoss,
    SoftNDCGLoss,
)
from softsort_tf.losses.spearman import SpearmanLoss, soft_spearman_correlation


def test_gradients_match_finite_differences():
    """Directional derivatives of each loss against central differences (float64)."""
    rng = np.random.RandomState(0)
    smooth = dict(epsilon=1e-1, threshold=1e-10, max_iterations=5000, dtype="float64")
    logits = rng.randn(2, 5)
    y = rng.randn(12, 1)
    targets = rng.randn(2, 5)
    topk = ss.SoftTopKLoss(1, from_sparse=True, **smooth)
    cdf = ss.SoftTopKLoss(2, form="cdf", from_sparse=True, **smooth)
    lq = ss.SoftLeastQuantileRegressionLoss(0.5, error_power=2.0, **smooth)
    trim = ss.SoftTrimmedRegressionLoss(0.2, 0.7, **smooth)
    quantile = ss.SoftQuantileRegressionLoss(0.3, **smooth)
    spear = ss.SpearmanLoss(**smooth)
    cases = [
        (lambda z: topk([3, 4], z), logits),
        (lambda z: cdf([3, 4], z), logits),
        (lambda z: lq(np.zeros_like(y), z), y),
        (lambda z: trim(np.zeros_like(y), z), y),
        (lambda z: quantile(np.zeros_like(y), z), y),
        (lambda z: spear(targets, z), logits),
    ]
    delta = 1e-5
    for fn, x in cases:
        _, grad = value_and_grad(fn, x)
        v = rng.randn(*x.shape)
        numerical = (float(fn(x + delta * v)) - float(fn(x - delta * v))) / (2 * delta)
        assert float(np.sum(grad * v)) == pytest.approx(numerical, rel=2e-3, abs=2e-5)


def test_mixed_precision_inputs_and_float64_loss():
    logits = tf.constant(np.random.RandomState(5).randn(3, 5), tf.float16)
    value = ss.SoftTopKLoss(2, from_sparse=True)([0, 1, 2], logits)
    assert value.dtype == tf.float32 and np.isfinite(value.numpy())
    value64 = ss.SoftTopKLoss(2, from_sparse=True, dtype="float64")([0, 1, 2], logits)
    assert value64.dtype == tf.float64
    lq = ss.SoftLeastQuantileRegressionLoss(dtype="float64")(np.zeros(4), np.arange(4.0))
    assert lq.dtype == tf.float64


def test_xla_matches_eager():
    rng = np.random.RandomState(6)
    logits = tf.constant(rng.randn(4, 6).astype(np.float32))
    targets = tf.constant(rng.randn(4, 6).astype(np.float32))
    topk = ss.SoftTopKLoss(2, from_sparse=True)
    spear = ss.SpearmanLoss()

    def losses_and_gradient(z):
        with tf.GradientTape() as tape:
            tape.watch(z)
            value = topk([0, 1, 2, 3], z)
        return value, tape.gradient(value, z), spear(targets, z)

    eager = losses_and_gradient(logits)
    xla = tf.function(losses_and_gradient, jit_compile=True)(logits)
    for a, b in zip(tf.nest.flatten(eager), tf.nest.flatten(xla), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-4)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="`k`"):
        ss.SoftTopKLoss(0)
    with pytest.raises(ValueError, match="`k`"):
        ss.SoftTopKLoss(4, from_sparse=True)([0], [[1.0, 2.0, 3.0, 4.0]])
    with pytest.raises(ValueError, match="`form`"):
        ss.SoftTopKLoss(1, form="softmax")
    with pytest.raises(ValueError, match="`epsilon`"):
        ss.SoftTopKLoss(1, epsilon=0.0)
    with pytest.raises(TypeError, match="solver_options"):
        ss.SoftTopKLoss(1, solver_options={"tolerance": 1.0})
    with pytest.raises(ValueError, match="from_sparse"):
        ss.SoftTopKLoss(1)([0, 1], [[1.0, 2.0], [2.0, 1.0]])
    with pytest.raises(ValueError, match="L >= 2"):
        ss.SoftTopKLoss(1, from_sparse=True)([0], [[1.0]])
    with pytest.raises(ValueError, match="`quantile`"):
        ss.SoftLeastQuantileRegressionLoss(1.0)
    with pytest.raises(ValueError, match="`width`"):
        ss.SoftLeastQuantileRegressionLoss(0.1, width=0.5)
    with pytest.raises(ValueError, match="`error_power`"):
        ss.SoftLeastQuantileRegressionLoss(error_power=-1.0)
    with pytest.raises(ValueError, match="start_quantile"):
        ss.SoftTrimmedRegressionLoss(0.6, 0.4)
    with pytest.raises(ValueError, match="`quantile`"):
        ss.SoftQuantileRegressionLoss(0.0)
    with pytest.raises(ValueError, match="`width`"):
        ss.SoftQuantileRegressionLoss(0.1, width=0.3)
    with pytest.raises(ValueError, match="`squash`"):
        ss.SoftQuantileRegressionLoss(squash="tanh")
    with pytest.raises(ValueError, match=r"\[batch, 1\]"):
        ss.SoftQuantileRegressionLoss()(np.zeros((4, 2)), np.zeros((4, 2)))
    with pytest.raises(ValueError, match="`quantile`"):
        ss.PinballLoss(1.0)
    with pytest.raises(ValueError, match="`quantile`"):
        ss.pinball_loss([1.0], [0.0], quantile=-0.5)
    with pytest.raises(ValueError, match="start_quantile"):
        ss.sinkhorn_trimmed_mean([1.0, 2.0], -0.1, 0.5)
    with pytest.raises(ValueError, match="`axis`"):
        ss.SpearmanLoss(axis=1.5)
    with pytest.raises(ValueError, match="`squash`"):
        ss.SpearmanLoss(squash="tanh")


LOSS_FACTORIES = {
    "top_k_rank": lambda: ss.SoftTopKLoss(2, from_sparse=True, epsilon=5e-3,
                                          implicit_diff=ss.ImplicitDiff(solver="cg"),
                                          squash="robust", targets="centres"),
    "top_k_cdf": lambda: ss.SoftTopKLoss(1, form="cdf", from_sparse=True, reduction="sum"),
    "least_quantile": lambda: ss.SoftLeastQuantileRegressionLoss(0.3, error_power=2.0, width=0.05,
                                                                 squash="atan"),
    "trimmed": lambda: ss.SoftTrimmedRegressionLoss(0.1, 0.7, threshold=1e-4, implicit_diff=None),
    "spearman": lambda: ss.SpearmanLoss(axis=-1, epsilon=2e-2, max_iterations=500),
    "spearman_permutahedron": lambda: ss.SpearmanLoss(
        method="permutahedron", temperature=0.5, method_kwargs={"regularization": "kl"}),
    "top_k_lapsum": lambda: ss.SoftTopKLoss(2, from_sparse=True, method="lapsum",
                                            temperature=0.2),
    "quantile_regression": lambda: ss.SoftQuantileRegressionLoss(
        0.2, width=0.05, epsilon=0.05, squash="atan", targets="centres"),
    "pinball": lambda: ss.PinballLoss(0.3, reduction="sum"),
}


def _example_data(name, rng):
    if name.startswith("top_k"):
        return rng.randint(4, size=8), 4
    if name.startswith("spearman"):
        return rng.randn(8, 4).astype(np.float32), 4
    return rng.randn(8, 1).astype(np.float32), 1


@pytest.mark.parametrize("name", sorted(LOSS_FACTORIES))
def test_loss_config_round_trip(name):
    rng = np.random.RandomState(7)
    loss = LOSS_FACTORIES[name]()
    y, units = _example_data(name, rng)
    y_pred = rng.randn(8, units).astype(np.float32)
    expected = float(loss(y, y_pred))
    config = loss.get_config()
    clone = type(loss).from_config(config)
    assert clone.get_config() == config
    assert float(clone(y, y_pred)) == pytest.approx(expected, rel=1e-6)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert type(restored) is type(loss) and restored.get_config() == config
    assert float(restored(y, y_pred)) == pytest.approx(expected, rel=1e-6)


def test_losses_survive_saving_a_model(tmp_path):
    """One model with an output per loss, compiled, saved and reloaded."""
    rng = np.random.RandomState(8)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    outputs, targets, loss_objects = {}, {}, {}
    for name in sorted(LOSS_FACTORIES):
        y, units = _example_data(name, rng)
        outputs[name] = keras.layers.Dense(units, name=name)(inputs)
        targets[name] = y
        loss_objects[name] = LOSS_FACTORIES[name]()
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss=loss_objects)
    x = rng.randn(8, 4).astype(np.float32)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    predictions, restored = model(x), loaded.loss
    for name, loss in loss_objects.items():
        assert type(restored[name]) is type(loss)
        assert restored[name].get_config() == loss.get_config()
        expected = float(loss(targets[name], predictions[name]))
        assert float(restored[name](targets[name], loaded(x)[name])) == pytest.approx(
            expected, rel=1e-5)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"], indirect=True)
def test_losses_compute_in_float32_under_a_mixed_policy(policy):
    for loss in (ss.PermutationCrossEntropy(), ss.PermutationCrossEntropy(dtype=policy),
                 ss.SpearmanLoss(dtype=policy), ss.SoftTopKLoss(dtype=policy),
                 ss.SoftTrimmedRegressionLoss(dtype=policy)):
        assert loss.dtype == "float32"
    assert ss.PermutationCrossEntropy(dtype="float64").dtype == "float64"
    # The gradient of the cross-entropy at the probability floor is ≈ 1/(n·δ) = 2.5e6 for
    # n = 4: finite in float32, beyond float16's range (65504).
    perm = tf.Variable(tf.constant([[[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]]))
    with tf.GradientTape() as tape:
        value = ss.PermutationCrossEntropy(dtype=policy)([[1, 0, 2, 3]], perm)
    grad = tape.gradient(value, perm).numpy()
    assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 65504


def test_keras_item_masks_are_the_padding_of_the_list_losses():
    # A Keras mask of the scores [batch, n] (e.g. `Masking` on the documents) is the
    # padding of the lists, not a mask of the per-list losses [batch].
    inputs = keras.Input((None, 2))
    h = keras.layers.Masking(0.0)(inputs)
    model = keras.Model(inputs, SqueezeKeepingMask()(keras.layers.Dense(1)(h)))
    rng = np.random.default_rng(9)
    x = rng.normal(size=(3, 6, 2)).astype(np.float32)
    lengths = np.array([6, 4, 2])
    valid = np.arange(6)[None, :] < lengths[:, None]
    x[~valid] = 0.0
    labels = rng.integers(0, 4, size=(3, 6)).astype(np.float32)
    labels[:, 0] = 3.0
    scores = model(x)
    assert get_keras_mask(scores) is not None
    padded_labels = np.where(valid, labels, -1.0).astype(np.float32)
    plain = tf.constant(scores.numpy())
    for loss, reference in (
            (SoftNDCGLoss(method="softsort"), lambda: SoftNDCGLoss(method="softsort")(
                padded_labels, plain)),
            (ListwisePermutationLoss(), lambda: ListwisePermutationLoss()(padded_labels, plain)),
            (SpearmanLoss(epsilon=1e-2), lambda: tf.reduce_mean(
                1.0 - soft_spearman_correlation(labels, plain, mask=valid, epsilon=1e-2)))):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            value = loss(labels, scores)
        assert float(value) == pytest.approx(float(reference()), rel=1e-5)
        grad = tape.gradient(value, scores).numpy()
        np.testing.assert_array_equal(grad[~valid], 0.0)
        assert np.abs(grad[valid]).max() > 0
        model.compile(loss=loss)
        assert model.evaluate(x, labels, verbose=0) == pytest.approx(float(reference()),
                                                                     rel=1e-5)


@pytest.mark.parametrize("make", [
    lambda: ss.SoftNDCGLoss(method="lapsum"), lambda: ss.SpearmanLoss(method="lapsum"),
    lambda: ss.ListwisePermutationLoss(),
])
def test_a_list_loss_checks_its_lists_once_per_call(make, monkeypatch):
    """The dtype, shape and same-lists checks run once per loss call (three times
    before: the loss, the functional form and its padding helper)."""
    from softsort_tf import _checks

    calls = []
    check = _checks.check_real_dtype

    def counted(name, dtype):  # each check of the lists checks the labels' dtype once
        calls.extend([name] if name == "y_true" else [])
        return check(name, dtype)

    monkeypatch.setattr(_checks, "check_real_dtype", counted)
    loss = make()
    labels = {"labels": np.array([[2.0, 0.0, 1.0, 3.0]], np.float32),
              "mask": np.array([[True, True, True, False]])}
    value = loss(labels, np.array([[0.3, -1.0, 2.0, 9.0]], np.float32))
    assert np.isfinite(value.numpy())
    assert len(calls) == 1
    with pytest.raises(ValueError, match="shape"):  # still checked
        loss(np.zeros((1, 3), np.float32), np.zeros((1, 4), np.float32))

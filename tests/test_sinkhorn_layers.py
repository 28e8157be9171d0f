"""Keras layers over the Sinkhorn operators: shapes, config, save/load, training."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss

HARD = dict(epsilon=1e-4, threshold=1e-5, max_iterations=3000)


def _layers():
    return [
        (ss.SinkhornRank(axis=1, direction="DESCENDING", **HARD), (4, 6)),
        (ss.SinkhornRank(zero_based=True, epsilon=0.05), (4, 6)),
        (ss.SinkhornCDF(squash="atan"), (4, 6)),
        (ss.SinkhornSort(topk=2, direction="DESCENDING"), (4, 2)),
        (ss.SinkhornSort(num_targets=3), (4, 3)),
        (ss.SinkhornQuantile(quantiles=[0.25, 0.75], width=0.1), (4, 2)),
        (ss.SinkhornQuantile(quantiles=0.5), (4,)),
        (ss.SinkhornQuantileNormalization(num_targets=5), (4, 6)),
    ]


@pytest.mark.parametrize("index", range(len(_layers())))
def test_layer_matches_op_shape_and_config(index):
    layer, expected_shape = _layers()[index]
    x = np.random.RandomState(index).randn(4, 6).astype(np.float32)
    out = layer(x)
    assert tuple(out.shape) == expected_shape
    assert tuple(layer.compute_output_shape((4, 6))) == expected_shape
    assert np.all(np.isfinite(out.numpy()))
    clone = layer.__class__.from_config(layer.get_config())
    if isinstance(layer, ss.SinkhornQuantileNormalization):
        clone.build((4, 6))
        clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(clone(x).numpy(), out.numpy())


def test_rank_layer_values_are_the_op():
    x = np.random.RandomState(0).randn(3, 5, 7).astype(np.float32)
    layer = ss.SinkhornRank(axis=1, direction="DESCENDING", epsilon=0.03)
    np.testing.assert_allclose(
        layer(x).numpy(),
        ss.sinkhorn_rank(x, axis=1, direction="DESCENDING", epsilon=0.03).numpy())


def test_quantile_normalization_targets_sorted_and_trainable():
    layer = ss.SinkhornQuantileNormalization(num_targets=4, **HARD)
    x = np.array([[0.3, -2.0, 1.0, 5.0]], np.float32)
    out = layer(x).numpy()
    # At initialisation f = (1/4, 2/4, 3/4, 1): the hard limit hands them out by rank.
    np.testing.assert_allclose(out, [[0.5, 0.25, 0.75, 1.0]], atol=1e-3)
    layer.logits.assign([3.0, -1.0, 0.5, 2.0])
    layer.offset.assign(-1.0)
    f = layer.target_values().numpy()
    assert np.all(np.diff(f) > 0)
    assert len(layer.trainable_weights) == 3
    frozen = ss.SinkhornQuantileNormalization(num_targets=4, learn_range=False)
    frozen.build((None, 4))
    assert len(frozen.trainable_weights) == 1


def _models(layer_factory, n=6):
    """The same layer inside Sequential, functional and subclassed models."""
    seq = keras.Sequential([keras.Input((n,)), keras.layers.Dense(n), layer_factory()])
    inp = keras.Input((n,))
    func = keras.Model(inp, layer_factory()(keras.layers.Dense(n)(inp)))

    @keras.saving.register_keras_serializable(package="softsort_tf_tests")
    class Sub(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense = keras.layers.Dense(n)
            self.sort = layer_factory()

        def call(self, x):
            return self.sort(self.dense(x))

    sub = Sub()
    sub(np.zeros((1, n), np.float32))
    return {"sequential": seq, "functional": func, "subclassed": sub}


@pytest.mark.parametrize("kind", ["sequential", "functional", "subclassed"])
@pytest.mark.parametrize("factory", [
    lambda: ss.SinkhornRank(epsilon=0.05),
    lambda: ss.SinkhornSort(topk=3, direction="DESCENDING"),
    lambda: ss.SinkhornQuantile(quantiles=[0.2, 0.5]),
    lambda: ss.SinkhornQuantileNormalization(num_targets=4),
    lambda: ss.SinkhornCDF(),
], ids=["rank", "sort", "quantile", "qnorm", "cdf"])
def test_save_load_round_trip(tmp_path, kind, factory):
    model = _models(factory)[kind]
    x = np.random.RandomState(1).randn(5, 6).astype(np.float32)
    before = model(x).numpy()
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded(x).numpy(), before)


def test_fit_learns_a_scorer_whose_soft_ranks_match_targets():
    """A linear scorer trained through SinkhornRank recovers a hidden ranking."""
    rng = np.random.RandomState(0)
    n, d = 8, 5
    w_true = rng.randn(d)
    x = rng.randn(256, n, d).astype(np.float32)
    ranks = np.argsort(np.argsort(x @ w_true, axis=1), axis=1).astype(np.float32) + 1
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((n, d)),
        keras.layers.Dense(1, use_bias=False),
        keras.layers.Reshape((n,)),
        ss.SinkhornRank(epsilon=0.05),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    before = model.evaluate(x, ranks, verbose=0)
    history = model.fit(x, ranks, epochs=8, batch_size=64, verbose=0)
    after = model.evaluate(x, ranks, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert after < 0.2 * before
    w = model.layers[0].kernel.numpy()[:, 0]
    cos = w @ w_true / np.linalg.norm(w) / np.linalg.norm(w_true)
    assert cos > 0.9


def test_layers_work_in_reduced_precision_and_under_xla():
    x = tf.constant(np.random.RandomState(2).randn(3, 7), tf.float16)
    layer = ss.SinkhornSort(direction="DESCENDING", dtype="mixed_float16")
    out = layer(x)
    assert out.dtype == tf.float16
    xla = tf.function(lambda v: layer(v), jit_compile=True)(x)
    np.testing.assert_allclose(tf.cast(xla, tf.float32).numpy(),
                               tf.cast(out, tf.float32).numpy(), atol=1e-2)


@pytest.mark.parametrize("call,match", [
    (lambda: ss.SinkhornRank(epsilon=0.0), "epsilon"),
    (lambda: ss.SinkhornRank(direction="sideways"), "direction"),
    (lambda: ss.SinkhornRank(axis=1.5), "axis"),
    (lambda: ss.SinkhornSort(topk=0), "topk"),
    (lambda: ss.SinkhornSort(topk=2, num_targets=3), "topk"),
    (lambda: ss.SinkhornQuantile(quantiles=[0.5, 0.2]), "increasing"),
    (lambda: ss.SinkhornQuantile(quantiles=1.2), "quantiles"),
    (lambda: ss.SinkhornQuantile(quantiles=0.5, width=1.5), "width"),
    (lambda: ss.SinkhornQuantileNormalization(num_targets=0), "num_targets"),
    (lambda: ss.SinkhornCDF(squash="relu"), "squash"),
])
def test_bad_layer_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()

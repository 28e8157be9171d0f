"""Tests of `softsort_tf.layers.sinkhorn`: the Sinkhorn layers are their operators
(values, shapes, config, targets), save and load, train, take Keras masks and ragged
lists, and run in functional models fed lists of several lengths."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras_test_layers import unknown_length_batches, unknown_length_inference

import softsort_tf as ss

# (Rows with ties, and a few float32 rows, stall just above the threshold of these tests;
# padded and unpadded, graph, XLA and eager agree anyway.)
pytestmark = pytest.mark.filterwarnings("ignore::softsort_tf.SinkhornConvergenceWarning")


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


ROUND_TRIP_FACTORIES = {
    "rank": lambda: ss.SinkhornRank(epsilon=0.05),
    "sort": lambda: ss.SinkhornSort(topk=3, direction="DESCENDING"),
    "quantile": lambda: ss.SinkhornQuantile(quantiles=[0.2, 0.5]),
    "qnorm": lambda: ss.SinkhornQuantileNormalization(num_targets=4),
    "cdf": lambda: ss.SinkhornCDF(),
}


@keras.saving.register_keras_serializable(package="softsort_tf_tests")
class _EverySinkhornLayer(keras.Model):
    """A subclassed model with a Dense and each layer of ROUND_TRIP_FACTORIES."""

    def __init__(self, n=6, **kwargs):
        super().__init__(**kwargs)
        self.n = n
        self.denses = [keras.layers.Dense(n) for _ in ROUND_TRIP_FACTORIES]
        self.sorts = [factory() for factory in ROUND_TRIP_FACTORIES.values()]

    def call(self, x):
        return [sort(dense(x)) for dense, sort in zip(self.denses, self.sorts, strict=True)]

    def get_config(self):
        return {**super().get_config(), "n": self.n}


def _model_of_every_layer(kind, n=6):
    """Every layer of ROUND_TRIP_FACTORIES inside one model of the given kind, and a
    function giving each layer's output (in ROUND_TRIP_FACTORIES' order) from the model
    or its reloaded copy. Sequential: the layers in a chain (Dense, rank, qnorm, cdf, sort,
    quantile), each layer's output read from the chain."""
    if kind == "sequential":
        order = ["rank", "qnorm", "cdf", "sort", "quantile"]
        model = keras.Sequential([keras.Input((n,)), keras.layers.Dense(n)]
                                 + [ROUND_TRIP_FACTORIES[name]() for name in order])

        def outputs(m, x):
            every = keras.Model(m.inputs, [layer.output for layer in m.layers[1:]])(x)
            by_name = dict(zip(order, every, strict=True))
            return [by_name[name] for name in ROUND_TRIP_FACTORIES]

        return model, outputs
    if kind == "functional":
        inp = keras.Input((n,))
        model = keras.Model(inp, [factory()(keras.layers.Dense(n)(inp))
                                  for factory in ROUND_TRIP_FACTORIES.values()])
    else:
        model = _EverySinkhornLayer(n)
        model(np.zeros((1, n), np.float32))
    return model, lambda m, x: m(x)


@pytest.mark.parametrize("kind", ["sequential", "functional", "subclassed"])
def test_save_load_round_trip(tmp_path, kind):
    # One model per kind holding every layer (one save and load), each layer's output
    # compared exactly.
    model, outputs = _model_of_every_layer(kind)
    x = np.random.RandomState(1).randn(5, 6).astype(np.float32)
    before = outputs(model, x)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded) is type(model)
    for name, got, want in zip(ROUND_TRIP_FACTORIES, outputs(loaded, x), before, strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=name)


def test_layers_work_in_reduced_precision_and_under_xla():
    x = tf.constant(np.random.RandomState(2).randn(3, 7), tf.float16)
    layer = ss.SinkhornSort(direction="DESCENDING", dtype="mixed_float16")
    out = layer(x)
    assert out.dtype == tf.float32  # every layer: float32 under a float16 policy
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


LAYERS = {
    "rank": lambda: ss.SinkhornRank(axis=1, epsilon=1e-2),
    "cdf": lambda: ss.SinkhornCDF(axis=1),
    "sort": lambda: ss.SinkhornSort(axis=1, direction="DESCENDING"),
    "sort_topk": lambda: ss.SinkhornSort(axis=1, topk=2),
    "quantile": lambda: ss.SinkhornQuantile(axis=1, quantiles=[0.25, 0.75]),
    "quantile_normalization": lambda: ss.SinkhornQuantileNormalization(axis=1,
                                                                       num_targets=4),
}


def _scorer_model(names):
    """Features `[batch, n, 3]` (n unknown) → scores `[batch, n, 1]` (a Dense per layer,
    kernel ones) → each layer of LAYERS in `names`: one output per layer."""
    inp = keras.Input((None, 3))
    return keras.Model(inp, {name: LAYERS[name]()(keras.layers.Dense(
        1, kernel_initializer="ones", name=f"dense_{name}")(inp)) for name in names})


def test_functional_model_predicts_two_list_lengths():
    # Every layer of LAYERS in one model, traced once with no static batch size or length:
    # that one graph predicts both lengths; each output checked.
    predict = unknown_length_inference(_scorer_model(sorted(LAYERS)), (3,))
    for n in (5, 9):
        x = np.random.RandomState(n).randn(4, n, 3).astype(np.float32)
        out = predict(x)
        scores = x.sum(axis=-1, keepdims=True)
        for name in sorted(LAYERS):
            expected = LAYERS[name]()
            if name == "quantile_normalization":
                expected.build((None, None, 1))
            np.testing.assert_allclose(out[name], expected(scores).numpy(), atol=1e-5,
                                       err_msg=f"{name}, n = {n}")


@pytest.mark.slow
def test_functional_model_fits_two_list_lengths():
    # The layers in one model, each after its own Dense and with its own mse loss: one fit
    # per length; each head's loss is finite and each head's Dense is trained.
    names = ["quantile_normalization", "rank", "sort"]
    model = _scorer_model(names)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss={name: "mse" for name in names})
    before = {name: model.get_layer(f"dense_{name}").get_weights()[0].copy()
              for name in names}
    for n in (5, 8):
        rng = np.random.RandomState(n)
        x = rng.randn(16, n, 3).astype(np.float32)
        # Random targets of the outputs' shape `[16, n, 1]` (what is asserted, a finite
        # loss and a trained Dense per head, does not depend on them; no eager call).
        y = {name: rng.randn(16, n, 1).astype(np.float32) for name in names}
        # Batches of no static length: both lengths run the one train graph of unknown
        # length (not a trace for the first length and a retrace for the second).
        history = model.fit(unknown_length_batches((x, y), 8), epochs=1, verbose=0)
        for name in names:
            assert np.isfinite(history.history[f"{name}_loss"][-1]), (name, n)
    for name in names:
        assert np.any(model.get_layer(f"dense_{name}").get_weights()[0] != before[name]), name


def test_masked_model_with_unknown_n_saves_and_loads(tmp_path):
    inp = keras.Input((None, 1))
    masked = keras.layers.Masking(mask_value=0.0)(inp)
    ranks = ss.SinkhornRank(axis=1, direction="DESCENDING", epsilon=1e-3)(masked)
    model = keras.Model(inp, ranks)
    path = tmp_path / "masked.keras"
    model.save(path)
    # The loaded model traced once with no static batch size or length: both lengths.
    predict = unknown_length_inference(keras.models.load_model(path), (1,))
    for n in (4, 6):
        x = np.random.RandomState(n).randn(3, n, 1).astype(np.float32)
        x[:, -1] = 0.0  # padding
        out = predict(x)
        # The original model's reference by an eager call (its predict traces added nothing).
        np.testing.assert_allclose(out, model(x).numpy(), atol=1e-6)
        assert np.all(out[:, -1] == 0.0)
        np.testing.assert_allclose(np.sort(out[0, :-1, 0]), np.arange(1, n), atol=0.05)


def test_plain_list_input_of_unknown_length():
    """`keras.Input((None,))` straight into a layer, with a mask argument."""
    inp = keras.Input((None,))
    valid = keras.Input((None,), dtype="bool")
    model = keras.Model([inp, valid], ss.SinkhornSort(epsilon=1e-3)(inp, mask=valid))
    # Traced once with no static batch size or length: the one graph runs both lengths.
    graph = tf.function(lambda x, mask: model([x, mask], training=False), input_signature=[
        tf.TensorSpec((None, None), tf.float32), tf.TensorSpec((None, None), tf.bool)])
    for n in (3, 6):
        x = np.random.RandomState(n).randn(2, n).astype(np.float32)
        mask = np.ones_like(x, bool)
        mask[1, 0] = False
        out = graph(x, mask).numpy()
        np.testing.assert_allclose(out[0], np.sort(x[0]), atol=1e-2)
        np.testing.assert_allclose(out[1, :-1], np.sort(x[1, 1:]), atol=1e-2)
        assert out[1, -1] == 0.0


# Small temperature, tight threshold, float64. (Padded entries and surplus bins are
# decoupled from the valid ones, so a padded list follows the iterations of the
# unpadded one: rows with ties that stop at `max_iterations` agree as well.)
TIGHT = dict(epsilon=1e-2, threshold=1e-8, max_iterations=500)


MASKED_LAYERS = {  # name: (factory, kind of output)
    "rank": (lambda: ss.SinkhornRank(**TIGHT), "elementwise"),
    "cdf": (lambda: ss.SinkhornCDF(**TIGHT), "elementwise"),
    "sort": (lambda: ss.SinkhornSort(**TIGHT), "sorted"),
    "sort_topk": (lambda: ss.SinkhornSort(topk=2, **TIGHT), "sorted"),
    "sort_num_targets": (lambda: ss.SinkhornSort(num_targets=2, **TIGHT), "per_list"),
    "quantile": (lambda: ss.SinkhornQuantile(quantiles=0.5, **TIGHT), "per_list"),
    "quantile_normalization": (lambda: ss.SinkhornQuantileNormalization(num_targets=4,
                                                                         **TIGHT),
                               "elementwise"),
}


@pytest.mark.parametrize("name", sorted(MASKED_LAYERS))
def test_layer_mask_argument_and_compute_mask(name):
    factory, kind = MASKED_LAYERS[name]
    layer = factory()
    assert layer.supports_masking
    x = np.array([[0.5, np.nan, -1.0, 2.0], [1.0, 3.0, 2.0, 0.0]])
    mask = np.array([[True, False, True, True], [True] * 4])
    out = layer(x, mask=mask).numpy()
    assert np.all(np.isfinite(out))
    computed = layer.compute_mask(x, tf.constant(mask))
    alone = factory()
    if name == "quantile_normalization":
        alone.build((None, 3))
    expected = alone(x[:1, mask[0]]).numpy()[0]
    if kind == "elementwise":
        np.testing.assert_array_equal(computed.numpy(), mask)
        assert out[0, 1] == 0.0
        np.testing.assert_allclose(out[0][mask[0]], expected, atol=1e-6)
    elif kind == "sorted":
        width = out.shape[1]
        np.testing.assert_array_equal(computed.numpy(),
                                      [np.arange(width) < 3, np.arange(width) < 4])
        np.testing.assert_allclose(out[0][:min(3, width)], expected, atol=1e-6)
        assert np.all(out[0][3:] == 0.0)
    else:
        assert computed is None
        np.testing.assert_allclose(out[0], expected, atol=1e-6)


def test_keras_masking_layer_upstream_is_honoured():
    x = np.array([[[0.5], [-1.0], [2.0], [0.0]], [[1.0], [3.0], [2.0], [4.0]]], np.float32)
    inp = keras.Input((None, 1))
    masked = keras.layers.Masking(mask_value=0.0)(inp)
    ranks = ss.SinkhornRank(axis=1, epsilon=1e-3)(masked)
    model = keras.Model(inp, ranks)
    out = model.predict(x, verbose=0)[..., 0]
    np.testing.assert_allclose(out, [[2, 1, 3, 0], [1, 3, 2, 4]], atol=0.02)


def test_embedding_mask_zero_upstream_is_honoured():
    tokens = np.array([[3, 1, 2, 0, 0], [4, 2, 5, 1, 3]])
    inp = keras.Input((None,), dtype="int32")
    emb = keras.layers.Embedding(6, 1, mask_zero=True,
                                 embeddings_initializer=keras.initializers.Constant(
                                     np.arange(6.0)[:, None]))(inp)
    ranks = ss.SinkhornRank(axis=1, direction="DESCENDING", epsilon=1e-3)(emb)
    out = keras.Model(inp, ranks).predict(tokens, verbose=0)[..., 0]
    np.testing.assert_allclose(out, [[1, 3, 2, 0, 0], [2, 4, 1, 5, 3]], atol=0.02)


def test_layers_accept_ragged_inputs():
    x = tf.ragged.constant([[0.3, -1.0, 2.0], [5.0]], dtype=tf.float64)
    ranks = ss.SinkhornRank(**TIGHT)(x)
    assert isinstance(ranks, tf.RaggedTensor)
    np.testing.assert_allclose(ranks.flat_values.numpy(),
                               ss.sinkhorn_rank(x, **TIGHT).flat_values.numpy())
    top = ss.SinkhornSort(topk=2, **TIGHT)(x)
    np.testing.assert_array_equal(top.row_lengths().numpy(), [2, 1])


def test_targets_reach_layers_and_their_config():
    layer = ss.SinkhornQuantile([0.2, 0.8], targets="regular", epsilon=1e-2)
    x = np.random.default_rng(1).normal(size=(2, 50)).astype(np.float32)
    expected = ss.sinkhorn_quantile(x, [0.2, 0.8], targets="regular", epsilon=1e-2)
    np.testing.assert_allclose(layer(x), expected, rtol=0, atol=1e-6)
    clone = ss.SinkhornQuantile.from_config(layer.get_config())
    assert clone.targets == "regular"
    other = ss.sinkhorn_quantile(x, [0.2, 0.8], targets="centres", epsilon=1e-2)
    assert np.abs(np.asarray(other) - np.asarray(expected)).max() > 1e-2

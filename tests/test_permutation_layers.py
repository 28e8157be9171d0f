"""Keras layers SoftSort, NeuralSort and SinkhornPermutation: outputs, stochastic
behaviour, shapes, XLA, mixed precision and save/load round trips."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss

LAYERS = {
    "softsort": (ss.SoftSort, dict(tau=0.4, distance_power=2.0), ss.soft_sort_matrix),
    "neuralsort": (ss.NeuralSort, dict(tau=0.4), ss.neural_sort_matrix),
    "sinkhorn": (ss.SinkhornPermutation, dict(epsilon=0.05, max_iterations=500),
                 ss.sinkhorn_permutation_matrix),
}


def scores(seed=0, shape=(3, 5)):
    return tf.constant(np.random.RandomState(seed).randn(*shape).astype(np.float32))


@pytest.mark.parametrize("name", list(LAYERS))
def test_output_modes_match_the_functional_ops(name):
    cls, kwargs, op = LAYERS[name]
    x, values = scores(0), scores(1)
    perm = op(x, direction="ASCENDING", **kwargs)
    out = cls(direction="ASCENDING", **kwargs)(x)
    np.testing.assert_allclose(out.numpy(), perm.numpy(), atol=1e-6)
    sorted_x = cls(direction="ASCENDING", output_mode="sorted", **kwargs)(x)
    np.testing.assert_allclose(sorted_x.numpy(), ss.permute_values(perm, x).numpy(), atol=1e-5)
    sorted_values = cls(direction="ASCENDING", output_mode="sorted", **kwargs)([x, values])
    np.testing.assert_allclose(sorted_values.numpy(), ss.permute_values(perm, values).numpy(),
                               atol=1e-5)
    ranks = cls(direction="ASCENDING", output_mode="ranks", **kwargs)(x)
    np.testing.assert_allclose(ranks.numpy(), ss.ranks_from_permutation(perm).numpy(), atol=1e-5)
    hard = cls(hard=True, output_mode="ranks", **kwargs)(x)
    np.testing.assert_array_equal(hard.numpy(), np.argsort(np.argsort(-x.numpy(), -1), -1) + 1)


@pytest.mark.parametrize("name", ["softsort", "neuralsort"])
def test_gumbel_noise_only_when_training_unless_asked(name):
    cls, kwargs, op = LAYERS[name]
    x = scores(2)
    deterministic = op(x, **kwargs).numpy()
    layer = cls(stochastic=True, seed=5, **kwargs)
    np.testing.assert_array_equal(layer(x).numpy(), deterministic)
    np.testing.assert_array_equal(layer(x, training=False).numpy(), deterministic)
    first, second = layer(x, training=True).numpy(), layer(x, training=True).numpy()
    assert first.shape == deterministic.shape
    assert np.abs(first - deterministic).max() > 1e-2
    assert np.abs(first - second).max() > 1e-2  # fresh noise at every call
    replay = cls(stochastic=True, seed=5, **kwargs)  # same seed, same sequence of samples
    np.testing.assert_allclose(replay(x, training=True).numpy(), first, atol=1e-6)
    always = cls(stochastic=True, sample_at_inference=True, seed=5, **kwargs)
    np.testing.assert_allclose(always(x).numpy(), first, atol=1e-6)
    with pytest.raises(ValueError, match="stochastic"):
        cls(num_samples=3, **kwargs)


def test_num_samples_adds_a_sample_axis():
    x = scores(3)
    layer = ss.SoftSort(tau=0.5, stochastic=True, num_samples=4, seed=1)
    assert layer(x, training=True).shape == (3, 4, 5, 5)
    inference = layer(x)  # S copies of the noise-free matrix: the same static shape
    assert inference.shape == (3, 4, 5, 5)
    for sample in range(4):
        np.testing.assert_array_equal(inference.numpy()[:, sample],
                                      ss.soft_sort_matrix(x, 0.5).numpy())
    ranks = ss.SoftSort(tau=0.5, stochastic=True, num_samples=4, seed=1, output_mode="ranks")
    assert ranks(x, training=True).shape == (3, 4, 5)
    sorted_values = ss.NeuralSort(stochastic=True, num_samples=2, output_mode="sorted", seed=0)
    assert sorted_values([x, scores(4)], training=True).shape == (3, 2, 5)


@pytest.mark.parametrize("kwargs, inputs, expected", [
    (dict(), [(None, 6)], (None, 6, 6)),
    (dict(output_mode="ranks"), [(None, 6)], (None, 6)),
    (dict(output_mode="sorted"), [(None, 6), (None, 6)], (None, 6)),
    (dict(stochastic=True, num_samples=3), [(None, 6)], (None, 3, 6, 6)),
    (dict(stochastic=True, num_samples=3, output_mode="ranks"), [(None, 2, 6)],
     (None, 2, 3, 6)),
])
def test_symbolic_output_shapes(kwargs, inputs, expected):
    tensors = [keras.Input(shape[1:]) for shape in inputs]
    for cls in (ss.SoftSort, ss.NeuralSort, ss.SinkhornPermutation):
        layer = cls(**kwargs)
        out = layer(tensors if len(tensors) > 1 else tensors[0])
        assert tuple(out.shape) == expected
        shape = layer.compute_output_shape(inputs if len(inputs) > 1 else inputs[0])
        assert tuple(shape) == expected


def build_model(with_sinkhorn=True):
    items = keras.Input((6,))
    scores_ = keras.layers.Dense(6)(items)
    soft = ss.SoftSort(tau=0.5, stochastic=True, num_samples=2, seed=11, name="soft")(scores_)
    neural = ss.NeuralSort(tau=0.7, direction="ASCENDING", output_mode="ranks",
                           name="neural")(scores_)
    outputs = [soft, neural]
    if with_sinkhorn:
        outputs.append(ss.SinkhornPermutation(epsilon=0.1, hard=True, output_mode="sorted",
                                              name="sinkhorn")([scores_, items]))
    return keras.Model(items, outputs)


def test_save_load_round_trip(tmp_path):
    model = build_model()
    x = np.random.RandomState(5).randn(4, 6).astype(np.float32)
    expected = model(x)
    model.save(tmp_path / "m.keras")
    restored = keras.models.load_model(tmp_path / "m.keras")
    for got, want in zip(restored(x), expected, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6)
    for name in ("soft", "neural", "sinkhorn"):
        assert restored.get_layer(name).get_config() == model.get_layer(name).get_config()
    # The seed generator's state is saved: training-mode samples continue identically.
    np.testing.assert_allclose(restored.get_layer("soft")(x[:, :6], training=True).numpy(),
                               model.get_layer("soft")(x[:, :6], training=True).numpy(),
                               atol=1e-6)


def test_config_round_trip_of_each_layer():
    for cls, kwargs, _ in LAYERS.values():
        layer = cls(direction="ASCENDING", hard=True, output_mode="ranks", stochastic=True,
                    num_samples=3, sample_at_inference=True, seed=4, **kwargs)
        clone = cls.from_config(layer.get_config())
        assert clone.get_config() == layer.get_config()
        restored = keras.layers.deserialize(keras.layers.serialize(layer))
        assert type(restored) is cls


def test_xla_and_mixed_precision_models():
    x = np.random.RandomState(6).randn(8, 6).astype(np.float32)
    model = build_model(with_sinkhorn=False)
    eager = model(x)
    xla = tf.function(model, jit_compile=True)(x)
    for got, want in zip(xla, eager, strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-4)
    # In training mode, the noise drawn under XLA is the one drawn eagerly.
    seed_state = model.get_layer("soft").seed_generator.state.numpy()
    eager_train = model(x, training=True)[0]
    model.get_layer("soft").seed_generator.state.assign(seed_state)
    xla_train = tf.function(lambda v: model(v, training=True), jit_compile=True)(x)[0]
    np.testing.assert_allclose(xla_train.numpy(), eager_train.numpy(), atol=1e-4)
    # Under a mixed policy the layers compute and return float32 (see
    # tests/test_mixed_precision.py for training).
    for policy in ("mixed_float16", "mixed_bfloat16", "float16"):
        layer = ss.SoftSort(tau=0.5, dtype=policy)
        out = layer(x)
        assert out.dtype == tf.float32 and layer.compute_dtype == "float32"
        np.testing.assert_allclose(out.numpy(), ss.soft_sort_matrix(x, 0.5).numpy(), atol=1e-6)
    assert ss.SoftSort(dtype="float64")(x.astype(np.float64)).dtype == tf.float64


@pytest.mark.parametrize("name", list(LAYERS))
def test_sample_axis_has_a_static_size_for_flatten_and_dense(name):
    # Bug: the sample axis had no static size (and size S in training, 1 in inference),
    # so a Flatten + Dense after a stochastic layer with num_samples failed.
    cls, kwargs, _ = LAYERS[name]
    inputs = keras.Input((5,))
    perm = cls(stochastic=True, num_samples=3, seed=2, **kwargs)(inputs)
    assert tuple(perm.shape) == (None, 3, 5, 5)
    outputs = keras.layers.Dense(1)(keras.layers.Flatten()(perm))
    model = keras.Model(inputs, outputs)
    model.compile("sgd", "mse")
    x = np.random.RandomState(0).randn(8, 5).astype(np.float32)
    history = model.fit(x, x.sum(-1), batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert model.predict(x, batch_size=4, verbose=0).shape == (8, 1)


@pytest.mark.parametrize("make, match", [
    (lambda: ss.SoftSort(output_mode="values"), "output_mode"),
    (lambda: ss.SoftSort(tau=-1.0), "tau"),
    (lambda: ss.NeuralSort(direction="down"), "direction"),
    (lambda: ss.NeuralSort(stochastic=True, num_samples=0), "num_samples"),
    (lambda: ss.SoftSort(stochastic=True, seed=-3), "seed"),
    (lambda: ss.SinkhornPermutation(epsilon=0.0), "epsilon"),
    (lambda: ss.SinkhornPermutation(squash="tanh"), "squash"),
    (lambda: ss.SoftSort(hard=1), "hard"),
])
def test_bad_arguments_raise_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_list_input_needs_sorted_output():
    with pytest.raises(ValueError, match="output_mode='sorted'"):
        ss.SoftSort()([scores(0), scores(1)])

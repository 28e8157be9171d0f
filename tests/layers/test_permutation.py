"""Tests of `softsort_tf.layers.permutation`: SoftSort, NeuralSort and
SinkhornPermutation as Keras layers (output modes, Gumbel samples, shapes, save/load,
XLA), Keras masks and ragged lists, functional models of unknown list length, and
training under mixed precision."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras_test_layers import Squeeze, unknown_length_batches, unknown_length_inference
from operator_cases import embed_block

import softsort_tf as ss

LAYERS = {
    "softsort": (ss.SoftSort, dict(tau=0.4, distance_power=2.0), ss.softsort_permutation_matrix),
    "neuralsort": (ss.NeuralSort, dict(tau=0.4), ss.neuralsort_permutation_matrix),
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
                                      ss.softsort_permutation_matrix(x, 0.5).numpy())
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
    # test_permutation_layers_train_under_mixed_precision for training).
    for policy in ("mixed_float16", "mixed_bfloat16", "float16"):
        layer = ss.SoftSort(tau=0.5, dtype=policy)
        out = layer(x)
        assert out.dtype == tf.float32 and layer.compute_dtype == "float32"
        np.testing.assert_allclose(out.numpy(), ss.softsort_permutation_matrix(x, 0.5).numpy(),
                                   atol=1e-6)
    assert ss.SoftSort(dtype="float64")(x.astype(np.float64)).dtype == tf.float64


@pytest.mark.keras_default_build
def test_sample_axis_has_a_static_size_for_flatten_and_dense():
    # Bug: the sample axis had no static size (and size S in training, 1 in inference),
    # so a Flatten + Dense after a stochastic layer with num_samples failed.
    # Every layer of LAYERS in one model (a Flatten + Dense head each), fitted once.
    inputs = keras.Input((5,))
    outputs = {}
    for name, (cls, kwargs, _) in LAYERS.items():
        perm = cls(stochastic=True, num_samples=3, seed=2, **kwargs)(inputs)
        assert tuple(perm.shape) == (None, 3, 5, 5), name
        outputs[name] = keras.layers.Dense(1, name=name)(keras.layers.Flatten()(perm))
    model = keras.Model(inputs, outputs)
    model.compile("sgd", {name: "mse" for name in LAYERS})
    x = np.random.RandomState(0).randn(8, 5).astype(np.float32)
    history = model.fit(x, {name: x.sum(-1) for name in LAYERS}, batch_size=4, epochs=1,
                        verbose=0)
    # Inference (sample axis of size 3, not 1, in inference too): an eager call runs the
    # fitted Flatten + Dense heads on the inference output (a `predict` graph would only
    # add a trace of the same layers).
    predictions = model(x, training=False)
    for name in LAYERS:
        assert np.isfinite(history.history[f"{name}_loss"][0]), name
        assert tuple(predictions[name].shape) == (8, 1), name


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


LENGTHS = (3, 6)


UNKNOWN_LENGTH_LAYERS = {
    "softsort": lambda **kw: ss.SoftSort(tau=0.3, **kw),
    "neuralsort": lambda **kw: ss.NeuralSort(tau=0.3, **kw),
    "sinkhorn": lambda **kw: ss.SinkhornPermutation(epsilon=0.05, **kw),
}


@pytest.mark.parametrize("layer", [
    "softsort", "neuralsort", pytest.param("sinkhorn", marks=pytest.mark.slow)])
def test_functional_model_with_unknown_length_predicts_two_lengths(layer):
    # Every output mode in one model (a deterministic and a sampling layer per mode),
    # traced once with no static batch size or length: that one graph predicts both
    # lengths; each output checked.
    modes = ["matrix", "sorted", "ranks"]
    inputs = keras.Input((None,))
    outputs = {}
    for mode in modes:
        outputs[mode] = UNKNOWN_LENGTH_LAYERS[layer](output_mode=mode)(inputs)
        outputs[f"{mode}_sampled"] = UNKNOWN_LENGTH_LAYERS[layer](
            stochastic=True, num_samples=2, output_mode=mode)(inputs)
    predict = unknown_length_inference(keras.Model(inputs, outputs))
    for n in LENGTHS:
        x = np.random.RandomState(n).randn(3, n).astype(np.float32)
        out = predict(x)
        for mode in modes:
            expected = UNKNOWN_LENGTH_LAYERS[layer](output_mode=mode)(x).numpy()
            np.testing.assert_allclose(out[mode], expected, atol=1e-5,
                                       err_msg=f"{mode}, n = {n}")
            assert out[f"{mode}_sampled"].shape == (expected.shape[:1] + (2,)
                                                    + expected.shape[1:]), (mode, n)


@pytest.mark.slow
def test_fit_with_padded_orderings_of_two_lengths():
    # Scores from a Dense layer per item, trained with the permutation cross-entropy on
    # padded lists (ordering then −1) of two lengths; padded items are masked upstream.
    # One head (its own Dense and layer, loss and metrics) per method, fitted together.
    keras.utils.set_random_seed(0)  # the layers' unseeded Gumbel noise: reproducible
    methods = ["neuralsort", "softsort"]
    items = keras.Input((None, 2))
    masked = keras.layers.Masking(mask_value=0.0)(items)
    outputs = {}
    for method in methods:
        scores = Squeeze()(keras.layers.Dense(1)(masked))  # carries the Keras mask
        # Named by its output key: Keras < 3.12 keys a dict of metrics by layer names.
        outputs[method] = UNKNOWN_LENGTH_LAYERS[method](stochastic=True, name=method)(scores)
    model = keras.Model(items, outputs)
    model.compile(keras.optimizers.Adam(0.05),
                  {method: ss.PermutationCrossEntropy() for method in methods},
                  metrics={method: [ss.ExactPermutationAccuracy(),
                                    ss.ElementwisePermutationAccuracy()] for method in methods})
    rng = np.random.RandomState(0)
    histories = []
    for n in (4, 7):
        x = rng.rand(64, n, 2).astype(np.float32) + 0.1
        n_valid = rng.randint(2, n + 1, size=64)
        order = np.full([64, n], -1, np.int32)
        for b in range(64):
            x[b, n_valid[b]:] = 0.0
            key = x[b, :n_valid[b]] @ np.array([1.0, -2.0])
            order[b, :n_valid[b]] = np.argsort(-key, kind="stable")
        targets = {method: order for method in methods}
        # Batches of no static length: both lengths run the one train graph of unknown
        # length.
        batches = unknown_length_batches((x, targets), 16)
        histories.append(model.fit(batches.shuffle(4, seed=n), epochs=6,
                                   verbose=0).history)
        # The values of `evaluate` (inference mode, the whole data set: 4 equal batches),
        # by an eager call, without tracing its graph (whose forward pass, loss and
        # metrics the train graph holds).
        predictions = model(x, training=False)
        result = {}
        for method in methods:
            result[f"{method}_loss"] = float(ss.PermutationCrossEntropy()(
                order, predictions[method]))
            accuracy = ss.ElementwisePermutationAccuracy()
            accuracy.update_state(order, predictions[method])
            result[f"{method}_elementwise_permutation_accuracy"] = float(accuracy.result())
            assert np.isfinite(result[f"{method}_loss"]), (method, n)
    for method in methods:
        loss = histories[0][f"{method}_loss"]
        assert loss[-1] < loss[0], (method, loss)
        accuracy = result[f"{method}_elementwise_permutation_accuracy"]
        assert accuracy > 0.6, (method, accuracy)


def test_masked_model_save_load_round_trip(tmp_path):
    items = keras.Input((None, 1))
    masked = keras.layers.Masking(mask_value=0.0)(items)
    scores = Squeeze()(keras.layers.Dense(1)(masked))
    ranks = ss.NeuralSort(tau=0.2, output_mode="ranks")(scores)
    sorted_values = ss.SoftSort(tau=0.2, output_mode="sorted")(scores)
    model = keras.Model(items, [ranks, sorted_values, scores])
    x = np.array([[[0.5], [0.0], [2.0], [1.0]], [[3.0], [1.5], [0.0], [0.0]]], np.float32)
    before = model.predict(x, verbose=0)
    for r in range(2):
        valid = x[r, :, 0] != 0
        s = before[2][r, valid][None]
        np.testing.assert_allclose(before[0][r, valid],
                                   ss.NeuralSort(tau=0.2, output_mode="ranks")(s)[0], atol=1e-5)
        assert np.all(before[0][r, ~valid] == 0)  # padded ranks: 0
        np.testing.assert_allclose(before[1][r, :valid.sum()],
                                   ss.SoftSort(tau=0.2, output_mode="sorted")(s)[0], atol=1e-5)
        assert np.all(before[1][r, valid.sum():] == 0)
    path = str(tmp_path / "masked.keras")
    model.save(path)
    # The loaded model traced once with no static batch size or length: both lengths.
    loaded = unknown_length_inference(keras.saving.load_model(path), (1,))
    for a, b in zip(before, loaded(x), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    longer = np.concatenate([x, x[:, :2]], axis=1)  # another length after loading
    assert loaded(longer)[0].shape == (2, 6)


@pytest.mark.parametrize("mode", ["matrix", "sorted", "ranks"])
@pytest.mark.parametrize("num_samples", [None, 2])
def test_layers_on_ragged_lists(mode, num_samples):
    lists = [[3.0, 1.0, 2.0], [5.0], [0.0, -1.0]]
    layer = ss.NeuralSort(tau=0.01, output_mode=mode, stochastic=num_samples is not None,
                          num_samples=num_samples)
    out = layer(tf.ragged.constant(lists))
    assert isinstance(out, tf.RaggedTensor)
    for row, values in zip(out.to_list(), lists, strict=True):
        ref = layer(np.array([values], np.float32)).numpy()[0]
        np.testing.assert_allclose(np.array(row), ref, atol=1e-6)


@pytest.mark.parametrize("mode", ["matrix", "sorted", "ranks"])
def test_layer_mask_argument_and_compute_mask(mode):
    x = np.array([[3.0, np.nan, 1.0, 2.0]], np.float32)
    mask = np.array([[True, False, True, True]])
    layer = ss.SoftSort(tau=0.01, output_mode=mode)
    out = layer(x, mask=mask).numpy()
    ref = layer(x[:, mask[0]]).numpy()
    assert np.all(np.isfinite(out))
    if mode == "matrix":
        np.testing.assert_allclose(out[0], embed_block(ref[0], mask[0]), atol=1e-7)
        assert layer.compute_mask(x, mask) is None
    elif mode == "sorted":
        np.testing.assert_allclose(out[0], np.append(ref[0], 0.0), atol=1e-6)
        assert np.asarray(layer.compute_mask(x, mask)).tolist() == [[True, True, True, False]]
    else:
        np.testing.assert_allclose(out[0][mask[0]], ref[0], atol=1e-6)
        assert out[0][1] == 0
        assert np.asarray(layer.compute_mask(x, mask)).tolist() == mask.tolist()
    stochastic = ss.SoftSort(tau=0.01, output_mode=mode, stochastic=True, num_samples=3)
    if mode != "matrix":
        assert np.asarray(stochastic.compute_mask(x, mask)).shape == (1, 3, 4)


@pytest.mark.parametrize("mode", ["sorted", "ranks", "matrix"])
def test_keras_mask_from_embedding_is_honoured(mode):
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(10, 3, mask_zero=True)(tokens)
    scores = Squeeze()(keras.layers.Dense(1)(embedded))
    model = keras.Model(tokens, ss.SoftSort(tau=0.05, output_mode=mode)(scores))
    score_model = keras.Model(tokens, scores)
    ids = np.array([[3, 0, 5, 7, 0], [1, 2, 0, 0, 0]], np.int32)  # 0 = padding
    out = model.predict(ids, verbose=0)
    s = np.asarray(score_model(ids))  # the scores (eager: a `predict` graph would add a trace)
    for r in range(2):
        valid = ids[r] > 0
        ref = ss.SoftSort(tau=0.05, output_mode=mode)(s[r, valid][None]).numpy()[0]
        if mode == "matrix":
            np.testing.assert_allclose(out[r], embed_block(ref, valid), atol=1e-6)
        elif mode == "sorted":
            np.testing.assert_allclose(out[r][:valid.sum()], ref, atol=1e-6)
            assert np.all(out[r][valid.sum():] == 0)
        else:
            np.testing.assert_allclose(out[r][valid], ref, atol=1e-5)
            assert np.all(out[r][~valid] == 0)


def test_sinkhorn_layer_takes_the_mask():
    x = np.array([[3.0, np.nan, 1.0, 2.0]], np.float32)
    mask = np.array([[True, False, True, True]])
    layer = ss.SinkhornPermutation(epsilon=1e-3, output_mode="ranks")
    out = layer(x, mask=mask).numpy()[0]
    np.testing.assert_allclose(out, [1.0, 0.0, 3.0, 2.0], atol=1e-3)


def test_keras_mask_without_the_list_axis_masks_whole_lists():
    # `Masking` on `[batch, n]` scores masks per example (its feature axis is n): the
    # mask `[batch]` is broadcast along the list.
    x = np.array([[3.0, 0.0, 1.0], [0.0, 0.0, 0.0]], np.float32)
    inputs = keras.Input((None,))
    layer = ss.SoftSort(tau=0.01, output_mode="ranks")
    model = keras.Model(inputs, layer(keras.layers.Masking(0.0)(inputs)))
    np.testing.assert_allclose(model.predict(x, verbose=0), [[1.0, 3.0, 2.0], [0.0] * 3],
                               atol=1e-6)
    assert np.asarray(layer.compute_mask(x, np.array([True, False]))).tolist() == [
        [True] * 3, [False] * 3]


N = 5


MIXED_PRECISION_LAYERS = {
    "softsort": lambda **kw: ss.SoftSort(tau=0.3, **kw),
    "neuralsort": lambda **kw: ss.NeuralSort(tau=0.3, **kw),
    "sinkhorn": lambda **kw: ss.SinkhornPermutation(epsilon=0.05, max_iterations=200, **kw),
    "softsort_stochastic": lambda **kw: ss.SoftSort(tau=0.3, stochastic=True, num_samples=2,
                                                    seed=1, **kw),
}


def sorting_data(batch=64):
    rng = np.random.RandomState(0)
    x = rng.randn(batch, N).astype(np.float32)
    return x, np.argsort(-x, axis=-1).astype(np.int32)  # DESCENDING orderings


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"], indirect=True)
def test_permutation_layers_train_under_mixed_precision(policy):
    # Every layer of MIXED_PRECISION_LAYERS in one mixed model, each after its own Dense
    # (same initialisation as alone) with its own loss and metric: one fit for all; each
    # head's loss and accuracy checked before and after. (The losses and accuracies of the
    # whole data set are computed by an eager inference call: the values of `evaluate`,
    # without tracing its graph, whose forward pass, losses and metrics the train graph
    # traced under the same policy holds.)
    names = sorted(MIXED_PRECISION_LAYERS)
    x, order = sorting_data()
    inputs = keras.Input((N,))
    outputs = {}
    for name in names:
        scores = keras.layers.Dense(N, kernel_initializer=keras.initializers.RandomNormal(
            stddev=0.3, seed=0))(inputs)
        assert scores.dtype == policy.removeprefix("mixed_")  # the model really is mixed
        perm = MIXED_PRECISION_LAYERS[name](name=name)(scores)  # named by its output key
        assert perm.dtype == "float32", name
        outputs[name] = perm
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.Adam(0.05),
                  {name: ss.PermutationCrossEntropy() for name in names},
                  metrics={name: [ss.ExactPermutationAccuracy()] for name in names})
    targets = {name: order for name in names}

    def evaluate():
        predictions = model(x)
        result = {}
        for name in names:
            result[f"{name}_loss"] = float(ss.PermutationCrossEntropy()(order, predictions[name]))
            accuracy = ss.ExactPermutationAccuracy()
            accuracy.update_state(order, predictions[name])
            result[f"{name}_exact_permutation_accuracy"] = float(accuracy.result())
        return result

    before = evaluate()
    history = model.fit(x, targets, batch_size=16, epochs=4, verbose=0).history
    after = evaluate()
    for name in names:
        assert np.all(np.isfinite(history[f"{name}_loss"])), name
        assert after[f"{name}_loss"] < 0.7 * before[f"{name}_loss"], name
        accuracy = f"{name}_exact_permutation_accuracy"
        assert after[accuracy] > before[accuracy], name
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        # Dynamic loss scaling halves the scale at each overflow: it must not collapse.
        assert float(model.optimizer.dynamic_scale) >= 2.0**10

"""Unknown list length n and batch size for the permutation operators, layers, loss and
metrics: `tf.function` with an `input_signature` of `None` dimensions (eager and XLA),
Keras functional models `Input((None,))` fed lists of two lengths (predict and fit),
and the save/load round trip of a masked model."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras_test_layers import Squeeze

import softsort_tf as ss
from softsort_tf.ops import hard_stats

DYNAMIC = [tf.TensorSpec([None, None], tf.float32)]
DYNAMIC_MASKED = DYNAMIC + [tf.TensorSpec([None, None], tf.bool)]
LENGTHS = (3, 6)


def _descending_order(s):
    return tf.argsort(s, axis=-1, direction="DESCENDING", stable=True)


# name: f(scores, mask) → a tensor (mask None or a bool [batch, n]).
OPERATORS = {
    "softsort": lambda s, m: ss.soft_sort_matrix(s, tau=0.3, mask=m),
    "softsort_p2_hard": lambda s, m: ss.soft_sort_matrix(s, tau=0.3, distance_power=2.0,
                                                         hard=True, mask=m),
    "neuralsort": lambda s, m: ss.neural_sort_matrix(s, tau=0.3, mask=m),
    "neuralsort_hard_ascending": lambda s, m: ss.neural_sort_matrix(
        s, tau=0.3, hard=True, direction="ASCENDING", mask=m),
    "hard": lambda s, m: ss.hard_permutation_matrix(s, mask=m),
    "stochastic_softsort": lambda s, m: ss.stochastic_soft_sort_matrix(s, 2, seed=3, tau=0.3,
                                                                       mask=m),
    "stochastic_neuralsort_hard": lambda s, m: ss.stochastic_neural_sort_matrix(
        s, 2, seed=[1, 2], tau=0.3, hard=True, mask=m),
    "gumbel_perturb": lambda s, m: ss.gumbel_perturb(s, 2, 5, mask=m),
    "permute_values": lambda s, m: ss.permute_values(
        ss.soft_sort_matrix(s, tau=0.3, mask=m), 2.0 * s, mask=m),
    "ranks_from_permutation": lambda s, m: ss.ranks_from_permutation(
        ss.neural_sort_matrix(s, tau=0.3, mask=m), mask=m),
    "rankdata": lambda s, m: ss.rankdata(s, mask=m),
    "weighted_quantile": lambda s, m: hard_stats.weighted_quantile(s, 0.3, mask=m),
    "interval_mean": lambda s, m: hard_stats.interval_mean(s, 0.1, 0.7, mask=m),
    "cross_entropy": lambda s, m: ss.permutation_cross_entropy(
        _descending_order(s), ss.soft_sort_matrix(s * 1.5, tau=0.3), mask=m),
    "cross_entropy_float_orderings": lambda s, m: ss.permutation_cross_entropy(
        tf.cast(_descending_order(s), tf.float32), ss.neural_sort_matrix(s, tau=0.3)),
    "exact_accuracy": lambda s, m: ss.exact_permutation_accuracy(
        _descending_order(s), ss.soft_sort_matrix(s * 0.5, tau=0.3), mask=m),
    "elementwise_accuracy": lambda s, m: ss.elementwise_permutation_accuracy(
        _descending_order(s), ss.soft_sort_matrix(-s, tau=0.3), mask=m),
}


def _inputs(n, batch=2, seed=0):
    rng = np.random.RandomState(seed + n)
    x = rng.randn(batch, n).astype(np.float32)
    mask = rng.rand(batch, n) < 0.7
    mask[:, 0] = True
    return x, mask


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_unknown_list_length_and_batch(name, jit):
    fn = OPERATORS[name]
    plain = tf.function(lambda s: fn(s, None), input_signature=DYNAMIC, jit_compile=jit)
    masked = tf.function(fn, input_signature=DYNAMIC_MASKED, jit_compile=jit)
    for n, batch in zip(LENGTHS, (2, 3), strict=True):
        x, mask = _inputs(n, batch)
        np.testing.assert_allclose(plain(x), fn(x, None), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(masked(x, mask), fn(x, mask), rtol=1e-5, atol=1e-6)
    # One trace per signature: the lengths did not retrace.
    assert plain.experimental_get_tracing_count() == 1
    assert masked.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("name", ["softsort", "neuralsort", "stochastic_softsort",
                                  "cross_entropy", "permute_values"])
def test_gradients_with_unknown_list_length_under_xla(name):
    fn = OPERATORS[name]

    def value_and_grad(s, m):
        with tf.GradientTape() as tape:
            tape.watch(s)
            total = tf.reduce_sum(tf.sin(3.0 * fn(s, m)))
        return tape.gradient(total, s)

    xla = tf.function(value_and_grad, input_signature=DYNAMIC_MASKED, jit_compile=True)
    for n in LENGTHS:
        x, mask = _inputs(n)
        np.testing.assert_allclose(xla(x, mask), value_and_grad(tf.constant(x), mask),
                                   rtol=1e-4, atol=1e-5)


LAYERS = {
    "softsort": lambda **kw: ss.SoftSort(tau=0.3, **kw),
    "neuralsort": lambda **kw: ss.NeuralSort(tau=0.3, **kw),
    "sinkhorn": lambda **kw: ss.SinkhornPermutation(epsilon=0.05, **kw),
}


@pytest.mark.parametrize("mode", ["matrix", "sorted", "ranks"])
@pytest.mark.parametrize("layer", [
    "softsort", "neuralsort", pytest.param("sinkhorn", marks=pytest.mark.slow)])
def test_functional_model_with_unknown_length_predicts_two_lengths(layer, mode):
    inputs = keras.Input((None,))
    kwargs = dict(output_mode=mode)
    model = keras.Model(inputs, [LAYERS[layer](**kwargs)(inputs),
                                 LAYERS[layer](stochastic=True, num_samples=2,
                                               **kwargs)(inputs)])
    for n in LENGTHS:
        x = np.random.RandomState(n).randn(3, n).astype(np.float32)
        out, sampled = model.predict(x, verbose=0, batch_size=2)
        expected = LAYERS[layer](**kwargs)(x).numpy()
        np.testing.assert_allclose(out, expected, atol=1e-5)
        assert sampled.shape == expected.shape[:1] + (2,) + expected.shape[1:]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["softsort", "neuralsort"])
def test_fit_with_padded_orderings_of_two_lengths(method):
    # Scores from a Dense layer per item, trained with the permutation cross-entropy on
    # padded lists (ordering then −1) of two lengths; padded items are masked upstream.
    items = keras.Input((None, 2))
    masked = keras.layers.Masking(mask_value=0.0)(items)
    scores = Squeeze()(keras.layers.Dense(1)(masked))  # carries the Keras mask
    model = keras.Model(items, LAYERS[method](stochastic=True)(scores))
    model.compile(keras.optimizers.Adam(0.05), ss.PermutationCrossEntropy(),
                  metrics=[ss.ExactPermutationAccuracy(), ss.ElementwisePermutationAccuracy()])
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
        histories.append(model.fit(x, order, epochs=6, batch_size=16, verbose=0).history)
        result = model.evaluate(x, order, verbose=0, return_dict=True)
        assert np.isfinite(result["loss"])
    assert histories[0]["loss"][-1] < histories[0]["loss"][0]
    assert result["elementwise_permutation_accuracy"] > 0.6


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
    loaded = keras.saving.load_model(path)
    for a, b in zip(before, loaded.predict(x, verbose=0), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    longer = np.concatenate([x, x[:, :2]], axis=1)  # another length after loading
    assert loaded.predict(longer, verbose=0)[0].shape == (2, 6)

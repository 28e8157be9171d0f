"""Losses and metrics with shapes unknown at trace time: an unknown batch size (the
batch-statistic regression losses and metrics), unknown list lengths (the list losses
and metrics), inside `tf.function` with `None` dimensions, under XLA, and in Keras
models fed batches and lists of several sizes. Values are compared with float64 numpy
references (or with the same call on static shapes)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from numpy_references import np_window_mean, np_window_shares

import softsort_tf as ss

HARD = dict(epsilon=1e-5, threshold=1e-6, max_iterations=3000)


def np_batch_loss(errors, weights, low, high):
    """Hard-limit batch-statistic loss ('sum_over_batch_size') of one batch: examples of
    weight 0 are padding (left out of the statistic), the others scale their shares."""
    errors, weights = np.asarray(errors, np.float64), np.asarray(weights, np.float64)
    valid = weights != 0
    shares = np.zeros_like(errors)
    if valid.any():
        shares[valid] = np_window_shares(errors[valid], low, high)
    return float(weights @ shares / errors.size)


# (loss, metric, window [low, high] of cumulative mass)
BATCH_STATISTICS = {
    "least_quantile": (lambda: ss.SoftLeastQuantileRegressionLoss(0.4, width=0.2,
                                                                   dtype="float64", **HARD),
                       lambda: ss.QuantileError(0.4, width=0.2, dtype="float64"), (0.3, 0.5)),
    "trimmed": (lambda: ss.SoftTrimmedRegressionLoss(0.1, 0.7, dtype="float64", **HARD),
                lambda: ss.TrimmedError(0.1, 0.7, dtype="float64"), (0.1, 0.7)),
}


def distinct_errors(rng, size):
    """Predictions whose absolute errors (targets 0) are ≥ 0.4 apart: an unambiguous
    hard limit."""
    return (rng.permutation(size) + 1.0 + rng.uniform(-0.3, 0.3, size)) * rng.choice([-1, 1],
                                                                                  size)


@pytest.mark.parametrize("name", sorted(BATCH_STATISTICS))
def test_batch_statistics_with_an_unknown_batch_size(name):
    # Bug: `Transport` filled the uniform masses with 1/B from the static batch size
    # (TypeError for a `None` batch): every tf.data pipeline without drop_remainder.
    make_loss, make_metric, (low, high) = BATCH_STATISTICS[name]
    loss, metric = make_loss(), make_metric()
    spec = tf.TensorSpec([None, 1], tf.float64)
    rng = np.random.RandomState(1)

    @tf.function(input_signature=[spec, spec, tf.TensorSpec([None], tf.float64)])
    def both(y_true, y_pred, weights):
        metric.reset_state()
        metric.update_state(y_true, y_pred, sample_weight=weights)
        return loss(y_true, y_pred), loss(y_true, y_pred, sample_weight=weights), metric.result()

    for size in (9, 5, 12):
        y_pred = distinct_errors(rng, size)
        weights = rng.uniform(0.5, 2.0, size)
        weights[rng.choice(size, 2, replace=False)] = 0.0  # two padded examples
        plain, weighted, hard = (float(v) for v in both(np.zeros((size, 1)), y_pred[:, None],
                                                         weights))
        errors = np.abs(y_pred)
        assert plain == pytest.approx(np_window_mean(errors, low, high), abs=2e-3)
        assert weighted == pytest.approx(np_batch_loss(errors, weights, low, high), abs=2e-3)
        assert hard == pytest.approx(np_window_mean(errors, low, high, weights), abs=1e-9)


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("name", sorted(BATCH_STATISTICS))
def test_batch_statistics_in_evaluate_and_fit_with_a_short_last_batch(name, jit):
    make_loss, make_metric, (low, high) = BATCH_STATISTICS[name]
    rng = np.random.RandomState(2)
    size, batch = 19, 8  # batches of 8, 8 and 3
    x = distinct_errors(rng, size)[:, None]
    weights = rng.uniform(0.5, 2.0, size)
    weights[[3, 17]] = 0.0
    data = tf.data.Dataset.from_tensor_slices((x, np.zeros(size), weights)).batch(batch)
    assert data.element_spec[0].shape[0] is None

    inputs = keras.Input((1,), dtype="float64")
    model = keras.Model(inputs, keras.layers.Dense(1, dtype="float64")(inputs))
    model.set_weights([np.ones((1, 1)), np.zeros(1)])  # predictions = x
    model.compile(optimizer=keras.optimizers.SGD(1e-3), loss=make_loss(),
                  weighted_metrics=[make_metric()], jit_compile=jit)
    got = model.evaluate(data, return_dict=True, verbose=0)

    # Keras averages the per-batch losses weighted by the batch sizes; the metric streams
    # the mean of its per-batch values (sample weights as masses) weighted by the
    # batches' numbers of examples of non-zero weight.
    starts = range(0, size, batch)
    errors = [np.abs(x[s:s + batch, 0]) for s in starts]
    w = [weights[s:s + batch] for s in starts]
    sizes = np.array([e.size for e in errors])
    counts = np.array([np.count_nonzero(v) for v in w])
    losses = [np_batch_loss(e, v, low, high) for e, v in zip(errors, w, strict=True)]
    hard = [np_window_mean(e, low, high, v) for e, v in zip(errors, w, strict=True)]
    assert got["loss"] == pytest.approx(sizes @ losses / size, abs=2e-3)
    assert got[make_metric().name] == pytest.approx(counts @ hard / counts.sum(), abs=1e-9)

    history = model.fit(data, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert not np.allclose(model.get_weights()[0], 1.0)  # a real step was taken


@pytest.mark.parametrize("name", sorted(BATCH_STATISTICS))
def test_batch_statistics_under_xla_with_an_unknown_batch_size(name):
    make_loss, make_metric, _ = BATCH_STATISTICS[name]
    loss, metric = make_loss(), make_metric()
    spec = tf.TensorSpec([None], tf.float64)

    def both(y_true, y_pred, weights):
        metric.reset_state()
        metric.update_state(y_true, y_pred, sample_weight=weights)
        return loss(y_true, y_pred, sample_weight=weights), metric.result()

    compiled = tf.function(both, input_signature=[spec] * 3, jit_compile=True)
    rng = np.random.RandomState(3)
    for size in (6, 11):
        y_pred, weights = distinct_errors(rng, size), rng.uniform(0.5, 2.0, size)
        weights[0] = 0.0
        args = (np.zeros(size), y_pred, weights)
        for got, want in zip(compiled(*args), both(*args), strict=True):
            assert float(got) == pytest.approx(float(want), rel=1e-6, abs=1e-9)


# ---------------------------------------------------------------------------------
# Unknown list length n: list losses and metrics.
# ---------------------------------------------------------------------------------
def padded_lists(rng, batch, n):
    """Graded labels 0–3 with a padded tail (−1) per list, Gaussian scores."""
    labels = rng.randint(0, 4, (batch, n)).astype(np.float32)
    labels[:, 0] = 2.0
    for b, length in enumerate(rng.randint(2, n + 1, batch)):
        labels[b, length:] = -1.0
    return labels, rng.randn(batch, n).astype(np.float32)


def _metric_value(metric):
    def value(y_true, y_pred):
        metric.reset_state()
        metric.update_state(y_true, y_pred)
        return metric.result()
    return value


LIST_FUNCTIONS = {
    "spearman_loss": lambda: ss.SpearmanLoss(),
    "spearman_loss_padded": lambda: ss.SpearmanLoss(negative_labels_are_padding=True),
    "spearman_loss_axis0": lambda: (lambda y, p: ss.SpearmanLoss(
        axis=0, negative_labels_are_padding=True)(tf.transpose(y), tf.transpose(p))),
    "soft_spearman": lambda: (lambda y, p: ss.losses.spearman.soft_spearman_correlation(
        y, p, mask=y >= 0)),
    "spearman_metric": lambda: _metric_value(
        ss.SpearmanCorrelation(negative_labels_are_padding=True)),
    "ndcg_sinkhorn": lambda: ss.losses.ranking.SoftNDCGLoss(),
    "ndcg_softsort": lambda: ss.losses.ranking.SoftNDCGLoss("softsort"),
    "ndcg_neuralsort": lambda: ss.losses.ranking.SoftNDCGLoss("neuralsort"),
    "listwise_neuralsort": lambda: ss.losses.ranking.ListwisePermutationLoss(),
    "listwise_softsort": lambda: ss.losses.ranking.ListwisePermutationLoss("softsort"),
    "ndcg_metric": lambda: _metric_value(ss.metrics.ranking.NDCGMetric(k=3)),
    "mrr_metric": lambda: _metric_value(ss.metrics.ranking.MRRMetric()),
    "top_k_rank": lambda: (lambda y, p: ss.SoftTopKLoss(2, epsilon=1e-2)(
        tf.one_hot(tf.argmax(y, axis=-1), tf.shape(y)[-1]), p)),
    "top_k_cdf_sparse": lambda: (lambda y, p: ss.SoftTopKLoss(
        1, form="cdf", from_sparse=True, epsilon=1e-2)(tf.argmax(y, axis=-1), p)),
}


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("name", sorted(LIST_FUNCTIONS))
def test_list_losses_and_metrics_with_an_unknown_list_length(name, jit):
    fn = LIST_FUNCTIONS[name]()
    spec = tf.TensorSpec([None, None], tf.float32)
    traced = tf.function(fn, input_signature=[spec, spec], jit_compile=jit)
    rng = np.random.RandomState(4)
    for n in (7, 4):
        labels, scores = padded_lists(rng, 3, n)
        want = fn(tf.constant(labels), tf.constant(scores)).numpy()
        got = traced(labels, scores).numpy()
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    assert traced.experimental_get_tracing_count() == 1


def test_top_k_loss_with_an_unknown_number_of_classes():
    spec = tf.TensorSpec([None, None], tf.float32)
    logits = np.array([[0.0, 5.0, 1.0], [2.0, 1.0, 0.0]], np.float32)

    # The default ε is 0.3/L²: with L unknown the graph cannot be built without `epsilon`.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32), spec])
    def default_epsilon(labels, logits):
        return ss.SoftTopKLoss(2, from_sparse=True)(labels, logits)

    with pytest.raises(ValueError, match="`epsilon`"):
        default_epsilon.get_concrete_function()

    loss = ss.SoftTopKLoss(2, from_sparse=True, epsilon=1e-3, reduction="none")
    traced = tf.function(loss, input_signature=[tf.TensorSpec([None], tf.int32), spec])
    np.testing.assert_allclose(traced(np.array([2, 2], np.int32), logits),
                               loss(np.array([2, 2]), logits), rtol=1e-5)
    # k < L is checked when L is known: at run time here.
    with pytest.raises(tf.errors.InvalidArgumentError, match="`k`"):
        traced(np.array([0], np.int32), logits[:1, :2])


LIST_LOSSES = {name: LIST_FUNCTIONS[name] for name in (
    "spearman_loss_padded", "ndcg_sinkhorn", "ndcg_softsort", "ndcg_neuralsort",
    "listwise_neuralsort", "listwise_softsort")}


@pytest.mark.parametrize("name", sorted(LIST_LOSSES))
def test_keras_model_fed_two_list_lengths(name):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((None, 2))
    scores = keras.layers.Reshape((-1,))(keras.layers.Dense(1)(inputs))
    model = keras.Model(inputs, scores)
    loss = LIST_LOSSES[name]()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss,
                  metrics=[ss.metrics.ranking.NDCGMetric(k=3)])
    rng = np.random.RandomState(5)
    for n in (5, 9):
        labels, _ = padded_lists(rng, 8, n)
        x = rng.randn(8, n, 2).astype(np.float32)
        history = model.fit(x, labels, batch_size=4, epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        got = model.evaluate(x, labels, batch_size=8, verbose=0, return_dict=True)
        pred = model.predict(x, batch_size=8, verbose=0)
        assert pred.shape == (8, n)
        assert got["loss"] == pytest.approx(float(loss(labels, pred)), rel=1e-4, abs=1e-6)

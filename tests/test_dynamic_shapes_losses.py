"""Losses and metrics with shapes unknown at trace time: an unknown batch size (the
batch-statistic regression losses and metrics), unknown list lengths (the list losses
and metrics), inside `tf.function` with `None` dimensions, under XLA, and in Keras
models fed batches and lists of several sizes. Values are compared with float64 numpy
references (or with the same call on static shapes)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from numpy_references import np_window_mean

import softsort_tf as ss

HARD = dict(epsilon=1e-5, threshold=1e-6, max_iterations=3000)


def np_window_shares(x, low, high):
    """Per-example shares n·c_i of a batch statistic in the hard limit (uniform masses):
    c_i = overlap_i · x_i / (high − low), Σ_i c_i the mean of the window [low, high]."""
    x = np.asarray(x, np.float64)
    n = x.size
    order = np.argsort(x, kind="stable")
    upto = np.arange(1, n + 1) / n
    overlap = np.clip(np.minimum(upto, high) - np.maximum(upto - 1 / n, low), 0.0, None)
    shares = np.empty(n)
    shares[order] = n * overlap * x[order] / (high - low)
    return shares


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


@pytest.mark.parametrize("name", sorted(BATCH_STATISTICS))
def test_batch_statistics_in_evaluate_and_fit_with_a_short_last_batch(name):
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
                  weighted_metrics=[make_metric()], jit_compile=False)
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

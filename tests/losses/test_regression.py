"""Tests of `softsort_tf.losses.regression`: the soft least-quantile, trimmed and
quantile regression losses and the pinball loss (with the matching metrics of
`softsort_tf.metrics.regression` where a test compares them): exact float64 limits,
reductions, sample weights and padding, unknown batch sizes (graph, XLA, Keras with a
short last batch), `tf.distribute.MirroredStrategy`, reduced precision, and a robust
regression problem."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from numpy_references import np_window_mean, np_window_shares
from operator_cases import GRADIENT_CASES, separated_values, value_and_grad

import softsort_tf as ss
from softsort_tf.experiments import small_problems
from softsort_tf.metrics import regression as metrics

HARD = dict(epsilon=1e-5, threshold=1e-6, max_iterations=3000)


SETTINGS = settings(max_examples=10, deadline=None)


seeds = st.integers(0, 10_000)


@settings(max_examples=8, deadline=None)
@given(st.integers(3, 16), st.sampled_from([0.2, 0.5, 0.73]),
       st.sampled_from([None, 0.02, 0.2]), st.booleans(), seeds)
def test_least_quantile_loss_hard_limit(n, tau, width, weighted, seed):
    rng = np.random.RandomState(seed)
    width = None if width is None else min(width, tau, 1 - tau)
    y_pred = separated_values(rng, (n,)) + n  # distinct positive errors
    y_true = np.zeros(n)
    weights = rng.uniform(0.5, 2.0, n) if weighted else None
    loss = ss.SoftLeastQuantileRegressionLoss(tau, width=width, dtype="float64", **HARD)
    t = width or min(0.1, tau, 1 - tau)
    expected = np_window_mean(np.abs(y_pred), tau - t / 2, tau + t / 2)
    assert float(loss(y_true, y_pred)) == pytest.approx(expected, abs=2e-3)
    # Sample weights scale each example's share, as in every Keras loss.
    shares = np_window_shares(np.abs(y_pred), tau - t / 2, tau + t / 2)
    if weighted:
        assert float(loss(y_true, y_pred, sample_weight=weights)) == pytest.approx(
            weights @ shares / n, abs=2e-3 * n)
    # The exact metric with the same width is the same number (weights as masses).
    metric = metrics.QuantileError(tau, width=t, dtype="float64")
    metric.update_state(y_true, y_pred, sample_weight=weights)
    assert float(metric.result()) == pytest.approx(
        np_window_mean(np.abs(y_pred), tau - t / 2, tau + t / 2, weights), abs=1e-9)


def test_least_quantile_with_a_narrow_window_is_the_quantile():
    rng = np.random.RandomState(0)
    errors = rng.permutation(np.arange(1.0, 21.0)) + rng.uniform(-0.2, 0.2, 20)
    for tau in (0.3, 0.5, 0.62):
        loss = ss.SoftLeastQuantileRegressionLoss(tau, width=0.5 / 20, dtype="float64", **HARD)
        expected = np.quantile(errors, tau, method="averaged_inverted_cdf")
        assert float(loss(np.zeros(20), errors)) == pytest.approx(expected, abs=1e-3)
        metric = metrics.QuantileError(tau, dtype="float64")
        metric.update_state(np.zeros(20), errors)
        assert float(metric.result()) == pytest.approx(expected, abs=1e-9)


@SETTINGS
@given(st.integers(2, 12), st.sampled_from([(0.0, 0.5), (0.1, 0.9), (0.25, 1.0), (0.0, 1.0),
                                            (0.33, 0.41)]), st.booleans(), seeds)
def test_trimmed_loss_hard_limit(n, bounds, weighted, seed):
    rng = np.random.RandomState(seed)
    start, end = bounds
    y_pred = separated_values(rng, (n, 1))[:, 0] * 2.0
    y_true = rng.uniform(-0.1, 0.1, n)
    errors = np.abs(y_true - y_pred)
    assume(np.diff(np.sort(errors)).min() > 1e-2)  # keep the hard limit unambiguous
    weights = rng.uniform(0.5, 2.0, n) if weighted else None
    loss = ss.SoftTrimmedRegressionLoss(start, end, dtype="float64", **HARD)
    expected = np_window_mean(errors, start, end)
    assert float(loss(y_true[:, None], y_pred[:, None])) == pytest.approx(expected, abs=2e-3)
    if weighted:
        shares = np_window_shares(errors, start, end)
        got = float(loss(y_true[:, None], y_pred[:, None], sample_weight=weights))
        assert got == pytest.approx(weights @ shares / n, abs=2e-3 * n)
    metric = metrics.TrimmedError(start, end, dtype="float64")
    metric.update_state(y_true, y_pred, sample_weight=weights)
    assert float(metric.result()) == pytest.approx(
        np_window_mean(errors, start, end, weights), abs=1e-9)


def np_quantile_regression_loss(r, quantile, width):
    """The hard limit of `SoftQuantileRegressionLoss`: τ·mean(r) − b₁·Q₁ − (t/2)·Q₂ + Q₂²
    with Q₁, Q₂ the means of the sorted residuals of cumulative mass in [0, τ − t/2] and
    [τ − t/2, τ + t/2] (τ·n and t·n integers here), and the middle bin's values."""
    s = np.sort(r)
    n = len(s)
    b1, b2 = round((quantile - width / 2) * n), round(width * n)
    q1, q2 = s[:b1].mean(), s[b1:b1 + b2].mean()
    value = quantile * r.mean() - (b1 / n) * q1 - (width / 2) * q2 + q2 ** 2
    return value, s[b1:b1 + b2]


@pytest.mark.parametrize("quantile", [0.1, 0.2, 0.5])
def test_quantile_regression_loss_hard_limit_and_pinball_bound(quantile):
    rng = np.random.default_rng(1)
    r = rng.standard_exponential(200) - 1.0
    loss = ss.SoftQuantileRegressionLoss(quantile, dtype="float64", **HARD)
    value = float(loss(r, np.zeros(200)))
    reference, middle = np_quantile_regression_loss(r, quantile, min(0.1, quantile))
    assert np.isfinite(value) and value == pytest.approx(reference, abs=2e-3)
    # τ·mean − (mass τ below q)·(its mean) is min_c of the mean pinball loss, up to the
    # spread of the middle bin times t/2.
    c = np.quantile(r, quantile)
    min_pinball = np.mean(np.maximum(quantile * (r - c), (quantile - 1) * (r - c)))
    gap = abs((reference - middle.mean() ** 2) - min_pinball)
    assert gap <= min(0.1, quantile) / 2 * (middle.max() - middle.min()) + 1e-9


def test_quantile_regression_loss_options_reach_the_transport():
    r = np.random.default_rng(4).standard_exponential(100).astype(np.float32) - 1.0
    zeros = np.zeros_like(r)
    value = {opts: float(ss.SoftQuantileRegressionLoss(0.1, squash=opts[0], targets=opts[1])(
        r, zeros)) for opts in (("logistic", "regular"), ("logistic", "centres"),
                                ("atan", "regular"))}
    assert len({round(v, 6) for v in value.values()}) == 3  # each option changes the loss
    reference, _ = np_quantile_regression_loss(r.astype(np.float64), 0.1, 0.1)
    for v in value.values():  # ... within what ε = 0.01 blurs of the hard loss
        assert v == pytest.approx(reference, abs=0.03)


def test_quantile_regression_loss_moves_the_quantile_to_zero():
    y = tf.constant(np.random.default_rng(2).normal(size=64), tf.float32)
    pred = tf.Variable(tf.zeros(64))
    loss = ss.SoftQuantileRegressionLoss(0.2)
    opt = keras.optimizers.SGD(0.5)

    @tf.function  # one trace for the 100 steps
    def step():
        with tf.GradientTape() as tape:
            value = loss(y, pred + 0.0)
        grad = tape.gradient(value, pred)
        opt.apply_gradients([(tf.fill([64], tf.reduce_sum(grad)), pred)])
        return grad

    # At zero offset 50 % of y lie below; only a shared offset is free: it moves to the
    # 0.2-quantile (there by step 50: 20.3 %, the same fraction as after 200 steps).
    assert np.mean(y.numpy() <= pred.numpy()) == pytest.approx(0.5, abs=0.1)
    for _ in range(100):
        assert np.all(np.isfinite(step().numpy()))
    assert np.mean(y.numpy() <= pred.numpy()) == pytest.approx(0.2, abs=0.05)


def test_pinball_loss_matches_numpy():
    rng = np.random.default_rng(3)
    y, p = rng.normal(size=(6, 1)), rng.normal(size=(6, 1))
    r = (y - p)[:, 0]
    expected = np.maximum(0.3 * r, -0.7 * r)
    got = ss.pinball_loss(y, p, quantile=0.3)
    assert got.dtype == tf.float64 and got.shape == (6,)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(ss.pinball_loss(y[:, 0], p, 0.3).numpy(), expected, rtol=1e-12)
    loss = ss.PinballLoss(quantile=0.3, dtype="float64")
    assert float(loss(y, p)) == pytest.approx(expected.mean(), rel=1e-12)
    weights = rng.uniform(size=6)
    assert float(loss(y, p, sample_weight=weights)) == pytest.approx(
        weights @ expected / 6, rel=1e-12)
    np.testing.assert_allclose(ss.PinballLoss(0.3, reduction="none")(y, p).numpy(), expected,
                               rtol=1e-6)


def test_quantile_regression_losses_under_xla_match_eager():
    rng = np.random.default_rng(6)
    y = tf.constant(rng.normal(size=(32, 1)), tf.float32)
    pred = tf.constant(rng.normal(size=(32, 1)), tf.float32)
    losses = (ss.SoftQuantileRegressionLoss(0.3), ss.PinballLoss(0.3))

    def values_and_gradients(z):
        with tf.GradientTape() as tape:
            tape.watch(z)
            values = [loss(y, z) for loss in losses]
        return values, tape.gradient(values, z)

    eager = values_and_gradients(pred)
    xla = tf.function(values_and_gradients, jit_compile=True)(pred)
    for a, b in zip(tf.nest.flatten(eager), tf.nest.flatten(xla), strict=True):
        assert np.all(np.isfinite(a.numpy()))
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)


REGRESSION_LOSSES = {
    "least_quantile": lambda: ss.SoftLeastQuantileRegressionLoss(0.5),
    "least_quantile_p05": lambda: ss.SoftLeastQuantileRegressionLoss(0.3, error_power=0.5),
    "trimmed": lambda: ss.SoftTrimmedRegressionLoss(0.1, 0.8),
    "quantile_regression": lambda: ss.SoftQuantileRegressionLoss(0.3),
}


def batch_statistic(loss, y_true, y_pred):
    """The statistic of a batch-statistic loss, from the public functional operators."""
    y_true, y_pred = np.asarray(y_true, np.float64), np.asarray(y_pred, np.float64)
    if isinstance(loss, ss.SoftQuantileRegressionLoss):
        r = (y_true - y_pred).reshape(-1)
        width = loss.width or min(0.1, loss.quantile, 1 - loss.quantile)
        b, _ = ss.quantile_target_weights(loss.quantile, width)
        q = ss.sinkhorn_sort(r, axis=0, target_weights=b, options=loss.options).numpy()
        return loss.quantile * r.mean() - b[0] * q[0] - width / 2 * q[1] + q[1] ** 2
    errors = np.mean(np.abs(y_true - y_pred) ** loss.error_power,
                     axis=tuple(range(1, y_pred.ndim)))
    if isinstance(loss, ss.SoftTrimmedRegressionLoss):
        return float(ss.sinkhorn_trimmed_mean(errors, loss.start_quantile, loss.end_quantile,
                                              axis=0, options=loss.options))
    width = loss.width or min(0.1, loss.quantile, 1 - loss.quantile)
    return float(ss.sinkhorn_quantile(errors, loss.quantile, width=width, axis=0,
                                      options=loss.options))


@pytest.mark.parametrize("case", sorted(GRADIENT_CASES))
def test_regression_and_spearman_gradients_are_finite(case):
    # Every regression loss on this case, then the Spearman loss once.
    for name in sorted(REGRESSION_LOSSES):
        preds = GRADIENT_CASES[case].astype(np.float32).reshape(-1, 1)
        if name == "quantile_regression" and case == "huge":
            preds = preds * 1e-12  # its Q̃² term overflows float32 beyond |x| ≈ 1.8e19
        targets = np.zeros_like(preds)
        loss = REGRESSION_LOSSES[name]()
        value, grad = value_and_grad(lambda z, loss=loss, targets=targets: loss(targets, z),
                                     preds)
        assert np.isfinite(value) and np.all(np.isfinite(grad)), name
    spearman = ss.SpearmanLoss()
    lists = GRADIENT_CASES[case].astype(np.float32)
    targets = np.broadcast_to(np.arange(6.0), lists.shape)
    value, grad = value_and_grad(lambda z: spearman(targets, z), lists)
    assert np.isfinite(value) and np.all(np.isfinite(grad)), "spearman"


def test_batch_of_one_regression_loss_is_the_error():
    loss = ss.SoftLeastQuantileRegressionLoss(0.5)
    value, grad = value_and_grad(lambda z: loss([[1.0]], z), np.array([[3.0]], np.float32))
    assert value == pytest.approx(2.0, abs=1e-4)
    assert grad[0, 0] == pytest.approx(1.0, abs=1e-3)
    trimmed = ss.SoftTrimmedRegressionLoss(0.2, 0.6, error_power=2.0)
    assert float(trimmed([[1.0]], [[3.0]])) == pytest.approx(4.0, abs=1e-3)


@pytest.mark.parametrize("name", sorted(REGRESSION_LOSSES))
def test_batch_statistic_reductions(name):
    rng = np.random.RandomState(2)
    y_true, y_pred = rng.randn(7, 1).astype(np.float32), rng.randn(7, 1).astype(np.float32)
    base = REGRESSION_LOSSES[name]()
    config = base.get_config()
    statistic = float(batch_statistic(base, y_true, y_pred))

    def with_reduction(reduction):
        return type(base).from_config({**config, "reduction": reduction})(y_true, y_pred)

    shares = with_reduction("none").numpy()
    assert shares.shape == (7,) and np.mean(shares) == pytest.approx(statistic, rel=1e-4)
    np.testing.assert_allclose(base.call(y_true, y_pred).numpy(), shares, rtol=1e-6)
    assert float(with_reduction("sum")) == pytest.approx(7 * statistic, rel=1e-4)
    for reduction in ("mean", "mean_with_sample_weight", "sum_over_batch_size"):
        assert float(with_reduction(reduction)) == pytest.approx(statistic, rel=1e-4)


def test_batch_statistic_sample_weights_and_masks_scale_the_shares():
    rng = np.random.RandomState(3)
    y_pred = rng.permutation(np.arange(1.0, 9.0)) + rng.uniform(-0.2, 0.2, 8)
    y_true = np.zeros(8)
    weights = np.array([1, 2, 0, 3, 1, -1, 2, 1.0])
    nonzero, positive = weights != 0, weights > 0
    sharp = dict(epsilon=1e-4, threshold=1e-6, dtype="float64")
    for loss in (ss.SoftLeastQuantileRegressionLoss(0.4, **sharp),
                 ss.SoftTrimmedRegressionLoss(0.1, 0.6, **sharp),
                 ss.SoftQuantileRegressionLoss(0.4, **sharp)):
        # A zero weight is padding (left out of the statistic); the other weights scale
        # their example's share, as in every Keras loss (negative weights included).
        shares = loss.call(y_true[nonzero], y_pred[nonzero]).numpy()
        assert float(loss(y_true, y_pred, sample_weight=weights)) == pytest.approx(
            weights[nonzero] @ shares / 8, rel=1e-6)
        assert float(loss(y_true, y_pred, sample_weight=2.0)) == pytest.approx(
            2 * float(loss(y_true, y_pred)), rel=1e-9)
        # A Keras mask of y_pred leaves the masked examples out: the loss is the
        # statistic of the others.
        masked = tf.constant(y_pred)
        masked._keras_mask = tf.constant(positive)
        statistic = float(loss(y_true[positive], y_pred[positive]))
        assert float(loss(y_true, masked)) == pytest.approx(statistic, rel=1e-6)
        assert float(loss(y_true, y_pred, sample_weight=positive * 1.0)) == pytest.approx(
            statistic * positive.sum() / 8, rel=1e-6)


@pytest.mark.parametrize("name", ["least_quantile", "trimmed", "quantile_regression"])
def test_batch_statistic_padding_is_left_out_of_the_statistic(name):
    # Bug: a zero-weight example took its place in the sort, so padding a batch (e.g.
    # to a fixed size) moved the quantile/trimmed mean of the real examples.
    rng = np.random.RandomState(5)
    make = {"least_quantile": ss.SoftLeastQuantileRegressionLoss(0.3, width=0.2, **HARD,
                                                                 dtype="float64"),
            "trimmed": ss.SoftTrimmedRegressionLoss(0.1, 0.6, **HARD, dtype="float64"),
            "quantile_regression": ss.SoftQuantileRegressionLoss(0.3, width=0.2, **HARD,
                                                                 dtype="float64")}
    loss = make[name]
    size, padded = 9, [1, 4, 5, 10]
    y_pred = rng.randn(size, 1) * 3
    y_true = rng.randn(size, 1)
    valid = np.ones(size + 4, bool)
    valid[padded] = False
    full_pred = np.zeros((size + 4, 1))
    full_true = np.zeros((size + 4, 1))
    full_pred[valid], full_true[valid] = y_pred, y_true
    full_pred[~valid, 0] = [np.nan, 1e30, -np.inf, 0.0]
    full_true[~valid, 0] = [0.0, np.nan, 5.0, 0.0]

    def value_and_grads(y_t, y_p, **kwargs):
        y_p = tf.constant(y_p)
        with tf.GradientTape() as tape:
            tape.watch(y_p)
            value = loss(y_t, y_p, **kwargs)
        return float(value), tape.gradient(value, y_p).numpy()

    want, want_grad = value_and_grads(y_true, y_pred)
    got, grad = value_and_grads(full_true, full_pred, sample_weight=valid * 1.0)
    assert got * (size + 4) / size == pytest.approx(want, rel=1e-6)
    np.testing.assert_array_equal(grad[~valid], 0.0)
    np.testing.assert_allclose(grad[valid] * (size + 4) / size, want_grad, rtol=1e-5,
                               atol=1e-9)
    # The same through a Keras mask (the loss is then the statistic of the valid ones).
    masked = tf.constant(full_pred)
    masked._keras_mask = tf.constant(valid)
    assert float(loss(full_true, masked)) == pytest.approx(want, rel=1e-6)
    # A batch of padding alone: loss 0, zero gradient.
    nothing, nothing_grad = value_and_grads(full_true, full_pred,
                                            sample_weight=np.zeros(size + 4))
    assert nothing == 0.0 and not np.any(nothing_grad)


def test_least_quantile_regression_ignores_outliers():
    """y = 3x + 1 + noise on 200 points, 30% of them (60) replaced by gross outliers
    around the line y = 4 − 6x; a linear model trained full-batch (Adam 0.1, 100 steps,
    seed 0) with the soft least-median loss (τ = 0.5) recovers slope 2.98, while MSE
    gives 0.17 (its optimum, the least-squares slope, is −0.12)."""
    robust = small_problems.outlier_slope(ss.SoftLeastQuantileRegressionLoss(quantile=0.5))
    mse = small_problems.outlier_slope("mse")
    assert abs(robust - 3.0) < 0.15
    assert abs(mse - 3.0) > 1.5
    assert abs(robust - 3.0) < 0.1 * abs(mse - 3.0)


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


def test_batch_statistics_with_an_unknown_batch_size():
    # Bug: `Transport` filled the uniform masses with 1/B from the static batch size
    # (TypeError for a `None` batch): every tf.data pipeline without drop_remainder.
    # Every loss and metric of BATCH_STATISTICS in one graph (one trace), checked each.
    made = {name: (make_loss(), make_metric(), window)
            for name, (make_loss, make_metric, window) in sorted(BATCH_STATISTICS.items())}
    spec = tf.TensorSpec([None, 1], tf.float64)
    rng = np.random.RandomState(1)

    @tf.function(input_signature=[spec, spec, tf.TensorSpec([None], tf.float64)])
    def both(y_true, y_pred, weights):
        out, gradients = {}, {}
        for name, (loss, metric, _) in made.items():
            metric.reset_state()
            metric.update_state(y_true, y_pred, sample_weight=weights)
            with tf.GradientTape() as tape:
                tape.watch(y_pred)
                weighted = loss(y_true, y_pred, sample_weight=weights)
            out[name] = (loss(y_true, y_pred), weighted, metric.result())
            gradients[name] = tape.gradient(weighted, y_pred)
        return out, gradients

    for size in (9, 5, 12):
        y_pred = distinct_errors(rng, size)
        weights = rng.uniform(0.5, 2.0, size)
        weights[rng.choice(size, 2, replace=False)] = 0.0  # two padded examples
        results, gradients = both(np.zeros((size, 1)), y_pred[:, None], weights)
        errors = np.abs(y_pred)
        for name, (_, _, (low, high)) in made.items():
            # The graph's gradient at an unknown batch size: finite, none on the padding,
            # a real one on the examples inside the window.
            grad = gradients[name].numpy()[:, 0]
            assert np.all(np.isfinite(grad)) and not np.any(grad[weights == 0]), name
            assert np.abs(grad).max() > 1e-3, name
            plain, weighted, hard = (float(v) for v in results[name])
            assert plain == pytest.approx(np_window_mean(errors, low, high), abs=2e-3), name
            assert weighted == pytest.approx(np_batch_loss(errors, weights, low, high),
                                             abs=2e-3), name
            assert hard == pytest.approx(np_window_mean(errors, low, high, weights),
                                         abs=1e-9), name


class _StepAtTheLastBatch(keras.optimizers.schedules.LearningRateSchedule):
    """Learning rate 0 for the first `steps` steps, then `rate`: the weights (and so the
    predictions) stay the same over the first batches of an epoch."""

    def __init__(self, steps, rate):
        self.steps, self.rate = steps, rate

    def __call__(self, step):
        return tf.where(step >= self.steps, self.rate, 0.0)


def test_batch_statistics_in_fit_with_a_short_last_batch():
    # Under XLA only: the Keras train step traced here (batch size `None`) is the same
    # Python and the same graph with and without `jit_compile`; running that graph
    # without XLA at unknown batch sizes (values, weighted values, metrics and
    # gradients) is `test_batch_statistics_with_an_unknown_batch_size` (a graph fit
    # case cost 4.6 s for nothing more).
    # One model with a head (its own Dense, predictions = x) per loss of BATCH_STATISTICS,
    # each head compiled with its loss and metric: one fit (one trace, one compilation per
    # batch shape) for all of them. Keras reports each head's loss and metric, checked
    # each. The learning rate is 0 until the last (short) batch, so every batch's loss and
    # metric are those of predictions = x (as `evaluate` would give, through the same
    # `compute_loss` and `compute_metrics` of Keras, without a second trace and compile
    # for the test step), and the step on the short batch must move each head.
    names = sorted(BATCH_STATISTICS)
    rng = np.random.RandomState(2)
    size, batch = 19, 8  # batches of 8, 8 and 3
    x = distinct_errors(rng, size)[:, None]
    weights = rng.uniform(0.5, 2.0, size)
    weights[[3, 17]] = 0.0
    targets = {name: np.zeros(size) for name in names}
    data = tf.data.Dataset.from_tensor_slices((x, targets, weights)).batch(batch)
    assert data.element_spec[0].shape[0] is None

    inputs = keras.Input((1,), dtype="float64")
    model = keras.Model(inputs, {name: keras.layers.Dense(1, dtype="float64", name=name)(inputs)
                                 for name in names})
    model.set_weights([np.ones((1, 1)), np.zeros(1)] * len(names))  # predictions = x
    metrics = {name: BATCH_STATISTICS[name][1]() for name in names}
    model.compile(optimizer=keras.optimizers.SGD(_StepAtTheLastBatch(2, 1e-3)),
                  loss={name: BATCH_STATISTICS[name][0]() for name in names},
                  weighted_metrics={name: [metrics[name]] for name in names}, jit_compile=True)
    got = {key: values[0] for key, values in
           model.fit(data, epochs=1, verbose=0).history.items()}

    # Keras averages the per-batch losses weighted by the batch sizes; the metric streams
    # the mean of its per-batch values (sample weights as masses) weighted by the
    # batches' numbers of examples of non-zero weight.
    starts = range(0, size, batch)
    errors = [np.abs(x[s:s + batch, 0]) for s in starts]
    w = [weights[s:s + batch] for s in starts]
    sizes = np.array([e.size for e in errors])
    counts = np.array([np.count_nonzero(v) for v in w])
    expected_total = 0.0
    for name in names:
        low, high = BATCH_STATISTICS[name][2]
        losses = [np_batch_loss(e, v, low, high) for e, v in zip(errors, w, strict=True)]
        hard = [np_window_mean(e, low, high, v) for e, v in zip(errors, w, strict=True)]
        expected_total += sizes @ losses / size
        # Keras 3.15 averages a head's own loss over the batches weighted by the *static*
        # batch size, i.e. unweighted when it is unknown (as here); the total below is
        # weighted by the real batch sizes. Either way, each batch's value is checked.
        head = got[f"{name}_loss"]
        assert (head == pytest.approx(np.mean(losses), abs=2e-3)
                or head == pytest.approx(sizes @ losses / size, abs=2e-3)), (name, head, losses)
        assert got[f"{name}_{metrics[name].name}"] == pytest.approx(
            counts @ hard / counts.sum(), abs=1e-9), name
        # A real step was taken on each head (on the short last batch).
        assert not np.allclose(model.get_layer(name).get_weights()[0], 1.0), name
    assert got["loss"] == pytest.approx(expected_total, abs=2e-3 * len(names))


def test_batch_statistics_under_xla_with_an_unknown_batch_size():
    # Every loss and metric of BATCH_STATISTICS in one XLA program per batch size.
    made = {name: (make_loss(), make_metric())
            for name, (make_loss, make_metric, _) in sorted(BATCH_STATISTICS.items())}
    spec = tf.TensorSpec([None], tf.float64)

    def both(y_true, y_pred, weights):
        out = {}
        for name, (loss, metric) in made.items():
            metric.reset_state()
            metric.update_state(y_true, y_pred, sample_weight=weights)
            out[name] = (loss(y_true, y_pred, sample_weight=weights), metric.result())
        return out

    compiled = tf.function(both, input_signature=[spec] * 3, jit_compile=True)
    rng = np.random.RandomState(3)
    for size in (6, 11):
        y_pred, weights = distinct_errors(rng, size), rng.uniform(0.5, 2.0, size)
        weights[0] = 0.0
        args = (np.zeros(size), y_pred, weights)
        xla, eager = compiled(*args), both(*args)
        for name in made:
            for got, want in zip(xla[name], eager[name], strict=True):
                assert float(got) == pytest.approx(float(want), rel=1e-6, abs=1e-9), name


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_SCRIPT = r"""
import json, sys
# Unused here; TensorFlow's import of Keras imports its scikit-learn wrapper, which
# imports scikit-learn when it can (about a second of the child's start-up).
sys.modules["sklearn"] = None
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(2)])
# As in the test processes (tests/conftest.py): the one graph of the fit runs once, so
# Grappler's rewrites (which keep what is computed) cost more than they save (3 of the
# child's 18 CPU seconds).
tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
import keras
import softsort_tf as ss

LR = 0.1
rng = np.random.RandomState(0)
x = rng.randn(8, 3).astype(np.float32)
y = (x @ np.array([1.0, -2.0, 0.5]) + rng.standard_cauchy(8)).astype(np.float32)
w0 = [rng.randn(3, 1).astype(np.float32), np.array([0.3], np.float32)]
LOSSES = {
    "least_quantile": lambda: ss.SoftLeastQuantileRegressionLoss(0.5, epsilon=1e-2),
    "trimmed": lambda: ss.SoftTrimmedRegressionLoss(0.0, 0.7, epsilon=1e-2),
}


NAMES = sorted(LOSSES)


def model():
    # One head (its own Dense from the same w0) per loss: one mirrored fit for all losses;
    # each head's gradient is that of its own loss alone.
    inputs = keras.Input((3,))
    m = keras.Model(inputs, {name: keras.layers.Dense(1, name=name)(inputs) for name in NAMES})
    for name in NAMES:
        m.get_layer(name).set_weights(w0)
    return m


out = {"devices": len(tf.config.list_logical_devices("CPU"))}
# Reference on one device: the gradient of the mean of the two half-batch losses.
m = model()
with tf.GradientTape() as tape:
    predictions = [m(x[i:i + 4]) for i in (0, 4)]
    reference_losses = {name: 0.5 * (LOSSES[name]()(y[:4], predictions[0][name])
                                     + LOSSES[name]()(y[4:], predictions[1][name]))
                        for name in NAMES}
    total = sum(reference_losses.values())
grads = dict(zip([id(v) for v in m.trainable_weights],
                 tape.gradient(total, m.trainable_weights), strict=True))
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    mm = model()
    mm.compile(keras.optimizers.SGD(LR), loss={name: LOSSES[name]() for name in NAMES})
history = mm.fit(x, {name: y for name in NAMES}, batch_size=8, epochs=1, shuffle=False,
                 verbose=0)
out["mirrored_total_loss"] = history.history["loss"][0]
for name in NAMES:
    layer = m.get_layer(name)
    expected = [w - LR * grads[id(v)].numpy() for w, v in
                zip(w0, (layer.kernel, layer.bias), strict=True)]
    out[name] = {
        "replicas": strategy.num_replicas_in_sync,
        "mirrored_weights": [w.ravel().tolist() for w in mm.get_layer(name).get_weights()],
        "expected_weights": [w.ravel().tolist() for w in expected],
        "w0": [w.ravel().tolist() for w in w0],
        "mirrored_loss": history.history[name + "_loss"][0],
        "expected_loss": float(reference_losses[name]),
    }
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def mirrored_run():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
        [ROOT] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["least_quantile", "trimmed"])
def test_mirrored_step_is_the_mean_of_the_replica_losses(mirrored_run, name):
    run = mirrored_run[name]
    assert mirrored_run["devices"] == 2 and run["replicas"] == 2
    for got, want, start in zip(run["mirrored_weights"], run["expected_weights"], run["w0"],
                                strict=True):
        # The step itself is not trivial (the loss has a gradient) ...
        assert np.abs(np.subtract(want, start)).max() > 1e-3
        # ... and equals one step on the mean of the per-replica losses, not R times it.
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert run["mirrored_loss"] == pytest.approx(run["expected_loss"], rel=1e-4)
    # The total is the sum of the heads' losses (one head per loss in one model).
    assert mirrored_run["mirrored_total_loss"] == pytest.approx(
        sum(mirrored_run[other]["expected_loss"] for other in ("least_quantile", "trimmed")),
        rel=1e-4)


REDUCED_PRECISION_LOSSES = {"least_quantile": ss.SoftLeastQuantileRegressionLoss,
                            "trimmed": ss.SoftTrimmedRegressionLoss}


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"], indirect=True)
def test_regression_losses_take_reduced_and_other_float_predictions(policy):
    # Bug: `tf.convert_to_tensor(y_pred, dtype=...)` raised for a float16/bfloat16 model
    # output, and for a float64 loss on a float32 model.
    y_true = np.linspace(0.0, 1.0, 8)
    y_pred = np.linspace(0.0, 1.0, 8) + np.array([0.1, -0.2, 0.05, 3.0, 0, 0.1, -0.1, 0.2])
    for name, make in REDUCED_PRECISION_LOSSES.items():
        reference = float(make(dtype="float64")(y_true, y_pred))
        reduced = tf.constant(y_pred, policy.removeprefix("mixed_"))
        value = make()(y_true, reduced)
        assert value.dtype == tf.float32, name
        assert float(value) == pytest.approx(reference, abs=2e-2), name
        value64 = make(dtype="float64")(y_true, tf.constant(y_pred, tf.float32))
        assert value64.dtype == tf.float64, name
        assert float(value64) == pytest.approx(reference, abs=1e-6), name


@pytest.mark.parametrize("policy", ["mixed_float16"], indirect=True)
def test_mixed_precision_models_train_with_each_loss(policy):
    # A model under a mixed policy trains with each loss: one head (its own Dense) per loss
    # and reduced float, in one model fitted once (one trace, not one per policy): float16
    # heads under the global mixed_float16 policy (loss-scaled, as Keras does), bfloat16
    # heads with the mixed_bfloat16 policy of their layer.
    y_true = np.linspace(0.0, 1.0, 8)
    y_pred = np.linspace(0.0, 1.0, 8) + np.array([0.1, -0.2, 0.05, 3.0, 0, 0.1, -0.1, 0.2])
    heads = {f"{name}_{dtype}": (make, dtype) for name, make in REDUCED_PRECISION_LOSSES.items()
             for dtype in ("float16", "bfloat16")}
    inputs = keras.Input((1,))
    model = keras.Model(inputs, {head: keras.layers.Dense(
        1, name=head, dtype=None if dtype == "float16" else "mixed_bfloat16")(inputs)
        for head, (_, dtype) in heads.items()})
    for head, (_, dtype) in heads.items():
        assert model.get_layer(head).compute_dtype == dtype, head
    model.compile(keras.optimizers.SGD(0.05), {head: make() for head, (make, _) in heads.items()})
    history = model.fit(y_true[:, None], {head: y_pred for head in heads}, batch_size=8,
                        epochs=3, verbose=0).history
    for head in heads:
        assert np.all(np.isfinite(history[f"{head}_loss"])), head


BATCH_STATISTIC_LOSSES = [ss.SoftLeastQuantileRegressionLoss, ss.SoftTrimmedRegressionLoss,
                          ss.SoftQuantileRegressionLoss]


@pytest.mark.parametrize("make", BATCH_STATISTIC_LOSSES)
def test_epsilon_the_compute_dtype_cannot_hold_is_rejected_at_construction(make):
    """ε below float32's smallest Sinkhorn ε (3.8e-6), however given, raises when the
    loss is built, naming `epsilon` and the range; a float64 loss holds it."""
    message = r"`epsilon`.*float32 must be in \[3\.81e-06, 3\.4e\+38\]"
    with pytest.raises(ValueError, match=message):
        make(epsilon=1e-8)
    with pytest.raises(ValueError, match=message):
        make(options=ss.SinkhornOptions(epsilon=1e-8))
    with pytest.raises(ValueError, match=message):
        make(epsilon=1e-8, dtype="mixed_float16")  # computed in float32
    loss = make(epsilon=1e-6, dtype="float64")
    y_true = np.zeros(5)
    y_pred = np.array([1.0, -2.0, 3.0, 50.0, -90.0])
    assert np.isfinite(float(loss(y_true, y_pred)))


@pytest.mark.parametrize("fn", [
    lambda y, p: ss.soft_least_quantile_regression_loss(y, p),
    lambda y, p: ss.soft_trimmed_regression_loss(y, p),
    lambda y, p: ss.soft_quantile_regression_loss(y, p),
    lambda y, p: ss.pinball_loss(y, p, 0.5),
])
def test_ragged_examples_are_refused_naming_the_argument(fn):
    ragged = tf.ragged.constant([[1.0, 2.0], [3.0]])
    dense = tf.zeros([2, 2])
    with pytest.raises(ValueError, match=r"`y_pred` must be a dense tensor, got a "
                                         r"tf\.RaggedTensor"):
        fn(dense, ragged)
    with pytest.raises(ValueError, match=r"`y_true` must be a dense tensor"):
        fn(ragged, dense)


def test_trimmed_mean_of_ragged_lists_is_that_of_each_list():
    """Each list's trimmed mean equals that of the list alone (float64); 0 for an empty
    list; outer ragged axes are kept."""
    rng = np.random.default_rng(7)
    lists = [list(rng.normal(size=n)) for n in (5, 1, 0, 8, 3)]
    ragged = tf.ragged.constant(lists, tf.float64)
    out = ss.sinkhorn_trimmed_mean(ragged, 0.2, 0.8, epsilon=1e-3)
    assert isinstance(out, tf.Tensor) and out.dtype == tf.float64 and out.shape == (5,)
    expected = [float(ss.sinkhorn_trimmed_mean(np.array(row), 0.2, 0.8, epsilon=1e-3))
                if row else 0.0 for row in lists]
    assert np.all(np.isfinite(out.numpy()))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6, atol=1e-9)
    nested = tf.RaggedTensor.from_row_lengths(ragged, [2, 0, 3])
    out = ss.sinkhorn_trimmed_mean(nested, 0.2, 0.8, epsilon=1e-3)
    assert [len(row) for row in out.to_list()] == [2, 0, 3]
    np.testing.assert_allclose(out.flat_values.numpy(), expected, rtol=1e-6, atol=1e-9)

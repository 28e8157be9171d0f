"""Tests of the exact statistics (`hard_stats`) and the hard metrics against numpy/scipy."""

import keras
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy_references import np_window_mean

import softsort_tf as ss
from softsort_tf.ops import hard_stats

SETTINGS = settings(max_examples=15, deadline=None)
seeds = st.integers(0, 10_000)


# ---------------------------------------------------------------------------------
# hard_stats
# ---------------------------------------------------------------------------------
@SETTINGS
@given(st.sampled_from([((7,), 0), ((3, 6), -1), ((5, 4), 0), ((2, 5, 3), 1)]),
       st.sampled_from([np.float32, np.float64, np.int32]), seeds)
def test_rankdata_matches_scipy_with_ties(shape_axis, dtype, seed):
    shape, axis = shape_axis
    x = np.random.RandomState(seed).randint(0, 4, size=shape).astype(dtype)  # many ties
    np.testing.assert_array_equal(ss.rankdata(x, axis=axis).numpy(),
                                  scipy.stats.rankdata(x, axis=axis))


def test_hard_stats_under_xla():
    rng = np.random.RandomState(0)
    x = rng.randint(0, 5, size=(4, 9)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, size=(4, 9)).astype(np.float32)

    def stats(v, weights):
        return (hard_stats.rankdata(v), hard_stats.weighted_quantile(v, 0.3, weights=weights),
                hard_stats.interval_mean(v, 0.2, 0.7, weights=weights),
                hard_stats.pearson_correlation(v, weights))

    eager = stats(tf.constant(x), tf.constant(w))
    xla = tf.function(stats, jit_compile=True)(tf.constant(x), tf.constant(w))
    np.testing.assert_array_equal(xla[0].numpy(), scipy.stats.rankdata(x, axis=-1))
    for a, b in zip(eager, xla, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)


@SETTINGS
@given(st.integers(1, 12), st.sampled_from([0.1, 0.25, 0.5, 0.6, 0.75, 0.99]), st.booleans(),
       seeds)
def test_weighted_quantile_matches_numpy(n, tau, ties, seed):
    rng = np.random.RandomState(seed)
    x = rng.randint(0, 3, n).astype(np.float64) if ties else rng.randn(n)
    expected = np.quantile(x, tau, method="averaged_inverted_cdf")
    assert float(hard_stats.weighted_quantile(x, tau)) == pytest.approx(expected, abs=1e-12)
    # Integer weights are repetitions.
    counts = rng.randint(1, 4, n)
    expected = np.quantile(np.repeat(x, counts), tau, method="averaged_inverted_cdf")
    got = hard_stats.weighted_quantile(x, tau, weights=counts.astype(np.float64))
    assert float(got) == pytest.approx(expected, abs=1e-12)


def test_weighted_quantile_ignores_zero_weights_and_keeps_batch_axes():
    x = np.array([[5.0, 1.0, 100.0, 3.0], [2.0, 8.0, 4.0, 6.0]])
    w = np.array([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    got = hard_stats.weighted_quantile(x, 0.5, weights=w).numpy()
    np.testing.assert_allclose(got, [3.0, 5.0])
    np.testing.assert_allclose(hard_stats.weighted_quantile(x.T, 0.5, axis=0, weights=w.T),
                               [3.0, 5.0])


@SETTINGS
@given(st.integers(1, 12), st.sampled_from([(0.0, 0.5), (0.1, 0.9), (0.3, 0.35), (0.0, 1.0)]),
       seeds)
def test_interval_mean_matches_numpy(n, bounds, seed):
    rng = np.random.RandomState(seed)
    x = rng.randn(n)
    weights = rng.uniform(0.2, 3.0, n)
    for w in (None, weights):
        expected = np_window_mean(x, *bounds, weights=w)
        got = float(hard_stats.interval_mean(x, *bounds, weights=w))
        assert got == pytest.approx(expected, abs=1e-12)


def test_interval_mean_is_the_trimmed_mean():
    x = np.random.RandomState(1).standard_t(1, size=20)
    assert float(hard_stats.interval_mean(x, 0.1, 0.9)) == pytest.approx(
        scipy.stats.trim_mean(x, 0.1), rel=1e-12)


def test_pearson_correlation_and_constant_rows():
    rng = np.random.RandomState(2)
    u, v = rng.randn(3, 8), rng.randn(3, 8)
    expected = [np.corrcoef(a, b)[0, 1] for a, b in zip(u, v, strict=True)]
    np.testing.assert_allclose(hard_stats.pearson_correlation(u, v).numpy(), expected,
                               rtol=1e-10)
    const = tf.constant(np.ones((1, 8)))
    with tf.GradientTape() as tape:
        tape.watch(const)
        corr = hard_stats.pearson_correlation(const, v[:1])
    assert float(corr[0]) == 0.0
    np.testing.assert_array_equal(tape.gradient(corr, const).numpy(), 0.0)


# ---------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------
def test_quantile_error_streams_batch_statistics():
    rng = np.random.RandomState(3)
    y1, p1 = rng.randn(6, 2), rng.randn(6, 2)
    y2, p2 = rng.randn(4, 2), rng.randn(4, 2)
    e1 = (np.abs(y1 - p1) ** 2).mean(1)  # power 2, averaged over the non-batch axis
    e2 = (np.abs(y2 - p2) ** 2).mean(1)
    q = [np.quantile(e, 0.7, method="averaged_inverted_cdf") for e in (e1, e2)]
    metric = ss.QuantileError(0.7, error_power=2.0, dtype="float64")
    metric.update_state(y1, p1)
    assert float(metric.result()) == pytest.approx(q[0], rel=1e-12)
    metric.update_state(y2, p2)
    assert float(metric.result()) == pytest.approx((6 * q[0] + 4 * q[1]) / 10, rel=1e-12)
    metric.reset_state()
    assert float(metric.result()) == 0.0
    # Sample weights are masses of the batch sample; width gives the window mean.
    counts = np.array([1, 3, 1, 2, 1, 1])
    metric.update_state(y1, p1, sample_weight=counts)
    expected = np.quantile(np.repeat(e1, counts), 0.7, method="averaged_inverted_cdf")
    assert float(metric.result()) == pytest.approx(expected, rel=1e-12)
    windowed = ss.QuantileError(0.5, width=0.2, dtype="float64")
    windowed.update_state(y1[:, 0], p1[:, 0])
    assert float(windowed.result()) == pytest.approx(
        np_window_mean(np.abs(y1[:, 0] - p1[:, 0]), 0.4, 0.6), rel=1e-12)


def test_trimmed_error_streams_batch_statistics():
    rng = np.random.RandomState(4)
    batches = [(rng.randn(10), rng.randn(10)), (rng.randn(20), rng.randn(20))]
    metric = ss.TrimmedError(0.1, 0.9, dtype="float64")
    values = []
    for y, p in batches:
        metric.update_state(y[:, None], p[:, None])
        values.append(scipy.stats.trim_mean(np.abs(y - p), 0.1))
    assert float(metric.result()) == pytest.approx((10 * values[0] + 20 * values[1]) / 30,
                                                   rel=1e-12)
    weights = rng.uniform(0.5, 2, 10)
    weighted = ss.TrimmedError(0.0, 0.5, dtype="float64")
    weighted.update_state(*batches[0], sample_weight=weights)
    assert float(weighted.result()) == pytest.approx(
        np_window_mean(np.abs(batches[0][0] - batches[0][1]), 0.0, 0.5, weights), rel=1e-12)


@pytest.mark.parametrize("make", [lambda: ss.QuantileError(0.3, error_power=2.0),
                                  lambda: ss.QuantileError(0.5, width=0.2),
                                  lambda: ss.TrimmedError(0.1, 0.7)])
def test_batch_error_metrics_leave_zero_weight_examples_out(make):
    # Zero sample weights are padding: left out of the statistic (NaN values included)
    # and of the count that weights each batch; a batch of padding alone adds nothing.
    rng = np.random.RandomState(7)
    y_pred, y_true = rng.randn(10), rng.randn(10)
    weights = rng.uniform(0.5, 2.0, 10)
    padded_pred = np.insert(y_pred, [2, 7], [np.nan, np.inf])
    padded_true = np.insert(y_true, [2, 7], [0.0, np.nan])
    padded_weights = np.insert(weights, [2, 7], 0.0)
    reference, metric = make(), make()
    reference.update_state(y_true[:6], y_pred[:6], sample_weight=weights[:6])
    reference.update_state(y_true[6:], y_pred[6:], sample_weight=weights[6:])
    metric.update_state(padded_true[:7], padded_pred[:7], sample_weight=padded_weights[:7])
    metric.update_state(padded_true[7:], padded_pred[7:], sample_weight=padded_weights[7:])
    metric.update_state(padded_true[:3], padded_pred[:3], sample_weight=np.zeros(3))
    assert np.isfinite(float(metric.result()))
    assert float(metric.result()) == pytest.approx(float(reference.result()), rel=1e-6)


def test_spearman_correlation_metric_matches_scipy():
    rng = np.random.RandomState(5)
    y_true = rng.randint(0, 3, size=(6, 7)).astype(np.float32)  # ties
    y_pred = rng.randn(6, 7).astype(np.float32)
    y_pred[0, :3] = 1.0  # ties in predictions too
    rho = np.array([scipy.stats.spearmanr(t, p).statistic
                    for t, p in zip(y_true, y_pred, strict=True)])
    weights = rng.uniform(0.5, 2.0, 6)
    metric = ss.SpearmanCorrelation()
    metric.update_state(y_true[:4], y_pred[:4], sample_weight=weights[:4])
    metric.update_state(y_true[4:], y_pred[4:], sample_weight=weights[4:])
    assert float(metric.result()) == pytest.approx((weights * rho).sum() / weights.sum(),
                                                   abs=1e-5)
    by_column = ss.SpearmanCorrelation(axis=0)
    by_column.update_state(y_true.T, y_pred.T)
    assert float(by_column.result()) == pytest.approx(rho.mean(), abs=1e-5)
    np.testing.assert_allclose(ss.spearman_correlation(y_true, y_pred).numpy(), rho, atol=1e-5)


def test_metrics_in_fit_and_evaluate():
    """Inside `evaluate` (graph mode) with one batch, each metric is the statistic of
    the model's predictions."""
    rng = np.random.RandomState(6)
    x = rng.randn(32, 3).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + rng.standard_t(1, 32)).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mae",
                  metrics=[ss.QuantileError(0.5), ss.TrimmedError(0.0, 0.8)])
    model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    result = model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
    errors = np.abs(y - model.predict(x, verbose=0)[:, 0])
    assert result["quantile_error"] == pytest.approx(
        np.quantile(errors, 0.5, method="averaged_inverted_cdf"), rel=1e-5)
    assert result["trimmed_error"] == pytest.approx(np_window_mean(errors, 0.0, 0.8), rel=1e-5)


METRIC_FACTORIES = {
    "quantile": lambda: ss.QuantileError(0.3, error_power=2.0, width=0.1, name="q"),
    "trimmed": lambda: ss.TrimmedError(0.2, 0.9, error_power=0.5, name="t"),
    "spearman": lambda: ss.SpearmanCorrelation(axis=-1, name="rho"),
}


@pytest.mark.parametrize("name", sorted(METRIC_FACTORIES))
def test_metric_serialisation_round_trip(name):
    metric = METRIC_FACTORIES[name]()
    config = metric.get_config()
    clone = type(metric).from_config(config)
    assert clone.get_config() == config
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(metric))
    assert type(restored) is type(metric) and restored.get_config() == config
    rng = np.random.RandomState(7)
    y, p = rng.randn(8, 4), rng.randn(8, 4)
    for m in (metric, restored):
        m.update_state(y, p)
    assert float(restored.result()) == pytest.approx(float(metric.result()), rel=1e-6)


def test_metrics_survive_saving_a_model(tmp_path):
    rng = np.random.RandomState(8)
    x, y = rng.randn(16, 4).astype(np.float32), rng.randn(16, 4).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss="mse",
                  metrics=[factory() for factory in METRIC_FACTORIES.values()])
    before = model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    model.save(tmp_path / "m.keras")
    after = keras.models.load_model(tmp_path / "m.keras").evaluate(
        x, y, batch_size=16, verbose=0, return_dict=True)
    assert set(before) == {"loss", "q", "t", "rho"}
    assert after == pytest.approx(before, rel=1e-5)


def test_bad_metric_arguments():
    with pytest.raises(ValueError, match="`quantile`"):
        ss.QuantileError(0.0)
    with pytest.raises(ValueError, match="width"):
        ss.QuantileError(0.05, width=0.2)
    with pytest.raises(ValueError, match="start_quantile"):
        ss.TrimmedError(0.5, 0.5)
    with pytest.raises(ValueError, match="`error_power`"):
        ss.TrimmedError(error_power=0.0)
    with pytest.raises(ValueError, match="`axis`"):
        ss.SpearmanCorrelation(axis="rows")
    with pytest.raises(ValueError, match="same shape"):
        ss.spearman_correlation(np.ones((2, 3)), np.ones(3))


@pytest.mark.parametrize("bad", [-1.0, np.nan])
def test_regression_metrics_reject_negative_or_nan_sample_weights(bad):
    # Unclear error: a negative (or NaN) mass was accepted silently.
    weights = np.array([1.0, bad, 2.0, 1.0])
    for metric in (ss.QuantileError(0.5), ss.TrimmedError(0.1, 0.8)):
        with pytest.raises(ValueError, match="sample_weight"):
            metric.update_state(np.zeros(4), np.arange(4.0), sample_weight=weights)
        metric.update_state(np.zeros(4), np.arange(4.0), sample_weight=[1.0, 0.0, 2.0, 1.0])
        assert np.isfinite(float(metric.result()))

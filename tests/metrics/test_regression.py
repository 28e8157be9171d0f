"""Tests of `softsort_tf.metrics.regression`: `QuantileError` and `TrimmedError` stream
batch statistics, leave zero-weight examples out, run in fit/evaluate, serialise and
survive saving (with `SpearmanCorrelation` in the serialisation tests), and reject bad
arguments."""

import keras
import numpy as np
import pytest
import scipy.stats
from numpy_references import np_window_mean

import softsort_tf as ss


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

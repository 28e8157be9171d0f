"""Tests of `softsort_tf.metrics.spearman`: `spearman_correlation` and
`SpearmanCorrelation` against scipy, with masks."""

import numpy as np
import pytest
import scipy.stats
from scipy import stats

import softsort_tf as ss
from softsort_tf.losses.spearman import soft_spearman_correlation
from softsort_tf.metrics.spearman import SpearmanCorrelation, spearman_correlation


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


def test_masked_spearman_matches_scipy_on_the_valid_entries_and_keeps_old_behaviour():
    rng = np.random.default_rng(4)
    y, x = rng.normal(size=(5, 9)), rng.normal(size=(5, 9))
    mask = np.arange(9)[None, :] < np.array([[9], [7], [4], [2], [6]])
    x[~mask] = np.inf
    rho = spearman_correlation(y, x, mask=mask).numpy()
    soft = soft_spearman_correlation(y, x, mask=mask, epsilon=1e-4).numpy()
    for b in range(5):
        ref = stats.spearmanr(y[b, mask[b]], x[b, mask[b]]).statistic
        assert rho[b] == pytest.approx(ref, abs=1e-12)
        assert soft[b] == pytest.approx(ref, abs=5e-3)
    # Axis 0 with a mask: the same lists, transposed.
    np.testing.assert_allclose(spearman_correlation(y.T, x.T, axis=0, mask=mask.T), rho)
    # Without a mask nothing changed: NaN still propagates, unmasked results unchanged.
    with_nan = x[:2].copy()
    with_nan[0, 0] = np.nan
    np.testing.assert_array_equal(np.isnan(spearman_correlation(y[:2], with_nan)), [True, False])
    np.testing.assert_array_equal(np.isnan(spearman_correlation(y[:2], with_nan, mask=mask[:2])),
                                  [True, False])
    np.testing.assert_allclose(spearman_correlation(y[:1, :9], y[:1, :9]).numpy(), 1.0)
    metric = SpearmanCorrelation(negative_labels_are_padding=True)
    clone = SpearmanCorrelation.from_config(metric.get_config())
    assert clone.negative_labels_are_padding
    clone.update_state(np.where(mask, np.abs(y), -1.0), x)
    refs = [stats.spearmanr(np.abs(y[b, mask[b]]), x[b, mask[b]]).statistic for b in range(5)]
    assert float(clone.result()) == pytest.approx(np.mean(refs), abs=1e-6)

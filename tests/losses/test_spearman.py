"""Tests of `softsort_tf.losses.spearman`: the Spearman loss and the soft Spearman
correlation (hard limit, reductions, NaN per list, lists of different lengths)."""

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from operator_cases import separated_values

import softsort_tf as ss

HARD = dict(epsilon=1e-5, threshold=1e-6, max_iterations=3000)


SETTINGS = settings(max_examples=10, deadline=None)


seeds = st.integers(0, 10_000)


@SETTINGS
@given(st.sampled_from([((4, 6), -1), ((6, 3), 0), ((2, 5, 3), 1)]), seeds)
def test_spearman_loss_hard_limit(shape_axis, seed):
    shape, axis = shape_axis
    rng = np.random.RandomState(seed)
    y_pred = np.moveaxis(separated_values(rng, tuple(np.moveaxis(np.empty(shape), axis, -1).shape)),
                         -1, axis)
    y_true = rng.randint(0, 3, size=shape).astype(np.float64)  # many ties
    loss = ss.SpearmanLoss(axis=axis, reduction="none", dtype="float64", **HARD)
    got = loss(y_true, y_pred).numpy()
    yt, yp = np.moveaxis(y_true, axis, -1), np.moveaxis(y_pred, axis, -1)
    expected = np.empty(yt.shape[:-1])
    for idx in np.ndindex(*yt.shape[:-1]):
        if np.all(yt[idx] == yt[idx][0]):
            expected[idx] = 1.0  # constant targets: correlation taken as 0
        else:
            expected[idx] = 1.0 - scipy.stats.spearmanr(yt[idx], yp[idx]).statistic
    np.testing.assert_allclose(got, expected, atol=2e-3)


def test_spearman_sample_weight_and_reductions():
    rng = np.random.RandomState(4)
    y_true, y_pred = rng.randn(4, 6), rng.randn(4, 6)
    weights = np.array([1.0, 0.0, 2.0, 1.0])
    per_list = ss.SpearmanLoss(reduction="none")(y_true, y_pred).numpy()
    assert per_list.shape == (4,) and np.all((per_list >= 0) & (per_list <= 2))
    np.testing.assert_allclose(
        per_list, 1 - ss.soft_spearman_correlation(y_true, y_pred).numpy(), rtol=1e-6)
    assert float(ss.SpearmanLoss()(y_true, y_pred, sample_weight=weights)) == pytest.approx(
        (weights * per_list).sum() / 4, rel=1e-5)
    # Perfectly ordered predictions give ≈ 0, reversed ones ≈ 2.
    order = np.arange(6.0)[None]
    assert float(ss.SpearmanLoss()(order, order * 3 + 1)) < 0.02
    assert float(ss.SpearmanLoss()(order, -order)) > 1.98


def test_spearman_propagates_nan_per_list():
    # Bug: a NaN prediction gave a loss of exactly 1.0 (finite) with a NaN gradient.
    y_true = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    y_pred = tf.constant([[0.1, np.nan, 0.3, 0.2], [0.1, 0.4, 0.3, 0.2]])
    with tf.GradientTape() as tape:
        tape.watch(y_pred)
        per_list = ss.SpearmanLoss(reduction="none")(y_true, y_pred)
        other = per_list[1]
    values = per_list.numpy()
    assert np.isnan(values[0]) and np.isfinite(values[1])
    assert np.all(np.isfinite(tape.gradient(other, y_pred).numpy()[1]))  # other list
    assert np.isnan(float(ss.SpearmanLoss()(y_true, y_pred)))
    assert np.isnan(ss.soft_spearman_correlation(y_pred, y_true).numpy()[0])  # NaN target
    assert np.isnan(ss.spearman_correlation(y_true, y_pred).numpy()[0])
    assert np.isfinite(ss.spearman_correlation(y_true, y_pred).numpy()[1])


def test_spearman_lists_of_different_lengths_raise_a_clear_error():
    # Bug: lists of lengths 5 and 6 raised a raw `Mul` error.
    for fn in (ss.SpearmanLoss(), ss.soft_spearman_correlation, ss.spearman_correlation):
        with pytest.raises(ValueError, match="same shape"):
            fn(np.arange(5.0)[None], np.arange(6.0)[None])

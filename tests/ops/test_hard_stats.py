"""Tests of `softsort_tf.ops.hard_stats`, the exact (hard) references of the soft
operators: `rankdata`, `weighted_quantile`, `interval_mean` and `pearson_correlation`
against numpy/scipy, under XLA, and on padded lists."""

import functools

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy_references import np_window_mean
from operator_cases import padded_batches

import softsort_tf as ss
from softsort_tf.ops import hard_stats

SETTINGS = settings(max_examples=15, deadline=None)


seeds = st.integers(0, 10_000)


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


@functools.cache
def _rankdata_xla():
    """`ss.rankdata` traced once for an unknown n (one XLA program per input shape)."""
    return tf.function(ss.rankdata, jit_compile=True,
                       input_signature=[tf.TensorSpec([None, None])])


@pytest.mark.parametrize("n", [1, 2, 7, 300])
def test_rankdata_equals_scipy_with_ties_eager_and_xla(n):
    """Ties averaged as scipy; one sort and segment sums, so XLA compiles it for an
    unknown n without a quadratic search."""
    rng = np.random.default_rng(n)
    x = rng.integers(0, max(2, n // 3), size=(3, n)).astype(np.float32)
    expected = scipy.stats.rankdata(x, axis=-1)
    np.testing.assert_allclose(ss.rankdata(x).numpy(), expected)
    np.testing.assert_allclose(_rankdata_xla()(x).numpy(), expected)


@settings(max_examples=20, deadline=None)
@given(batch=padded_batches())
def test_padded_rankdata_equals_unpadded_rankdata(batch):
    x, mask, _ = batch
    ranks = ss.rankdata(x, mask=mask).numpy()
    for r in range(2):
        np.testing.assert_array_equal(ranks[r, mask[r]], ss.rankdata(x[r, mask[r]]).numpy())
        assert np.all(ranks[r, ~mask[r]] == 0)


@settings(max_examples=15, deadline=None)
@given(batch=padded_batches(), quantile=st.sampled_from([0.1, 0.5, 0.75]))
def test_padded_hard_quantile_and_interval_mean(batch, quantile):
    x, mask, _ = batch
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        q = hard_stats.weighted_quantile(xt, quantile, mask=mask)
        m = hard_stats.interval_mean(xt, 0.2, 0.8, mask=mask)
        total = tf.reduce_sum(q + m)
    grad = tape.gradient(total, xt).numpy()
    for r in range(2):
        v = x[r, mask[r]]
        np.testing.assert_allclose(q[r], hard_stats.weighted_quantile(v, quantile), rtol=1e-12)
        np.testing.assert_allclose(m[r], hard_stats.interval_mean(v, 0.2, 0.8), rtol=1e-12)
        assert np.all(grad[r, ~mask[r]] == 0) and np.all(np.isfinite(grad[r]))

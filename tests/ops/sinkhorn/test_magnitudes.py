"""Tests of `softsort_tf.ops.sinkhorn` on inputs over the whole float range: huge,
subnormal, offset and mixed-scale rows.

Every Sinkhorn operator must give finite values that keep their hard limits at small
ε whatever the magnitude of the inputs (the squashing and the sorted-value read-out are
computed in float64 after centring; see `softsort_tf.ops.squash`, tested in
`tests/ops/test_squash.py`)."""

import hypothesis.strategies as st
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from hypothesis import given, settings

import softsort_tf as ss

SMALL = dict(epsilon=1e-4, threshold=1e-6)


def _ranks(x, **kwargs):
    return ss.sinkhorn_rank(x, **SMALL, **kwargs).numpy()


def _sort(x, **kwargs):
    return ss.sinkhorn_sort(x, **SMALL, **kwargs).numpy()


@pytest.mark.parametrize("row, dtype", [
    ([3e38, -1e38, 2e38, 0.0, 1e37], np.float32),
    ([-3.4e38, 3.4e38, 1e38, -2e37], np.float32),
    ([1.7e308, -1.7e308, 1e308, 0.0], np.float64),
])
def test_values_near_the_largest_float_give_every_operator_finite_exact_limits(row, dtype):
    x = np.array([row], dtype)
    expected = scipy.stats.rankdata(row)
    np.testing.assert_allclose(_ranks(x), [expected], atol=1e-3)
    np.testing.assert_allclose(ss.sinkhorn_cdf(x, **SMALL).numpy(), [expected / len(row)],
                               atol=1e-3)
    s = _sort(x)
    assert np.all(np.isfinite(s))
    np.testing.assert_allclose(s, [np.sort(x[0])], rtol=1e-3, atol=1e-3 * np.abs(x).max())
    q = ss.sinkhorn_quantile(x, 0.5, **SMALL).numpy()
    assert np.isfinite(q).all() and x.min() <= q[0] <= x.max()
    mask = ss.sinkhorn_topk(x, 2, **SMALL).numpy()
    np.testing.assert_allclose(mask, [(expected > len(row) - 2).astype(float)], atol=1e-3)
    t = ss.sinkhorn_quantile_normalization(x, np.arange(len(row), dtype=dtype),
                                           **SMALL).numpy()
    np.testing.assert_allclose(t, [expected - 1], atol=1e-3)
    P = ss.sinkhorn_permutation_matrix(x, **SMALL).numpy()
    assert np.all(np.isfinite(P))


def test_subnormal_float32_inputs_keep_their_order():
    row = np.array([[6e-40, 1e-40, 3e-40, 2e-40, 5e-40, 4e-40, 0.0]], np.float32)
    np.testing.assert_allclose(_ranks(row), [scipy.stats.rankdata(row[0])], atol=1e-3)
    np.testing.assert_allclose(ss.sinkhorn_topk(row, 3, **SMALL).numpy(),
                               [[1, 0, 0, 0, 1, 1, 0]], atol=1e-3)
    # Sorted values are themselves subnormal, which TensorFlow's CPU kernels flush to
    # zero (documented limit); they stay finite and in [min, max] of what TF reads.
    s = _sort(row)
    assert np.all(np.isfinite(s)) and np.all(s >= 0) and np.all(s <= row.max())


def test_a_large_common_offset_keeps_sorted_values_exact_and_monotone():
    row = (1e7 + np.array([[6, 5, 4, 3, 2, 1, 0]], np.float32)).astype(np.float32)
    s = _sort(row)
    assert np.all(np.diff(s[0]) >= 0), s
    np.testing.assert_allclose(s, [np.sort(row[0])], atol=0.5)
    topk = ss.sinkhorn_sort(row, topk=2, direction="DESCENDING", **SMALL).numpy()
    np.testing.assert_allclose(topk, [[1e7 + 6, 1e7 + 5]], atol=0.5)
    q = ss.sinkhorn_quantile(row, [0.25, 0.75], **SMALL).numpy()
    assert np.all(np.abs(q - 1e7 - 3) <= 3.0) and q[0, 0] < q[0, 1]


RAW = dict(squash=None, threshold=1e-5)  # values as they are: ε in their units


def _raw_outputs(x, epsilon, **kwargs):
    """Ranks, top-3 masses and the relaxed matrix of raw values (p = 2)."""
    return (ss.sinkhorn_rank(x, epsilon=epsilon, **RAW, **kwargs).numpy(),
            ss.sinkhorn_topk(x, 3, epsilon=epsilon, **RAW, **kwargs).numpy(),
            ss.sinkhorn_permutation_matrix(x, epsilon=epsilon, **RAW, **kwargs).numpy())


@pytest.mark.parametrize("epsilon", [1.0, 0.1])
@pytest.mark.parametrize("offset", [1e2, 1e4, 1e6])
def test_raw_values_with_a_large_offset_keep_float32_precision(offset, epsilon):
    """squash=None: float32 values c + x (spread ~10) give the float64 result of the
    same rounded values to float32 precision, whatever c: the cost is formed from the
    values moved onto the targets per list, not from c + x."""
    x = (np.random.RandomState(0).randn(3, 8) * 3 + offset).astype(np.float32)
    for got, want in zip(_raw_outputs(x, epsilon), _raw_outputs(x.astype(np.float64), epsilon),
                         strict=True):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, atol=2e-5)


def test_raw_values_are_shift_invariant_in_float64():
    """p = 2: (x_i + c − y_j)² differs from (x_i − y_j)² by a term per input and one per
    target, so the plan, and every output but the sorted values, ignore c."""
    x = np.random.RandomState(1).randn(2, 9) * 3
    for got, want in zip(_raw_outputs(x + 1e5, 0.5), _raw_outputs(x, 0.5), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-10)
    np.testing.assert_allclose(ss.sinkhorn_sort(x + 1e5, epsilon=0.5, **RAW).numpy(),
                               ss.sinkhorn_sort(x, epsilon=0.5, **RAW).numpy() + 1e5,
                               atol=1e-8)


def _rank_and_gradient(x, w, **kwargs):
    """sinkhorn_rank(x) and d(Σ w ∘ sinkhorn_rank(x))/dx in the dtype of x."""
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        ranks = ss.sinkhorn_rank(x, **kwargs)
        loss = tf.reduce_sum(ranks * tf.constant(w, x.dtype))
    return ranks.numpy(), tape.gradient(loss, x).numpy()


def _rank_gradient(x, w, **kwargs):
    """d(Σ w ∘ sinkhorn_rank(x))/dx in the dtype of x."""
    return _rank_and_gradient(x, w, **kwargs)[1]


@pytest.mark.parametrize("implicit", [True, False])
def test_raw_values_with_a_large_offset_keep_float32_gradients(implicit):
    """The gradient of ranks of c + x (float32, c = 1e4) is the float64 one."""
    rng = np.random.RandomState(2)
    x = (rng.randn(3, 8) * 3 + 1e4).astype(np.float32)
    w = rng.randn(3, 8)
    kwargs = dict(epsilon=1.0, **RAW, **({} if implicit else {"implicit_diff": None}))
    got, want = _rank_gradient(x, w, **kwargs), _rank_gradient(x.astype(np.float64), w, **kwargs)
    assert np.all(np.isfinite(got)) and np.abs(want).max() > 0.1
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("spread, epsilon", [(1e2, 0.01), (1e3, 1.0), (1e4, 1.0),
                                             (1e5, 1.0), (1e5, 100.0)])
def test_raw_values_with_a_wide_spread_keep_float32_precision(spread, epsilon):
    """squash=None: float32 values spread over [0, S] give the float64 ranks and top-k
    masses to 1e-4 up to S = 1e5, and the matrices to the float32 rounding of the
    potentials (≈ 1e-7·S/ε). The p = 2 cost is formed without the term x² of each
    input, whose rounding grows as S² (ranks were off by 2.6e-4 at S = 100, ε = 0.01,
    by 0.02 at S = 1e4, ε = 1 and by 0.75 at S = 1e5; matrices by up to 3.7e21)."""
    x = np.random.RandomState(4).uniform(0.0, spread, (4, 12)).astype(np.float32)
    kwargs = dict(squash=None, epsilon=epsilon, max_iterations=1000)
    ops = (lambda v, t: ss.sinkhorn_rank(v, threshold=t, **kwargs),
           lambda v, t: ss.sinkhorn_topk(v, 4, threshold=t, **kwargs),
           lambda v, t: ss.sinkhorn_permutation_matrix(v, threshold=t, **kwargs))
    for op, atol in zip(ops, (1e-4, 1e-4, 5e-4 + 1e-7 * spread / epsilon), strict=True):
        got, want = op(x, 1e-6).numpy(), op(x.astype(np.float64), 1e-9).numpy()
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, atol=atol)


@pytest.mark.parametrize("implicit", [True, False])
def test_raw_values_with_a_wide_spread_keep_float32_gradients(implicit):
    """The gradient of ranks of values spread over [0, 1e4] (float32, ε = 1) is the
    float64 one (it was off by 0.011 implicitly and, unrolled through the 1000 iterations
    here, by 3.4e-3; the unrolled error grew with the iterations, to 0.63 through 20000)."""
    rng = np.random.RandomState(5)
    x = rng.uniform(0.0, 1e4, (3, 8)).astype(np.float32)
    x[:, 1] = x[:, 0] + 3.0  # a pair a few ε apart
    w = rng.randn(3, 8)
    kwargs = dict(epsilon=1.0, squash=None, threshold=1e-6, max_iterations=1000,
                  **({} if implicit else {"implicit_diff": None}))
    got, want = _rank_gradient(x, w, **kwargs), _rank_gradient(x.astype(np.float64), w, **kwargs)
    assert np.all(np.isfinite(got)) and np.abs(want).max() > 0.02
    np.testing.assert_allclose(got, want, atol=2e-4)


@pytest.mark.parametrize("epsilon", [0.01, 0.1])
@pytest.mark.parametrize("far", [1e4, 1e6, 1e8])
@pytest.mark.parametrize("layout", ["high", "both ends", "zero weight"])
def test_raw_values_with_far_entries_keep_float32_precision(layout, far, epsilon):
    """squash=None: a bulk of spread ~1 beside entries at distance D (one above, one at
    each end, or one of zero weight) gives the float64 ranks, top-k masses and
    gradients. The values are centred on their median, not the midpoint of their
    ends, and the warm start's potential is anchored at the middle target, not its
    mean (ranks were off by 7e-3 at D = 1e4, 0.8 at 1e6 and 5 at 1e8)."""
    rng = np.random.RandomState(6)
    x = rng.randn(3, 8) * 0.3
    x[:, -1] = far
    if layout == "both ends":
        x[:, 0] = -far
    weights = None
    if layout == "zero weight":
        weights = np.ones_like(x)
        weights[:, -1] = 0.0
    kwargs = dict(epsilon=epsilon, squash=None, weights=weights, threshold=1e-6,
                  max_iterations=5000)
    w = rng.randn(3, 8)
    # The ranks are those whose gradient is checked below (one solve per dtype for both).
    (ranks, got_grad), (want_ranks, want_grad) = (
        _rank_and_gradient(x.astype(dtype), w, **kwargs) for dtype in (np.float32, np.float64))
    topk = [ss.sinkhorn_topk(x.astype(dtype), 3, **kwargs).numpy()
            for dtype in (np.float32, np.float64)]
    for got, want, atol in ((ranks, want_ranks, 1e-4), (*topk, 1e-5)):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, atol=atol)
    assert np.all(np.isfinite(got_grad)) and np.abs(want_grad).max() > 0.1
    np.testing.assert_allclose(got_grad, want_grad, atol=1e-3 * np.abs(want_grad).max())


def test_raw_values_centre_on_the_valid_entries_only():
    """Padded entries (even huge or infinite ones) do not move the centre of a masked
    or ragged list: its outputs are those of the list alone."""
    x = (np.random.RandomState(3).randn(2, 6) * 3 + 1e4).astype(np.float32)
    padded = np.concatenate([x, np.array([[3e38, -np.inf], [-3e38, 1e30]], np.float32)],
                            axis=1)
    mask = np.arange(8)[None, :] < 6
    alone = ss.sinkhorn_rank(x, epsilon=1.0, **RAW).numpy()
    masked = ss.sinkhorn_rank(padded, epsilon=1.0, mask=np.repeat(mask, 2, 0), **RAW).numpy()
    assert np.all(np.isfinite(masked))
    # Each list stops at its own marginal error (threshold 1e-5 of the unit mass).
    tol = 6 * RAW["threshold"] * 2
    np.testing.assert_allclose(masked[:, :6], alone, atol=tol)
    np.testing.assert_array_equal(masked[:, 6:], 0.0)
    ragged = tf.RaggedTensor.from_row_lengths(np.concatenate([x[0], x[1, :4]]), [6, 4])
    got = ss.sinkhorn_rank(ragged, epsilon=1.0, **RAW)
    np.testing.assert_allclose(got[0].numpy(), alone[0], atol=tol)
    np.testing.assert_allclose(got[1].numpy(),
                               ss.sinkhorn_rank(x[1:, :4], epsilon=1.0, **RAW).numpy()[0],
                               atol=tol)


def test_robust_squash_resolves_mixed_scales_that_the_logistic_squash_merges():
    row = np.array([[1e-3, 1e30, 0.5, 1.0, 2.0, 4.0, 8.0, 1e15]], np.float32)
    expected = scipy.stats.rankdata(row[0])
    np.testing.assert_allclose(_ranks(row, squash="robust"), [expected], atol=1e-2)
    # The default logistic squash standardises with the mean and std, which the
    # outliers dominate: the bulk's ranks merge (the reason for 'robust').
    merged = _ranks(row)
    assert np.ptp(merged[0, [0, 2, 3, 4, 5, 6]]) < 1.0
    s = _sort(row, squash="robust")
    np.testing.assert_allclose(s[0, :6], np.sort(row[0])[:6], rtol=1e-2, atol=1e-4)


def _distinct_row(draw, n):
    grid = draw(st.permutations(list(range(-10, 11))))[:n]
    return np.array(grid, np.float64) / 10.0


@st.composite
def scaled_rows(draw, dtype):
    n = draw(st.integers(2, 6))
    low, high = (-36, 37) if dtype == np.float32 else (-300, 300)
    scale = 10.0 ** draw(st.integers(low, high))
    offset = draw(st.sampled_from([0.0, 0.0, 1.0, -3.0]))
    return ((_distinct_row(draw, n) + offset) * scale).astype(dtype)[None, :]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data())
def test_property_every_scale_gives_exact_ranks_and_bounded_monotone_sorts(dtype, data):
    x = data.draw(scaled_rows(dtype))
    ranks = _ranks(x)
    assert np.all(np.isfinite(ranks))
    np.testing.assert_allclose(ranks, [scipy.stats.rankdata(x[0])], atol=0.05)
    s = _sort(x)
    assert np.all(np.isfinite(s))
    span = float(np.ptp(x.astype(np.float64)))
    tol = 1e-5 * span
    assert np.all(np.diff(s[0]) >= -tol)
    assert s.min() >= x.min() - tol and s.max() <= x.max() + tol


SCALES = [1e-30, 1e-10, 1.0, 1e10, 1e30]


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_extreme_magnitudes_are_finite(dtype):
    """Rows of every scale in one batch (each row is its own problem: the operators
    and their gradients treat the rows of a batch independently), rows 2s and 2s + 1
    the same random pair scaled by `SCALES[s]`."""
    base = np.random.RandomState(0).randn(2, 6)
    x = tf.constant(np.concatenate([base * scale for scale in SCALES]), dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        outs = [ss.sinkhorn_rank(x), ss.sinkhorn_sort(x), ss.sinkhorn_quantile(x, 0.5),
                ss.sinkhorn_cdf(x), ss.sinkhorn_topk(x, 2)]
        loss = tf.add_n([tf.reduce_sum(o) for o in outs[::2]])
    grad = tape.gradient(loss, x).numpy()
    r = outs[0].numpy()
    for s, scale in enumerate(SCALES):
        rows = slice(2 * s, 2 * s + 2)
        for i, o in enumerate(outs):
            assert np.all(np.isfinite(o.numpy()[rows])), (scale, i)
        assert np.all(np.isfinite(grad[rows])), scale
        np.testing.assert_array_equal(np.argsort(r[rows], 1), np.argsort(x.numpy()[rows], 1),
                                      err_msg=f"scale {scale}")

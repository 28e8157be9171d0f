"""Tests of `softsort_tf.ops.sinkhorn`: values against exact numpy/scipy references.

The hard (ε → 0) limits of ranks, CDFs, sorts, top-k, quantiles, quantile normalisation and
the permutation matrix; marginals with input and target weights; equivariance,
monotonicity and ties; the Sinkhorn permutation matrix against its numpy formula.

Other aspects of the same module are in this directory:
`test_hard_limits.py`, `test_target_grid.py`, `test_masks.py`, `test_shapes.py`,
`test_gradients.py`, `test_magnitudes.py` and `test_errors.py`."""


import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy_references import np_log_sinkhorn_plan

import softsort_tf as ss
from softsort_tf.ops import sinkhorn as sinkhorn_ops

HARD = dict(epsilon=1e-5, threshold=1e-6, max_iterations=3000)


SETTINGS = settings(max_examples=15, deadline=None, derandomize=True)


def separated(seed, shape, axis):
    """Random inputs whose entries along `axis` are well separated (a clear hard sort)."""
    rng = np.random.RandomState(seed)
    base = rng.rand(*shape).argsort(axis=axis).argsort(axis=axis).astype(np.float64)
    return base + rng.uniform(-0.3, 0.3, size=shape)


def np_rank(x, axis, direction):
    sign = -1.0 if direction == "DESCENDING" else 1.0
    return scipy.stats.rankdata(sign * x, axis=axis)


shapes_axes = st.sampled_from([((7,), 0), ((3, 6), -1), ((5, 4), 0), ((2, 5, 3), 1),
                               ((2, 3, 4), 0), ((2, 2, 3, 5), -1)])


directions = st.sampled_from(["ASCENDING", "DESCENDING"])


seeds = st.integers(0, 10_000)


@SETTINGS
@given(shapes_axes, directions, seeds)
def test_rank_cdf_hard_limit(shape_axis, direction, seed):
    shape, axis = shape_axis
    x = separated(seed, shape, axis)
    n = shape[axis]
    expected = np_rank(x, axis, direction)
    ranks = ss.sinkhorn_rank(x, axis=axis, direction=direction, **HARD).numpy()
    np.testing.assert_allclose(ranks, expected, atol=1e-3)
    zero = ss.sinkhorn_rank(x, axis=axis, direction=direction, zero_based=True, **HARD)
    np.testing.assert_allclose(zero.numpy(), expected - 1, atol=1e-3)
    cdf = ss.sinkhorn_cdf(x, axis=axis, direction=direction, **HARD).numpy()
    np.testing.assert_allclose(cdf, expected / n, atol=1e-3)


@SETTINGS
@given(shapes_axes, directions, seeds)
def test_sort_and_topk_hard_limit(shape_axis, direction, seed):
    shape, axis = shape_axis
    x = separated(seed, shape, axis)
    expected = np.sort(x, axis=axis)
    if direction == "DESCENDING":
        expected = np.flip(expected, axis=axis)
    out = ss.sinkhorn_sort(x, axis=axis, direction=direction, **HARD).numpy()
    np.testing.assert_allclose(out, expected, atol=1e-4)
    n = shape[axis]
    k = max(1, n // 2)
    top = ss.sinkhorn_sort(x, axis=axis, direction=direction, topk=k, **HARD).numpy()
    np.testing.assert_allclose(top, np.take(expected, np.arange(k), axis=axis), atol=1e-4)
    mask = ss.sinkhorn_topk(x, k, axis=axis, direction=direction, **HARD).numpy()
    np.testing.assert_allclose(mask, (np_rank(x, axis, direction) <= k).astype(float),
                               atol=1e-3)


def window_quantile(x, tau, width):
    """Exact K-quantile: mean of the values whose cumulative mass is in τ ± width/2."""
    xs = np.sort(x)
    n = xs.size
    lo, hi = tau - width / 2, tau + width / 2
    edges = np.arange(n + 1) / n
    overlap = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0, None)
    return float(overlap @ xs / overlap.sum())


@SETTINGS
@given(st.integers(3, 12), seeds, st.lists(st.floats(0.05, 0.95), min_size=1, max_size=3))
def test_quantile_hard_limit(n, seed, levels):
    levels = np.unique(np.round(levels, 2))
    if levels.size > 1 and np.diff(levels).min() < 0.05:
        levels = levels[:1]
    x = separated(seed, (n,), 0)
    width = min(sinkhorn_ops.default_quantile_width(levels), 0.5 / n)
    out = ss.sinkhorn_quantile(x, levels, width=width, **HARD).numpy()
    expected = [window_quantile(x, t, width) for t in levels]
    np.testing.assert_allclose(out, expected, atol=1e-3)
    # The default width makes the hard limit numpy's averaged inverted CDF.
    out = ss.sinkhorn_quantile(x, levels, **HARD).numpy()
    np.testing.assert_allclose(
        out, np.quantile(x, levels, method="averaged_inverted_cdf"), atol=1e-3)
    # A window inside one input's mass (or centred on a boundary between two) gives
    # numpy's averaged inverted CDF.
    for tau in levels:
        dist = abs(tau * n - np.round(tau * n)) / n
        small = 0.5 / n if dist < 1e-9 else min(0.5 / n, 1.8 * dist)
        out = ss.sinkhorn_quantile(x, tau, width=small, **HARD).numpy()
        np.testing.assert_allclose(
            out, np.quantile(x, tau, method="averaged_inverted_cdf"), atol=1e-3)


def test_scalar_quantile_removes_axis_and_descending():
    x = separated(1, (4, 9), 1)
    q = ss.sinkhorn_quantile(x, 0.5, axis=1, **HARD)
    assert q.shape == (4,)
    np.testing.assert_allclose(q.numpy(), np.median(x, axis=1), atol=1e-4)
    q = ss.sinkhorn_quantile(x.T, [0.3, 0.5], axis=0, **HARD)
    assert q.shape == (2, 4)
    top = ss.sinkhorn_quantile(x, 0.2, direction="DESCENDING", width=0.04, **HARD).numpy()
    np.testing.assert_allclose(top, np.quantile(x, 0.8, axis=1,
                                                method="averaged_inverted_cdf"), atol=1e-3)


@SETTINGS
@given(shapes_axes, seeds, st.integers(2, 9))
def test_quantile_normalization_hard_limit(shape_axis, seed, m):
    shape, axis = shape_axis
    x = separated(seed, shape, axis)
    n = shape[axis]
    targets = np.random.RandomState(seed).randn(n) * 10
    out = ss.sinkhorn_quantile_normalization(x, targets, axis=axis, **HARD).numpy()
    ranks = np_rank(x, axis, "ASCENDING").astype(int) - 1
    np.testing.assert_allclose(out, np.sort(targets)[ranks], atol=1e-3)
    # m ≠ n: with m dividing n each target value is given to n/m consecutive inputs.
    x = separated(seed, (2, 3 * m), 1)
    targets = np.arange(m, dtype=float)[::-1]
    out = ss.sinkhorn_quantile_normalization(x, targets, **HARD).numpy()
    ranks = np_rank(x, 1, "ASCENDING").astype(int) - 1
    np.testing.assert_allclose(out, ranks // 3, atol=1e-3)


def test_permutation_matrix_hard_limit_and_orientation():
    x = separated(3, (3, 6), 1)
    for direction in ("ASCENDING", "DESCENDING"):
        p = ss.sinkhorn_permutation_matrix(x, direction=direction, **HARD).numpy()
        order = np.argsort(x if direction == "ASCENDING" else -x, axis=1)
        np.testing.assert_allclose(p, np.eye(6)[order], atol=1e-3)
        np.testing.assert_allclose(np.einsum("bij,bj->bi", p, x),
                                   np.take_along_axis(x, order, axis=1), atol=1e-3)


def test_weights_and_target_weights_marginals_through_operators():
    rng = np.random.RandomState(0)
    x = rng.randn(2, 8)
    w = rng.uniform(0.5, 2.0, (2, 8))
    # With weights, the hard CDF of x_i is the weight of the entries <= x_i.
    cdf = ss.sinkhorn_cdf(x, weights=w, **HARD).numpy()
    wn = w / w.sum(1, keepdims=True)
    expected = np.array([[wn[b][x[b] <= v].sum() for v in x[b]] for b in range(2)])
    # Bins of the uniform grid are 1/8 wide, the CDF is read at bin ends: agree to 1/8.
    assert np.abs(cdf - expected).max() <= 1 / 8 + 1e-6
    tw = np.array([0.5, 0.25, 0.25])
    s = ss.sinkhorn_sort(x, target_weights=tw, **HARD).numpy()
    xs = np.sort(x, axis=1)
    np.testing.assert_allclose(s, np.stack([xs[:, :4].mean(1), xs[:, 4:6].mean(1),
                                            xs[:, 6:].mean(1)], 1), atol=1e-4)


@SETTINGS
@given(st.integers(2, 15), seeds, st.floats(1e-3, 0.5), directions)
def test_rank_equivariance(n, seed, eps, direction):
    rng = np.random.RandomState(seed)
    x = rng.randn(2, n)
    perm = rng.permutation(n)
    kw = dict(epsilon=eps, direction=direction, threshold=1e-8, max_iterations=5000)
    # x and its permuted copy as one batch of 4 rows (each row is solved on its own):
    # one call per operator instead of two.
    both = np.concatenate([x, x[:, perm]])
    r, r_perm = np.split(ss.sinkhorn_rank(both, **kw).numpy(), 2)
    np.testing.assert_allclose(r_perm, r[:, perm], atol=1e-6)
    s, s_perm = np.split(ss.sinkhorn_sort(both, **kw).numpy(), 2)
    np.testing.assert_allclose(s_perm, s, atol=1e-6)


@SETTINGS
@given(st.integers(2, 30), seeds, st.floats(1e-3, 1.0), directions,
       st.sampled_from(["logistic", "atan"]))
def test_sort_is_monotone(n, seed, eps, direction, squash):
    x = np.random.RandomState(seed).randn(3, n) * 5
    s = ss.sinkhorn_sort(x, epsilon=eps, direction=direction, squash=squash).numpy()
    d = np.diff(s, axis=1)
    if direction == "DESCENDING":
        d = -d
    assert np.all(d >= -1e-9)
    # Outputs are convex combinations of the inputs.
    assert np.all(s >= x.min(1, keepdims=True) - 1e-9)
    assert np.all(s <= x.max(1, keepdims=True) + 1e-9)


def test_ties_give_equal_ranks_and_constant_rows_are_finite():
    x = tf.constant([[1.0, 2.0, 1.0, 3.0, 2.0], [4.0, 4.0, 4.0, 4.0, 4.0]], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        r = ss.sinkhorn_rank(x, epsilon=1e-2)
        loss = tf.reduce_sum(r * tf.range(5, dtype=tf.float64))
    g = tape.gradient(loss, x)
    r = r.numpy()
    assert r[0, 0] == pytest.approx(r[0, 2], abs=1e-9)
    assert r[0, 1] == pytest.approx(r[0, 4], abs=1e-9)
    np.testing.assert_allclose(r[1], 3.0, atol=1e-6)  # a constant row: all tied, mid rank
    assert np.all(np.isfinite(g.numpy()))
    hard = ss.sinkhorn_rank(x[:1], **HARD).numpy()
    np.testing.assert_allclose(hard, [[1.5, 3.5, 1.5, 5.0, 3.5]], atol=1e-3)


def test_operators_standardise_with_their_weights():
    """A zero-weight outlier changes nothing: the transport problem is the same."""
    x = np.array([[1.0, 2.0, 3.0, 4.0, 1e6]])
    w = np.array([[1.0, 1.0, 1.0, 1.0, 0.0]])
    kw = dict(epsilon=1e-2, threshold=1e-7, max_iterations=5000, num_targets=4)
    # Ranks are scaled to [1, n]: n = 5 with the outlier, 4 without.
    for op, factor in ((ss.sinkhorn_cdf, 1.0), (ss.sinkhorn_rank, 5 / 4)):
        with_outlier = op(x, weights=w, **kw).numpy()[:, :4]
        without = op(x[:, :4], **kw).numpy()
        np.testing.assert_allclose(with_outlier, factor * without, atol=1e-5)
    # Unweighted, the outlier compresses the other four into nearly one value.
    cdf = ss.sinkhorn_cdf(x, **kw).numpy()
    spread = ss.sinkhorn_cdf(x, weights=w, **kw).numpy()
    assert cdf[0, 3] - cdf[0, 0] < 0.1 and spread[0, 3] - spread[0, 0] > 0.7


def test_target_values_per_row_follow_the_rows_of_x():
    """Per-row target values `[..., m]` go to the row of x with the same leading index
    (x `(2, 5, 3)` sorted along axis 1: rows are indexed by (i, k))."""
    rng = np.random.RandomState(13)
    x = rng.randn(2, 5, 3)
    targets = rng.randn(2, 3, 5) * 10
    out = ss.sinkhorn_quantile_normalization(x, targets, axis=1, **HARD).numpy()
    for i in range(2):
        for k in range(3):
            ranks = scipy.stats.rankdata(x[i, :, k]).astype(int) - 1
            np.testing.assert_allclose(out[i, :, k], np.sort(targets[i, k])[ranks], atol=1e-3)


def np_sinkhorn_problem(x, direction, targets="regular"):
    """The transport problem of the Sinkhorn permutation matrix of a row x: sign·x and
    the targets y_j = (j − 1)/(n − 1) ('regular') or (j − 1/2)/n ('centres'); its plan
    (cost |x̃ − y|², uniform marginals, Cuturi et al., Algorithm 1, in the log domain)
    gives the matrix n·Pᵀ."""
    sign = -1.0 if direction == "DESCENDING" else 1.0
    xs = sign * np.asarray(x, np.float64)
    n = xs.size
    y = np.arange(n) / (n - 1) if targets == "regular" else (np.arange(n) + 0.5) / n
    return xs, y


PERMUTATION_X = np.random.RandomState(7).rand(2, 6)


PERMUTATION_CASES = [(direction, targets) for targets in (None, "regular", "centres")
                     for direction in ("ASCENDING", "DESCENDING")]


@pytest.fixture(scope="module")
def numpy_permutations():
    """n·Pᵀ of the numpy plan (5000 log-domain iterations at ε = 0.1) of every row of
    `PERMUTATION_X` in every case, from one batched numpy run of the 12 problems."""
    problems = [np_sinkhorn_problem(row, direction, targets or "regular")
                for direction, targets in PERMUTATION_CASES for row in PERMUTATION_X]
    xs, ys = (np.stack(parts) for parts in zip(*problems, strict=True))
    n = xs.shape[1]
    plans = n * np.transpose(np_log_sinkhorn_plan(xs, ys, 0.1, 5000), (0, 2, 1))
    return {case: plans[2 * i:2 * i + 2] for i, case in enumerate(PERMUTATION_CASES)}


@pytest.mark.parametrize("direction, targets", PERMUTATION_CASES)
def test_sinkhorn_permutation_matches_numpy_formula(direction, targets, numpy_permutations):
    grid = {} if targets is None else {"targets": targets}  # None: the default, 'regular'
    out = ss.sinkhorn_permutation_matrix(PERMUTATION_X, direction=direction, squash=None,
                                         epsilon=0.1, threshold=1e-10, max_iterations=1000,
                                         **grid).numpy()
    for got, expected in zip(out, numpy_permutations[direction, targets], strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-8)


@pytest.mark.parametrize("dtype, row_tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
def test_sinkhorn_permutation_marginals_are_as_documented(dtype, row_tol):
    """Rows sum to 1 up to rounding; columns up to the reported error (n · error in L1)."""
    s = np.random.RandomState(1).randn(4, 12).astype(dtype)
    for threshold in (1e-2, 1e-3):
        perm, info = ss.sinkhorn_permutation_matrix(s, epsilon=1e-2, threshold=threshold,
                                                    return_info=True)
        perm, error = perm.numpy().astype(np.float64), info.error.numpy()
        np.testing.assert_allclose(perm.sum(-1), 1.0, atol=row_tol)
        column_error = np.abs(perm.sum(-2) - 1.0).sum(-1)
        np.testing.assert_allclose(column_error, 12 * error, rtol=1e-3, atol=10 * row_tol)
        assert np.all(column_error <= 12 * threshold)


@pytest.mark.parametrize("direction", ["ASCENDING", "DESCENDING", "descending"])
def test_quantile_normalization_keeps_the_order_of_x_in_both_directions(direction):
    x = tf.constant([[0.3, -2.0, 1.0, 0.5], [4.0, 3.0, 2.0, 1.0]], tf.float64)
    targets = [10.0, 20.0, 30.0, 40.0]
    out = ss.sinkhorn_quantile_normalization(x, targets, direction=direction, epsilon=1e-4,
                                             threshold=1e-9).numpy()
    hard = np.sort(targets)[np.argsort(np.argsort(x.numpy(), axis=-1), axis=-1)]
    np.testing.assert_allclose(out, hard, atol=1e-3)
    layer = ss.SinkhornQuantileNormalization(num_targets=4, direction=direction, epsilon=1e-4)
    y = layer(x).numpy()
    assert np.all(np.argsort(y, axis=-1) == np.argsort(x.numpy(), axis=-1))

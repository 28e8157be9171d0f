"""Tests of `softsort_tf.ops.sinkhorn`: the documented hard (ε → 0) limits of every
Sinkhorn operator, with input weights and target grids of any size m, against an exact
float64 numpy reference.

In the limit the transport plan is the north-west-corner plan of the sorted inputs
(Prop. 1 of Cuturi et al., 2019): input i holds the mass interval [W_i − a_i, W_i] of
the sorted sample, target bin j the interval [B_j − b_j, B_j], and P_ij is the length
of their overlap. Every read-out is a fixed linear function of that plan.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import softsort_tf as ss
from softsort_tf.ops import sinkhorn as sinkhorn_ops
from softsort_tf.ops.hard_stats import interval_mean

# float64, small ε and a tight threshold: the documented limits to ~1e-6. Where an
# input's mass barely overlaps a bin (a near-degenerate problem) Sinkhorn converges
# slowly; the comparisons then allow for the marginal error the solver reports.
HARD = dict(epsilon=1e-7, threshold=1e-10, max_iterations=20000)
TOL = 1e-6


# Both placements of the targets (`SinkhornOptions.targets`) have the same hard limits.
GRIDS = ["centres", "regular"]


def run(op, *args, **kwargs):
    """`op(*args, **kwargs, **HARD)` as numpy, and the largest reported marginal error."""
    out, info = op(*args, return_info=True, **kwargs, **HARD)
    return out.numpy(), float(np.max(info.error.numpy()))
SETTINGS = settings(max_examples=8, deadline=None, derandomize=True)
directions = st.sampled_from(["ASCENDING", "DESCENDING"])
seeds = st.integers(0, 10_000)


def problem(seed, n, weighted):
    """A row of n well-separated values and positive weights (or None)."""
    rng = np.random.RandomState(seed)
    x = rng.permutation(n) + rng.uniform(-0.3, 0.3, n)
    w = rng.uniform(0.2, 2.0, n) if weighted else None
    return x, w


def hard_plan(x, w, b, direction):
    """The unregularised plan `[n, m]` (overlaps of the mass intervals) and a."""
    n = x.size
    a = np.full(n, 1.0 / n) if w is None else w / w.sum()
    order = np.argsort(-x if direction == "DESCENDING" else x, kind="stable")
    upto = np.empty(n)
    upto[order] = np.cumsum(a[order])
    bins_upto = np.cumsum(b)
    lo = np.maximum((upto - a)[:, None], (bins_upto - b)[None, :])
    hi = np.minimum(upto[:, None], bins_upto[None, :])
    return np.clip(hi - lo, 0.0, None), a, upto


def uniform(m):
    return np.full(m, 1.0 / m)


@pytest.mark.parametrize("grid", GRIDS)
def test_the_issue_examples(grid):
    """Weighted CDF and ranks on a grid of m ≠ n targets (issue 15, item 1)."""
    x = np.array([[0.3, -1.2, 2.0, 0.9, -0.1]])
    ranks = ss.sinkhorn_rank(x, num_targets=50, targets=grid, **HARD).numpy()
    np.testing.assert_allclose(ranks, [[3.0, 1.0, 5.0, 4.0, 2.0]], atol=TOL)
    # Target bins aligned with the cumulative weights resolve the weighted CDF exactly.
    cdf = ss.sinkhorn_cdf(np.array([[1.0, 2.0, 3.0]]), weights=[0.8, 0.1, 0.1],
                          target_weights=[0.8, 0.1, 0.1], targets=grid, **HARD).numpy()
    np.testing.assert_allclose(cdf, [[0.8, 0.9, 1.0]], atol=TOL)
    cdf = ss.sinkhorn_cdf(np.array([[1.0, 2.0, 3.0]]), weights=[0.8, 0.1, 0.1], num_targets=10,
                          targets=grid, **HARD).numpy()
    np.testing.assert_allclose(cdf, [[0.8, 0.9, 1.0]], atol=TOL)


@pytest.mark.parametrize("grid", GRIDS)
@SETTINGS
@given(st.integers(2, 9), st.integers(1, 4), seeds, directions, st.booleans())
def test_rank_and_cdf_limits(grid, n, multiple, seed, direction, weighted):
    x, w = problem(seed, n, weighted)
    rng = np.random.RandomState(seed + 1)
    for m in (n * multiple, int(rng.randint(1, 3 * n + 1))):
        b = uniform(m)
        plan, a, upto = hard_plan(x, w, b, direction)
        centres = np.cumsum(b) - b / 2
        expected = plan @ centres / a + a / 2
        kw = dict(weights=w, num_targets=m, direction=direction, targets=grid)
        cdf, err = run(ss.sinkhorn_cdf, x, **kw)
        tol = TOL + 2 * err / a.min()
        np.testing.assert_allclose(cdf, expected, atol=tol)
        np.testing.assert_allclose(run(ss.sinkhorn_rank, x, **kw)[0], n * expected, atol=n * tol)
        # Always within [a_i, 1] (ranks in [1, n] for uniform weights) and within half
        # a bin of the weighted empirical CDF, exactly it when the grid resolves it.
        assert np.all(cdf >= a - tol) and np.all(cdf <= 1 + tol)
        assert np.abs(cdf - upto).max() <= b.max() / 2 + tol
        if w is None and m % n == 0:
            np.testing.assert_allclose(cdf, upto, atol=tol)
    # Target weights equal to the sorted weights make every W_i a bin boundary.
    if w is not None:
        order = np.argsort(-x if direction == "DESCENDING" else x)
        cdf, err = run(ss.sinkhorn_cdf, x, weights=w, target_weights=w[order],
                       direction=direction, targets=grid)
        np.testing.assert_allclose(cdf, hard_plan(x, w, uniform(n), direction)[2],
                                   atol=TOL + 2 * err / w.min() * w.sum())


@pytest.mark.parametrize("grid", GRIDS)
@SETTINGS
@given(st.integers(2, 9), st.integers(1, 12), seeds, directions, st.booleans())
def test_sort_quantile_normalisation_and_mask_limits(grid, n, m, seed, direction, weighted):
    x, w = problem(seed, n, weighted)
    rng = np.random.RandomState(seed + 2)
    b = rng.uniform(0.2, 1.0, m)
    b /= b.sum()
    plan, a, _ = hard_plan(x, w, b, direction)
    kw = dict(weights=w, direction=direction, targets=grid)
    scale = np.abs(x).max()
    # Sort: bin j gets the mean of x over the cumulative mass [B_j − b_j, B_j].
    s, err = run(ss.sinkhorn_sort, x, target_weights=b, **kw)
    tol = 10 * TOL + 2 * err * scale / b.min()
    np.testing.assert_allclose(s, plan.T @ x / b, atol=tol)
    sign = -1.0 if direction == "DESCENDING" else 1.0
    bounds = np.concatenate([[0.0], np.cumsum(b)])
    means = [sign * float(interval_mean(sign * x, lo, min(hi, 1.0), weights=w))
             for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    np.testing.assert_allclose(s, means, atol=tol)
    # Quantile normalisation (ascending; its `direction` is handled with issue 9): the
    # overlap-weighted mean of the sorted target values.
    f = rng.randn(m) * 3
    out, err = run(ss.sinkhorn_quantile_normalization, x, f, target_weights=b, weights=w,
                   targets=grid)
    plan_up, _, _ = hard_plan(x, w, b, "ASCENDING")
    np.testing.assert_allclose(out, plan_up @ np.sort(f) / a,
                               atol=10 * TOL + 2 * err * np.abs(f).max() / a.min())
    # Quantiles: the mean over the window [τ − t/2, τ + t/2].
    tau = float(rng.uniform(0.2, 0.8))
    q, err = run(ss.sinkhorn_quantile, x, tau, **kw)
    qb, _ = sinkhorn_ops.quantile_target_weights(tau, n=None if weighted else n)
    plan_q, _, _ = hard_plan(x, w, qb, direction)
    tol = 10 * TOL + 2 * err * scale / qb.min()
    np.testing.assert_allclose(q, plan_q[:, 1] @ x / qb[1], atol=tol)
    if not weighted:  # the default width makes it numpy's averaged inverted CDF
        level = tau if direction == "ASCENDING" else 1 - tau
        np.testing.assert_allclose(q, np.quantile(x, level, method="averaged_inverted_cdf"),
                                   atol=tol)
    # Top-k mask: the fraction of each input's mass inside the first k/n.
    if n > 1:
        k = int(rng.randint(1, n))
        mask, err = run(ss.sinkhorn_topk, x, k, **kw)
        plan_k, _, _ = hard_plan(x, w, np.array([k / n, 1 - k / n]), direction)
        np.testing.assert_allclose(mask, plan_k[:, 0] / a, atol=TOL + 2 * err / a.min())
        top, err = run(ss.sinkhorn_sort, x, topk=k, direction=direction, targets=grid)
        np.testing.assert_allclose(top, np.sort(sign * x)[:k] * sign,
                                   atol=10 * TOL + 2 * err * scale * n)


@pytest.mark.parametrize("grid", GRIDS)
@SETTINGS
@given(st.integers(1, 9), seeds, directions)
def test_permutation_matrix_limit(grid, n, seed, direction):
    x, _ = problem(seed, n, False)
    p, err = run(ss.sinkhorn_permutation_matrix, x, direction=direction, targets=grid)
    plan, _, _ = hard_plan(x, None, uniform(n), direction)
    np.testing.assert_allclose(p, n * plan.T, atol=TOL + 2 * n * err)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("m", [3, 7, 40])
def test_ranks_stay_in_range_at_every_epsilon(m, grid):
    """Soft ranks of uniform weights lie in [1, n] for any grid size (up to threshold)."""
    x = np.random.RandomState(0).randn(4, 10)
    for eps in (1e-4, 1e-2, 1.0):
        r = ss.sinkhorn_rank(x, num_targets=m, epsilon=eps, threshold=1e-9, targets=grid,
                             max_iterations=20000).numpy()
        assert r.min() >= 1 - 1e-6 and r.max() <= 10 + 1e-6

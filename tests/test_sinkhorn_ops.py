"""Property tests of the Sinkhorn operators against exact numpy/scipy references."""

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import softsort_tf as ss
from softsort_tf.ops import sinkhorn as sinkhorn_ops
from softsort_tf.ops import squash as squash_lib
from softsort_tf.ops import transport as transport_lib
from softsort_tf.solvers import sinkhorn as sinkhorn_solver


def _diff(implicit: bool, solver: str = "auto"):
    """`implicit_diff` of an implicit (True) or unrolled (False) solve."""
    return ss.ImplicitDiff(solver=solver) if implicit else None

HARD = dict(epsilon=1e-5, threshold=1e-6, max_iterations=3000)
SETTINGS = settings(max_examples=15, deadline=None)


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


# ---------------------------------------------------------------------------------
# Hard limit: small ε gives the exact values.
# ---------------------------------------------------------------------------------
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
    mask = ss.sinkhorn_topk_mask(x, k, axis=axis, direction=direction, **HARD).numpy()
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


# ---------------------------------------------------------------------------------
# Marginals, equivariance, monotonicity, ties.
# ---------------------------------------------------------------------------------
def random_problem(seed, n, m):
    """A batch of 3 random transport problems: x `[3, n]`, sorted y `[m]`, weights a, b."""
    rng = np.random.RandomState(seed)
    x = rng.rand(3, n)
    a = rng.uniform(0.2, 1.0, (3, n))
    a /= a.sum(-1, keepdims=True)
    b = rng.uniform(0.2, 1.0, m)
    b /= b.sum()
    return x, np.sort(rng.rand(m)), a, b


@SETTINGS
@given(st.integers(2, 20), st.integers(1, 12), st.floats(1e-3, 1.0), seeds,
       st.sampled_from([1.5, 2.0, 3.0]))
def test_plan_marginals(n, m, eps, seed, power):
    x, y, a, b = random_problem(seed, n, m)
    threshold = 1e-4
    res = sinkhorn_solver.solve(x, y, a, b, epsilon=eps, power=power, threshold=threshold,
                                max_iterations=20000)
    plan = res.plan().numpy()
    row_err = np.abs(plan.sum(2) - a).sum(-1)
    np.testing.assert_array_less(row_err, threshold)
    np.testing.assert_allclose(plan.sum(1), np.broadcast_to(b, (3, m)), atol=1e-9)
    np.testing.assert_allclose(res.error.numpy(), row_err, rtol=1e-6, atol=1e-12)
    assert np.all(res.num_iterations.numpy() <= 20000)


@SETTINGS
@given(st.integers(2, 20), st.integers(1, 12), st.floats(1e-3, 1.0), seeds,
       st.booleans())
def test_input_exact_plan_marginals(n, m, eps, seed, implicit):
    """exact_marginal='input': rows equal a, columns are within the reported error."""
    x, y, a, b = random_problem(seed, n, m)
    res = sinkhorn_solver.solve(x, y, a, b, epsilon=eps, threshold=1e-4,
                                max_iterations=20000, implicit_diff=_diff(implicit),
                                exact_marginal="input")
    plan = res.plan().numpy()
    np.testing.assert_allclose(plan.sum(2), a, atol=1e-9)
    col_err = np.abs(plan.sum(1) - b).sum(-1)
    np.testing.assert_array_less(col_err, res.error.numpy() + 1e-12)
    np.testing.assert_array_less(res.error.numpy(), 1e-4)
    # Same potentials g as the default plan: both are read from the same iterate.
    target = sinkhorn_solver.solve(x, y, a, b, epsilon=eps, threshold=1e-4,
                                   max_iterations=20000, implicit_diff=_diff(implicit))
    np.testing.assert_allclose(res.g.numpy(), target.g.numpy(), atol=1e-9)


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
    r = ss.sinkhorn_rank(x, **kw).numpy()
    r_perm = ss.sinkhorn_rank(x[:, perm], **kw).numpy()
    np.testing.assert_allclose(r_perm, r[:, perm], atol=1e-6)
    s = ss.sinkhorn_sort(x, **kw).numpy()
    np.testing.assert_allclose(ss.sinkhorn_sort(x[:, perm], **kw).numpy(), s, atol=1e-6)


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


@SETTINGS
@given(st.integers(2, 12), seeds, st.floats(1e-20, 1e20))
def test_weighted_standardisation(n, seed, scale):
    """Weighted mean 0 and weighted variance 1; zero-weight entries change nothing."""
    rng = np.random.RandomState(seed)
    x = rng.randn(3, n) * scale
    w = rng.uniform(0.1, 1.0, (3, n))
    z = squash_lib.standardize(x, weights=w).numpy()
    wn = w / w.sum(1, keepdims=True)
    np.testing.assert_allclose((wn * z).sum(1), 0.0, atol=1e-9)
    np.testing.assert_allclose((wn * z * z).sum(1), 1.0, rtol=1e-9)
    expected = (x - (wn * x).sum(1, keepdims=True))
    expected /= np.sqrt((wn * expected**2).sum(1, keepdims=True))
    np.testing.assert_allclose(z, expected, rtol=1e-7, atol=1e-9)
    # Uniform weights give the unweighted standardisation.
    np.testing.assert_allclose(squash_lib.standardize(x, weights=np.ones_like(x)).numpy(),
                               squash_lib.standardize(x).numpy(), rtol=1e-9, atol=1e-12)
    # A zero-weight outlier, however large, leaves the squashed values of the others alone.
    outlier = np.concatenate([x, np.full((3, 1), 1e30 * np.sign(scale))], axis=1)
    w0 = np.concatenate([w, np.zeros((3, 1))], axis=1)
    s = squash_lib.squash_values(outlier, weights=w0).numpy()
    np.testing.assert_allclose(s[:, :n], squash_lib.squash_values(x, weights=w).numpy(),
                               rtol=1e-9, atol=1e-12)
    assert np.all(np.isfinite(s)) and np.all(s[:, n] > 0.99)


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


@pytest.mark.parametrize("scale", [1e-30, 1e-10, 1.0, 1e10, 1e30])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_extreme_magnitudes_are_finite(scale, dtype):
    x = tf.constant(np.random.RandomState(0).randn(2, 6) * scale, dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        outs = [ss.sinkhorn_rank(x), ss.sinkhorn_sort(x), ss.sinkhorn_quantile(x, 0.5),
                ss.sinkhorn_cdf(x), ss.sinkhorn_topk_mask(x, 2)]
        loss = tf.add_n([tf.reduce_sum(o) for o in outs[::2]])
    for o in outs:
        assert np.all(np.isfinite(o.numpy()))
    assert np.all(np.isfinite(tape.gradient(loss, x).numpy()))
    r = outs[0].numpy()
    np.testing.assert_array_equal(np.argsort(r, 1), np.argsort(x.numpy(), 1))


# ---------------------------------------------------------------------------------
# Gradients.
# ---------------------------------------------------------------------------------
GRAD_KW = dict(epsilon=0.05, threshold=1e-13, max_iterations=20000)


@pytest.mark.parametrize("implicit", [True, False])
@pytest.mark.parametrize("op", ["rank", "sort", "quantile", "qnorm", "topk"])
def test_gradients_match_finite_differences(op, implicit):
    x = tf.constant(np.random.RandomState(1).randn(2, 5), tf.float64)
    fns = {
        "rank": lambda v: ss.sinkhorn_rank(v, implicit_diff=_diff(implicit), **GRAD_KW),
        "sort": lambda v: ss.sinkhorn_sort(v, implicit_diff=_diff(implicit), direction="DESCENDING",
                                           **GRAD_KW),
        "quantile": lambda v: ss.sinkhorn_quantile(v, [0.3, 0.7], implicit_diff=_diff(implicit),
                                                   **GRAD_KW),
        "qnorm": lambda v: ss.sinkhorn_quantile_normalization(
            v, [0.0, 1.0, 5.0], implicit_diff=_diff(implicit), power=1.5, **GRAD_KW),
        # Two target bins converge slowly at ε = 0.05: a larger ε reaches the threshold.
        "topk": lambda v: ss.sinkhorn_topk_mask(v, 2, implicit_diff=_diff(implicit),
                                                **{**GRAD_KW, "epsilon": 0.3}),
    }
    theoretical, numerical = tf.test.compute_gradient(fns[op], [x], delta=1e-5)
    assert np.abs(theoretical[0]).max() > 1e-3  # a real, non-zero Jacobian
    np.testing.assert_allclose(theoretical[0], numerical[0], atol=2e-5, rtol=1e-3)


@pytest.mark.parametrize("implicit", [True, False])
def test_gradients_wrt_weights_match_finite_differences(implicit):
    rng = np.random.RandomState(2)
    x = tf.constant(rng.randn(2, 5), tf.float64)
    w = tf.constant(rng.uniform(0.5, 1.5, (2, 5)), tf.float64)
    tw = tf.constant([0.2, 0.5, 0.3], tf.float64)

    def f_a(w_):
        return ss.sinkhorn_cdf(x, weights=w_, num_targets=3, implicit_diff=_diff(implicit),
                               **GRAD_KW)

    def f_b(tw_):
        return ss.sinkhorn_sort(x, target_weights=tw_, implicit_diff=_diff(implicit), **GRAD_KW)

    for f, arg in [(f_a, w), (f_b, tw)]:
        theoretical, numerical = tf.test.compute_gradient(f, [arg], delta=1e-5)
        assert np.abs(theoretical[0]).max() > 1e-3
        np.testing.assert_allclose(theoretical[0], numerical[0], atol=2e-5, rtol=1e-3)


@pytest.mark.parametrize("solver", ["cg", "dense"])
def test_implicit_and_unrolled_gradients_agree(solver):
    x = tf.constant(np.random.RandomState(3).randn(4, 40), tf.float64)
    weights = tf.constant(np.random.RandomState(4).randn(4, 40), tf.float64)

    def grad(implicit):
        with tf.GradientTape() as tape:
            tape.watch(x)
            r = ss.sinkhorn_rank(x, epsilon=1e-2, threshold=1e-12, max_iterations=20000,
                                 implicit_diff=_diff(implicit, solver))
            loss = tf.reduce_sum(r * weights)
        return tape.gradient(loss, x).numpy()

    g_imp, g_unr = grad(True), grad(False)
    assert np.abs(g_imp).max() > 1e-2
    np.testing.assert_allclose(g_imp, g_unr, atol=1e-6 * np.abs(g_unr).max())


def test_cg_and_dense_implicit_solvers_agree_float32():
    x = tf.constant(np.random.RandomState(5).rand(8, 50), tf.float32)
    v = tf.constant(np.random.RandomState(6).randn(8, 50), tf.float32)

    def grad(solver):
        with tf.GradientTape() as tape:
            tape.watch(x)
            s = ss.sinkhorn_sort(x, epsilon=1e-2, squash=None,
                                 implicit_diff=ss.ImplicitDiff(solver=solver))
            loss = tf.reduce_sum(s * v)
        return tape.gradient(loss, x).numpy()

    np.testing.assert_allclose(grad("cg"), grad("dense"), atol=2e-3 * np.abs(grad("dense")).max())


@pytest.mark.parametrize("op", ["rank", "topk"])
def test_float32_gradients_in_the_hard_regime_match_float64_in_every_mode(op):
    """float32 implicit gradients at small ε were rounding noise (ranks at ε = 1e-4 off by
    19 where |g| ≤ 3.3) and differed between eager, graph and XLA (issue 15, item 4)."""
    rng = np.random.RandomState(15)
    x, w = rng.randn(3, 10), rng.randn(3, 10)
    fns = {
        "rank": lambda v, e: ss.sinkhorn_rank(v, epsilon=e),
        "topk": lambda v, e: ss.sinkhorn_topk_mask(v, 3, epsilon=e),
    }

    def grad(v, eps):
        with tf.GradientTape() as tape:
            tape.watch(v)
            out = fns[op](v, eps)
            loss = tf.reduce_sum(out * tf.cast(w[:, :out.shape[-1]], v.dtype))
        return tape.gradient(loss, v)

    graph = tf.function(grad)
    xla = tf.function(grad, jit_compile=True)
    for eps in (1e-3, 1e-4, 1e-5):
        g64 = grad(tf.constant(x), eps).numpy()
        tol = 2e-3 * np.abs(g64).max() + 1e-5
        x32 = tf.constant(x, tf.float32)
        for mode in (grad, graph, xla) if eps == 1e-4 else (grad,):  # compiles are slow
            g32 = mode(x32, eps).numpy()
            np.testing.assert_allclose(g32, g64, atol=tol, err_msg=f"ε = {eps}, {mode}")


def test_reproducibility_between_identical_calls_is_as_documented():
    """Issue 15, item 10: `implicit_diff=None` gradients differed between identical calls.
    As documented: forward values and implicit gradients are bit-identical (eager and
    graph), unrolled gradients bit-identical eagerly and within a few ulps of the largest
    entry under `tf.function`."""
    rng = np.random.RandomState(16)
    x = tf.constant(rng.randn(8, 100), tf.float32)
    w = tf.constant(rng.randn(8, 100), tf.float32)

    def with_grad(v, implicit):
        with tf.GradientTape() as tape:
            tape.watch(v)
            r = ss.sinkhorn_rank(v, implicit_diff=_diff(implicit))
            loss = tf.reduce_sum(r * w)
        return r.numpy(), tape.gradient(loss, v).numpy()

    for implicit in (True, False):
        eager = [with_grad(x, implicit) for _ in range(3)]
        for r, g in eager[1:]:
            np.testing.assert_array_equal(r, eager[0][0])
            np.testing.assert_array_equal(g, eager[0][1])

    @tf.function
    def graph_grad(v, implicit):
        with tf.GradientTape() as tape:
            tape.watch(v)
            r = ss.sinkhorn_rank(v, implicit_diff=_diff(implicit))
            loss = tf.reduce_sum(r * w)
        return r, tape.gradient(loss, v)

    for implicit in (True, False):
        runs = [[t.numpy() for t in graph_grad(x, implicit)] for _ in range(4)]
        scale = np.abs(runs[0][1]).max()
        for r, g in runs[1:]:
            np.testing.assert_array_equal(r, runs[0][0])
            if implicit:
                np.testing.assert_array_equal(g, runs[0][1])
            else:
                np.testing.assert_allclose(g, runs[0][1], rtol=0,
                                           atol=4 * np.spacing(np.float32(scale)))


# ---------------------------------------------------------------------------------
# Solver behaviour: warm start, annealing, frozen rows, info, XLA.
# ---------------------------------------------------------------------------------
def test_speedups_do_not_change_the_answer_and_warm_start_saves_iterations():
    x = np.random.RandomState(7).rand(6, 100)
    kw = dict(epsilon=1e-3, squash=None, threshold=1e-6, max_iterations=20000,
              return_info=True)
    ref, info_cold = ss.sinkhorn_rank(x, initializer="zeros", check_every=1, **kw)
    warm, info_warm = ss.sinkhorn_rank(x, **kw)
    anneal, _ = ss.sinkhorn_rank(x, initializer="zeros", epsilon_start=1.0, epsilon_decay=0.8,
                                 **kw)
    np.testing.assert_allclose(warm.numpy(), ref.numpy(), atol=1e-3)
    np.testing.assert_allclose(anneal.numpy(), ref.numpy(), atol=1e-3)
    assert info_warm.num_iterations.numpy().max() < info_cold.num_iterations.numpy().min()


def np_exact_target_potential(x, y):
    """Exact 1-D dual potential for uniform weights and n = m (squared cost), numpy.

    With n = m every boundary B_j = j/n is a tie between the j-th and (j+1)-th smallest
    inputs, so x*_j is their midpoint and g_{j+1} − g_j = c(x*_j, y_{j+1}) − c(x*_j, y_j).
    """
    xs = np.sort(x, axis=-1)
    x_star = 0.5 * (xs[:, :-1] + xs[:, 1:])
    inc = (x_star - y[1:]) ** 2 - (x_star - y[:-1]) ** 2
    g = np.concatenate([np.zeros_like(inc[:, :1]), np.cumsum(inc, axis=-1)], axis=-1)
    return g - g.mean(-1, keepdims=True)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_warm_start_is_the_exact_potential_in_float32_and_under_xla(jit_compile):
    """Ties of the cumulative masses are found despite float32 running-sum drift.

    Regression: under XLA a constant-folded cumulative sum of 1/n and a run-time one
    differed by ~1e-5 at n = 1000, which split exact ties at random: the warm start was
    off by 4e-4 (0.04 ε) and XLA needed twice the iterations of eager mode.
    """
    n = 1000
    x = np.random.RandomState(11).rand(2, n)
    y = np.linspace(0.0, 1.0, n)

    def potential(x_):
        batch = tf.shape(x_)[0]
        yb = tf.broadcast_to(tf.constant(y, x_.dtype)[None], tf.stack([batch, n]))
        a = tf.fill(tf.stack([batch, n]), tf.constant(1.0 / n, x_.dtype))
        b = tf.fill(tf.stack([batch, n]), tf.cast(1.0, x_.dtype) / tf.cast(n, x_.dtype))
        return sinkhorn_solver.exact_target_potential(x_, a, yb, b, 2.0)

    fn = tf.function(potential, jit_compile=True) if jit_compile else potential
    g = fn(tf.constant(x, tf.float32)).numpy()
    np.testing.assert_allclose(g, np_exact_target_potential(x, y), atol=1e-6)
    g64 = fn(tf.constant(x, tf.float64)).numpy()
    np.testing.assert_allclose(g64, np_exact_target_potential(x, y), atol=1e-12)


def test_converged_rows_do_not_drift():
    """A row's result and iteration count do not depend on the rest of the batch."""
    rng = np.random.RandomState(8)
    quick = np.tanh(rng.randn(1, 30)) * 0.5 + 0.5
    slow = np.sort(rng.rand(1, 30)) ** 4  # crowded near 0: many iterations at small ε
    kw = dict(epsilon=1e-3, threshold=1e-4, max_iterations=3000, squash=None,
              initializer="zeros", return_info=True)
    rows = [ss.sinkhorn_sort(r, **kw) for r in (quick, slow)]
    both, info_both = ss.sinkhorn_sort(np.concatenate([quick, slow]), **kw)
    n_both = info_both.num_iterations.numpy()
    assert n_both[0] != n_both[1]
    for i, (alone, info_alone) in enumerate(rows):
        assert n_both[i] == info_alone.num_iterations.numpy()[0]
        # Sorted values are read out around the row's median (`Transport.sorted_values`):
        # agreement to float64 rounding of that centre (~1e-16 · 0.1), not of each value.
        np.testing.assert_allclose(both.numpy()[i], alone.numpy()[0], rtol=1e-12, atol=1e-14)


def test_info_reports_iterations_and_error_with_batch_shape():
    x = np.random.RandomState(9).randn(2, 3, 10)
    r, info = ss.sinkhorn_rank(x, axis=1, return_info=True, threshold=1e-4)
    assert r.shape == (2, 3, 10)
    assert info.num_iterations.shape == (2, 10) and info.error.shape == (2, 10)
    assert np.all(info.error.numpy() < 1e-4)
    _, info = ss.sinkhorn_rank(x, return_info=True, epsilon=1e-4, max_iterations=7,
                               initializer="zeros", threshold=1e-12)
    assert np.all(info.num_iterations.numpy() <= 10)  # rounded up to check_every = 5
    assert np.all(info.error.numpy() > 1e-12)


@pytest.mark.parametrize("op", ["rank", "sort", "cdf", "quantile", "qnorm", "topk", "perm"])
def test_xla_matches_eager(op):
    x = tf.constant(np.random.RandomState(10).randn(3, 4, 9), tf.float32)
    fns = {
        "rank": lambda v: ss.sinkhorn_rank(v, axis=1),
        "sort": lambda v: ss.sinkhorn_sort(v, topk=3, direction="DESCENDING"),
        "cdf": lambda v: ss.sinkhorn_cdf(v, axis=0, threshold=1e-5),
        "quantile": lambda v: ss.sinkhorn_quantile(v, [0.25, 0.5]),
        "qnorm": lambda v: ss.sinkhorn_quantile_normalization(v, [1.0, 2.0, 4.0]),
        "topk": lambda v: ss.sinkhorn_topk_mask(v, 3, implicit_diff=None),
        "perm": lambda v: ss.sinkhorn_permutation_matrix(v),
    }
    f = fns[op]

    def with_grad(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            out = f(v)
            loss = tf.reduce_sum(tf.sin(out))
        return out, tape.gradient(loss, v)

    eager_out, eager_grad = with_grad(x)
    xla_out, xla_grad = tf.function(with_grad, jit_compile=True)(x)
    np.testing.assert_allclose(xla_out.numpy(), eager_out.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(xla_grad.numpy(), eager_grad.numpy(), atol=1e-3, rtol=1e-3)


# ---------------------------------------------------------------------------------
# Dtypes and bad input.
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_dtypes(dtype):
    x32 = np.random.RandomState(11).randn(2, 6).astype(np.float32)
    x = tf.cast(x32, dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        r = ss.sinkhorn_rank(x)
        loss = tf.reduce_sum(tf.cast(r, tf.float32) * tf.range(6, dtype=tf.float32))
    g = tape.gradient(loss, x)
    assert r.dtype == dtype and g.dtype == dtype
    ref = ss.sinkhorn_rank(tf.cast(x, tf.float32)).numpy()
    tol = {tf.float16: 1e-2, tf.bfloat16: 5e-2}.get(dtype, 1e-5)
    np.testing.assert_allclose(tf.cast(r, tf.float32).numpy(), ref, rtol=tol, atol=tol * 6)
    assert np.all(np.isfinite(tf.cast(g, tf.float32).numpy()))
    assert ss.sinkhorn_quantile(x, 0.5).dtype == dtype


@pytest.mark.parametrize("dtype, out_dtype", [(tf.int32, tf.float32), (tf.int64, tf.float64),
                                              (tf.uint32, tf.float32)])
def test_large_integers_stay_distinct(dtype, out_dtype):
    """Integers above 2²⁴ collapsed into ties in float32 (issue 15, item 8)."""
    big = np.array([[16777217, 16777216, 16777218, 16777219]])
    x = tf.constant(big, dtype)
    ranks = ss.sinkhorn_rank(x, epsilon=1e-3)
    assert ranks.dtype == out_dtype
    np.testing.assert_allclose(ranks.numpy(), [[2, 1, 3, 4]], atol=1e-3)
    np.testing.assert_array_equal(ss.rankdata(x).numpy(), [[2, 1, 3, 4]])
    s = ss.sinkhorn_sort(x, epsilon=1e-3)
    assert s.dtype == out_dtype
    if out_dtype == tf.float64:
        np.testing.assert_allclose(s.numpy(), np.sort(big), rtol=0, atol=1e-3)
    np.testing.assert_allclose(ss.soft_sort_matrix(x, tau=0.01).numpy()[0],
                               np.eye(4)[[3, 2, 0, 1]], atol=1e-6)
    assert ss.hard_permutation_matrix(x).dtype == out_dtype


def test_nan_propagates_without_hanging_and_can_raise():
    x = np.random.RandomState(12).randn(3, 6)
    x[1, 2] = np.nan
    x[2, 0] = np.inf
    r, info = ss.sinkhorn_rank(x, return_info=True, max_iterations=100_000)
    r = r.numpy()
    assert np.all(np.isfinite(r[0]))
    assert np.all(np.isnan(r[1]))
    assert not np.all(np.isfinite(r[2]))
    assert info.num_iterations.numpy().max() < 100
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf"):
        ss.sinkhorn_rank(x, check_numerics=True)


BAD_CALLS = [
    (lambda: ss.sinkhorn_rank([1.0, 2.0], epsilon=0.0), "epsilon"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], epsilon=-1.0), "epsilon"),
    (lambda: ss.sinkhorn_sort([1.0, 2.0], power=0.0), "power"),
    (lambda: ss.sinkhorn_cdf([1.0, 2.0], threshold=0.0), "threshold"),
    (lambda: ss.sinkhorn_cdf([1.0, 2.0], max_iterations=0), "max_iterations"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], 0.0), "quantiles"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], 1.0), "quantiles"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], [0.6, 0.4]), "increasing"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], [0.4, 0.4]), "increasing"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], 0.5, width=1.0), "width"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], [0.4, 0.5], width=0.2), "width"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], 0.05, width=0.2), "width"),
    (lambda: ss.sinkhorn_topk_mask([1.0, 2.0, 3.0], 0), "`k`"),
    (lambda: ss.sinkhorn_topk_mask([1.0, 2.0, 3.0], 3), "`k`"),
    (lambda: ss.sinkhorn_sort([1.0, 2.0, 3.0], topk=3), "topk"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], direction="UP"), "direction"),
    (lambda: ss.sinkhorn_rank([[1.0, 2.0]], axis=2), "axis"),
    (lambda: ss.sinkhorn_rank([[1.0, 2.0]], axis=-3), "axis"),
    (lambda: ss.sinkhorn_rank(3.0), "rank"),
    (lambda: ss.sinkhorn_rank(np.zeros([2, 0])), "n = 0"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], squash="tanh"), "squash"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], weights=[1.0, 2.0, 3.0]), "weights"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], epsilon_start=1.0, epsilon_decay=1.5),
     "epsilon_decay"),
    # Issue 15: raw TensorFlow errors (or silent NaN) before.
    (lambda: ss.sinkhorn_rank([1.0, 2.0], num_targets=0), "num_targets"),
    (lambda: ss.sinkhorn_cdf([1.0, 2.0], num_targets=-1), "num_targets"),
    (lambda: ss.sinkhorn_sort([1.0, 2.0], num_targets=2.5), "num_targets"),
    (lambda: ss.sinkhorn_rank(np.zeros([3, 4]), weights=np.ones([1, 4])), "weights"),
    (lambda: ss.sinkhorn_rank(np.zeros([3, 4]), weights=[1.0, -1.0, 1.0, 1.0]), "weights"),
    (lambda: ss.sinkhorn_rank(np.zeros([3, 4]), weights=np.zeros([3, 4])), "weights"),
    (lambda: ss.sinkhorn_sort([1.0, 2.0, 3.0], target_weights=[0.5, 0.0, 0.5]),
     "target_weights"),
    (lambda: ss.sinkhorn_sort([1.0, 2.0, 3.0], target_weights=[0.5, -0.1, 0.5]),
     "target_weights"),
    (lambda: ss.sinkhorn_cdf([1.0, 2.0, 3.0], target_weights=[0.5, np.nan]),
     "target_weights"),
    (lambda: ss.sinkhorn_quantile_normalization(np.zeros([3, 4]), np.zeros([2, 5])),
     "target_values"),
    (lambda: ss.sinkhorn_quantile_normalization(np.zeros([2, 5, 3]), np.zeros([3, 2, 4]),
                                                axis=1), "target_values"),
    (lambda: ss.sinkhorn_quantile_normalization(np.zeros([2, 5, 3]), np.zeros([6, 4]),
                                                axis=1), "target_values"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], power=1.0), "power"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], power=0.5), "power"),
]


@pytest.mark.parametrize("call,match", BAD_CALLS)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("op", [ss.sinkhorn_sort, ss.sinkhorn_rank,
                                lambda v, **kw: ss.sinkhorn_topk_mask(v, 2, **kw)])
def test_epsilon_below_what_the_dtype_resolves_is_rejected(op):
    """float32 sorts exploded to 1e9 at ε = 1e-10 and inf from 1e-11 (issue 15, item 3)."""
    x = np.random.RandomState(14).randn(3, 8)
    for eps in (1e-7, 1e-11):
        with pytest.raises(ValueError, match="`epsilon`.*float32.*float64"):
            op(x.astype(np.float32), epsilon=eps)
    with pytest.raises(ValueError, match="`epsilon`.*float64"):
        op(x, epsilon=1e-16)
    # At the smallest accepted ε each dtype converges to a finite, nearly hard result.
    for dtype in (np.float32, np.float64):
        eps = transport_lib.min_epsilon(dtype)
        out, info = op(x.astype(dtype), epsilon=eps, return_info=True)
        assert np.all(info.error.numpy() < 1e-3)
        assert np.all(np.isfinite(out.numpy()))
    s = ss.sinkhorn_sort(x.astype(np.float32), epsilon=transport_lib.min_epsilon(
        np.float32)).numpy()
    np.testing.assert_allclose(s, np.sort(x, axis=1), atol=1e-2)


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


ONE_ITEM_OPS = {
    "rank": lambda v: ss.sinkhorn_rank(v),
    "cdf": lambda v: ss.sinkhorn_cdf(v),
    "sort": lambda v: ss.sinkhorn_sort(v),
    "quantile": lambda v: ss.sinkhorn_quantile(v, [0.25, 0.5]),
    "normalization": lambda v: ss.sinkhorn_quantile_normalization(v, [3.0]),
    "matrix": lambda v: ss.sinkhorn_permutation_matrix(v),
    "topk_masked": lambda v: ss.sinkhorn_topk_mask(v, 1, mask=tf.ones_like(v) > 0),
}


@pytest.mark.parametrize("jit_compile", [None, True])
@pytest.mark.parametrize("name", sorted(ONE_ITEM_OPS))
def test_one_item_lists_of_unknown_length_equal_the_static_result(name, jit_compile):
    """Lists of one item with n unknown at trace time: the same values as with a
    static n (rank 1, CDF 1, the value itself as its sort, the 1 × 1 matrix 1)."""
    op = ONE_ITEM_OPS[name]
    x = tf.constant([[0.7], [-2.0]])
    expected = op(x).numpy()
    traced = tf.function(op, input_signature=[tf.TensorSpec([None, None])],
                         jit_compile=jit_compile)
    got = traced(x).numpy()
    assert got.shape == expected.shape
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_one_item_lists_hard_values_and_ragged_groups_of_single_items():
    x = tf.constant([[0.7]])
    np.testing.assert_allclose(ss.sinkhorn_rank(x).numpy(), [[1.0]])
    np.testing.assert_allclose(ss.sinkhorn_cdf(x).numpy(), [[1.0]])
    ragged = tf.ragged.constant([[0.3], [2.0, 1.0, 3.0], [5.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    ranks = ss.sinkhorn_rank(ragged, epsilon=1e-3)
    np.testing.assert_allclose(ranks[0].numpy(), [1.0])
    np.testing.assert_allclose(ranks[1].numpy(), [2.0, 1.0, 3.0], atol=1e-3)
    sort = ss.sinkhorn_sort(ragged, epsilon=1e-3)
    np.testing.assert_allclose(sort[0].numpy(), [0.3], rtol=1e-6)
    traced = tf.function(lambda r: ss.sinkhorn_sort(r, epsilon=1e-3), input_signature=[
        tf.RaggedTensorSpec([None, None], tf.float32, 1)])
    np.testing.assert_allclose(traced(ragged)[0].numpy(), [0.3], rtol=1e-6)


EMPTY_ROW_OPS = {
    "rank": ss.sinkhorn_rank,
    "sort": ss.sinkhorn_sort,
    "topk_sort": lambda v: ss.sinkhorn_sort(v, topk=1),
    "quantile": lambda v: ss.sinkhorn_quantile(v, 0.5),
    "topk_mask": lambda v: ss.sinkhorn_topk_mask(v, 1),
    "sinkhorn_matrix": ss.sinkhorn_permutation_matrix,
    "softsort_matrix": ss.soft_sort_matrix,
    "hard_matrix": ss.hard_permutation_matrix,
}


@pytest.mark.parametrize("name", sorted(EMPTY_ROW_OPS))
def test_eager_ragged_batches_with_empty_lists(name):
    """A length group made only of empty lists (eager mode) gives empty rows (0 for
    per-list outputs); the other lists are those of the batch without the empty ones."""
    op = EMPTY_ROW_OPS[name]
    x = tf.ragged.constant([[], [2.0, 1.0, 3.0], [], [5.0, 4.0]])
    out = op(x)
    without = op(tf.ragged.constant([[2.0, 1.0, 3.0], [5.0, 4.0]]))
    if isinstance(out, tf.RaggedTensor):
        assert out[0].shape[0] == 0 and out[2].shape[0] == 0
        np.testing.assert_allclose(out[1].numpy(), without[0].numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(out[3].numpy(), without[1].numpy(), rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_allclose(out.numpy()[[0, 2]], 0.0)
        np.testing.assert_allclose(out.numpy()[[1, 3]], without.numpy(), rtol=1e-6)

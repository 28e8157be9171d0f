"""LapSum operators (softsort_tf.ops.lapsum) against a float64 numpy reference written
from the definition F(x) = Σ_j Lap_α(x − r_j): direct pairwise sums and bisection for
F⁻¹ (never the closed form of the module)."""

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from softsort_tf.ops import lapsum as L


# ---------------------------------------------------------------------------------
# Reference from the definition.
# ---------------------------------------------------------------------------------
def lap(z):
    z = np.asarray(z, np.float64)
    return np.where(z <= 0, 0.5 * np.exp(np.minimum(z, 0)), 1 - 0.5 * np.exp(-np.maximum(z, 0)))


def big_f(x, r, alpha):
    """F(x) = Σ_j Lap_α(x − r_j) for an array of x (last axis of r summed)."""
    return lap((np.asarray(x)[..., None] - r) / alpha).sum(-1)


def f_inverse(levels, r, alpha):
    """F⁻¹ by bisection: up to 200 halvings of a bracket that contains every solution,
    until a halving leaves every bracket as it was (then so would all the others)."""
    levels = np.asarray(levels, np.float64)
    n = len(r)
    pad = alpha * (40 + np.log(2 * n + 2))
    lo = np.full(levels.shape, r.min() - pad)
    hi = np.full(levels.shape, r.max() + pad)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        above = big_f(mid, r, alpha) > levels
        new_hi, new_lo = np.where(above, mid, hi), np.where(above, lo, mid)
        if np.array_equal(new_hi, hi) and np.array_equal(new_lo, lo):
            break
        hi, lo = new_hi, new_lo
    return 0.5 * (lo + hi)


def ref_rank(r, alpha):
    return 0.5 + big_f(r, r, alpha)


def ref_sort(r, alpha):
    return f_inverse(np.arange(len(r)) + 0.5, r, alpha)


def ref_topk(r, k, alpha):
    # t solves Σ_i Lap_α(r_i − t) = k, i.e. F(t) = n − k.
    t = f_inverse(np.array(len(r) - k, np.float64), r, alpha)
    return lap((r - t) / alpha)


def ref_quantile(r, taus, alpha):
    return f_inverse(len(r) * np.asarray(taus, np.float64), r, alpha)


def ref_permutation(r, alpha):
    """Ascending: row k = inputs landing at position k."""
    n = len(r)
    t = f_inverse(np.arange(1, n, dtype=np.float64), r, alpha)
    lower = np.concatenate([[-np.inf], t])
    upper = np.concatenate([t, [np.inf]])
    return lap((upper[:, None] - r[None]) / alpha) - lap((lower[:, None] - r[None]) / alpha)


def rows(x):
    return np.asarray(x, np.float64).reshape(-1, np.shape(x)[-1])


def scores(shape, seed=0, ties=True):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape)
    if ties and shape[-1] > 3:
        x[..., 2] = x[..., 0]
    return x


# ---------------------------------------------------------------------------------
# Values against the definition.
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.05, 0.5, 3.0])
def test_rank_matches_definition(alpha):
    x = scores([2, 3, 9])
    for direction, sign in (("ASCENDING", 1.0), ("DESCENDING", -1.0)):
        out = L.lapsum_rank(x, alpha, direction).numpy()
        assert out.shape == x.shape and np.all(np.isfinite(out))
        want = np.stack([ref_rank(sign * r, alpha) for r in rows(x)]).reshape(x.shape)
        np.testing.assert_allclose(out, want, atol=1e-12)
        np.testing.assert_allclose(out.sum(-1), 9 * 10 / 2, atol=1e-10)


@pytest.mark.parametrize("alpha", [0.05, 0.5, 3.0])
def test_sort_matches_definition(alpha):
    x = scores([3, 8], seed=1)
    out = L.lapsum_sort(x, alpha).numpy()
    want = np.stack([ref_sort(r, alpha) for r in x])
    np.testing.assert_allclose(out, want, atol=1e-10)
    desc = L.lapsum_sort(x, alpha, "DESCENDING").numpy()
    np.testing.assert_allclose(desc, np.stack([-ref_sort(-r, alpha) for r in x]), atol=1e-10)
    assert np.all(np.diff(out, axis=-1) > 0) and np.all(np.diff(desc, axis=-1) < 0)


@pytest.mark.parametrize("k", [1, 2.5, 4, 6.75])
def test_topk_matches_definition_and_sums_to_k(k):
    x = scores([3, 8], seed=2)
    for alpha in (0.1, 1.0):
        out = L.lapsum_topk(x, k, alpha).numpy()
        np.testing.assert_allclose(out, np.stack([ref_topk(r, k, alpha) for r in x]),
                                   atol=1e-10)
        np.testing.assert_allclose(out.sum(-1), k, atol=1e-10)
        assert np.all((out > 0) & (out < 1))
        low = L.lapsum_topk(x, k, alpha, "ASCENDING").numpy()
        np.testing.assert_allclose(low, np.stack([ref_topk(-r, k, alpha) for r in x]),
                                   atol=1e-10)


def test_quantile_matches_definition():
    x = scores([2, 3, 11], seed=3)
    taus = [0.1, 0.5, 0.77]
    out = L.lapsum_quantile(x, taus, 0.3).numpy()
    assert out.shape == (2, 3, 3)
    want = np.stack([ref_quantile(r, taus, 0.3) for r in rows(x)]).reshape(2, 3, 3)
    np.testing.assert_allclose(out, want, atol=1e-10)
    scalar = L.lapsum_quantile(x, 0.5, 0.3).numpy()
    assert scalar.shape == (2, 3)
    np.testing.assert_allclose(scalar, want[..., 1], atol=1e-10)


def test_permutation_matrix_matches_definition():
    x = scores([2, 7], seed=4)
    for alpha in (0.05, 0.7):
        out = L.lapsum_permutation_matrix(x, alpha, "ASCENDING").numpy()
        np.testing.assert_allclose(out, np.stack([ref_permutation(r, alpha) for r in x]),
                                   atol=1e-10)
        np.testing.assert_allclose(out.sum(-1), 1.0, atol=1e-12)
        np.testing.assert_allclose(out.sum(-2), 1.0, atol=1e-12)
        assert np.all(out >= 0)
        desc = L.lapsum_permutation_matrix(x, alpha).numpy()
        np.testing.assert_allclose(desc, np.stack([ref_permutation(-r, alpha) for r in x]),
                                   atol=1e-10)


# ---------------------------------------------------------------------------------
# Hard limits and structure.
# ---------------------------------------------------------------------------------
def test_hard_limits():
    x = np.array([[2.5, -1.0, 0.3, 4.0, 0.3, 7.0, -3.0]])
    a = 1e-4
    np.testing.assert_allclose(L.lapsum_rank(x, a).numpy(), scipy.stats.rankdata(x, axis=-1),
                               atol=1e-9)
    np.testing.assert_allclose(L.lapsum_rank(x, a, "DESCENDING").numpy(),
                               scipy.stats.rankdata(-x, axis=-1), atol=1e-9)
    np.testing.assert_allclose(L.lapsum_sort(x, a).numpy(), np.sort(x), atol=1e-3)
    np.testing.assert_allclose(L.lapsum_sort(x, a, "DESCENDING").numpy(), -np.sort(-x),
                               atol=1e-3)
    for k in (1, 2, 3, 5):
        hard = np.zeros_like(x)
        hard[0, np.argsort(-x[0])[:k]] = 1.0
        np.testing.assert_allclose(L.lapsum_topk(x, k, a).numpy(), hard, atol=1e-9)
    # A tie at the boundary shares the mass: the 0.3's are 4th/5th largest.
    np.testing.assert_allclose(L.lapsum_topk(x, 4, a).numpy()[0, [2, 4]], [0.5, 0.5],
                               atol=1e-9)
    taus = [0.1, 2 / 7, 0.5, 0.9]
    np.testing.assert_allclose(L.lapsum_quantile(x, taus, a).numpy()[0],
                               np.quantile(x[0], taus, method="averaged_inverted_cdf"),
                               atol=1e-3)
    y = np.array([[0.3, 2.0, 1.0, -1.0]])
    P = L.lapsum_permutation_matrix(y, a).numpy()[0]
    np.testing.assert_allclose(P, np.eye(4)[np.argsort(-y[0])], atol=1e-9)


def test_float32_hard_limit_and_large_temperature():
    x = np.array([[3.0, 1.0, 2.0, 2.0]], np.float32)
    r = L.lapsum_rank(x, 1e-6).numpy()
    assert r.dtype == np.float32
    np.testing.assert_allclose(r, [[4.0, 1.0, 2.5, 2.5]])
    flat = L.lapsum_rank(x, 1e8).numpy()
    np.testing.assert_allclose(flat, 2.5, atol=1e-6)


def test_monotone_in_scores():
    x = scores([4, 30], seed=5, ties=False)
    order = np.argsort(x, axis=-1)
    for out in (L.lapsum_rank(x, 0.3).numpy(), L.lapsum_topk(x, 7, 0.3).numpy()):
        assert np.all(np.diff(np.take_along_axis(out, order, -1), axis=-1) > 0)
    assert np.all(np.diff(L.lapsum_sort(x, 0.3).numpy(), axis=-1) > 0)


def test_long_list_matches_definition():
    rng = np.random.default_rng(6)
    x = rng.normal(size=[1, 2000])
    out = L.lapsum_rank(x, 0.01).numpy()[0]
    np.testing.assert_allclose(out, ref_rank(x[0], 0.01), atol=1e-9)
    sort = L.lapsum_sort(x, 0.01).numpy()[0]
    idx = rng.choice(2000, 40, replace=False)
    np.testing.assert_allclose(sort[idx], f_inverse(idx + 0.5, x[0], 0.01), atol=1e-9)


@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 33, 257])
def test_rank_across_scan_block_boundaries(n):
    """The prefix sums run in blocks of 16: lengths around and across block edges."""
    x = np.random.default_rng(n).normal(size=[2, n])
    out = L.lapsum_rank(x, 0.05).numpy()
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, np.stack([ref_rank(row, 0.05) for row in x]), atol=1e-10)


def test_float32_sort_key_ties_and_special_values():
    """float32 rows are ordered by a packed integer key: ties, ±0, denormals and the
    extremes give the ranks and sort of the float64 computation, eagerly, in a graph
    and under XLA."""
    x = np.array([[0.0, -0.0, 1.0, -1.0, 3e38, -3e38, 1e-45, -1e-45, 1.0, -1.0, 0.0,
                   2.0, 2.0, -2.5]], np.float32)
    want_rank = L.lapsum_rank(x.astype(np.float64), 0.5).numpy()
    want_sort = L.lapsum_sort(x.astype(np.float64), 0.5).numpy()
    both = tf.autograph.experimental.do_not_convert(
        lambda v: (L.lapsum_rank(v, 0.5), L.lapsum_sort(v, 0.5)))
    for fn in (both, tf.function(both), tf.function(both, jit_compile=True)):
        rank, sort = (t.numpy() for t in fn(tf.constant(x)))
        assert np.all(np.isfinite(rank)) and np.all(np.isfinite(sort))
        np.testing.assert_allclose(rank, want_rank, rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(sort, want_sort, rtol=1e-6, atol=1e-5)


# ---------------------------------------------------------------------------------
# Gradients.
# ---------------------------------------------------------------------------------
def _finite_difference_check(fn, x, eps=1e-6, atol=1e-6):
    x = tf.constant(x, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
        w = tf.constant(np.random.default_rng(7).normal(size=y.shape))
        loss = tf.reduce_sum(w * y)
    grad = tape.gradient(loss, x).numpy()
    assert np.all(np.isfinite(grad))
    xv = x.numpy()
    # All perturbed inputs in one batch: row i·2 (+eps) and i·2 + 1 (−eps) of entry i.
    flat = xv.reshape(-1)
    shifted = np.repeat(xv[None], 2 * flat.size, axis=0)
    for i, idx in enumerate(np.ndindex(xv.shape)):
        shifted[(2 * i,) + idx] += eps
        shifted[(2 * i + 1,) + idx] -= eps
    vals = np.sum(w.numpy() * fn(tf.constant(shifted)).numpy(),
                  axis=tuple(range(1, 1 + y.shape.rank)))
    num = ((vals[0::2] - vals[1::2]) / (2 * eps)).reshape(xv.shape)
    np.testing.assert_allclose(grad, num, atol=atol, rtol=1e-5)


@pytest.mark.parametrize("name", ["rank", "sort", "topk", "quantile", "perm"])
def test_gradients_match_finite_differences(name):
    x = scores([2, 6], seed=8, ties=False)
    fns = {
        "rank": lambda v: L.lapsum_rank(v, 0.4),
        "sort": lambda v: L.lapsum_sort(v, 0.4, "DESCENDING"),
        "topk": lambda v: L.lapsum_topk(v, 2.5, 0.4),
        "quantile": lambda v: L.lapsum_quantile(v, [0.2, 0.5], 0.4),
        "perm": lambda v: L.lapsum_permutation_matrix(v, 0.4),
    }
    _finite_difference_check(fns[name], x)


@pytest.mark.parametrize("name", ["rank", "sort", "topk", "quantile", "perm"])
def test_gradient_wrt_alpha_and_k(name):
    x = tf.constant(scores([2, 6], seed=9, ties=False))

    def fn(alpha, k):
        return {
            "rank": lambda: L.lapsum_rank(x, alpha),
            "sort": lambda: L.lapsum_sort(x, alpha),
            "topk": lambda: L.lapsum_topk(x, k, alpha),
            "quantile": lambda: L.lapsum_quantile(x, [0.3, 0.8], alpha),
            "perm": lambda: L.lapsum_permutation_matrix(x, alpha),
        }[name]()

    alpha, k = tf.constant(0.5, tf.float64), tf.constant(2.5, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch([alpha, k])
        out = fn(alpha, k)
        w = tf.constant(np.random.default_rng(10).normal(size=out.shape))
        loss = tf.reduce_sum(w * out)
    ga, gk = tape.gradient(loss, [alpha, k])
    eps = 1e-6

    def value(a, kk):
        return float(tf.reduce_sum(w * fn(tf.constant(a, tf.float64),
                                          tf.constant(kk, tf.float64))))

    np.testing.assert_allclose(float(ga), (value(0.5 + eps, 2.5) - value(0.5 - eps, 2.5))
                               / (2 * eps), rtol=1e-5, atol=1e-7)
    if name == "topk":
        np.testing.assert_allclose(float(gk), (value(0.5, 2.5 + eps) - value(0.5, 2.5 - eps))
                                   / (2 * eps), rtol=1e-5, atol=1e-7)


def test_gradients_finite_at_ties_and_extreme_temperatures():
    x = tf.constant([[1.0, 1.0, 1.0, 2.0, -4.0]])
    for alpha in (1e-30, 1e-6, 1.0, 1e30):
        for fn in (lambda v, alpha=alpha: L.lapsum_rank(v, alpha),
                   lambda v, alpha=alpha: L.lapsum_sort(v, alpha),
                   lambda v, alpha=alpha: L.lapsum_topk(v, 2, alpha),
                   lambda v, alpha=alpha: L.lapsum_topk(v, 3, alpha),
                   lambda v, alpha=alpha: L.lapsum_quantile(v, [0.4, 0.5], alpha),
                   lambda v, alpha=alpha: L.lapsum_permutation_matrix(v, alpha)):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = fn(x)
                loss = tf.reduce_sum(y * tf.cos(tf.cast(tf.range(tf.size(y)), tf.float32)
                                                 )[None] if y.shape.rank == 2 else y)
            g = tape.gradient(loss, x)
            assert np.all(np.isfinite(y.numpy())) and np.all(np.isfinite(g.numpy())), alpha


# ---------------------------------------------------------------------------------
# Extreme scales, dtypes.
# ---------------------------------------------------------------------------------
def test_extreme_scales_float32_finite():
    x = np.array([[1e30, -1e30, 3.0, 1e-30, -2e38, 3e38, -1e-30, 0.0]], np.float32)
    w = tf.constant(np.random.default_rng(11).normal(size=[8]).astype(np.float32))
    for alpha in (1e-30, 1e-3, 1.0, 1e30):
        for fn in (lambda v, alpha=alpha: L.lapsum_rank(v, alpha),
                   lambda v, alpha=alpha: L.lapsum_sort(v, alpha),
                   lambda v, alpha=alpha: L.lapsum_topk(v, 3, alpha),
                   lambda v, alpha=alpha: L.lapsum_quantile(v, [0.25, 0.5, 0.75], alpha),
                   lambda v, alpha=alpha: L.lapsum_permutation_matrix(v, alpha)):
            xt = tf.constant(x)
            with tf.GradientTape() as tape:
                tape.watch(xt)
                y = fn(xt)
                loss = tf.reduce_sum(y * w[: y.shape[-1]])
            g = tape.gradient(loss, xt)
            assert np.all(np.isfinite(y.numpy())) and np.all(np.isfinite(g.numpy()))
    # Sharp: the hard results, the outliers not disturbing the small scores.
    np.testing.assert_allclose(L.lapsum_rank(x, 1e-33).numpy(),
                               scipy.stats.rankdata(x.astype(np.float64), axis=-1))
    np.testing.assert_allclose(L.lapsum_sort(x, 1e-33).numpy(), np.sort(x), rtol=1e-6)


def test_outlier_does_not_blur_a_cluster():
    """The scan keeps full relative precision: a 1e30 outlier does not change the soft
    ranks of scores 1e-3 apart at α = 1e-3 (no common reference point)."""
    x = np.array([[-1e30, 0.0, 1e-3, 2e-3, 5e-3]], np.float32)
    out = L.lapsum_rank(x, 1e-3).numpy()[0]
    want = ref_rank(x[0].astype(np.float64), 1e-3)
    np.testing.assert_allclose(out, want, rtol=2e-6)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_reduced_precision(dtype):
    x = scores([2, 6], seed=12, ties=False).astype(np.float32)
    xt = tf.cast(tf.constant(x), dtype)
    x32 = tf.cast(xt, tf.float32)
    for fn in (lambda v: L.lapsum_rank(v, 0.5), lambda v: L.lapsum_sort(v, 0.5),
               lambda v: L.lapsum_topk(v, 2, 0.5),
               lambda v: L.lapsum_quantile(v, [0.5], 0.5),
               lambda v: L.lapsum_permutation_matrix(v, 0.5)):
        out = fn(xt)
        assert out.dtype == dtype
        ref = fn(x32).numpy()
        np.testing.assert_allclose(tf.cast(out, tf.float32).numpy(), ref,
                                   atol=0.05 * max(1.0, np.abs(ref).max()))


# ---------------------------------------------------------------------------------
# XLA with dynamic shapes.
# ---------------------------------------------------------------------------------
def test_xla_equals_eager_dynamic_n():
    """Every operator and its gradient, traced with unknown batch and n (`None` dims),
    compiled by XLA (one function: one compilation), with a mask."""
    spec = [tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([None, None], tf.bool)]

    @tf.autograph.experimental.do_not_convert
    def all_ops(x, mask):
        with tf.GradientTape() as tape:
            tape.watch(x)
            outs = [L.lapsum_rank(x, 0.3, mask=mask),
                    L.lapsum_sort(x, 0.3, "DESCENDING", mask=mask),
                    L.lapsum_topk(x, 2, 0.3, mask=mask),
                    L.lapsum_quantile(x, [0.3, 0.6], 0.3, mask=mask),
                    L.lapsum_permutation_matrix(x, 0.3, mask=mask)]
            loss = sum(tf.reduce_sum(o * tf.sin(o + 1.0)) for o in outs)
        return outs + [tape.gradient(loss, x)]

    xla = tf.function(all_ops, jit_compile=True, input_signature=spec)
    n = 9
    x = tf.constant(scores([3, n], seed=n).astype(np.float32))
    mask = tf.constant(np.arange(n)[None, :] < np.array([[n], [n - 2], [3]]))
    for got, want in zip(xla(x, mask), all_ops(x, mask), strict=True):
        assert np.all(np.isfinite(got.numpy()))
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=2e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------
# Masks.
# ---------------------------------------------------------------------------------
def _ops():
    return {
        "rank": lambda v, m=None: L.lapsum_rank(v, 0.4, mask=m),
        "sort": lambda v, m=None: L.lapsum_sort(v, 0.4, mask=m),
        "topk": lambda v, m=None: L.lapsum_topk(v, 2.5, 0.4, mask=m),
        "quantile": lambda v, m=None: L.lapsum_quantile(v, [0.25, 0.5], 0.4, mask=m),
        "perm": lambda v, m=None: L.lapsum_permutation_matrix(v, 0.4, mask=m),
    }


@pytest.mark.parametrize("name", ["rank", "sort", "topk", "quantile", "perm"])
def test_mask_equals_unpadded(name):
    fn = _ops()[name]
    valid_x = scores([5], seed=13)
    padded = np.array([np.nan, valid_x[0], np.inf, valid_x[1], valid_x[2], -np.inf,
                       valid_x[3], valid_x[4]])
    mask = ~np.isin(np.arange(8), [0, 2, 5])
    xt = tf.constant(padded[None])
    with tf.GradientTape() as tape:
        tape.watch(xt)
        out = fn(xt, tf.constant(mask[None]))
        loss = tf.reduce_sum(out * tf.sin(out))
    grad = tape.gradient(loss, xt).numpy()[0]
    assert np.all(np.isfinite(out.numpy())) and np.all(np.isfinite(grad))
    np.testing.assert_array_equal(grad[~mask], 0.0)
    ut = tf.constant(valid_x[None])
    with tf.GradientTape() as tape:
        tape.watch(ut)
        want = fn(ut)
        loss = tf.reduce_sum(want * tf.sin(want))
    want_grad = tape.gradient(loss, ut).numpy()[0]
    out, want = out.numpy()[0], want.numpy()[0]
    np.testing.assert_allclose(grad[mask], want_grad, atol=1e-12)
    if name in ("rank", "topk"):
        np.testing.assert_allclose(out[mask], want, atol=1e-12)
        np.testing.assert_array_equal(out[~mask], 0.0)
    elif name == "sort":
        np.testing.assert_allclose(out[:5], want, atol=1e-12)
        np.testing.assert_array_equal(out[5:], 0.0)
    elif name == "quantile":
        np.testing.assert_allclose(out, want, atol=1e-12)
    else:
        np.testing.assert_allclose(out[:5][:, mask], want, atol=1e-12)
        assert np.all(out[5:] == 0) and np.all(out[:, ~mask] == 0)


def test_mask_edge_rows():
    x = tf.constant(scores([3, 4], seed=14))
    mask = tf.constant([[True, True, False, False], [False] * 4, [True] * 4])
    p = L.lapsum_topk(x, 2, 0.3, mask=mask).numpy()
    np.testing.assert_array_equal(p[0], [1.0, 1.0, 0.0, 0.0])   # n_valid <= k: all chosen
    np.testing.assert_array_equal(p[1], 0.0)
    np.testing.assert_allclose(p[2].sum(), 2.0, atol=1e-12)
    for fn in _ops().values():
        out = fn(x, mask).numpy()
        assert np.all(np.isfinite(out)) and np.all(out[1] == 0)
    rank1 = L.lapsum_rank(x, 0.3, mask=[True, False, True, True]).numpy()
    assert np.all(rank1[:, 1] == 0)


# ---------------------------------------------------------------------------------
# Bad input.
# ---------------------------------------------------------------------------------
def test_bad_input_raises_value_error_naming_the_argument():
    x = tf.constant([[1.0, 2.0, 3.0]])
    for bad in (0.0, -1.0, float("nan"), float("inf"), "a", True):
        with pytest.raises(ValueError, match="alpha"):
            L.lapsum_rank(x, bad)
    with pytest.raises(ValueError, match="alpha"):
        L.lapsum_sort(x, tf.constant(-2.0))
    for bad in (0, -1, 3, 3.5, float("nan"), True):
        with pytest.raises(ValueError, match="`k`"):
            L.lapsum_topk(x, bad)
    with pytest.raises(ValueError, match="direction"):
        L.lapsum_rank(x, direction="UP")
    with pytest.raises(ValueError, match="quantiles"):
        L.lapsum_quantile(x, [0.5, 1.0])


def test_runtime_checks_of_tensor_arguments():
    f = tf.function(lambda x, a, k: L.lapsum_topk(x, k, a),
                    input_signature=[tf.TensorSpec([None, None]), tf.TensorSpec([]),
                                     tf.TensorSpec([])])
    x = tf.constant([[1.0, 2.0, 3.0]])
    assert np.isclose(float(tf.reduce_sum(f(x, 1.0, 2.0))), 2.0, atol=1e-5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="alpha"):
        f(x, -1.0, 2.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="`k`"):
        f(x, 1.0, 3.0)


# ---------------------------------------------------------------------------------
# Issue 39: offsets, non-finite scores, k in float64, extreme temperatures.
# ---------------------------------------------------------------------------------
def test_topk_and_matrix_depend_on_differences_only():
    """The threshold is held as offsets from its sorted neighbours: scores around 1000
    (float32, α = 1e-3), four tied 1e4's and float64 ties at α = 1e-20 give the exact
    values of the same inputs (the absolute threshold was rounded: Σp = 2.0534, matrix
    rows 0.961–1.074, [0.188]·4, rows [2, 0, 0, 2], [0.5, 0.5, 0.5, 1])."""
    x = np.array([[0.0012, -0.0021, 0.0005, 0.0031, -0.0007, 0.0018]], np.float32) + 1000
    r = x[0].astype(np.float64)
    p = L.lapsum_topk(x, 2, 1e-3).numpy()
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p[0], ref_topk(r, 2, 1e-3), atol=2e-6)
    np.testing.assert_allclose(p.sum(), 2.0, atol=2e-6)
    P = L.lapsum_permutation_matrix(x, 1e-3).numpy()[0]
    assert np.all(np.isfinite(P))
    np.testing.assert_allclose(P, ref_permutation(-r, 1e-3), atol=2e-6)
    np.testing.assert_allclose(P.sum(0), 1.0, atol=2e-6)
    np.testing.assert_allclose(P.sum(1), 1.0, atol=2e-6)
    ties = np.full([1, 4], 1e4, np.float32)
    np.testing.assert_allclose(L.lapsum_topk(ties, 1, 1e-3).numpy(), 0.25, atol=1e-7)
    np.testing.assert_allclose(L.lapsum_permutation_matrix(ties, 1e-4).numpy(), 0.25,
                               atol=1e-7)
    p64 = L.lapsum_topk(np.array([[5.0, 5.0, 5.0, 10.0]]), 2, 1e-20).numpy()
    np.testing.assert_allclose(p64, [[1 / 3, 1 / 3, 1 / 3, 1.0]], atol=1e-15)
    rng = np.random.default_rng(21)
    for _ in range(1):  # scores around 100, α = 1e-4
        y = (100 + 1e-4 * rng.normal(size=[1, 7])).astype(np.float32)
        ry = y[0].astype(np.float64)
        for k in (1, 3.5):
            np.testing.assert_allclose(L.lapsum_topk(y, k, 1e-4).numpy()[0],
                                       ref_topk(ry, k, 1e-4), atol=3e-6)
        np.testing.assert_allclose(L.lapsum_permutation_matrix(y, 1e-4, "ASCENDING")
                                   .numpy()[0], ref_permutation(ry, 1e-4), atol=3e-6)
        np.testing.assert_allclose(L.lapsum_quantile(y, [0.3, 0.5], 1e-4).numpy()[0],
                                   ref_quantile(ry, [0.3, 0.5], 1e-4), atol=2e-5)


def test_python_k_keeps_float64():
    """A Python k is not rounded to float32 for float64 scores (Σp was 2.0999999046)."""
    x = scores([1, 10], seed=22, ties=False)
    p = L.lapsum_topk(x, 2.1, 0.5).numpy()
    assert p.dtype == np.float64
    np.testing.assert_allclose(p.sum(), 2.1, rtol=0, atol=1e-14)
    y = np.random.default_rng(23).normal(size=[1, 3000])
    k = 1000.5833
    q = L.lapsum_topk(y, k, 0.05).numpy()
    np.testing.assert_allclose(q.sum(), k, rtol=0, atol=1e-9)
    np.testing.assert_allclose(q[0], ref_topk(y[0], k, 0.05), atol=1e-9)


def test_infinite_scores_get_their_limits():
    """±inf entries are the limits of very large finite scores: +inf ranks last
    (ascending), sorts last, gets top-k mass 1 and row 0 of the descending matrix; the
    finite entries get the results of the finite list alone (mass 1 where it belongs),
    with finite gradients and zero gradient at the infinite entries."""
    inf = np.inf
    x = np.array([[0.3, -1.2, inf, 0.7, -0.1], [0.3, -1.2, -inf, 0.7, -0.1],
                  [inf, -1.2, -inf, 0.7, inf]], np.float32)
    a = 0.3
    xt = tf.constant(x)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(xt)
        outs = dict(rank=L.lapsum_rank(xt, a), sort=L.lapsum_sort(xt, a),
                    top1=L.lapsum_topk(xt, 1, a), top2=L.lapsum_topk(xt, 2.5, a),
                    top4=L.lapsum_topk(xt, 4, a),
                    quantile=L.lapsum_quantile(xt, [0.1, 0.5, 0.9], a),
                    perm=L.lapsum_permutation_matrix(xt, a))
        losses = {name: tf.reduce_sum(tf.sin(tf.where(tf.math.is_finite(out), out, 0.0)))
                  for name, out in outs.items()}
    for name in outs:
        g = tape.gradient(losses[name], xt).numpy()
        assert np.all(np.isfinite(g)), name
        np.testing.assert_array_equal(g[~np.isfinite(x)], 0.0, err_msg=name)
    o = {k: v.numpy() for k, v in outs.items()}
    for i, row in enumerate(x):
        fin = np.isfinite(row)
        r = row[fin].astype(np.float64)
        pos, neg = row == inf, row == -inf
        n_neg, n_pos, nf = neg.sum(), pos.sum(), fin.sum()
        want_rank = np.zeros(5)
        want_rank[fin] = n_neg + ref_rank(r, a)
        want_rank[neg] = (n_neg + 1) / 2
        want_rank[pos] = 5 - (n_pos - 1) / 2
        np.testing.assert_allclose(o["rank"][i], want_rank, atol=2e-6)
        want_sort = np.concatenate([[-inf] * n_neg, ref_sort(r, a), [inf] * n_pos])
        np.testing.assert_allclose(o["sort"][i], want_sort, atol=2e-6)
        for name, k in (("top1", 1), ("top2", 2.5), ("top4", 4)):
            want = np.zeros(5)
            want[pos] = min(k / n_pos, 1.0) if n_pos else 0.0
            kf = k - n_pos
            if kf >= nf:
                want[fin] = 1.0
                want[neg] = (kf - nf) / n_neg
            elif kf > 0:
                want[fin] = ref_topk(r, kf, a)
            np.testing.assert_allclose(o[name][i], want, atol=2e-6, err_msg=name)
            np.testing.assert_allclose(o[name][i].sum(), k, atol=4e-6)
        levels = 5 * np.array([0.1, 0.5, 0.9]) - n_neg
        want_q = np.where(levels <= 0, -inf, np.where(levels >= nf, inf, 0.0))
        inner = (levels > 0) & (levels < nf)
        want_q[inner] = f_inverse(levels[inner], r, a)
        np.testing.assert_allclose(o["quantile"][i], want_q, atol=2e-6)
        P = o["perm"][i]   # descending: +inf rows first
        want_p = np.zeros([5, 5])
        want_p[:n_pos][:, pos] = 1.0 / max(n_pos, 1)
        want_p[n_pos:n_pos + nf][:, fin] = ref_permutation(-r, a)
        want_p[n_pos + nf:][:, neg] = 1.0 / max(n_neg, 1)
        np.testing.assert_allclose(P, want_p, atol=2e-6)


def test_nan_gives_a_nan_list():
    """A NaN at a valid entry makes its whole list NaN (the other lists untouched, no
    NaN gradient into the batch); a NaN at a padded entry is ignored."""
    x = np.array([[0.3, np.nan, 2.0, 0.7, -0.1], [0.3, -1.2, 2.0, 0.7, -0.1]])
    xt = tf.constant(x)
    for fn in (lambda v, m=None: L.lapsum_rank(v, 0.3, mask=m),
               lambda v, m=None: L.lapsum_sort(v, 0.3, mask=m),
               lambda v, m=None: L.lapsum_topk(v, 2, 0.3, mask=m),
               lambda v, m=None: L.lapsum_quantile(v, [0.5], 0.3, mask=m),
               lambda v, m=None: L.lapsum_permutation_matrix(v, 0.3, mask=m)):
        with tf.GradientTape() as tape:
            tape.watch(xt)
            out = fn(xt)
            loss = tf.reduce_sum(tf.where(tf.math.is_nan(out), tf.zeros_like(out), out))
        o = out.numpy()
        assert np.all(np.isnan(o[0]))
        assert np.all(np.isfinite(o[1]))
        np.testing.assert_allclose(o[1], fn(xt[1:]).numpy()[0], atol=1e-12)
        assert np.all(np.isfinite(tape.gradient(loss, xt).numpy()))
        masked = fn(xt, np.isfinite(x)).numpy()
        assert np.all(np.isfinite(masked))


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_finite_across_the_temperature_range(dtype):
    """Values, the gradient in x and the gradient in a tensor α are finite at both ends
    of `temperature_range(dtype)` (α = 3e38 in float32 gave the sort gradient
    [nan, nan, -inf], ties at α = 2e-38 gave NaN)."""
    low, high = L.temperature_range(dtype)
    assert isinstance(low, float) and isinstance(high, float) and 0 < low < 1 < high
    info = np.finfo(dtype.as_numpy_dtype)
    assert low <= 1e-20 if dtype == tf.float32 else low <= 1e-290
    assert high >= info.max / 1e3
    # The values alone stay finite down to the smallest normal α (tied scores included).
    for fn in (L.lapsum_rank, L.lapsum_sort, L.lapsum_permutation_matrix):
        out = fn(tf.constant([[1.0, 1.0, 1.0], [1.0, 2.0, 2.0]], dtype), float(info.tiny))
        assert np.all(np.isfinite(out.numpy()))
    rows = tf.constant([[1.0, 2.0, 3.0, 2.5], [1.0, 1.0, 1.0, 1.0], [-4.0, 1.0, 1.0, 7.0]],
                       dtype)
    weights = tf.constant(np.cos(np.arange(16.0)).reshape(4, 4), dtype)
    for alpha in (low, high):
        a = tf.constant(alpha, dtype)
        for name, fn in (("rank", lambda v, t: L.lapsum_rank(v, t)),
                         ("sort", lambda v, t: L.lapsum_sort(v, t)),
                         ("topk", lambda v, t: L.lapsum_topk(v, 2, t)),
                         ("quantile", lambda v, t: L.lapsum_quantile(v, [0.3, 0.5], t)),
                         ("perm", lambda v, t: L.lapsum_permutation_matrix(v, t))):
            with tf.GradientTape() as tape:
                tape.watch([rows, a])
                out = fn(rows, a)
                w = tf.reshape(weights, [-1])[: out.shape[-1]]
                loss = tf.reduce_sum(out * w)
            gx, ga = tape.gradient(loss, [rows, a])
            what = f"{name}, alpha={alpha:g}"
            assert np.all(np.isfinite(out.numpy())), what
            assert np.all(np.isfinite(gx.numpy())), what
            assert np.isfinite(ga.numpy()), what


def test_float32_long_list_with_a_wide_alpha():
    """n = 10⁵ standard normal float32 scores at α = 2 (every score within a few α of
    n/2 others): the ranks are those of the float64 definition rounded to float32
    (the float32 sums lost 1.6 to the cancellation in B − A), the sorted values and
    the top-k masses too, Σp = k to float32 rounding of the masses."""
    n, alpha = 100_000, 2.0
    x = np.random.default_rng(24).normal(size=[1, n]).astype(np.float32)
    r = x[0].astype(np.float64)
    order = np.argsort(r, kind="stable")
    s = r[order]
    # F(s_i) = i + ½ + ½(B_i − A_i) with the strict one-sided sums, in float64 around
    # the reference 0 (|s|/α < 3: no overflow, relative precision n·1e-16).
    e_pos, e_neg = np.exp(s / alpha), np.exp(-s / alpha)
    a = np.exp(-s / alpha) * (np.cumsum(e_pos) - e_pos)
    b = np.exp(s / alpha) * (np.cumsum(e_neg[::-1])[::-1] - e_neg)
    want = np.empty(n)
    want[order] = np.arange(n) + 1.0 + 0.5 * (b - a)
    ulp = np.spacing(np.float32(n))
    rank = L.lapsum_rank(x, alpha).numpy()[0]
    assert np.all(np.isfinite(rank))
    np.testing.assert_allclose(rank, want, rtol=0, atol=ulp)
    p = L.lapsum_topk(x, n / 3, alpha).numpy()[0].astype(np.float64)
    p64 = L.lapsum_topk(r[None], n / 3, alpha).numpy()[0]
    np.testing.assert_allclose(p64.sum(), n / 3, rtol=1e-12)
    np.testing.assert_allclose(p, p64, atol=1e-6)
    assert abs(p.sum() - n / 3) < 1e-7 * n
    sort = L.lapsum_sort(x, alpha).numpy()[0]
    idx = np.arange(0, n, 997)
    np.testing.assert_allclose(sort[idx], L.lapsum_sort(r[None], alpha).numpy()[0][idx],
                               atol=2e-5)


def test_float32_sums_up_to_the_threshold():
    """Lists of a static length up to `FLOAT32_SUMS_UP_TO` keep the kernel sums in
    float32 (no float64 op in the traced graph, so TFLite's builtins convert them):
    at that length, with α far above the spread of the scores (the worst case
    measured), the ranks are within 16 ulps of n of the float64-sum ones, the sorted
    values within 5e-4·α and the top-k masses within 2e-6. Longer lists and lists of
    an unknown length keep float64 sums (the n = 10⁵ test above)."""
    n = L.FLOAT32_SUMS_UP_TO
    assert L.sum_dtype(tf.float32, n) == tf.float32
    assert L.sum_dtype(tf.float32, n + 1) == tf.float64
    assert L.sum_dtype(tf.float32, None) == tf.float64
    assert L.sum_dtype(tf.float64, 8) == tf.float64
    rng = np.random.default_rng(31)
    for x, alpha in ((rng.uniform(size=[2, n]), 10.0), (rng.normal(size=[2, n]), 3.0)):
        x = x.astype(np.float32)
        r32 = L.lapsum_rank(x, alpha).numpy()
        # The reference: float64 sums of the same float32 scores (an unknown
        # length), rounded to float32.
        wide = tf.function(lambda v, a=alpha: L.lapsum_rank(v, a)).get_concrete_function(
            tf.TensorSpec([2, None], tf.float32))
        r64 = wide(tf.constant(x)).numpy()
        assert np.all(np.isfinite(r32))
        np.testing.assert_allclose(r32, r64, rtol=0, atol=16 * np.spacing(np.float32(n)))
        np.testing.assert_allclose(L.lapsum_sort(x, alpha).numpy(),
                                   L.lapsum_sort(x.astype(np.float64), alpha).numpy(),
                                   rtol=0, atol=5e-4 * alpha)
        np.testing.assert_allclose(L.lapsum_topk(x, n // 3, alpha).numpy(),
                                   L.lapsum_topk(x.astype(np.float64), n // 3, alpha).numpy(),
                                   rtol=0, atol=2e-6)


def test_long_static_lists_choose_their_sum_dtype_by_the_sums():
    """float32 lists of a static length above `FLOAT32_SUMS_UP_TO` keep the float32
    kernel sums when every A_i + B_i is at most that bound (a temperature of a few
    neighbour spacings: the speed of the short lists) and redo them in float64 when one
    exceeds it (α far above the spread, where float32 sums leave the ranks about 50
    ulps of n off at n = 4096). Either way the ranks and their gradient equal those of
    float64 scores within float32 precision."""
    n = 4 * L.FLOAT32_SUMS_UP_TO
    rng = np.random.default_rng(39)
    x = rng.normal(size=[1, n]).astype(np.float32)
    w = rng.normal(size=[1, n])
    for alpha in (30.0 / n, 10.0):       # sums of about 60 / of about n
        def rank_and_grad(v, alpha=alpha):
            v = tf.constant(v)
            with tf.GradientTape() as tape:
                tape.watch(v)
                r = L.lapsum_rank(v, alpha)
                loss = tf.reduce_sum(tf.cast(w, v.dtype) * r)
            return r.numpy().astype(np.float64), tape.gradient(loss, v).numpy()

        r32, g32 = rank_and_grad(x)
        r64, g64 = rank_and_grad(x.astype(np.float64))
        assert np.all(np.isfinite(r32)) and np.all(np.isfinite(g32))
        np.testing.assert_allclose(r32, r64, rtol=0, atol=4 * np.spacing(np.float32(n)))
        np.testing.assert_allclose(g32, g64, rtol=0, atol=1e-4 * np.max(np.abs(g64)))


def test_xla_gradient_beyond_the_float32_sums_takes_no_data_dependent_branch():
    """Under XLA the forward and backward of lists longer than `FLOAT32_SUMS_UP_TO`
    take the float64 sums without a `tf.cond` on the data: the compiled gradient of such
    a branch was compiled anew for every input value (4 s a step at n = 3000). Values
    and gradients equal eager's."""
    n = L.FLOAT32_SUMS_UP_TO + 76
    rng = np.random.default_rng(0)
    weights = tf.constant(rng.standard_normal((2, n)), tf.float32)

    def step(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            ranks = L.lapsum_rank(v, 0.5)
            loss = tf.reduce_sum(weights * ranks)
        return ranks, tape.gradient(loss, v)

    compiled = tf.function(step, jit_compile=True)
    graph = compiled.get_concrete_function(tf.TensorSpec((2, n), tf.float32)).graph
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node) + [d for f in graph_def.library.function for d in f.node_def]
    assert not [d.op for d in nodes if d.op in ("If", "StatelessIf")]
    x = tf.constant(rng.standard_normal((2, n)), tf.float32)
    (r_xla, g_xla), (r_eager, g_eager) = compiled(x), step(x)
    assert np.all(np.isfinite(g_xla.numpy())) and np.all(np.isfinite(r_xla.numpy()))
    np.testing.assert_allclose(r_xla.numpy(), r_eager.numpy(), rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(g_xla.numpy(), g_eager.numpy(), rtol=1e-3, atol=2e-3)

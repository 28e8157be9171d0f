"""LapSum operators: soft ranks, sorts, top-k masks, quantiles and permutation matrices
in O(n log n) (Struski, Bednarczyk, Podolak & Tabor, ICML 2025, arXiv 2503.06242).

Every operator is read off the LapSum function F(x) = Σ_j Lap_α(x − r_j) of a list's
scores (paper eq. (1); Lap_α the Laplace CDF of scale α) or its inverse, the closed
form of paper Thm. 3.1 (`_SortedList.invert`) from one-sided kernel sums of the sorted
scores, computed by a parallel scan of non-negative terms (nothing overflows at any
scale). Thresholds are held as offsets from their sorted neighbours, so results depend
on the scores' differences only.

`alpha` (default `DEFAULT_ALPHA`, a Python number or a scalar tensor that gradients
reach) is in the units of the scores; `temperature_range(dtype)` is the range a dtype
resolves. Inputs `[..., n]`; float16/bfloat16 compute in float32. Padding and
non-finite scores: docs/api.md ("Padding"). Every operator compiles with XLA.
"""

from __future__ import annotations

import collections
import math
import numbers

import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _docs, _masking
from softsort_tf.ops import family
from softsort_tf.ops.permutation import _in_xla_context, poison_rows, with_straight_through
from softsort_tf.ops.wrapper import ListResult, Lists, list_operator

__all__ = ["DEFAULT_ALPHA", "temperature_range", "lapsum_permutation_matrix",
           "lapsum_quantile", "lapsum_rank", "lapsum_sort", "lapsum_topk"]

DEFAULT_ALPHA = 1.0

# -- Arguments -------------------------------------------------------------------------
# Headroom at both ends of α's range: the sorted values reach s ± α·log(2n) (< 22·α for
# n < 2³¹) and a gradient in the scores is up to about n/α times the cotangent.
_HIGH_HEADROOM = 2.0 ** 8
_LOW_HEADROOM = 2.0 ** 40


def temperature_range(dtype) -> tuple[float, float]:
    """`(low, high)`: the α a LapSum computation in `dtype` resolves (float16 and
    bfloat16 compute in float32), 2⁴⁰/max to max/2⁸ (max: the largest finite number of
    the dtype); inside it, values and gradients are finite for finite scores.

    Example:
    >>> "%.3g, %.3g" % temperature_range("float32")
    '3.23e-27, 1.33e+36'
    """
    dtype = tf.as_dtype(dtype)
    if dtype in (tf.float16, tf.bfloat16):
        dtype = tf.float32
    info = np.finfo(dtype.as_numpy_dtype)
    return _LOW_HEADROOM / float(info.max), float(info.max) / _HIGH_HEADROOM


def _alpha_tensor(alpha, dtype):
    """`alpha` as a scalar tensor of `dtype`, checked finite and > 0."""
    if not isinstance(alpha, (tf.Tensor, tf.Variable)):
        return tf.constant(_checks.check_positive("alpha", alpha), dtype)
    value = tf.get_static_value(alpha) if isinstance(alpha, tf.Tensor) else None
    if value is not None:
        _checks.check_positive("alpha", np.asarray(value).item() if np.size(value) == 1
                               else value)
    if alpha.shape.rank not in (None, 0):
        raise ValueError(f"`alpha` must be a scalar, got shape {alpha.shape}.")
    a = tf.cast(alpha, dtype)
    if value is not None:
        return a
    check = tf.debugging.assert_positive(
        a, message="softsort_tf: `alpha` must be a finite number > 0")
    with tf.control_dependencies([check]):
        return tf.identity(a)


class _Prepared:
    """One call's lists in the frame the operators compute in: the scores `x` `[b, n]`
    (negated for 'DESCENDING'; padded and non-finite entries replaced by the row's
    largest finite valid score) and `raw` (before the replacement), `alpha`; bool
    `[b, n]` `valid` (finite valid entries), `neg`/`pos` (valid at −inf/+inf); float
    `[b]` counts `n_neg`, `n_pos`, `n_fin`, `n_all`; bool `[b]` `nan` (poisoned rows)."""

    def __init__(self, lists: Lists, direction: str, alpha):
        self.direction = _checks.check_direction(direction)
        x2d = -lists.values if self.direction == "DESCENDING" else lists.values
        dtype = x2d.dtype
        self.alpha = _alpha_tensor(alpha, dtype)
        self.view, self.mask = lists.view, lists.mask
        given = tf.ones_like(x2d, dtype=tf.bool) if lists.mask is None else lists.mask
        self.valid = tf.logical_and(given, tf.math.is_finite(x2d))
        self.neg = tf.logical_and(given, tf.equal(x2d, tf.constant(-np.inf, dtype)))
        self.pos = tf.logical_and(given, tf.equal(x2d, tf.constant(np.inf, dtype)))
        self.nan = tf.reduce_any(tf.logical_and(given, tf.math.is_nan(x2d)), axis=-1)
        self.raw = x2d
        self.x = _masking.replace_padded(x2d, self.valid)
        self.n_neg, self.n_pos, self.n_fin, self.n_all = (
            _masking.n_valid(t, dtype) for t in (self.neg, self.pos, self.valid, given))

    def place(self, finite, n_fin):
        """`finite` `[b, n, ...]` (sorted positions 0..n_fin − 1) moved to positions n₋..,
        and the bool `[b, n]` positions of the −inf, finite and +inf entries."""
        n = tf.shape(finite)[1]
        position = tf.range(n)[None, :]
        n_neg = tf.cast(self.n_neg, tf.int32)[:, None]
        end = n_neg + tf.cast(n_fin, tf.int32)[:, None]
        shifted = tf.gather(finite, tf.clip_by_value(position - n_neg, 0, n - 1), batch_dims=1)
        return (shifted, position < n_neg, tf.logical_and(position >= n_neg, position < end),
                tf.logical_and(position >= end,
                               position < tf.cast(self.n_all, tf.int32)[:, None]))


# -- The parallel scan -----------------------------------------------------------------
#: Longest static list length whose float32 scores keep the kernel sums in float32
#: (ranks within 14 ulps of n of the float64 sums at n = 1024); longer lists keep them
#: while every A_i + B_i is at most this bound.
FLOAT32_SUMS_UP_TO = 1024


def sum_dtype(dtype, n: int | None):
    """The dtype of the kernel sums and of F for scores of `dtype` in lists of static
    length `n` (None: unknown): float32 only for float32 lists up to `FLOAT32_SUMS_UP_TO`."""
    if dtype == tf.float64 or n is None or n > FLOAT32_SUMS_UP_TO:
        return tf.float64
    return dtype


def _shift_right(t, shift, fill):
    """`t[:, i - shift]` (`fill` for i < shift) for a dynamic `shift`, XLA-compilable."""
    n = tf.shape(t)[-1]
    padded = tf.concat([tf.fill(tf.shape(t), tf.constant(fill, t.dtype)), t], axis=-1)
    out = tf.slice(padded, tf.stack([0, n - shift]), tf.stack([-1, n]))
    return tf.reshape(out, tf.shape(t))


def _doubling_scan(decay, add):
    """Inclusive scan y_i = decay_i·y_{i−1} + add_i of `[rows, n]` tensors by recursive
    doubling (Hillis–Steele): ⌈log₂ n⌉ passes of O(n)."""
    n = tf.shape(decay)[-1]

    def body(shift, m, c):
        return shift * 2, m * _shift_right(m, shift, 1.0), m * _shift_right(c, shift, 0.0) + c

    _, _, c = tf.while_loop(lambda shift, m, c: shift < n, body,
                            (tf.constant(1, tf.int32), decay, add), maximum_iterations=64)
    return c


# Block length of the two-level scan.
_BLOCK = 16


@tf.custom_gradient
def _affine_scan(decay, add):
    """Inclusive scan y_i = decay_i·y_{i−1} + add_i (y_{−1} = 0) along the last axis of
    `[rows, n]` tensors, 0 ≤ decay ≤ 1, add ≥ 0: recursive doubling inside blocks of
    `_BLOCK`, then over the blocks' totals (O(n) work, O(log n) depth). The gradient is
    the reverse scan λ_i = ȳ_i + decay_{i+1}·λ_{i+1}."""
    rows = tf.shape(decay)[0]
    n = tf.shape(decay)[1]
    num_blocks = (n + _BLOCK - 1) // _BLOCK
    pad = tf.stack([[0, 0], [0, num_blocks * _BLOCK - n]])
    shape = tf.stack([rows, num_blocks, _BLOCK])
    m = tf.reshape(tf.pad(decay, pad), shape)      # decay products over the window
    c = tf.reshape(tf.pad(add, pad), shape)        # scan within the block so far
    shift = 1
    while shift < _BLOCK:
        prev_m = tf.pad(m[:, :, :-shift], [[0, 0], [0, 0], [shift, 0]], constant_values=1.0)
        prev_c = tf.pad(c[:, :, :-shift], [[0, 0], [0, 0], [shift, 0]])
        c = m * prev_c + c
        m = m * prev_m
        shift *= 2
    totals = _doubling_scan(m[:, :, -1], c[:, :, -1])            # y at each block's end
    incoming = tf.concat([tf.zeros_like(totals[:, :1]), totals[:, :-1]], axis=-1)
    y = tf.reshape(c + m * incoming[:, :, None], tf.stack([rows, num_blocks * _BLOCK]))[:, :n]

    def grad(dy):
        next_decay = tf.concat([decay[:, 1:], tf.zeros_like(decay[:, :1])], axis=-1)
        lam = tf.reverse(_affine_scan(tf.reverse(next_decay, [-1]), tf.reverse(dy, [-1])),
                         [-1])
        y_prev = tf.concat([tf.zeros_like(y[:, :1]), y[:, :-1]], axis=-1)
        return lam * y_prev, lam

    return y, grad


def _laplace_sums(s, w, alpha):
    """The strict one-sided kernel sums of sorted rows `s` `[b, n]` with weights `w`,
    A_i = Σ_{j<i} w_j·exp(−(s_i − s_j)/α) and B_i = Σ_{j>i} w_j·exp(−(s_j − s_i)/α)."""
    decay = tf.exp(-_scaled_gap(s[:, :-1], s[:, 1:], alpha))    # [b, n − 1], in [0, 1]
    zero = tf.zeros_like(s[:, :1])
    # A_i = D_i·(A_{i−1} + w_{i−1}), D_i = exp(−(s_i − s_{i−1})/α), D_0 = 0.
    d_left = tf.concat([zero, decay], axis=-1)
    w_prev = tf.concat([zero, w[:, :-1]], axis=-1)
    # B_i = E_i·(B_{i+1} + w_{i+1}), E_i = D_{i+1}, E_{n−1} = 0; scanned reversed.
    d_right = tf.reverse(tf.concat([decay, zero], axis=-1), [-1])
    w_next = tf.reverse(tf.concat([w[:, 1:], zero], axis=-1), [-1])
    both = _affine_scan(tf.concat([d_left, d_right], axis=0),
                        tf.concat([d_left * w_prev, d_right * w_next], axis=0))
    rows = tf.shape(s)[0]
    return both[:rows], tf.reverse(both[rows:], [-1])


def _scaled_gap(low, high, alpha):
    """(high − low)/α ≥ 0 without overflow in the subtraction (+inf past the range)."""
    return _over_alpha(tf.maximum(high * 0.5 - low * 0.5, 0.0), alpha)


def _scaled_difference(a, b, alpha):
    """(a − b)/α without overflow in the subtraction (±inf past the range)."""
    return _over_alpha(a * 0.5 - b * 0.5, alpha)


@tf.custom_gradient
def _over_alpha(half, alpha):
    """2·half/α for a scalar α, with the gradient in α written as −Σ ȳ·y/α where ȳ ≠ 0
    (autodiff's −ȳ·half/α² overflows at a small α, and 0·inf is NaN)."""
    y = half / alpha * 2.0

    def grad(dy):
        used = tf.not_equal(dy, 0.0)
        term = tf.where(used, dy * tf.where(used, y, tf.zeros_like(y)) / alpha,
                        tf.zeros_like(y))
        return dy / alpha * 2.0, -tf.reduce_sum(term)

    return y, grad


# -- The sorted list and the inverse of F ----------------------------------------------
#: Solutions t of F(t) = level, `[b, K]` each: t, its segment m (s_m ≤ t ≤ s_{m+1},
#: 1-based), and the offsets (t − s_left)/α ≥ 0 and (t − s_right)/α ≤ 0.
_Threshold = collections.namedtuple(
    "_Threshold", "value m s_left s_right delta_left delta_right")


class _SortedList:
    """One call's finite scores sorted, with the kernel sums: `[b, n]` `s` (ascending,
    finite valid entries first), `order` (their input indices), `w` (1 at finite valid
    positions), `a`, `b` (`_laplace_sums`), `f` (F at `s`, +inf past the finite entries)
    and `count` `[b]`, the number N of finite valid entries."""

    def __init__(self, prep: _Prepared, x2d, alpha):
        self.alpha = alpha
        dtype = x2d.dtype
        n = tf.shape(x2d)[-1]
        order = _stable_argsort(prep.raw if prep.mask is None else x2d)
        if prep.mask is None:
            # The sort of the raw scores puts the −inf entries first and the +inf ones
            # last: the finite entries come first once each row is rotated by n₋.
            n_neg = tf.cast(prep.n_neg, tf.int32)[:, None]
            order = tf.gather(order, (tf.range(n)[None, :] + n_neg) % n, batch_dims=1)
            n_fin = n - n_neg - tf.cast(prep.n_pos, tf.int32)[:, None]
            w = tf.cast(tf.range(n)[None, :] < n_fin, dtype)
            before = tf.minimum(tf.range(n)[None, :], n_fin)   # valid entries before each
        else:
            order = _valid_first(order, prep.valid)
            w = tf.cast(tf.gather(prep.valid, order, batch_dims=1), dtype)
            before = None
        self.order, self.w = order, w
        self.s = tf.gather(x2d, order, batch_dims=1)
        self.count = tf.reduce_sum(w, axis=-1)

        def sums_and_f(sums):                       # in the dtype `sums` (FLOAT32_SUMS_UP_TO)
            a, b = _laplace_sums(tf.cast(self.s, sums), tf.cast(w, sums), tf.cast(alpha, sums))
            count_before = (tf.cumsum(tf.cast(w, sums), axis=-1, exclusive=True)
                            if before is None else tf.cast(before, sums))
            f = count_before + 0.5 * tf.cast(w, sums) + 0.5 * (b - a)
            return tf.cast(a, dtype), tf.cast(b, dtype), tf.cast(f, dtype)

        wide = sum_dtype(dtype, x2d.shape[-1])
        # Under XLA a data-dependent choice of precision (tf.cond) would make the compiled
        # gradient depend on the input's values (compiled anew for each); XLA takes the
        # wide sums whenever they may be needed.
        if wide == dtype or x2d.shape[-1] is None or _in_xla_context():
            self.a, self.b, f = sums_and_f(wide)
        else:
            a, b, f = sums_and_f(dtype)
            small = tf.reduce_max(a + b) <= FLOAT32_SUMS_UP_TO
            self.a, self.b, f = tf.cond(small, lambda: (a, b, f), lambda: sums_and_f(wide))
        self.f = tf.where(w > 0, f, tf.constant(np.inf, dtype))

    def scatter(self, y_sorted):
        """A `[b, n]` result in sorted order → input order."""
        return _scatter_rows(self.order, y_sorted)

    def solve(self, levels):
        """F⁻¹ at a few levels `[b, K]` in (0, N), as a `_Threshold` (O(n·K))."""
        below = self.f[:, None, :] <= levels[:, :, None]
        return self.invert(levels, tf.reduce_sum(tf.cast(below, tf.int32), axis=-1))

    def solve_unit_spaced(self, offset, num_levels):
        """F⁻¹ at the levels offset + k, k < num_levels (O(n), a histogram of F), and
        the bool `[b, num_levels]` of the levels below N (the others are discarded)."""
        b = tf.shape(self.f)[0]
        dtype = self.f.dtype
        kmax = tf.cast(num_levels, dtype)
        first = tf.math.ceil(tf.minimum(self.f - offset, kmax))     # first level ≥ F
        first = tf.cast(tf.clip_by_value(first, 0.0, kmax), tf.int32)
        width = num_levels + 1
        ids = tf.reshape(first + tf.range(b)[:, None] * width, [-1])
        hist = tf.math.unsorted_segment_sum(tf.ones_like(ids), ids, b * width)
        m = tf.cumsum(tf.reshape(hist, tf.stack([b, width])), axis=-1)[:, :num_levels]
        levels = tf.broadcast_to(tf.range(num_levels, dtype=dtype)[None, :] + offset,
                                 tf.stack([b, num_levels]))
        inside = levels < self.count[:, None]
        levels = tf.where(inside, levels, 0.5 * tf.ones_like(levels))
        return self.invert(levels, tf.where(inside, m, tf.zeros_like(m))), inside

    def offsets(self, thr, values):
        """(t − r)/α `[b, K, n]` of thresholds `thr` at scores `values` `[b, n]`, from
        the neighbour on r's side (two terms of the same sign: no cancellation)."""
        s = values[:, None, :]
        below = s <= thr.s_left[:, :, None]
        from_left = thr.delta_left[:, :, None] + _scaled_difference(
            thr.s_left[:, :, None], s, self.alpha)
        from_right = thr.delta_right[:, :, None] + _scaled_difference(
            thr.s_right[:, :, None], s, self.alpha)
        return tf.where(below, from_left, from_right)

    def invert(self, levels, m):
        """The solutions t of F(t) = level for `[b, K]` levels in (0, N) in the segments
        m (paper Thm. 3.1: with d = level − m, p = 1 + A_m, q = 1 + B_{m+1},
        ℓ = log p + log q − (s_{m+1} − s_m)/α, t = (s_m + s_{m+1})/2 + (α/2)·log(p/q)
        + α·asinh(d·e^{−ℓ/2}), for |d| ≤ e^{ℓ/2}; from one neighbour otherwise)."""
        alpha = self.alpha
        dtype = self.s.dtype
        n = tf.shape(self.s)[-1]
        count = tf.cast(self.count, tf.int32)[:, None]
        has_left = m >= 1
        has_right = m < count
        left = tf.clip_by_value(m - 1, 0, n - 1)
        right = tf.clip_by_value(m, 0, n - 1)
        s_left = tf.gather(self.s, left, batch_dims=1)
        s_right = tf.gather(self.s, right, batch_dims=1)
        log_p = tf.math.log1p(tf.gather(self.a, left, batch_dims=1))
        log_q = tf.math.log1p(tf.gather(self.b, right, batch_dims=1))
        d = levels - tf.cast(m, dtype)
        both = tf.logical_and(has_left, has_right)
        gap = _scaled_gap(s_left, s_right, alpha)
        ell = tf.where(both, log_p + log_q - gap, tf.constant(-np.inf, dtype))
        abs_d = tf.abs(d)
        small = tf.logical_and(both, abs_d <= tf.exp(0.5 * ell))
        # |d| ≤ exp(ℓ/2): the symmetric form, asinh of an argument in [−1, 1].
        nonzero = tf.logical_and(small, abs_d > 0)
        ell_s = tf.where(nonzero, ell, tf.zeros_like(ell))
        safe_abs = tf.where(nonzero, abs_d, tf.ones_like(abs_d))
        z = tf.where(nonzero, tf.sign(d) * tf.exp(tf.math.log(safe_abs) - 0.5 * ell_s),
                     tf.zeros_like(d))
        asinh_z = _asinh_unit(z)
        x_small = (0.5 * s_left + 0.5 * s_right + 0.5 * alpha * (log_p - log_q)
                   + alpha * asinh_z)
        # Otherwise from one neighbour, with
        # log(|d| + sqrt(d² + e^ℓ)) = log|d| + log(1 + sqrt(1 + e^{ℓ − 2 log|d|})).
        use_right = tf.logical_and(tf.logical_not(small), tf.logical_and(
            has_right, tf.logical_or(d >= 0, tf.logical_not(has_left))))
        use_left = tf.logical_and(tf.logical_not(small), tf.logical_not(use_right))
        tiny = tf.constant(np.finfo(dtype.as_numpy_dtype).tiny, dtype)
        big = tf.logical_not(small)
        log_abs = tf.math.log(tf.maximum(tf.where(big, abs_d, tf.ones_like(abs_d)), tiny))
        ell_b = tf.where(big, ell, tf.zeros_like(ell))
        h = log_abs + tf.math.log1p(tf.sqrt(1.0 + tf.exp(ell_b - 2.0 * log_abs)))
        from_right = tf.where(use_right, h - log_q, tf.zeros_like(h))
        from_left = tf.where(use_left, log_p - h, tf.zeros_like(h))
        value = tf.where(small, x_small, tf.where(use_right, s_right + alpha * from_right,
                                                  s_left + alpha * from_left))
        # The offsets: symmetric form t = midpoint + α·c; one-neighbour forms from that
        # neighbour, the other one across the gap g (inf when it overflows: the scores
        # across the gap are then at distance inf, as they should).
        c = 0.5 * (log_p - log_q) + asinh_z
        gap_f = tf.where(both, gap, tf.zeros_like(gap))
        delta_left = tf.where(small, 0.5 * gap_f + c,
                              tf.where(use_right, gap_f + from_right, from_left))
        delta_right = tf.where(small, c - 0.5 * gap_f,
                               tf.where(use_right, from_right, from_left - gap_f))
        return _Threshold(value, m, s_left, s_right, delta_left, delta_right)


def _sort_rows(packed):
    """Ascending sort of the rows: XLA's single-operand sort under XLA, else `tf.sort`."""
    if _in_xla_context():
        from tensorflow.compiler.tf2xla.ops import gen_xla_ops
        return gen_xla_ops.xla_sort(packed)
    return tf.sort(packed, axis=-1)


def _stable_argsort(x2d):
    """Stable ascending argsort of `[b, n]` rows (int32); float32 rows sort one int64 key
    per entry (the float's order-preserving bits, then the index): distinct keys, and a
    single integer operand XLA's CPU sort compares natively."""
    if x2d.dtype != tf.float32:
        return tf.argsort(x2d, axis=-1, stable=True)
    # In integer arithmetic (TFLite has no builtin shift or and): a negative float's bits
    # b, magnitude bits flipped, are −b − 2³¹ − 1; the index is the key modulo 2³².
    bits = tf.cast(tf.bitcast(x2d, tf.int32), tf.int64)
    key = tf.where(bits >= 0, bits, -bits - tf.constant(2 ** 31 + 1, tf.int64))
    index = tf.range(tf.shape(x2d)[-1], dtype=tf.int64)
    packed = _sort_rows(key * tf.constant(2 ** 32, tf.int64) + index)
    return tf.cast(tf.math.floormod(packed, tf.constant(2 ** 32, tf.int64)), tf.int32)


def _scatter_rows(index, values):
    """`out[b, index[b, i]] = values[b, i]` for `[b, n]` tensors (a batched scatter)."""
    b = tf.shape(index)[0]
    rows = tf.broadcast_to(tf.range(b)[:, None], tf.stack([b, tf.shape(index)[1]]))
    return tf.scatter_nd(tf.stack([rows, index], axis=-1), values, tf.shape(values))


def _valid_first(order, valid):
    """`order` stably reordered with the valid entries first (O(n))."""
    is_valid = tf.gather(valid, order, batch_dims=1)
    vi = tf.cast(is_valid, tf.int32)
    n_valid = tf.reduce_sum(vi, axis=-1, keepdims=True)
    pos = tf.where(is_valid, tf.cumsum(vi, axis=-1, exclusive=True),
                   n_valid + tf.cumsum(1 - vi, axis=-1, exclusive=True))
    return _scatter_rows(pos, order)


def _asinh_unit(z):
    """asinh(z) for |z| ≤ 1; in float32 (no TFLite Asinh) log1p(u + u²/(1 + √(1 + u²)))
    of u = |z|, odd-extended (within 2 ulps)."""
    if z.dtype == tf.float64:
        return tf.math.asinh(z)

    def positive(u):
        return tf.math.log1p(u + u * u / (1.0 + tf.sqrt(1.0 + u * u)))

    return tf.where(z >= 0, positive(z), -positive(-z))


def _lap_cdf(z):
    """Lap_1(z) (standard Laplace CDF), elementwise; exact at ±inf."""
    return tf.where(z <= 0, 0.5 * tf.exp(tf.minimum(z, 0.0)),
                    1.0 - 0.5 * tf.exp(-tf.maximum(z, 0.0)))


def _lap_cdf_difference(hi, lo, spread):
    """Lap_1(hi) − Lap_1(lo) for hi ≥ lo (±inf allowed), without cancellation;
    `spread` = hi − lo ≥ 0, computed by the caller without overflow."""
    shrink = -tf.math.expm1(-spread)                               # 1 − e^{−(hi − lo)}
    both_neg = hi <= 0
    both_pos = lo >= 0
    hi_n = tf.where(both_neg, hi, tf.zeros_like(hi))
    lo_p = tf.where(both_pos, lo, tf.zeros_like(lo))
    mixed = 1.0 - 0.5 * tf.exp(-tf.maximum(hi, 0.0)) - 0.5 * tf.exp(tf.minimum(lo, 0.0))
    return tf.where(both_neg, 0.5 * tf.exp(hi_n) * shrink,
                    tf.where(both_pos, 0.5 * tf.exp(-lo_p) * shrink, mixed))


def _implicit_weights(u, valid):
    """∂t/∂r_j = π_j = softmax_j(−|u_j|) over the valid entries and u clipped finite (0
    at the others) for the offsets u = (t − r_j)/α `[..., n]` of a threshold."""
    bound = tf.constant(np.finfo(u.dtype.as_numpy_dtype).max / 4, u.dtype)
    u = tf.clip_by_value(u, -bound, bound)                      # so that 0·u = 0
    logits = tf.where(valid, -tf.abs(u), tf.constant(-np.inf, u.dtype))
    pi = tf.where(valid, tf.nn.softmax(logits, axis=-1), tf.zeros_like(u))
    return pi, tf.where(valid, u, tf.zeros_like(u))


# -- Operators -------------------------------------------------------------------------
@list_operator
@_docs.fill
def lapsum_rank(x, alpha=DEFAULT_ALPHA, direction: str = "ASCENDING", axis: int = -1, *,
                mask=None):
    """Soft ranks ½ + F(r_i) = 1 + Σ_{j≠i} Lap_α(r_i − r_j) (paper eq. (1)).

    1-based: in the hard limit α → 0 they equal `scipy.stats.rankdata` (ties
    averaged); for any α they lie in [1, n], sum to n(n + 1)/2 and increase with the
    scores. O(n log n) time, O(n) memory.

    Args:
      x: `[..., n]` real tensor.
      alpha: the Laplace scale α > 0, in the units of the scores (module docstring).
      {direction_rank}
      {axis}
      {mask}

    Returns:
      Soft ranks, the shape and (floating) dtype of x (0 at padding).

    Example:
    >>> r = lapsum_rank([[2.5, -1.0, 0.3, 4.0]], alpha=0.01)
    >>> np.round(r.numpy(), 3)
    array([[3., 1., 2., 4.]], dtype=float32)
    """
    prep = _Prepared(x, direction, alpha)
    lst = _SortedList(prep, prep.x, prep.alpha)
    finite = lst.scatter(tf.where(lst.w > 0, lst.f + 0.5, tf.zeros_like(lst.f)))
    # ±inf entries: tied among themselves at the ends of the order.
    zero = tf.zeros_like(finite)
    ranks = tf.where(prep.valid, finite + prep.n_neg[:, None], zero)
    ranks = tf.where(prep.neg, zero + 0.5 * (prep.n_neg[:, None] + 1.0), ranks)
    ranks = tf.where(prep.pos, zero + prep.n_all[:, None] - 0.5 * (prep.n_pos[:, None] - 1.0),
                     ranks)
    return ListResult(poison_rows(ranks, prep.nan), "elementwise")


@list_operator
@_docs.fill
def lapsum_sort(x, alpha=DEFAULT_ALPHA, direction: str = "ASCENDING", axis: int = -1, *,
                mask=None):
    """Soft sort F⁻¹(k − ½), k = 1..n: the inverse of the soft rank (paper Thm. 3.1).

    In the hard limit α → 0 it equals `np.sort`; the outputs are monotonic in k and in
    the units of x. O(n log n) time, O(n) memory.

    Args:
      x: `[..., n]` real tensor.
      alpha: the Laplace scale α > 0, in the units of the scores.
      {direction}
      {axis}
      {mask}

    Returns:
      Soft-sorted values, the shape and (floating) dtype of x (with a mask: the first
      n_valid are the valid values', then 0).

    Example:
    >>> v = lapsum_sort([[2.5, -1.0, 0.3, 4.0]], alpha=0.01)
    >>> np.round(v.numpy(), 3)
    array([[-1. ,  0.3,  2.5,  4. ]], dtype=float32)
    """
    prep = _Prepared(x, direction, alpha)
    lst = _SortedList(prep, prep.x, prep.alpha)
    thr, keep = lst.solve_unit_spaced(0.5, tf.shape(prep.x)[-1])
    values = tf.where(keep, thr.value, tf.zeros_like(thr.value))
    # The finite values at positions n₋ .. n₋ + N − 1, −inf before, +inf after, then 0.
    shifted, neg, fin, pos = prep.place(values, lst.count)
    inf = tf.constant(np.inf, values.dtype) * tf.ones_like(shifted)
    values = tf.where(neg, -inf, tf.where(fin, shifted, tf.where(pos, inf,
                                                                 tf.zeros_like(shifted))))
    values = poison_rows(values, prep.nan)
    if prep.direction == "DESCENDING":
        values = -values
    return ListResult(values, "sorted", lengths=None if prep.mask is None else prep.n_all)


def _check_k(k, static_n):
    """`(k, checked)`: `k` checked in (0, n) at trace time when its value is known (a
    Python number, or a constant tensor, returned as is so that gradients reach it);
    `checked` False when it must be checked at run time."""
    if isinstance(k, (tf.Tensor, tf.Variable)):
        if k.shape.rank not in (None, 0):
            raise ValueError(f"`k` must be a scalar, got shape {k.shape}.")
        value = tf.get_static_value(k) if isinstance(k, tf.Tensor) else None
        if value is not None:
            _check_k(np.asarray(value).item(), static_n)
        return k, value is not None
    if (isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Real)
            or not 0 < k < (math.inf if static_n is None else static_n)):
        bound = "n" if static_n is None else f"n = {static_n}"
        raise ValueError(f"`k` must be a real number in (0, {bound}), got {k!r}.")
    return float(k), True


@list_operator
@_docs.fill
def lapsum_topk(x, k, alpha=DEFAULT_ALPHA, direction: str = "DESCENDING", axis: int = -1, *,
                mask=None):
    """Soft top-k membership Lap_α(r_i − t), with t solving Σ_i Lap_α(r_i − t) = k
    (paper §3).

    Each membership is in (0, 1), they sum to k, increase with the score and tend to
    the hard top-k indicator as α → 0 (scores tied at the boundary share). The gradient
    is that of the implicit function t(r, k, α), in k too.

    Args:
      x: `[..., n]` real tensor.
      k: a number in (0, n), real allowed, or a scalar tensor. With a mask, rows with
        n_valid <= k select all their valid entries, rows without one give 0.
      alpha: the Laplace scale α > 0, in the units of the scores.
      direction: 'DESCENDING' (default: the k largest) or 'ASCENDING' (the k smallest).
      {axis}
      {mask}

    Returns:
      The soft membership, the shape and (floating) dtype of x.

    Example:
    >>> p = lapsum_topk([[2.5, -1.0, 0.3, 4.0]], k=2, alpha=0.01)
    >>> np.round(p.numpy(), 3)
    array([[1., 0., 0., 1.]], dtype=float32)
    """
    # The membership selects the largest entries of the prepared scores: those of x for
    # 'DESCENDING', of −x for 'ASCENDING'.
    flip = "ASCENDING" if _checks.check_direction(direction) == "DESCENDING" else "DESCENDING"
    prep = _Prepared(x, flip, alpha)
    x2d, view = prep.x, prep.view
    dtype = x2d.dtype
    # With a mask, rows of n_valid <= k select all their entries: k may reach n.
    k_value, static_k = _check_k(k, view.static_n if prep.mask is None else None)
    k_t = (tf.constant(k_value, dtype) if isinstance(k_value, float)
           else tf.cast(k_value, dtype))
    checks = [] if static_k else [
        tf.debugging.assert_positive(k_t, message="softsort_tf: `k` must be > 0")]
    if prep.mask is None and not (static_k and view.static_n is not None):
        checks.append(tf.debugging.assert_less(
            k_t, tf.cast(tf.shape(x2d)[-1], dtype),
            message="softsort_tf: `k` must be smaller than the list length n"))
    if checks:
        with tf.control_dependencies(checks):
            k_t = tf.identity(k_t)
    # +inf entries take the first min(k, n₊) of the mass, equally; the finite entries the
    # top-(k − n₊) of their own list; −inf entries what is left, equally.
    k_finite = k_t - prep.n_pos
    p = _topk_membership(prep, tf.broadcast_to(k_finite, tf.shape(prep.n_fin)))
    share_pos = tf.clip_by_value(k_t / tf.maximum(prep.n_pos, 1.0), 0.0, 1.0)
    share_neg = tf.clip_by_value((k_finite - prep.n_fin) / tf.maximum(prep.n_neg, 1.0),
                                 0.0, 1.0)
    p = tf.where(prep.pos, tf.ones_like(p) * share_pos[:, None], p)
    p = tf.where(prep.neg, tf.ones_like(p) * share_neg[:, None], p)
    return ListResult(poison_rows(p, prep.nan), "elementwise")


def _topk_membership(prep, k):
    """The memberships `[b, n]` of the finite entries for their share k `[b]` with the
    implicit-function gradient in (x, k, α); rows with k ≤ 0 give 0, k ≥ N 1."""
    valid, count = prep.valid, prep.n_fin
    vmask = tf.cast(valid, prep.x.dtype)

    @tf.custom_gradient
    def membership(x2d, k, alpha):
        level = count - k                                         # F(t) = N − k
        active = tf.logical_and(level > 0, level < count)
        safe_level = tf.where(active, level, 0.5 * tf.ones_like(level))
        scores = tf.stop_gradient(x2d)
        lst = _SortedList(prep, scores, tf.stop_gradient(alpha))
        thr = lst.solve(safe_level[:, None])                      # [b, 1]
        u = -lst.offsets(thr, scores)[:, 0, :]                    # (r_i − t)/α
        u = tf.where(valid, u, tf.zeros_like(u))
        full = tf.where(level <= 0, tf.ones_like(level), tf.zeros_like(level))
        p = tf.where(active[:, None], _lap_cdf(u), tf.ones_like(u) * full[:, None]) * vmask

        def grad(dp):
            # dp_i = f_i·(dr_i − dt − u_i·dα), dt = Σπ_j dr_j − dk/F' − (Σπ_j u_j)·dα,
            # with f_i = e^{−|u_i|}/(2α), π = f/Σf, F' = Σf.
            pi, uc = _implicit_weights(u, valid)
            f = tf.exp(-tf.abs(uc)) / (2.0 * alpha) * vmask
            dp = dp * tf.cast(active, dp.dtype)[:, None]
            v_bar = tf.reduce_sum(dp * pi, axis=-1, keepdims=True)
            u_bar = tf.reduce_sum(pi * uc, axis=-1, keepdims=True)
            return f * (dp - v_bar), v_bar[:, 0], -tf.reduce_sum(dp * f * (uc - u_bar))

        return p, grad

    return membership(prep.x, k, prep.alpha)


@list_operator
@_docs.fill
def lapsum_quantile(x, quantiles, alpha=DEFAULT_ALPHA, axis: int = -1, *, mask=None):
    """Soft quantiles F⁻¹(τ·n) (the inverse LapSum at the level τ·n).

    In the hard limit α → 0 they equal `np.quantile(x, τ, method='averaged_inverted_cdf')`.
    O(n log n) time, O(n) memory per level; the gradient is that of the implicit
    function F(t) = τn: ∂t/∂r_j = softmax_j(−|t − r_j|/α).

    Args:
      x: `[..., n]` real tensor.
      quantiles: a level or a strictly increasing sequence of q levels in (0, 1).
      alpha: the Laplace scale α > 0, in the units of the scores.
      {axis}
      {mask}

    Returns:
      `[..., q]` (the list axis replaced by the levels), `[...]` for a scalar level;
      0 for a list without valid entry.

    Example:
    >>> q = lapsum_quantile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5, alpha=0.01)
    >>> round(float(q), 2)
    3.0
    """
    taus, scalar = _checks.check_quantiles(quantiles)
    prep = _Prepared(x, "ASCENDING", alpha)
    valid, count = prep.valid, prep.n_fin
    dtype = prep.x.dtype
    # F of the whole list is that of the finite entries plus n₋ (the −inf entries):
    # levels at or below 0 are −inf, at or above the finite count +inf.
    levels = prep.n_all[:, None] * tf.constant(taus, dtype)[None, :] - prep.n_neg[:, None]
    active = tf.logical_and(levels > 0, levels < count[:, None])

    @tf.custom_gradient
    def solve(x2d, alpha):
        scores = tf.stop_gradient(x2d)
        lst = _SortedList(prep, scores, tf.stop_gradient(alpha))
        thr = lst.solve(tf.where(active, levels, 0.5 * tf.ones_like(levels)))   # [b, q]

        def grad(dt):
            pi, u = _implicit_weights(lst.offsets(thr, scores), valid[:, None, :])
            dt = dt * tf.cast(active, dtype)
            return (tf.reduce_sum(dt[:, :, None] * pi, axis=1),
                    tf.reduce_sum(dt * tf.reduce_sum(pi * u, axis=-1)))

        return tf.where(active, thr.value, tf.zeros_like(thr.value)), grad

    out = solve(prep.x, prep.alpha)
    inf = tf.constant(np.inf, dtype)
    out = tf.where(levels <= 0, -inf * tf.ones_like(out),
                   tf.where(levels >= count[:, None], inf * tf.ones_like(out), out))
    if prep.mask is not None:  # a list without valid entry: 0
        out = tf.where(prep.n_all[:, None] > 0, out, tf.zeros_like(out))
    out = poison_rows(out, prep.nan)
    return ListResult(out[:, 0] if scalar else out, "per_list")


@list_operator
@_docs.fill
def lapsum_permutation_matrix(x, alpha=DEFAULT_ALPHA, direction: str = "DESCENDING", *,
                              mask=None):
    """Soft permutation matrix P[k, j] = Lap_α(t_{k+1} − r_j) − Lap_α(t_k − r_j), with
    thresholds t_k = F⁻¹(k), t_0 = −∞, t_n = +∞ (paper §4).

    Row k is the distribution of the input at position k of the `direction` order (as
    in `softsort_tf.ops.permutation.softsort_permutation_matrix`: `P @ x` soft-sorts
    x); P is doubly stochastic and tends to the sorting permutation as α → 0. O(n²)
    time and memory.

    Args:
      x: `[..., n]` scores.
      alpha: the Laplace scale α > 0, in the units of the scores.
      direction: 'DESCENDING' (default; row 0 = the largest score) or 'ASCENDING'.
      {mask}

    Returns:
      `[..., n, n]` matrix in the (floating) dtype of x (0 outside the valid block).

    Example:
    >>> P = lapsum_permutation_matrix([[0.3, 2.0, 1.0]], alpha=0.01)
    >>> np.round(P.numpy()[0], 3)
    array([[0., 1., 0.],
           [0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    """
    prep = _Prepared(x, direction, alpha)   # 'DESCENDING': −x ascending
    x2d = prep.x
    dtype = x2d.dtype
    lst = _SortedList(prep, x2d, prep.alpha)
    n = tf.shape(x2d)[-1]
    b = tf.shape(x2d)[0]
    thr, inner = lst.solve_unit_spaced(1.0, tf.maximum(n - 1, 1))   # t_1..t_{n−1}
    inf = tf.constant(np.inf, dtype)
    # (t_k − r_j)/α for the inner thresholds t_1..t_{N−1}, +inf beyond; t_0 = −∞.
    off = tf.where(inner[:, :, None], lst.offsets(thr, x2d), inf)[:, : n - 1]
    column = tf.fill(tf.stack([b, 1, n]), inf)
    lo = tf.concat([-column, off], axis=1)                        # (t_k − r_j)/α
    hi = tf.concat([off, column], axis=1)                         # (t_{k+1} − r_j)/α
    # (t_{k+1} − t_k)/α without cancellation: across segments, the sum of three
    # non-negative terms; within a segment, the difference of the offsets from the
    # nearer neighbour.
    dl, dr = thr.delta_left, thr.delta_right
    same = tf.equal(thr.m[:, 1:], thr.m[:, :-1])
    across = (-dr[:, :-1] + _scaled_gap(thr.s_right[:, :-1], thr.s_left[:, 1:], prep.alpha)
              + dl[:, 1:])
    near_left = dl[:, 1:] <= -dr[:, :-1]
    within = tf.where(near_left, dl[:, 1:] - dl[:, :-1], dr[:, 1:] - dr[:, :-1])
    step = tf.maximum(tf.where(same, within, across), 0.0)
    step = tf.where(tf.logical_and(inner[:, 1:], inner[:, :-1]), step, inf)
    edge = tf.fill(tf.stack([b, 1]), inf)
    spread = tf.concat([edge, step, edge], axis=1)[:, :n]          # [b, n] rows
    spread = tf.where(tf.equal(n, 1), tf.fill(tf.stack([b, n]), inf), spread)
    finite = _lap_cdf_difference(hi, lo, spread[:, :, None])
    # The finite block at rows n₋ .. n₋ + N − 1 and the finite entries' columns; −inf
    # entries share the first n₋ rows, +inf the last n₊ valid rows.
    perm, neg, fin, pos = prep.place(finite, lst.count)
    perm = tf.where(tf.logical_and(fin[:, :, None], prep.valid[:, None, :]), perm,
                    tf.zeros_like(perm))
    ones = tf.ones_like(perm)
    perm = tf.where(tf.logical_and(neg[:, :, None], prep.neg[:, None, :]),
                    ones / tf.maximum(prep.n_neg, 1.0)[:, None, None], perm)
    perm = tf.where(tf.logical_and(pos[:, :, None], prep.pos[:, None, :]),
                    ones / tf.maximum(prep.n_pos, 1.0)[:, None, None], perm)
    return ListResult(poison_rows(perm, prep.nan), "square")


# -- The LapSum family (`softsort_tf.ops.family`) --------------------------------------
def _quantile_from(x, quantiles, *, direction, mask, **kwargs):
    """`lapsum_quantile` in the front door's convention: 'DESCENDING' is the quantile
    from the top."""
    if _checks.check_direction(direction) == "DESCENDING":
        return -lapsum_quantile(-x, quantiles, mask=mask, **kwargs)
    return lapsum_quantile(x, quantiles, mask=mask, **kwargs)


_quantile_from.keywords = frozenset({"alpha", "axis", "mask", "direction"})


LAPSUM = family.Family(
    "lapsum", "alpha", DEFAULT_ALPHA,
    "scale α of the Laplace kernel, in the units of the scores: values closer than α "
    "are blurred together", "Struski, Bednarczyk, Podolak & Tabor (2025)",
    operations=dict(rank=family.family_operation(lapsum_rank),
                    sort=family.family_operation(lapsum_sort),
                    topk=family.family_operation(lapsum_topk),
                    quantile=_quantile_from),
    matrix_fn=with_straight_through(lapsum_permutation_matrix), doubly_stochastic=True,
    real_k=True, tensor_temperature=True, temperature_range=temperature_range,
    scale_free_temperature=30.0)

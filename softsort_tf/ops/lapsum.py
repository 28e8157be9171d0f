"""LapSum operators: soft ranks, sorts, top-k masks, quantiles and permutation matrices
in O(n log n) (Struski, Bednarczyk, Podolak & Tabor, ICML 2025, arXiv 2503.06242).

The construction
----------------
Let Lap_α be the CDF of the Laplace distribution of scale α > 0 centred at 0,

    Lap_α(z) = ½·exp(z/α)            for z ≤ 0,
    Lap_α(z) = 1 − ½·exp(−z/α)       for z > 0,

and, for the scores r_1..r_n of one list, the *LapSum* function (paper eq. (1))

    F(x) = Σ_j Lap_α(x − r_j),       a continuous increasing bijection R → (0, n).

Every operator of this module is read off F or its inverse:

- soft rank (1-based):      rank_i = ½ + F(r_i) = 1 + Σ_{j≠i} Lap_α(r_i − r_j);
- soft sort:                sort_k = F⁻¹(k − ½), k = 1..n (the inverse of the soft rank);
- soft top-k membership:    p_i = Lap_α(r_i − t) with Σ_i Lap_α(r_i − t) = k, i.e.
                            F(t) = n − k (paper §3, "soft top-k"); Σ_i p_i = k exactly;
- soft quantile at level τ: F⁻¹(τ·n);
- soft permutation matrix:  P[k, j] = Lap_α(t_{k+1} − r_j) − Lap_α(t_k − r_j) with the
                            thresholds t_k = F⁻¹(k) (t_0 = −∞, t_n = +∞): the mass of
                            input j between two thresholds (paper §4, "soft permutation").
                            Rows sum to F(t_{k+1}) − F(t_k) = 1 and columns to 1.

As α → 0, F tends to the step function #{r_j < x} + ½·#{r_j = x}, so the soft ranks
tend to `scipy.stats.rankdata` (ties averaged), the soft sort to `np.sort`, the top-k
mask to the hard top-k indicator (ties at the boundary share the mass), the quantiles
to `np.quantile(..., method='averaged_inverted_cdf')` and P to the sorting permutation.

Closed-form inverse (paper Thm. 3.1, rewritten)
------------------------------------------------
Sort the scores, s_1 ≤ ... ≤ s_n. Between two neighbours, x ∈ [s_m, s_{m+1}],

    F(x) = m − ½·p_m·exp(−(x − s_m)/α) + ½·q_m·exp(−(s_{m+1} − x)/α),
    p_m = Σ_{j≤m} exp(−(s_m − s_j)/α) ∈ [1, m],  q_m = Σ_{j>m} exp(−(s_j − s_{m+1})/α) ∈ [1, n − m],

a quadratic in exp(x/α). Its root for F(x) = w, with d = w − m, g = (s_{m+1} − s_m)/α,
ℓ = log p_m + log q_m − g, is

    x = (s_m + s_{m+1})/2 + (α/2)·(log p_m − log q_m) + α·asinh(d·exp(−ℓ/2)),

evaluated in three numerically safe forms (|d| ≤ exp(ℓ/2); d > 0 from the right
neighbour; d < 0 from the left one), which also cover the two unbounded pieces (m = 0:
x = s_1 − α·log q_0 + α·log(2w); m = n: x = s_n + α·log p_n − α·log(2(n − w))). The
segment m of each level is found by counting (a histogram of the sorted F values for
the n levels of the sort and the permutation matrix, a comparison for a few levels).

p and q are the strict one-sided Laplace-kernel sums A_i = Σ_{j<i} exp(−(s_i − s_j)/α)
and B_i = Σ_{j>i} exp(−(s_j − s_i)/α): p_m = 1 + A_m, q_m = 1 + B_{m+1}, and
F(s_i) = i − ½ + ½·(B_i − A_i). They are computed by a parallel prefix scan of the
affine recurrence A_i = D_i·(A_{i−1} + 1), D_i = exp(−(s_i − s_{i−1})/α) ∈ [0, 1]
(recursive doubling inside blocks of 16 entries, then over the blocks' totals: O(n)
work up to an O(n/16·log n) term, O(log n) depth): every quantity is a sum of
non-negative terms bounded by n, multiplied by decays ≤ 1, so nothing overflows for
scores of any scale and the sums keep full relative precision (no common reference
point whose cancellation would lose it). For float32 (and reduced-precision) scores
the gaps, decays, scans and F are computed in float64: F = i − ½ + ½(B − A) cancels two
sums of up to n terms, and the float32 rounding of the decays and of the sums grows
with n·α/spread (n = 10⁵ normal scores at α = 2: ranks off by 1.6, where float64
accumulation leaves the float32 rounding of the result); lists of a static length
whose sums all stay below `FLOAT32_SUMS_UP_TO` keep them in float32. The thresholds of
the top-k mask, the quantiles and the permutation matrix are held as offsets from their two
sorted neighbours, and every membership is computed from differences of scores, so the
results do not depend on the scores' offset. The scan's gradient is the same scan run
backwards (O(n) memory). float32 scores are sorted as one integer key per entry (the
order-preserving bits of the float and the index), which XLA's CPU sort compares
natively.

Cost: one sort, two scans (O(n log n) work, O(n) memory), O(1) per level; the
permutation matrix is O(n²). Gradients: automatic differentiation through the scans
and the closed form (exact on each segment) for ranks, sorts and permutation matrices;
the top-k mask and the quantiles use the implicit-function gradient of F(t) = w,
∂t/∂r_j = π_j, with π_j = softmax_j(−|t − r_j|/α) computed in the log domain, so a
threshold deep inside a large gap between scores still has a finite gradient.

The temperature α
-----------------
`alpha` (default `DEFAULT_ALPHA` = 1.0) is the scale of the Laplace kernel, in the units
of the scores (as SoftSort's τ). Two scores Δ apart interact with weight ½·exp(−Δ/α): a
soft rank differs from the hard one by at most ½·Σ_{j≠i} exp(−|r_i − r_j|/α), so results
are close to the hard ones when neighbouring sorted scores differ by a few α, and each
soft rank blurs over the scores within a few α otherwise. Rescale α with the scale of
the scores (n standard normal scores are ≈ 2.5/n apart in the bulk). Must be a finite
number > 0 (a Python number, checked at trace time, or a tensor — e.g. a trainable
variable — checked at run time); gradients flow into a tensor α. `temperature_range(dtype)`
is the range of α a computation in `dtype` resolves (float32: 3.2e-27 to 1.3e36), inside
which values and gradients are finite; the front door and the layers check it.

Conventions
-----------
Inputs `[..., n]`, operated along the last axis, any number of leading batch dims.
`direction` as in `tf.sort`: 'ASCENDING' ranks the smallest score 1 and sorts
increasingly; 'DESCENDING' uses −x (ranks the largest 1, sorts decreasingly, and the
top-k mask selects the largest k). float16/bfloat16 are computed in float32 and
returned in the input dtype; float32 and float64 are kept. Padding (`mask=`, True =
valid) follows `softsort_tf._masking`: padded entries carry no mass, the valid results
equal those of the unpadded list, padded outputs are 0 (sorted outputs: the first
n_valid positions hold the valid values, then 0; permutation matrices: rows ≥ n_valid
and padded columns 0), padded scores (NaN and ±inf included) get exactly zero gradient.
Non-finite scores at valid entries follow the package's rule (`softsort_tf._masking`):
±inf entries get the limits of very large scores (+inf ranks and sorts last, takes top-k
mass first, −inf the reverse; ties among them share), the finite entries get the results
of the finite entries alone, and a NaN makes its whole list NaN.
Every operator compiles with `tf.function(jit_compile=True)` for an unknown n and batch.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _masking
from softsort_tf.ops import family
from softsort_tf.ops.permutation import with_straight_through
from softsort_tf.ops.wrapper import ListResult, Lists, list_operator

__all__ = [
    "DEFAULT_ALPHA",
    "temperature_range",
    "lapsum_permutation_matrix",
    "lapsum_quantile",
    "lapsum_rank",
    "lapsum_sort",
    "lapsum_topk",
]

DEFAULT_ALPHA = 1.0

# ---------------------------------------------------------------------------------
# Arguments.
# ---------------------------------------------------------------------------------
# Headroom at both ends of α's range: the sorted values and quantiles reach
# s ± α·log(2n) (under α·22 for n < 2³¹) and the gradients' intermediates a few times
# that; a gradient in the scores is up to about n/α times the cotangent, finite for
# n < 2³¹ and cotangents up to 2⁸ when α ≥ 2⁴⁰/max.
_HIGH_HEADROOM = 2.0 ** 8
_LOW_HEADROOM = 2.0 ** 40


def temperature_range(dtype) -> tuple[float, float]:
    """`(low, high)`: the α a LapSum computation in `dtype` resolves (float16 and
    bfloat16 compute in float32).

    From 2⁴⁰ / (the largest finite number of `dtype`) — a gradient in the scores grows
    as n/α, finite there for any list length — to that largest number / 2⁸ (room for
    the sorted values s ± α·log(2n) and the gradients' intermediates). Inside the range
    the values and the gradients (in the scores and in a tensor α) are finite for
    finite scores. The values alone stay finite down to the smallest normal α.

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
    """`alpha` as a scalar tensor of `dtype`; Python numbers and constants are checked
    at trace time, other tensors at run time (a `tf.debugging` assertion)."""
    if isinstance(alpha, (tf.Tensor, tf.Variable)):
        value = tf.get_static_value(alpha) if isinstance(alpha, tf.Tensor) else None
        if value is not None:
            _checks.check_positive("alpha", np.asarray(value).item() if np.size(value) == 1
                                   else value)
        if alpha.shape.rank not in (None, 0):
            raise ValueError(f"`alpha` must be a scalar, got shape {alpha.shape}.")
        a = tf.cast(alpha, dtype)
        if value is None:
            check = tf.debugging.assert_positive(
                a, message="softsort_tf: `alpha` must be a finite number > 0")
            with tf.control_dependencies([check]):
                a = tf.identity(a)
        return a
    if isinstance(alpha, (bool, np.bool_)):
        raise ValueError(f"`alpha` must be a finite number > 0, got {alpha!r}.")
    return tf.constant(_checks.check_positive("alpha", alpha), dtype)


class _Prepared:
    """One call's lists in the frame the operators compute in.

    Attributes:
      x: `[b, n]` scores (negated for 'DESCENDING'), every entry finite: padded and
        non-finite entries replaced by the largest finite valid score of the row.
      view: the `BatchView`.
      mask: the caller's bool mask `[b, n]`, or None.
      valid: bool `[b, n]`, the valid entries with a finite score (those the LapSum
        construction runs on).
      neg, pos: bool `[b, n]`, the valid entries at −inf and +inf (of `x`'s frame).
      n_neg, n_pos, n_all: `[b]` numbers of −inf, +inf and valid entries (float).
      nan: bool `[b]`, the lists with a NaN at a valid entry (their results are NaN).
    """

    def __init__(self, lists: Lists, direction: str):
        direction = _checks.check_direction(direction)
        x2d = -lists.values if direction == "DESCENDING" else lists.values
        dtype = x2d.dtype
        self.view, self.mask = lists.view, lists.mask
        given = tf.ones_like(x2d, dtype=tf.bool) if lists.mask is None else lists.mask
        finite = tf.math.is_finite(x2d)
        self.valid = tf.logical_and(given, finite)
        self.neg = tf.logical_and(given, tf.equal(x2d, tf.constant(-np.inf, dtype)))
        self.pos = tf.logical_and(given, tf.equal(x2d, tf.constant(np.inf, dtype)))
        self.nan = tf.reduce_any(tf.logical_and(given, tf.math.is_nan(x2d)), axis=-1)
        self.raw = x2d
        self.x = _masking.replace_padded(x2d, self.valid)

        def count(t):
            return tf.reduce_sum(tf.cast(t, dtype), axis=-1)

        self.n_neg, self.n_pos, self.n_all = count(self.neg), count(self.pos), count(given)

    def poison(self, values):
        """`values` `[b, ...]` with the lists holding a NaN set to NaN."""
        nan = tf.reshape(self.nan, tf.concat([tf.shape(self.nan), tf.ones(
            tf.rank(values) - 1, tf.int32)], axis=0))
        return tf.where(nan, tf.constant(np.nan, values.dtype), values)


# ---------------------------------------------------------------------------------
# The parallel scan.
# ---------------------------------------------------------------------------------
#: Longest list length, known when the graph is traced, whose float32 scores keep the
#: kernel sums in float32. Measured on normal, uniform and clustered scores at α from
#: 1e-3 to 1e4: float32 sums leave the ranks within 2, 5, 14, 52 and 197 ulps of n of
#: the float64 ones at n = 64, 256, 1024, 4096 and 16384 (the error grows as n), the
#: sorted values within 3.5e-4·α and the top-k masses within 1.2e-6 at n = 1024
#: (tests/ops/test_lapsum.py::test_float32_sums_up_to_the_threshold). Lists of a length
#: unknown at trace time accumulate the sums in float64; longer lists of a static length
#: keep the float32 sums when every A_i + B_i is at most this bound (as in the short
#: lists: at a temperature of a few neighbour spacings the sums stay far below it) and
#: redo them in float64 otherwise, chosen at run time
#: (test_long_static_lists_choose_their_sum_dtype_by_the_sums).
FLOAT32_SUMS_UP_TO = 1024


def sum_dtype(dtype, n: int | None):
    """The dtype of the kernel sums A, B and of F for scores of `dtype` in lists of
    static length `n` (None: unknown): float64 for float64 scores and for float32 lists
    longer than `FLOAT32_SUMS_UP_TO` or of unknown length, else float32."""
    if dtype == tf.float64 or n is None or n > FLOAT32_SUMS_UP_TO:
        return tf.float64
    return dtype


def _shift_right(t, shift, fill):
    """`t[:, i - shift]` (`fill` for i < shift) along the last axis, for a dynamic
    `shift` (a dynamic slice of the concatenation, compilable by XLA)."""
    n = tf.shape(t)[-1]
    padded = tf.concat([tf.fill(tf.shape(t), tf.constant(fill, t.dtype)), t], axis=-1)
    out = tf.slice(padded, tf.stack([0, n - shift]), tf.stack([-1, n]))
    return tf.reshape(out, tf.shape(t))


def _doubling_scan(decay, add):
    """Inclusive scan y_i = decay_i·y_{i−1} + add_i of `[rows, n]` tensors by recursive
    doubling (Hillis–Steele): ⌈log₂ n⌉ passes of O(n)."""
    n = tf.shape(decay)[-1]

    def body(shift, m, c):  # shift = 1, 2, 4, ... while below n: ⌈log₂ n⌉ passes
        prev_m = _shift_right(m, shift, 1.0)
        prev_c = _shift_right(c, shift, 0.0)
        return shift * 2, m * prev_m, m * prev_c + c

    _, _, c = tf.while_loop(lambda shift, m, c: shift < n, body,
                            (tf.constant(1, tf.int32), decay, add), maximum_iterations=64)
    return c


# Block length of the two-level scan.
_BLOCK = 16


def _scan_forward(decay, add):
    """Inclusive scan y_i = decay_i·y_{i−1} + add_i (y_{−1} = 0) of `[rows, n]` tensors,
    in blocks of `_BLOCK` entries: recursive doubling inside every block at once
    (log₂ `_BLOCK` passes of O(n)), recursive doubling over the blocks' totals
    (O((n / _BLOCK)·log n)), then each entry adds its block's incoming total times the
    product of the decays from the block start:
    y_i = local_i + (Π_{block start ≤ k ≤ i} decay_k)·y_{block start − 1}.
    Every term is a product of decays in [0, 1] and non-negative adds: no overflow."""
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
    y = c + m * incoming[:, :, None]
    return tf.reshape(y, tf.stack([rows, num_blocks * _BLOCK]))[:, :n]


@tf.custom_gradient
def _affine_scan(decay, add):
    """Inclusive scan y_i = decay_i·y_{i−1} + add_i (y_{−1} = 0) along the last axis of
    `[rows, n]` tensors (`_scan_forward`: O(n) work in blocks, O(log n) depth).

    With 0 ≤ decay ≤ 1 and add ≥ 0 every intermediate is a non-negative sum bounded by
    Σ add. The gradient is the reverse scan λ_i = ȳ_i + decay_{i+1}·λ_{i+1}, with
    ∂/∂add_i = λ_i and ∂/∂decay_i = λ_i·y_{i−1} (O(n) memory)."""
    y = _scan_forward(decay, add)

    def grad(dy):
        next_decay = tf.concat([decay[:, 1:], tf.zeros_like(decay[:, :1])], axis=-1)
        lam = tf.reverse(_affine_scan(tf.reverse(next_decay, [-1]), tf.reverse(dy, [-1])),
                         [-1])
        y_prev = tf.concat([tf.zeros_like(y[:, :1]), y[:, :-1]], axis=-1)
        return lam * y_prev, lam

    return y, grad


def _laplace_sums(s, w, alpha):
    """Strict one-sided Laplace-kernel sums of sorted rows `s` `[b, n]` with weights `w`:

        A_i = Σ_{j<i} w_j·exp(−(s_i − s_j)/α),   B_i = Σ_{j>i} w_j·exp(−(s_j − s_i)/α).
    """
    gaps = _scaled_gap(s[:, :-1], s[:, 1:], alpha)             # [b, n − 1], ≥ 0
    decay = tf.exp(-gaps)
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
    """(high − low)/α for high ≥ low without overflow in the subtraction (halves first,
    α itself never scaled: the smallest normal α stays normal); +inf when the quotient
    overflows, which every caller handles (exp(−inf) = 0)."""
    return _over_alpha(tf.maximum(high * 0.5 - low * 0.5, 0.0), alpha)


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


def _clip_finite(u):
    """u with ±inf replaced by ±(a large finite value), so that 0·u = 0."""
    bound = tf.constant(np.finfo(u.dtype.as_numpy_dtype).max / 4, u.dtype)
    return tf.clip_by_value(u, -bound, bound)


def _scaled_difference(a, b, alpha):
    """(a − b)/α without overflow in the subtraction (±inf when the quotient overflows
    or a is infinite)."""
    return _over_alpha(a * 0.5 - b * 0.5, alpha)


# ---------------------------------------------------------------------------------
# The sorted list and the inverse of F.
# ---------------------------------------------------------------------------------
class _SortedList:
    """One call's sorted scores with the prefix sums of the construction.

    Attributes (all `[b, n]` except `count`):
      s: scores sorted increasingly, valid entries first (padded ones last, with the
        largest valid value, weight 0).
      order: the input index of each sorted position.
      w: 1 at valid sorted positions, 0 at padded ones.
      a, b: the strict one-sided kernel sums A, B (see `_laplace_sums`).
      f: F at the sorted scores, +inf at padded positions (so that counting levels
        never lands in the padding).
      count: `[b]` number of valid entries N (float).
    """

    def __init__(self, x2d, valid, alpha, prep=None):
        self.alpha = alpha
        dtype = x2d.dtype
        before = None
        if prep is not None and prep.mask is None:
            # No padding: the sort of the raw scores puts the −inf entries first and the
            # +inf ones last, so the finite entries come first once each row is rotated
            # by its number of −inf (a gather, where `_valid_first` scatters).
            n = tf.shape(x2d)[-1]
            order = _stable_argsort(prep.raw)
            n_neg = tf.cast(prep.n_neg, tf.int32)[:, None]
            order = tf.gather(order, (tf.range(n)[None, :] + n_neg) % n, batch_dims=1)
            n_fin = n - n_neg - tf.cast(prep.n_pos, tf.int32)[:, None]
            w = tf.cast(tf.range(n)[None, :] < n_fin, dtype)
            # The number of valid entries before each position, without a cumsum.
            before = tf.minimum(tf.range(n)[None, :], n_fin)
        elif valid is not None:
            order = _stable_argsort(x2d)
            order = _valid_first(order, valid)
            w = tf.cast(tf.gather(valid, order, batch_dims=1), dtype)
        else:
            order = _stable_argsort(x2d)
            w = tf.ones_like(x2d)
        self.order = order
        self.s = tf.gather(x2d, order, batch_dims=1)
        self.w = w
        self.count = tf.reduce_sum(w, axis=-1)
        # Long float32 lists accumulate the sums in float64 (their gaps are exact there):
        # F = i + ½ + ½(B − A) cancels two sums of up to n terms, whose float32 rounding
        # (and that of the products of many decays) grows with n·α/spread. Lists of a
        # static length up to `FLOAT32_SUMS_UP_TO` keep float32 (no float64 in the graph);
        # longer lists of a static length keep the float32 sums when no A_i + B_i exceeds
        # `FLOAT32_SUMS_UP_TO` (the bound the short lists have), and redo them in float64
        # otherwise (one `tf.cond` per call).
        wide = sum_dtype(dtype, x2d.shape[-1])

        def sums_and_f(sum_dtype_):
            a, b = _laplace_sums(tf.cast(self.s, sum_dtype_), tf.cast(w, sum_dtype_),
                                 tf.cast(alpha, sum_dtype_))
            if before is not None:
                count_before = tf.cast(before, sum_dtype_)
            elif valid is None:
                count_before = tf.broadcast_to(
                    tf.range(tf.shape(x2d)[-1], dtype=sum_dtype_)[None, :], tf.shape(x2d))
            else:
                count_before = tf.cumsum(tf.cast(w, sum_dtype_), axis=-1, exclusive=True)
            f = count_before + 0.5 * tf.cast(w, sum_dtype_) + 0.5 * (b - a)
            return tf.cast(a, dtype), tf.cast(b, dtype), tf.cast(f, dtype)

        if wide == dtype:
            self.a, self.b, f = sums_and_f(dtype)
        elif x2d.shape[-1] is None:
            self.a, self.b, f = sums_and_f(wide)
        else:
            a, b, f = sums_and_f(dtype)
            small = tf.reduce_max(a + b) <= FLOAT32_SUMS_UP_TO
            self.a, self.b, f = tf.cond(small, lambda: (a, b, f), lambda: sums_and_f(wide))
        self.f = f if valid is None else tf.where(w > 0, f, tf.constant(np.inf, dtype))

    def scatter(self, y_sorted):
        """A `[b, n]` result in sorted order → input order (a batched scatter)."""
        b = tf.shape(self.order)[0]
        n = tf.shape(self.order)[1]
        rows = tf.broadcast_to(tf.range(b)[:, None], tf.stack([b, n]))
        idx = tf.stack([rows, self.order], axis=-1)
        return tf.scatter_nd(idx, y_sorted, tf.shape(y_sorted))

    def segments_counted(self, levels):
        """m = #{sorted positions with F ≤ level} for few levels `[b, K]` (O(n·K))."""
        below = self.f[:, None, :] <= levels[:, :, None]
        return tf.reduce_sum(tf.cast(below, tf.int32), axis=-1)

    def segments_unit_spaced(self, offset, num_levels):
        """m for the levels offset + k, k = 0..num_levels − 1 (O(n), a histogram)."""
        b = tf.shape(self.f)[0]
        kmax = tf.cast(num_levels, self.f.dtype)
        first = tf.math.ceil(tf.minimum(self.f - offset, kmax))     # first level ≥ F
        first = tf.cast(tf.clip_by_value(first, 0.0, kmax), tf.int32)
        width = num_levels + 1
        ids = first + tf.range(b)[:, None] * width
        ids = tf.reshape(ids, [-1])
        hist = tf.math.unsorted_segment_sum(tf.ones_like(ids), ids, b * width)
        return tf.cumsum(tf.reshape(hist, tf.stack([b, width])), axis=-1)[:, :num_levels]

    def offsets(self, thr, values):
        """(t − r)/α `[b, K, n]` of thresholds `thr` (`invert`) at scores `values`
        `[b, n]` (sorted or in input order), from the neighbour on the side of r:
        δ_left + (s_left − r)/α for r ≤ s_left, δ_right + (s_right − r)/α otherwise
        (no score lies strictly between the neighbours; scores tied with both give
        the same value either way). Both terms have the same sign, so the result is
        the difference of scores rounded once, whatever their offset (an absolute
        threshold near large scores would be rounded to their ulp)."""
        s = values[:, None, :]
        below = s <= thr.s_left[:, :, None]
        from_left = thr.delta_left[:, :, None] + _scaled_difference(
            thr.s_left[:, :, None], s, self.alpha)
        from_right = thr.delta_right[:, :, None] + _scaled_difference(
            thr.s_right[:, :, None], s, self.alpha)
        return tf.where(below, from_left, from_right)

    def invert(self, levels, m):
        """The solutions t of F(t) = level for `[b, K]` levels in (0, N) and their
        segments m, as a `_Threshold`: the value t and its offsets from the two sorted
        neighbours, δ_left = (t − s_m)/α ≥ 0 and δ_right = (t − s_{m+1})/α ≤ 0 (1-based
        s as in the module docstring), each computed from the closed form without
        forming t."""
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
        x_right = s_right + alpha * (tf.where(use_right, h - log_q, tf.zeros_like(h)))
        x_left = s_left + alpha * (tf.where(use_left, log_p - h, tf.zeros_like(h)))
        value = tf.where(small, x_small, tf.where(use_right, x_right, x_left))
        # The offsets: symmetric form t = midpoint + α·c; one-neighbour forms from that
        # neighbour, the other one across the gap g (inf when it overflows: the scores
        # across the gap are then at distance inf, as they should).
        c = 0.5 * (log_p - log_q) + asinh_z
        from_right = tf.where(use_right, h - log_q, tf.zeros_like(h))
        from_left = tf.where(use_left, log_p - h, tf.zeros_like(h))
        gap_f = tf.where(both, gap, tf.zeros_like(gap))
        delta_left = tf.where(small, 0.5 * gap_f + c,
                              tf.where(use_right, gap_f + from_right, from_left))
        delta_right = tf.where(small, c - 0.5 * gap_f,
                               tf.where(use_right, from_right, from_left - gap_f))
        return _Threshold(value, m, s_left, s_right, delta_left, delta_right)


class _Threshold:
    """Solutions t of F(t) = level (`_SortedList.invert`), `[b, K]` each: `value` (t),
    `m` (its segment: s_left = s_m ≤ t ≤ s_right = s_{m+1}, 1-based), and the offsets
    `delta_left` = (t − s_left)/α, `delta_right` = (t − s_right)/α."""

    def __init__(self, value, m, s_left, s_right, delta_left, delta_right):
        self.value, self.m = value, m
        self.s_left, self.s_right = s_left, s_right
        self.delta_left, self.delta_right = delta_left, delta_right


def _in_xla_context() -> bool:
    """Whether the op is being traced for XLA (`jit_compile=True`); False if TensorFlow
    cannot tell."""
    try:
        from tensorflow.python.ops import control_flow_util
        graph = tf.compat.v1.get_default_graph()
        return bool(control_flow_util.GraphOrParentsInXlaContext(graph))
    except (ImportError, AttributeError):  # pragma: no cover - private API moved
        return False


def _xla_sort():
    """XLA's single-operand sort op (ascending), or None if unavailable."""
    try:
        from tensorflow.compiler.tf2xla.ops import gen_xla_ops
        return gen_xla_ops.xla_sort
    except (ImportError, AttributeError):  # pragma: no cover - private API moved
        return None


def _stable_argsort(x2d):
    """Stable ascending argsort of `[b, n]` rows (int32).

    float32 rows (and n < 2³¹) are sorted as one int64 key per entry: the float's bits
    mapped to an order-preserving int32 (negative values have their magnitude bits
    flipped) in the high half, the index in the low half. Keys are distinct, so any sort
    is stable, and a single integer operand lets XLA's CPU sort compare natively (a
    key-value or float sort calls a compiled comparator per comparison). Other dtypes
    use `tf.argsort(stable=True)`."""
    if x2d.dtype != tf.float32:
        return tf.argsort(x2d, axis=-1, stable=True)
    # In integer arithmetic (TFLite has no builtin shift or and): a negative float's bits
    # b, magnitude bits flipped, are −b − 2³¹ − 1; the key times 2³² plus the index
    # packs both, and the index is the packed value modulo 2³².
    bits = tf.cast(tf.bitcast(x2d, tf.int32), tf.int64)
    key = tf.where(bits >= 0, bits, -bits - tf.constant(2 ** 31 + 1, tf.int64))
    index = tf.range(tf.shape(x2d)[-1], dtype=tf.int64)
    packed = key * tf.constant(2 ** 32, tf.int64) + index
    xla_sort = _xla_sort() if _in_xla_context() else None
    packed = xla_sort(packed) if xla_sort is not None else tf.sort(packed, axis=-1)
    return tf.cast(tf.math.floormod(packed, tf.constant(2 ** 32, tf.int64)), tf.int32)


def _valid_first(order, valid):
    """A stable reordering of the sorted positions `order` with the valid entries first
    (in their sorted order) and the padded ones after (O(n), a scatter)."""
    is_valid = tf.gather(valid, order, batch_dims=1)
    vi = tf.cast(is_valid, tf.int32)
    n_valid = tf.reduce_sum(vi, axis=-1, keepdims=True)
    pos = tf.where(is_valid, tf.cumsum(vi, axis=-1, exclusive=True),
                   n_valid + tf.cumsum(1 - vi, axis=-1, exclusive=True))
    b = tf.shape(order)[0]
    n = tf.shape(order)[1]
    rows = tf.broadcast_to(tf.range(b)[:, None], tf.stack([b, n]))
    return tf.scatter_nd(tf.stack([rows, pos], axis=-1), order, tf.shape(order))


def _asinh_unit(z):
    """asinh(z) for |z| ≤ 1: `tf.math.asinh` in float64; in float32 (no TFLite builtin
    Asinh) log1p(u + u²/(1 + √(1 + u²))) of u = |z|, odd-extended (within 2 ulps, and
    derivative 1 at 0)."""
    if z.dtype == tf.float64:
        return tf.math.asinh(z)

    def positive(u):
        return tf.math.log1p(u + u * u / (1.0 + tf.sqrt(1.0 + u * u)))

    return tf.where(z >= 0, positive(z), -positive(-z))


def _lap_cdf(z):
    """Lap_1(z) (standard Laplace CDF), elementwise; exact at ±inf."""
    neg = tf.minimum(z, 0.0)
    pos = tf.maximum(z, 0.0)
    return tf.where(z <= 0, 0.5 * tf.exp(neg), 1.0 - 0.5 * tf.exp(-pos))


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


# ---------------------------------------------------------------------------------
# Operators.
# ---------------------------------------------------------------------------------
@list_operator
def lapsum_rank(x, alpha=DEFAULT_ALPHA, direction: str = "ASCENDING", axis: int = -1, *,
                mask=None):
    """Soft ranks rank_i = ½ + F(r_i) = 1 + Σ_{j≠i} Lap_α(r_i − r_j) (paper eq. (1)).

    1-based: in the hard limit α → 0 they equal `scipy.stats.rankdata` (ties
    averaged); for any α they lie in [1, n], sum to n(n + 1)/2 and increase with the
    scores. O(n log n) time, O(n) memory.

    Args:
      x: `[..., n]` real tensor, ranked along the last axis.
      alpha: the Laplace scale α > 0, in the units of the scores (module docstring).
      direction: 'ASCENDING' (rank 1 = smallest) or 'DESCENDING' (rank 1 = largest).
      mask: optional boolean `[..., n]` (or `[n]`), True = valid; padded entries get
        rank 0 and do not move the valid ranks (see softsort_tf._masking).

    Returns:
      Soft ranks, the shape and (floating) dtype of x.

    Example:
    >>> r = lapsum_rank([[2.5, -1.0, 0.3, 4.0]], alpha=0.01)
    >>> np.round(r.numpy(), 3)
    array([[3., 1., 2., 4.]], dtype=float32)
    """
    prep = _Prepared(x, direction)
    alpha_t = _alpha_tensor(alpha, prep.x.dtype)
    lst = _SortedList(prep.x, prep.valid, alpha_t, prep)
    finite = lst.scatter(tf.where(lst.w > 0, lst.f + 0.5, tf.zeros_like(lst.f)))
    # ±inf entries: tied among themselves at the ends of the order.
    zero = tf.zeros_like(finite)
    ranks = tf.where(prep.valid, finite + prep.n_neg[:, None], zero)
    ranks = tf.where(prep.neg, zero + 0.5 * (prep.n_neg[:, None] + 1.0), ranks)
    ranks = tf.where(prep.pos, zero + prep.n_all[:, None] - 0.5 * (prep.n_pos[:, None] - 1.0),
                     ranks)
    return ListResult(prep.poison(ranks), "elementwise")


@list_operator
def lapsum_sort(x, alpha=DEFAULT_ALPHA, direction: str = "ASCENDING", axis: int = -1, *,
                mask=None):
    """Soft sort sort_k = F⁻¹(k − ½), k = 1..n: the inverse of the soft rank (paper
    Thm. 3.1 gives F⁻¹ in closed form; see the module docstring).

    In the hard limit α → 0 it equals `np.sort` (`direction='DESCENDING'`: decreasing).
    The outputs are increasing in k (decreasing for 'DESCENDING') and in the units of x.
    O(n log n) time, O(n) memory.

    Args:
      x: `[..., n]` real tensor, sorted along the last axis.
      alpha: the Laplace scale α > 0, in the units of the scores.
      direction: 'ASCENDING' or 'DESCENDING', as in `tf.sort`.
      mask: optional boolean `[..., n]` (or `[n]`), True = valid: the first n_valid
        outputs are the soft-sorted valid values, the others 0.

    Returns:
      Soft-sorted values, the shape and (floating) dtype of x.

    Example:
    >>> v = lapsum_sort([[2.5, -1.0, 0.3, 4.0]], alpha=0.01)
    >>> np.round(v.numpy(), 3)
    array([[-1. ,  0.3,  2.5,  4. ]], dtype=float32)
    """
    direction = _checks.check_direction(direction)
    prep = _Prepared(x, direction)
    x2d = prep.x
    dtype = x2d.dtype
    alpha_t = _alpha_tensor(alpha, dtype)
    lst = _SortedList(x2d, prep.valid, alpha_t, prep)
    n = tf.shape(x2d)[-1]
    m = lst.segments_unit_spaced(0.5, n)
    k = tf.range(n, dtype=dtype)[None, :] + 0.5
    levels = tf.broadcast_to(k, tf.shape(x2d))
    keep = levels < lst.count[:, None]
    levels = tf.where(keep, levels, tf.fill(tf.shape(levels), tf.constant(0.5, dtype)))
    m = tf.where(keep, m, tf.zeros_like(m))
    values = lst.invert(levels, m).value
    values = tf.where(keep, values, tf.zeros_like(values))
    # The finite values at positions n_neg .. n_neg + N_finite − 1, −inf before, +inf
    # after (then the padding).
    position = tf.range(n)[None, :]
    n_neg = tf.cast(prep.n_neg, tf.int32)[:, None]
    n_fin = tf.cast(lst.count, tf.int32)[:, None]
    shifted = tf.gather(values, tf.clip_by_value(position - n_neg, 0, n - 1), batch_dims=1)
    inf = tf.constant(np.inf, dtype)
    values = tf.where(position < n_neg, -inf * tf.ones_like(shifted),
                      tf.where(position < n_neg + n_fin, shifted,
                               tf.where(position < tf.cast(prep.n_all, tf.int32)[:, None],
                                        inf * tf.ones_like(shifted),
                                        tf.zeros_like(shifted))))
    values = prep.poison(values)
    if direction == "DESCENDING":
        values = -values
    return ListResult(values, "sorted", lengths=None if prep.mask is None else prep.n_all)


def _check_k(k, static_n):
    """`(k, checked)`: `k` validated at trace time when its value is known (a Python
    number, or a constant tensor, returned as is so that gradients reach it) against
    (0, n); `checked` False when it must be checked at run time."""
    if isinstance(k, (tf.Tensor, tf.Variable)):
        value = tf.get_static_value(k) if isinstance(k, tf.Tensor) else None
        if k.shape.rank not in (None, 0):
            raise ValueError(f"`k` must be a scalar, got shape {k.shape}.")
        if value is None:
            return k, False
        _check_k(np.asarray(value).item(), static_n)
        return k, True
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, float, np.integer,
                                                             np.floating)):
        raise ValueError(f"`k` must be a real number in (0, n), got {k!r}.")
    k = float(k)
    if not math.isfinite(k) or k <= 0 or (static_n is not None and k >= static_n):
        bound = "n" if static_n is None else f"n = {static_n}"
        raise ValueError(f"`k` must be a real number in (0, {bound}), got {k!r}.")
    return k, True


@list_operator
def lapsum_topk(x, k, alpha=DEFAULT_ALPHA, direction: str = "DESCENDING", axis: int = -1, *,
                mask=None):
    """Soft top-k membership p_i = Lap_α(r_i − t), with t solving Σ_i Lap_α(r_i − t) = k
    (paper §3; F(t) = n − k, solved in closed form).

    Each p_i ∈ (0, 1), Σ_i p_i = k, p is increasing in the score, and p tends to the
    hard top-k indicator as α → 0 (scores tied at the boundary share the mass). `k` may
    be real and may be a (differentiable) tensor; the gradient is that of the implicit
    function t(r, k, α) (π-weights in the log domain: finite at any gap and α). The
    memberships are computed from the scores' differences to the threshold's sorted
    neighbours, never from an absolute threshold: adding a constant to the scores does
    not change them beyond the rounding of the differences.

    Args:
      x: `[..., n]` real tensor.
      k: a number in (0, n), real allowed, or a scalar tensor. With `mask`, rows with
        n_valid <= k select all their valid entries (p = 1), rows without valid
        entries give 0. A Python k is exact in the compute dtype (float64 for float64
        scores).
      alpha: the Laplace scale α > 0, in the units of the scores.
      direction: 'DESCENDING' (default: the k largest) or 'ASCENDING' (the k smallest).
      axis: the axis of the lists (default: the last).
      mask: optional boolean `[..., n]` (or `[n]`), True = valid.

    Returns:
      The soft membership, the shape and (floating) dtype of x.

    Example:
    >>> p = lapsum_topk([[2.5, -1.0, 0.3, 4.0]], k=2, alpha=0.01)
    >>> np.round(p.numpy(), 3)
    array([[1., 0., 0., 1.]], dtype=float32)
    """
    direction = _checks.check_direction(direction)
    # The membership Lap_α(r_i − t) selects the largest entries of the prepared scores:
    # those of x for 'DESCENDING', of −x for 'ASCENDING'.
    prep = _Prepared(x, "ASCENDING" if direction == "DESCENDING" else "DESCENDING")
    x2d, view = prep.x, prep.view
    dtype = x2d.dtype
    alpha_t = _alpha_tensor(alpha, dtype)
    # With a mask, rows of n_valid <= k select all their entries: k may reach n.
    k_value, static_k = _check_k(k, view.static_n if prep.mask is None else None)
    k_t = (tf.constant(k_value, dtype) if isinstance(k_value, float)
           else tf.cast(k_value, dtype))
    if not static_k:
        checks = [tf.debugging.assert_positive(k_t, message="softsort_tf: `k` must be > 0")]
        if prep.mask is None:
            checks.append(tf.debugging.assert_less(
                k_t, tf.cast(tf.shape(x2d)[-1], dtype),
                message="softsort_tf: `k` must be smaller than the list length n"))
        with tf.control_dependencies(checks):
            k_t = tf.identity(k_t)
    elif prep.mask is None and view.static_n is None:
        check = tf.debugging.assert_less(
            k_t, tf.cast(tf.shape(x2d)[-1], dtype),
            message=f"softsort_tf: `k` = {k_value} must be smaller than the list length n")
        with tf.control_dependencies([check]):
            k_t = tf.identity(k_t)
    # +inf entries take the first min(k, n₊) of the mass, equally; the finite entries the
    # top-(k − n₊) of their own list; −inf entries what is left, equally.
    count = tf.reduce_sum(tf.cast(prep.valid, dtype), axis=-1)
    k_finite = k_t - prep.n_pos
    p = _topk_membership(x2d, k_finite, alpha_t, prep, count)
    share_pos = tf.clip_by_value(k_t / tf.maximum(prep.n_pos, 1.0), 0.0, 1.0)
    share_neg = tf.clip_by_value((k_finite - count) / tf.maximum(prep.n_neg, 1.0), 0.0, 1.0)
    p = tf.where(prep.pos, tf.ones_like(p) * share_pos[:, None], p)
    p = tf.where(prep.neg, tf.ones_like(p) * share_neg[:, None], p)
    return ListResult(prep.poison(p), "elementwise")


def _topk_membership(x2d, k, alpha, prep, count):
    """p `[b, n]` with its implicit-function gradient w.r.t. (x, k, α); k `[b]` (the
    finite entries' share), rows with k ≤ 0 give 0, rows with k ≥ count give 1."""
    dtype = x2d.dtype
    valid = prep.valid
    vmask = tf.cast(valid, dtype)

    @tf.custom_gradient
    def membership(x2d, k, alpha):
        level = count - k                                         # F(t) = N − k
        active = tf.logical_and(level > 0, level < count)
        safe_level = tf.where(active, level, 0.5 * tf.ones_like(level))
        scores = tf.stop_gradient(x2d)
        lst = _SortedList(scores, valid, tf.stop_gradient(alpha), prep)
        levels = safe_level[:, None]
        thr = lst.invert(levels, lst.segments_counted(levels))   # [b, 1]
        # u_i = (r_i − t)/α from the neighbours of t (`offsets`).
        u = -lst.offsets(thr, scores)[:, 0, :]
        u = tf.where(vmask > 0, u, tf.zeros_like(u))
        full = tf.where(level <= 0, tf.ones_like(level), tf.zeros_like(level))
        p = tf.where(active[:, None], _lap_cdf(u), tf.ones_like(u) * full[:, None]) * vmask

        def grad(dp):
            # dp_i = f_i·(dr_i − dt − u_i·dα), dt = Σπ_j dr_j − dk/F' + (Σπ_j u_j)·dα·(−1),
            # with f_i = e^{−|u_i|}/(2α), π = f/Σf, F' = Σf.
            uc = _clip_finite(u)
            logits = tf.where(vmask > 0, -tf.abs(uc), tf.constant(-np.inf, dtype))
            pi = tf.nn.softmax(logits, axis=-1)
            pi = tf.where(vmask > 0, pi, tf.zeros_like(pi))
            f = tf.exp(-tf.abs(uc)) / (2.0 * alpha) * vmask
            on = tf.cast(active, dtype)[:, None]
            dp = dp * on
            v_bar = tf.reduce_sum(dp * pi, axis=-1, keepdims=True)
            u_bar = tf.reduce_sum(pi * uc, axis=-1, keepdims=True)
            dx = f * (dp - v_bar)
            dk = v_bar[:, 0]
            dalpha = -tf.reduce_sum(dp * f * (uc - u_bar))
            return dx, dk, dalpha

        return p, grad

    k = tf.broadcast_to(k, tf.shape(count))
    return membership(x2d, k, alpha)


@list_operator
def lapsum_quantile(x, quantiles, alpha=DEFAULT_ALPHA, axis: int = -1, *, mask=None):
    """Soft quantiles F⁻¹(τ·n) (the inverse LapSum at the level τ·n).

    In the hard limit α → 0 they equal `np.quantile(x, τ, method='averaged_inverted_cdf')`
    (the inverse empirical CDF, averaged at its jumps). O(n log n) time, O(n) memory
    per level; the gradient is that of the implicit function F(t) = τn:
    ∂t/∂r_j = softmax_j(−|t − r_j|/α).

    Args:
      x: `[..., n]` real tensor.
      quantiles: a level or a strictly increasing sequence of q levels in (0, 1).
      alpha: the Laplace scale α > 0, in the units of the scores.
      mask: optional boolean `[..., n]` (or `[n]`), True = valid: quantiles of the valid
        entries; 0 for a list without valid entry.

    Returns:
      `[..., q]` (the last axis of x replaced by the levels), `[...]` for a scalar level.

    Example:
    >>> q = lapsum_quantile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5, alpha=0.01)
    >>> round(float(q), 2)
    3.0
    """
    taus, scalar = _checks.check_quantiles(quantiles)
    prep = _Prepared(x, "ASCENDING")
    x2d, valid = prep.x, prep.valid
    dtype = x2d.dtype
    alpha_t = _alpha_tensor(alpha, dtype)
    count = tf.reduce_sum(tf.cast(valid, dtype), axis=-1)
    taus_t = tf.constant(taus, dtype)
    # F of the whole list is that of the finite entries plus n₋ (the −inf entries):
    # levels at or below 0 are −inf, at or above the finite count +inf.
    levels = prep.n_all[:, None] * taus_t[None, :] - prep.n_neg[:, None]
    active = tf.logical_and(levels > 0, levels < count[:, None])

    @tf.custom_gradient
    def solve(x2d, alpha):
        safe = tf.where(active, levels, 0.5 * tf.ones_like(levels))
        scores = tf.stop_gradient(x2d)
        lst = _SortedList(scores, valid, tf.stop_gradient(alpha), prep)
        thr = lst.invert(safe, lst.segments_counted(safe))        # [b, q]
        t = tf.where(active, thr.value, tf.zeros_like(thr.value))

        def grad(dt):
            # u_j = (t − r_j)/α from the neighbours of t.
            on = valid[:, None, :]
            u = _clip_finite(lst.offsets(thr, scores))
            logits = tf.where(on, -tf.abs(u), tf.constant(-np.inf, dtype))
            pi = tf.nn.softmax(logits, axis=-1)
            pi = tf.where(on, pi, tf.zeros_like(pi))
            u = tf.where(on, u, tf.zeros_like(u))
            dt = dt * tf.cast(active, dtype)
            dx = tf.reduce_sum(dt[:, :, None] * pi, axis=1)
            dalpha = tf.reduce_sum(dt * tf.reduce_sum(pi * u, axis=-1))
            return dx, dalpha

        return t, grad

    out = solve(x2d, alpha_t)
    inf = tf.constant(np.inf, dtype)
    out = tf.where(levels <= 0, -inf * tf.ones_like(out),
                   tf.where(levels >= count[:, None], inf * tf.ones_like(out), out))
    if prep.mask is not None:  # a list without valid entry: 0
        out = tf.where(prep.n_all[:, None] > 0, out, tf.zeros_like(out))
    out = prep.poison(out)
    return ListResult(out[:, 0] if scalar else out, "per_list")


@list_operator
def lapsum_permutation_matrix(x, alpha=DEFAULT_ALPHA, direction: str = "DESCENDING", *,
                              mask=None):
    """Soft permutation matrix P[k, j] = Lap_α(t_{k+1} − r_j) − Lap_α(t_k − r_j), with
    thresholds t_k = F⁻¹(k), t_0 = −∞, t_n = +∞ (paper §4).

    Row k is the distribution of the input that lands at position k of the
    `direction` order (the orientation of `softsort_tf.ops.permutation.softsort_permutation_matrix`:
    `P @ x` soft-sorts values by x); P is doubly stochastic (rows and columns sum to 1)
    and tends to the sorting permutation matrix as α → 0. O(n²) time and memory (the
    thresholds themselves cost O(n log n)). The entries are computed from the scores'
    differences to each threshold's sorted neighbours (`_SortedList.offsets`), never
    from absolute thresholds: adding a constant to the scores does not change P beyond
    the rounding of the differences.

    Args:
      x: `[..., n]` scores.
      alpha: the Laplace scale α > 0, in the units of the scores.
      direction: 'DESCENDING' (default; row 0 = the largest score) or 'ASCENDING'.
      mask: optional boolean `[..., n]` (or `[n]`), True = valid: the valid block is the
        unpadded P, rows ≥ n_valid and padded columns are 0.

    Returns:
      `[..., n, n]` matrix in the (floating) dtype of x.

    Example:
    >>> P = lapsum_permutation_matrix([[0.3, 2.0, 1.0]], alpha=0.01)
    >>> np.round(P.numpy()[0], 3)
    array([[0., 1., 0.],
           [0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    """
    # 'DESCENDING' ranks −x ascending: position 0 of the ascending order of −x is the
    # largest score.
    prep = _Prepared(x, direction)
    x2d = prep.x
    dtype = x2d.dtype
    alpha_t = _alpha_tensor(alpha, dtype)
    lst = _SortedList(x2d, prep.valid, alpha_t, prep)
    n = tf.shape(x2d)[-1]
    b = tf.shape(x2d)[0]
    num = tf.maximum(n - 1, 1)
    m = lst.segments_unit_spaced(1.0, num)                       # levels 1..n−1
    levels = tf.broadcast_to(tf.range(num, dtype=dtype)[None, :] + 1.0, tf.stack([b, num]))
    inner = levels < lst.count[:, None]
    safe_levels = tf.where(inner, levels, 0.5 * tf.ones_like(levels))
    m = tf.where(inner, m, tf.zeros_like(m))
    thr = lst.invert(safe_levels, m)
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
    same = tf.equal(m[:, 1:], m[:, :-1])
    across = (-dr[:, :-1] + _scaled_gap(thr.s_right[:, :-1], thr.s_left[:, 1:], alpha_t)
              + dl[:, 1:])
    near_left = dl[:, 1:] <= -dr[:, :-1]
    within = tf.where(near_left, dl[:, 1:] - dl[:, :-1], dr[:, 1:] - dr[:, :-1])
    step = tf.maximum(tf.where(same, within, across), 0.0)
    step = tf.where(tf.logical_and(inner[:, 1:], inner[:, :-1]), step, inf)
    edge = tf.fill(tf.stack([b, 1]), inf)
    spread = tf.concat([edge, step, edge], axis=1)[:, :n]          # [b, n] rows
    spread = tf.where(tf.equal(n, 1), tf.fill(tf.stack([b, n]), inf), spread)
    finite = _lap_cdf_difference(hi, lo, spread[:, :, None])
    # Into the full list: the finite block at rows n₋ .. n₋ + N_finite − 1 and the
    # columns of the finite entries; −inf entries share the first n₋ rows, +inf the
    # last n₊ valid rows.
    row = tf.range(n)[None, :]
    n_neg = tf.cast(prep.n_neg, tf.int32)[:, None]
    n_fin = tf.cast(lst.count, tf.int32)[:, None]
    n_all = tf.cast(prep.n_all, tf.int32)[:, None]
    perm = tf.gather(finite, tf.clip_by_value(row - n_neg, 0, n - 1), batch_dims=1)
    in_block = tf.logical_and(row >= n_neg, row < n_neg + n_fin)[:, :, None]
    perm = tf.where(tf.logical_and(in_block, prep.valid[:, None, :]), perm,
                    tf.zeros_like(perm))
    ones = tf.ones_like(perm)
    neg_rows = (row < n_neg)[:, :, None]
    pos_rows = tf.logical_and(row >= n_neg + n_fin, row < n_all)[:, :, None]
    perm = tf.where(tf.logical_and(neg_rows, prep.neg[:, None, :]),
                    ones / tf.maximum(prep.n_neg, 1.0)[:, None, None], perm)
    perm = tf.where(tf.logical_and(pos_rows, prep.pos[:, None, :]),
                    ones / tf.maximum(prep.n_pos, 1.0)[:, None, None], perm)
    return ListResult(prep.poison(perm), "square")


# ---------------------------------------------------------------------------------
# The LapSum family (`softsort_tf.ops.family`).
# ---------------------------------------------------------------------------------
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

"""Soft ranks and sorts by projection onto the permutahedron (Blondel, Teboul, Berthet &
Djolonga, ICML 2020, "Fast Differentiable Sorting and Ranking").

The permutahedron P(w) is the convex hull of the permutations of a vector w. With
ρ = (n, n − 1, ..., 1) and a regularization Q (quadratic 'l2', or entropic 'kl'), the
paper defines (eqs. (5)–(7), §3)

    P_Q(z, w) = argmin_{μ ∈ P(w)} Q(μ − z)                (l2: ½‖μ − z‖²),

and with ε = `regularization_strength`:

- soft rank (ascending: the largest value gets ≈ n):  P_Q(θ/ε, ρ)  for 'l2',
  exp(P_E(θ/ε, log ρ)) for 'kl' (the log-KL projection, paper eq. (7));
- soft sort (ascending): −(ρ/ε − γ(ρ/ε, sort↓(−θ))) where γ is the dual isotonic
  solution below (the projection of ρ/ε onto P(−θ), mapped back to values).

Both reduce to isotonic regression (paper Prop. 3): for z sorted decreasingly
(s = z_σ) the projection is μ_σ = s − v with v the decreasing solution of

    l2:  min_{v_1 ≥ ... ≥ v_n} ½‖v − (s − w)‖²,      v_B = mean_B(s − w),
    kl:  min_{v_1 ≥ ... ≥ v_n} Σ_i e^{s_i − v_i} + e^{w_i}·v_i,
                                                      v_B = LSE(s_B) − LSE(w_B),

constant on blocks B of consecutive indices found by pool adjacent violators (PAV).
Its Jacobian (paper Lemma 3) is block diagonal: ∂v_B/∂s_B = 1/|B| (l2) or
softmax(s_B) (kl), so the backward pass is a block-wise average (O(n)).

PAV is sequential: here a `tf.while_loop` over the n entries with a stack of blocks, one
row at a time, compiled with XLA (the loop is wrapped in an inner
`tf.function(jit_compile=True)`, so eager and graph callers get the compiled loop too;
outside an XLA caller its inputs are padded to the next power of two of each dimension,
so that a new list length or batch size reuses a compiled program).
The outer operations (sort, block averages) are ordinary TF ops; float32 rows are sorted
as one integer key per entry (`softsort_tf.ops.lapsum`'s stable argsort), and the
inverse permutation is a scatter. Time O(n log n) for the sort plus O(n) loop
iterations (amortized: each entry is pushed once and merged at most once) per row.

Conventions: inputs `[..., n]` along the last axis with leading batch dims;
`direction` 'ASCENDING' (as torchsort: the smallest value gets rank ≈ 1, sorted values
increase) or 'DESCENDING' (applied to −x); float16/bfloat16 computed in float32 and
returned in the input dtype; float64 kept. `regularization_strength` ε > 0 is in the
units of the values: as ε → 0 the results tend to the hard ranks/sort (ties: the
hard rank of the first/second tied entry is arbitrary at ε = 0). Masks are not
supported (a `mask` argument raises a ValueError); pass the valid entries only.
"""

from __future__ import annotations

import tensorflow as tf

from softsort_tf import _checks, _masking
from softsort_tf.ops import family
from softsort_tf.ops.lapsum import _stable_argsort
from softsort_tf.ops.permutation import (
    _in_xla_context,
    centred_with_stand_ins,
    finite_midrange,
)
from softsort_tf.ops.wrapper import ListResult, Lists, list_operator

__all__ = ["permutahedron_rank", "permutahedron_sort"]

REGULARIZATIONS = ("l2", "kl")



def _check_regularization(regularization):
    if regularization not in REGULARIZATIONS:
        raise ValueError(f"`regularization` must be 'l2' or 'kl', got {regularization!r}.")
    return regularization


def _check_mask(mask):
    if mask is not None:  # a `mask` argument, or the padding of a ragged `x`'s lists
        raise ValueError("`mask` and a ragged `x` (lists padded to one length) are not "
                         "supported by the permutahedron operators: pass dense lists of "
                         "valid entries only, one length at a time (or use the LapSum "
                         "operators).")


# ---------------------------------------------------------------------------------
# Pool adjacent violators (decreasing solution), one row at a time.
# ---------------------------------------------------------------------------------
# Every entry starts as a block holding the pair (a, c) (l2: (y_i, 1); kl: (s_i, w_i));
# pooled blocks combine by addition (l2) or log-add-exp (kl) and have the value a/c
# (l2) or a − c (kl). A stack of blocks per row: each entry is pushed once and merged at
# most once, O(n). Adjacent blocks of equal value are pooled too, so the blocks are the
# maximal runs on which v is constant (the convention of the reference
# implementations, which fixes the Jacobian there).
def _combine(a1, c1, a2, c2, kl: bool):
    if kl:
        return tf.experimental.numpy.logaddexp(a1, a2), tf.experimental.numpy.logaddexp(c1, c2)
    return a1 + a2, c1 + c2


def _value(a, c, kl: bool):
    return a - c if kl else a / c


def _stack_pav(a0, c0, kl: bool, length):
    """PAV by a stack over the first `length` entries of one row (`[1, N]` pairs (a, c),
    N ≥ `length`). Returns each entry's block id `[1, N]` and the blocks' (a, c)
    `[1, N]` (valid for ids < the number of blocks; the entries past `length` are
    ignored). One row at a time: XLA then reads and writes the stack in place (a scatter
    into a batch of rows copies the whole buffer at every step)."""
    n = tf.shape(a0)[1]

    def at(t, pos):
        return tf.gather(t, tf.maximum(pos, 0)[:, None], batch_dims=1)[:, 0]

    def put(t, pos, val, where):
        idx = tf.stack([tf.zeros_like(pos), tf.maximum(pos, 0)], axis=-1)
        return tf.tensor_scatter_nd_update(t, idx, tf.where(where, val, at(t, pos)))

    def merge_needed(top, ba, bc):
        last = _value(at(ba, top - 1), at(bc, top - 1), kl)
        prev = _value(at(ba, top - 2), at(bc, top - 2), kl)
        return tf.logical_and(top >= 2, prev <= last)

    def outer_body(i, top, ba, bc, start):
        push = tf.ones([1], tf.bool)
        ba = put(ba, top, a0[:, i], push)
        bc = put(bc, top, c0[:, i], push)
        start = put(start, top, tf.fill([1], i), push)
        top = top + 1

        def inner_body(top, ba, bc):
            need = merge_needed(top, ba, bc)
            na, nc = _combine(at(ba, top - 2), at(bc, top - 2), at(ba, top - 1),
                              at(bc, top - 1), kl)
            ba = put(ba, top - 2, na, need)
            bc = put(bc, top - 2, nc, need)
            return tf.where(need, top - 1, top), ba, bc

        top, ba, bc = tf.while_loop(lambda *state: tf.reduce_any(merge_needed(*state)),
                                    inner_body, (top, ba, bc))
        return i + 1, top, ba, bc, start

    init = (tf.constant(0), tf.zeros([1], tf.int32), tf.zeros_like(a0), tf.zeros_like(c0),
            tf.zeros_like(a0, tf.int32))
    _, top, ba, bc, start = tf.while_loop(lambda i, *_: i < length, outer_body, init)
    # Entry j belongs to the last block whose start is <= j.
    marks = tf.scatter_nd(start[0, :, None], tf.cast(tf.range(n) < top, tf.int32), [n])
    return tf.cumsum(marks)[None, :] - 1, ba, bc


def _pav(a0, c0, rows, length, kl: bool):
    """`_stack_pav` on the first `length` entries of the first `rows` rows of `[B, N]`
    pairs (a, c). Returns each entry's block id `[B, N]` and the blocks' (a, c) `[B, N]`
    (valid for ids < the number of blocks; zeros in the rows past `rows`)."""

    def body(r, block, ba, bc):
        row = tf.reshape(r, [1, 1])
        out = _stack_pav(a0[r][None], c0[r][None], kl, length)
        return (r + 1,) + tuple(tf.tensor_scatter_nd_update(t, row, o)
                                for t, o in zip((block, ba, bc), out, strict=True))

    init = (tf.constant(0), tf.zeros_like(a0, tf.int32), tf.zeros_like(a0),
            tf.zeros_like(c0))
    return tf.while_loop(lambda r, *_: r < rows, body, init)[1:]


# XLA compiles a program for every shape it is called with: outside an XLA caller (eager,
# or a graph of unknown or changing shape) the PAV runs on its inputs padded to the next
# bucket of each dimension (`_bucket`), with the loops bounded by the true sizes, so that
# lists of a new length or a new batch size reuse a compiled program (at most one per
# power of two of each dimension) instead of compiling one more (0.4–0.7 s each).
_pav_l2 = tf.function(lambda a, c, rows, length: _pav(a, c, rows, length, False),
                      jit_compile=True, autograph=False, reduce_retracing=True)
_pav_kl = tf.function(lambda a, c, rows, length: _pav(a, c, rows, length, True),
                      jit_compile=True, autograph=False, reduce_retracing=True)
_MIN_BUCKET = 8


def _bucket(size):
    """The padded size of a dimension of `size` (int32 scalar tensor): the next power of
    two, at least `_MIN_BUCKET`."""
    m = size - 1
    for shift in (1, 2, 4, 8, 16):
        m = tf.bitwise.bitwise_or(m, tf.bitwise.right_shift(m, shift))
    return tf.maximum(m + 1, _MIN_BUCKET)


def _on_padded(pav, a, c, size):
    """`pav` on `[b, n]` pairs (a, c) padded to `size(b)` rows of `size(n)` entries (its
    loops bounded by b and n), sliced back."""
    rows, length = tf.shape(a)[0], tf.shape(a)[1]
    pad = [[0, size(rows) - rows], [0, size(length) - length]]
    out = pav(tf.pad(a, pad), tf.pad(c, pad), rows, length)
    return tuple(tf.slice(t, [0, 0], [rows, length]) for t in out)


# Outside XLA: one graph function (its few ops run as one call eagerly; traced again
# once, for any shape) that pads to the buckets.
_padded_pav_l2, _padded_pav_kl = (
    tf.function(lambda a, c, kl=kl: _on_padded(_pav_kl if kl else _pav_l2, a, c, _bucket),
                autograph=False, reduce_retracing=True) for kl in (False, True))


def _run_pav(kl: bool, a, c):
    """The PAV of `[b, n]` pairs (a, c) (`_pav`): inside an XLA program (which has one
    shape) on the pairs themselves, but with at least one row and entry (XLA compiles
    the loop's body, which slices a row, even where it never runs); else padded to the
    buckets of b and n."""
    if _in_xla_context():
        return _on_padded(_pav_kl if kl else _pav_l2, a, c, lambda s: tf.maximum(s, 1))
    out = (_padded_pav_kl if kl else _padded_pav_l2)(a, c)
    for t in out:
        t.set_shape(a.shape)
    return out


def _isotonic(s, w, kl: bool):
    """Decreasing isotonic solution v `[b, n]` of the problem above (l2 or kl) with its
    block ids; no gradient (the callers apply the block Jacobian)."""
    s = tf.stop_gradient(s)
    w = tf.stop_gradient(w)
    if kl:
        block, ba, bc = _run_pav(True, s, w)
    else:
        block, ba, bc = _run_pav(False, s - w, tf.ones_like(s))
    values = _value(ba, bc, kl)
    v = tf.gather(values, block, batch_dims=1)
    lse_s = tf.gather(ba, block, batch_dims=1) if kl else None
    return v, block, lse_s


def _block_vjp(vector, s, block, lse_s, kl: bool):
    """Jacobian of v w.r.t. s, transposed, applied to `vector` (paper Lemma 3):
    l2 → block means of `vector`; kl → softmax(s_B)·Σ_B vector."""
    b = tf.shape(vector)[0]
    n = tf.shape(vector)[1]
    ids = block + tf.range(b)[:, None] * n
    sums = tf.math.unsorted_segment_sum(tf.reshape(vector, [-1]), tf.reshape(ids, [-1]),
                                        b * n)
    per_entry = tf.reshape(tf.gather(sums, tf.reshape(ids, [-1])), [b, n])
    if kl:
        return tf.exp(s - lse_s) * per_entry
    counts = tf.math.unsorted_segment_sum(tf.ones_like(tf.reshape(vector, [-1])),
                                          tf.reshape(ids, [-1]), b * n)
    return per_entry / tf.reshape(tf.gather(counts, tf.reshape(ids, [-1])), [b, n])


def _per_block(t, block, reduce: str, scale=1.0):
    """The block statistic of t / `scale` (`t` `[b, n]`) at every entry: 'mean', 'max',
    or 'centred' (t/scale − its LSE over the block, computed as (t − max)/scale −
    log Σ exp(· − max), without the cancellation of large t/scale)."""
    b, n = tf.shape(t)[0], tf.shape(t)[1]
    ids = tf.reshape(block + tf.range(b)[:, None] * n, [-1])
    flat = tf.reshape(t, [-1])

    def spread(segment_values):
        return tf.reshape(tf.gather(segment_values, ids), [b, n])

    if reduce == "mean":
        sums = tf.math.unsorted_segment_sum(flat, ids, b * n)
        counts = tf.math.unsorted_segment_sum(tf.ones_like(flat), ids, b * n)
        return spread(sums) / spread(counts) / scale
    top = spread(tf.math.unsorted_segment_max(flat, ids, b * n))
    if reduce == "max":
        return top / scale
    shifted = (t - top) / scale
    sums = tf.math.unsorted_segment_sum(tf.reshape(tf.exp(shifted), [-1]), ids, b * n)
    return shifted - tf.math.log(spread(sums))


def _block_size(block):
    """The number of entries of each entry's block `[b, n]` (int32)."""
    b, n = tf.shape(block)[0], tf.shape(block)[1]
    ids = tf.reshape(block + tf.range(b)[:, None] * n, [-1])
    counts = tf.math.unsorted_segment_sum(tf.ones_like(ids), ids, b * n)
    return tf.reshape(tf.gather(counts, ids), [b, n])


def _non_finite(x2d):
    """`(x, finite, nan_rows)`: x with NaN replaced by 0 (±inf kept), the finite entries,
    and the lists holding a NaN (their results are NaN, their gradient 0)."""
    nan = tf.math.is_nan(x2d)
    return (tf.where(nan, tf.zeros_like(x2d), x2d), tf.math.is_finite(x2d),
            tf.reduce_any(nan, axis=-1))


def _poisoned(values, rows):
    return tf.where(rows[:, None], tf.constant(float("nan"), values.dtype), values)


def _rho_block_mean(block, dtype):
    """mean_B(ρ) at every sorted position `[b, n]` in `dtype`, ρ_i = n − i (0-based i):
    the blocks are runs of positions [first, last], so the mean is n − (first + last)/2,
    exact (a float32 sum of ρ over a long block rounds to a fraction of a rank). The
    integer 2n − first − last is cast to `dtype` and halved: that is the exact mean
    rounded once (halving is exact), float32 included, with no float64 in the graph."""
    b, n = tf.shape(block)[0], tf.shape(block)[1]
    ids = tf.reshape(block + tf.range(b)[:, None] * n, [-1])
    position = tf.reshape(tf.broadcast_to(tf.range(n)[None, :], tf.stack([b, n])), [-1])
    first = tf.gather(tf.math.unsorted_segment_min(position, ids, b * n), ids)
    last = tf.gather(tf.math.unsorted_segment_max(position, ids, b * n), ids)
    return tf.reshape(tf.cast(2 * n - first - last, dtype) * 0.5, tf.stack([b, n]))


def _centre(x2d, finite):
    """A per-row reference (the midrange of the finite entries, no gradient): the ranks
    do not depend on it and the sorted values move with it, so the projection is
    computed on numbers of the size of the scores' differences."""
    return finite_midrange(x2d, finite)[0]


def _descending_order(z):
    """The stable decreasing order of each row of `z` `[b, n]` (ties in index order):
    the ascending order of −z, with −0.0 read as 0.0 (they are equal scores)."""
    neg = -z
    return _stable_argsort(tf.where(tf.equal(neg, 0), tf.zeros_like(neg), neg))


def _rho(x2d):
    """ρ = (n, ..., 1) for every row, `[b, n]`."""
    n = tf.shape(x2d)[-1]
    return tf.broadcast_to(tf.cast(tf.range(n, 0, -1), x2d.dtype)[None, :], tf.shape(x2d))


# ---------------------------------------------------------------------------------
# Operators.
# ---------------------------------------------------------------------------------
def _prepare(lists: Lists, regularization, regularization_strength, direction):
    _check_mask(lists.mask)
    regularization = _check_regularization(regularization)
    strength = _checks.check_positive("regularization_strength", regularization_strength)
    direction = _checks.check_direction(direction)
    x2d, view = lists.values, lists.view
    if direction == "DESCENDING":
        x2d = -x2d
    return x2d, view, regularization == "kl", strength


@list_operator
def permutahedron_rank(x, regularization: str = "l2", regularization_strength: float = 1.0,
                       direction: str = "ASCENDING", axis: int = -1, *, mask=None):
    """Soft ranks by projection onto the permutahedron (paper §3, eqs. (6)–(7)).

    'l2': r = P_Q(θ/ε, ρ), the Euclidean projection of θ/ε onto the permutahedron of
    ρ = (n, ..., 1); 'kl': r = exp(P_E(θ/ε, log ρ)). Ranks are 1-based, increasing in θ
    for 'ASCENDING' (as torchsort's `soft_rank`), sum to n(n + 1)/2 ('l2'), and tend to
    the hard ranks as ε → 0. The gradient is the block-averaging Jacobian of isotonic
    regression (paper Lemma 3).

    Args:
      x: `[..., n]` real tensor.
      regularization: 'l2' or 'kl'.
      regularization_strength: ε > 0, in the units of x; large ε pulls all ranks to
        (n + 1)/2 ('l2').
      direction: 'ASCENDING' (rank 1 = smallest) or 'DESCENDING' (rank 1 = largest).
      mask: not supported (ValueError).

    Returns:
      Soft ranks with the shape and (floating) dtype of x.

    Example:
    >>> r = permutahedron_rank([[5.0, 1.0, 2.0]], regularization_strength=0.1)
    >>> r.numpy()
    array([[3., 1., 2.]], dtype=float32)
    """
    x2d, view, kl, strength = _prepare(x, regularization, regularization_strength, direction)
    # Non-finite scores (the package's rule, `softsort_tf._masking`): a ±inf entry is an
    # isolated block at its end of the order (PAV keeps it apart: its value is ±inf),
    # whose rank is its ρ (averaged over tied infinities); the finite entries keep the
    # projection of their own list onto the ρ values left between. NaN: the list is NaN.
    x2d, finite_x, nan_rows = _non_finite(x2d)

    @tf.custom_gradient
    def rank(x2d):
        z = (x2d - _centre(x2d, finite_x)) / strength
        order = _descending_order(z)
        s = tf.gather(z, order, batch_dims=1)
        rho = _rho(x2d)
        w = tf.math.log(rho) if kl else rho
        _, block, lse_s = _isotonic(s, w, kl)
        # s − v with v = (block statistic of s) − (that of w), written without the
        # cancellation of s − v when |s| = |θ/ε| is large. A block of infinite s (only
        # infinities share a block with them) has s − its statistic = 0 ('l2') or
        # −log |B| ('kl').
        finite_s = tf.math.is_finite(s)
        if kl:
            centred = tf.where(finite_s, _per_block(tf.where(finite_s, s, tf.zeros_like(s)),
                                                    block, "centred"),
                               -tf.math.log(tf.cast(_block_size(block), s.dtype)))
            # w − LSE_B(w) = log ρ − log(|B|·mean_B ρ), in closed form.
            log_sum = tf.math.log(tf.cast(_block_size(block), s.dtype)
                                  * _rho_block_mean(block, s.dtype))
            primal_sorted = centred + log_sum
        else:
            safe_s = tf.where(finite_s, s, tf.zeros_like(s))
            primal_sorted = (tf.where(finite_s, safe_s - _per_block(safe_s, block, "mean"),
                                      tf.zeros_like(s))
                             + _rho_block_mean(block, s.dtype))
        inv = _masking.inverse_permutation(order)
        primal = tf.gather(primal_sorted, inv, batch_dims=1)
        out = tf.exp(primal) if kl else primal

        def grad(dy):
            g = dy * out if kl else dy
            g_sorted = tf.gather(g, order, batch_dims=1)
            back = tf.gather(_block_vjp(g_sorted, s, block, lse_s, kl), inv, batch_dims=1)
            keep = tf.logical_and(finite_x, tf.logical_not(nan_rows)[:, None])
            return tf.where(keep, (g - back) / strength, tf.zeros_like(g))

        return out, grad

    return ListResult(_poisoned(rank(x2d), nan_rows), "elementwise")


@list_operator
def permutahedron_sort(x, regularization: str = "l2", regularization_strength: float = 1.0,
                       direction: str = "ASCENDING", axis: int = -1, *, mask=None):
    """Soft sort by projection onto the permutahedron (paper §3, eq. (5)).

    The projection of ρ/ε onto the permutahedron of the values, read as sorted values:
    −(ρ/ε − γ) with γ the isotonic solution of (ρ/ε, sort↓(−θ)) (as torchsort's
    `soft_sort`). The outputs are increasing for 'ASCENDING', keep the sum of x
    ('l2') and tend to `np.sort` as ε → 0.

    Args:
      x: `[..., n]` real tensor.
      regularization: 'l2' or 'kl'.
      regularization_strength: ε > 0; for 'l2' in inverse units of x: ρ/ε is
        projected onto the permutahedron of x, so scaling x by c is undone by ε·c
        (`permutahedron_sort(c·x, ε) = c·permutahedron_sort(x, c·ε)`), unlike the
        ranks, whose ε is in the units of x.
      direction: 'ASCENDING' or 'DESCENDING', as in `tf.sort`.
      mask: not supported (ValueError).

    Returns:
      Soft-sorted values with the shape and (floating) dtype of x.

    Example:
    >>> permutahedron_sort([[5.0, 1.0, 2.0]], regularization_strength=0.1).numpy()
    array([[1., 2., 5.]], dtype=float32)
    """
    x2d, view, kl, strength = _prepare(x, regularization, regularization_strength, direction)
    bad_rows, limit = _sort_limits(x2d, kl)
    # Each +inf beside finite scores under 'kl' becomes a stand-in (the other non-finite
    # entries are in `bad_rows`), far enough above them to be pooled (its singleton
    # value 1/ε + θ exceeds any block's, at most n/ε + log n + their half-spread) and to
    # add e^{−(θ − half-spread)} = 0 to its block's LSE: the limit, as `_sort_limits`.
    n = tf.cast(tf.shape(x2d)[-1], x2d.dtype)
    reach = n / strength + tf.math.log(n) + 800.0
    keys, _, finite_x = centred_with_stand_ins(x2d, lambda half_spread: reach)
    centre = _centre(x2d, finite_x)
    x2d = tf.where(bad_rows[:, None], tf.zeros_like(keys), keys)

    @tf.custom_gradient
    def sort(x2d):
        neg = -x2d
        order = _descending_order(neg)
        inv = _masking.inverse_permutation(order)
        sw = tf.gather(neg, order, batch_dims=1)              # −θ sorted decreasingly
        rho_raw = _rho(x2d)
        _, block, _ = _isotonic(rho_raw / strength, sw, kl)
        lse_w = None
        if kl:
            ids = block + tf.range(tf.shape(block)[0])[:, None] * tf.shape(block)[1]
            lse_w = tf.reshape(tf.gather(tf.math.unsorted_segment_max(
                tf.reshape(sw, [-1]), tf.reshape(ids, [-1]), tf.size(ids)),
                tf.reshape(ids, [-1])), tf.shape(sw))
            # LSE over the block, stabilised by the block maximum.
            sums = tf.math.unsorted_segment_sum(tf.reshape(tf.exp(sw - lse_w), [-1]),
                                                tf.reshape(ids, [-1]), tf.size(ids))
            lse_w = lse_w + tf.math.log(tf.reshape(tf.gather(sums, tf.reshape(ids, [-1])),
                                                   tf.shape(sw)))
            # v − ρ/ε with v = LSE_B(ρ/ε) − LSE_B(w), without cancellation at small ε.
            out = -_per_block(rho_raw, block, "centred", strength) - lse_w
        else:
            # v − ρ/ε with v = mean_B(ρ/ε) − mean_B(w).
            out = ((_rho_block_mean(block, x2d.dtype) - rho_raw) / strength
                   - _per_block(sw, block, "mean"))

        def grad(dy):
            # ∂v_B/∂w_i = −1/|B| (l2) or −softmax(w_B)_i (kl), and w = −θ sorted.
            g_sorted = _block_vjp(dy, sw, block, lse_w, kl)
            g = tf.gather(g_sorted, inv, batch_dims=1)
            return tf.where(bad_rows[:, None], tf.zeros_like(g), g)

        return out, grad

    out = tf.where(bad_rows[:, None], limit, sort(x2d) + centre)
    if view is not None and direction_is_descending(direction):
        out = -out
    return ListResult(out, "sorted")


def _sort_limits(x2d, kl: bool):
    """Non-finite scores of the ascending sort of `x2d` `[b, n]`: their limits as
    scores grow without bound (the package's rule, `softsort_tf._masking`).

    PAV pools a block holding a ±inf score with every other block ('l2': the block mean
    of ρ/ε + θ↑ is ±inf at the end of the order that must hold the extreme value; 'kl':
    a −inf score makes LSE(−θ) = +inf in its block, and so −inf values before every
    other), so the whole list follows it: 'l2' lists with +inf (−inf) entries sort to
    +inf (−inf) everywhere, with both to NaN; 'kl' lists with a −inf entry sort to −inf.
    A +inf score under 'kl' only adds e^{−∞} = 0 to the LSE of its block, which it
    joins: a list with finite entries has a finite limit (computed by the caller with a
    stand-in for each +inf), a list of +inf alone is +inf.

    Returns `(bad_rows, limit)`: the lists `[b]` whose result is `limit` `[b, 1]` (±inf
    or NaN, zero gradient)."""
    dtype = x2d.dtype
    nan = tf.reduce_any(tf.math.is_nan(x2d), axis=-1)
    pos = tf.reduce_any(tf.equal(x2d, tf.constant(float("inf"), dtype)), axis=-1)
    neg = tf.reduce_any(tf.equal(x2d, tf.constant(-float("inf"), dtype)), axis=-1)
    inf = tf.fill(tf.shape(nan), tf.constant(float("inf"), dtype))
    if kl:
        alone = tf.logical_and(pos, tf.logical_not(
            tf.reduce_any(tf.math.is_finite(x2d), axis=-1)))
        bad_rows = tf.logical_or(nan, tf.logical_or(neg, alone))
        limit = tf.where(nan, inf * 0.0, tf.where(neg, -inf, inf))
    else:
        bad_rows = tf.logical_or(nan, tf.logical_or(pos, neg))
        limit = tf.where(tf.logical_or(nan, tf.logical_and(pos, neg)), inf * 0.0,
                         tf.where(pos, inf, -inf))
    return bad_rows, limit[:, None]


def direction_is_descending(direction: str) -> bool:
    return _checks.check_direction(direction) == "DESCENDING"


# The permutahedron family (`softsort_tf.ops.family`).
PERMUTAHEDRON = family.Family(
    "permutahedron", "regularization_strength", 1.0,
    "strength of the quadratic ('l2') or entropic ('kl') regularisation of the "
    "projection: in the units of the scores for ranks, in inverse units for 'l2' sorts",
    "Blondel, Teboul, Berthet & Djolonga (2020)",
    operations=dict(rank=family.family_operation(permutahedron_rank),
                    sort=family.family_operation(permutahedron_sort)), masks=False,
    scale_free_temperature=30.0)

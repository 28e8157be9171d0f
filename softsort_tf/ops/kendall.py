"""Permutations as inputs: the Kendall embedding, the Kendall and Mallows kernels, and
Kendall's τ (hard and smooth).

Jiao & Vert ("The Kendall and Mallows kernels for permutations", ICML 2015 / IEEE TPAMI
2017; "The weighted Kendall and high-order kernels for permutations", ICML 2018) embed
a ranking of n items, read from a score vector x ∈ Rⁿ, by its pairwise comparisons

    Φ(x)_ij = 1[x_i < x_j]                       (talk: "The Kendall embedding").

For two rankings with n_c concordant and n_d discordant pairs, ⟨Φ(x), Φ(y)⟩ over the
ordered pairs i ≠ j is n_c and ‖Φ(x) − Φ(y)‖² = 2 n_d ("Geometry of the embedding"),
so that the Kendall kernel (τ) and the Mallows kernel exp(−λ n_d) are positive
definite and right-invariant: relabelling the items of both rankings by the same
permutation leaves them unchanged.

Conventions of this module:

- Pair order. `kendall_embedding` returns the n(n − 1)/2 pairs (i, j), i < j, in
  row-major order (0, 1), (0, 2), …, (0, n − 1), (1, 2), …, (n − 2, n − 1): the order
  of `numpy.triu_indices(n, 1)`.
- Ties. The hard embedding uses the strict comparison: a tied pair gives 0 (and 0 in
  the signed embedding sign(x_j − x_i)). The smooth embedding gives 1/2 for a tied
  pair (0 signed): the hard embedding at ties is not its σ → 0 limit. Kendall's τ is
  τ-b, (n_c − n_d) / √((n₀ − n₁)(n₀ − n₂)), n₀ = n(n − 1)/2 and n₁, n₂ the pairs tied
  in x and in y (`scipy.stats.kendalltau`): the cosine between the signed embeddings.
- Padding (softsort_tf._masking): with a `mask`, padded items take no part; a pair
  with a padded item is 0 in the embedding, and τ and the kernels are those of the
  valid items alone.
- Degenerate lists. τ is 0, with weight 0 (`return_weights=True`), for a list with
  fewer than two valid items or whose targets or predictions are all tied (where
  scipy returns NaN). A NaN at a valid entry gives NaN.

Complexities (n items, per list or per pair of rows): the embedding is O(n²);
`kendall_tau`, `kendall_kernel` and `mallows_kernel` count discordant pairs either
pairwise (`algorithm='pairwise'`, O(n²) time and memory; the kernels then take inner
products of embeddings, one matrix product for the whole Gram matrix) or by sorting
(`algorithm='merge'`, O(n log n) time and O(n) memory per pair: Knight's algorithm, the
discordant pairs being the inversions of the y-ranks in x-order, counted by a
most-significant-bit-first radix partition, log₂ n vectorised passes of O(n) each);
`algorithm='auto'` takes 'pairwise' for a static n ≤ `PAIRWISE_MAX_N` (lists) or
`GRAM_PAIRWISE_MAX_N` (kernels) and 'merge' otherwise (n unknown at trace time
included). `soft_kendall_tau` and
`weighted_kendall_kernel` are O(n²).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _masking, _shapes, _special
from softsort_tf import _lists as ranking

PAIRWISE_MAX_N = 32
"""`algorithm='auto'` of `kendall_tau` counts pairs pairwise (O(n²) per list) up to this
static n, by sorting (O(n log n)) above it and when n is unknown at trace time."""

GRAM_PAIRWISE_MAX_N = 128
"""`algorithm='auto'` of the kernels takes products of the `[rows, n²]` embeddings up to
this static n (one matrix product serves all pairs of rows), sorting above it and
when n is unknown at trace time."""

ALGORITHMS = ("auto", "pairwise", "merge")

COMBINATIONS = ("additive", "multiplicative")


# --------------------------------------------------------------------------- checks


def _check_smooth_scale(smooth_scale, *, allow_none: bool):
    if smooth_scale is None:
        if allow_none:
            return None
        raise ValueError("`smooth_scale` must be a finite number > 0, got None.")
    return _checks.check_positive("smooth_scale", smooth_scale)


def check_algorithm(algorithm) -> str:
    """Validates the `algorithm` argument (one of `ALGORITHMS`)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"`algorithm` must be one of {ALGORITHMS}, got {algorithm!r}.")
    return algorithm


def _resolve_algorithm(algorithm: str, static_n, limit: int = PAIRWISE_MAX_N) -> str:
    if algorithm != "auto":
        return algorithm
    return "pairwise" if static_n is not None and static_n <= limit else "merge"


# ------------------------------------------------------------------------ embedding


def pair_indices(n):
    """The pairs (i, j), i < j, of n items in row-major order (`numpy.triu_indices(n, 1)`).

    Args:
      n: a Python int, or a scalar integer tensor (n unknown at trace time).

    Returns:
      `(i, j)`, two int32 vectors of length n(n − 1)/2.

    Example:
    >>> i, j = pair_indices(3)
    >>> i.numpy().tolist(), j.numpy().tolist()
    ([0, 0, 1], [1, 2, 2])
    """
    if isinstance(n, (int, np.integer)):
        i, j = np.triu_indices(int(n), 1)
        return tf.constant(i, tf.int32), tf.constant(j, tf.int32)
    # Pair p starts row i at s(i) = i(2n − i − 1)/2: invert s in closed form, then
    # correct a rounding error of the square root by one step either way.
    n64 = tf.cast(n, tf.int64)
    num_pairs = n64 * (n64 - 1) // 2
    p = tf.range(num_pairs, dtype=tf.int64)
    b = tf.cast(2 * n64 - 1, tf.float64)
    disc = tf.maximum(b * b - 8.0 * tf.cast(p, tf.float64), 0.0)
    i = tf.cast(tf.floor((b - tf.sqrt(disc)) / 2.0), tf.int64)
    i = tf.clip_by_value(i, 0, tf.maximum(n64 - 2, 0))

    def start(r):
        return r * (2 * n64 - r - 1) // 2

    i = tf.where(start(i + 1) <= p, i + 1, i)
    i = tf.where(start(i) > p, i - 1, i)
    j = p - start(i) + i + 1
    return tf.cast(i, tf.int32), tf.cast(j, tf.int32)


def kendall_embedding(x, smooth_scale: float | None = None, *, signed: bool = False,
                      axis: int = -1, mask=None):
    """The Kendall embedding of the ranking of x (Jiao & Vert 2015, §2; talk, "The
    Kendall embedding"), hard or smoothed by Gaussian noise.

    Hard (`smooth_scale=None`): Φ_ij = 1[x_i < x_j] for the pairs i < j (0 for a tie).
    Smooth (`smooth_scale=σ > 0`): the expectation of the hard embedding of x + ε,
    ε ~ N(0, σ² I),

        Φ_ij = P(x_i + ε_i < x_j + ε_j) = Φ_N((x_j − x_i) / (σ√2)),

    with Φ_N the standard normal CDF: differentiable, 1/2 at a tie, → the hard
    embedding at untied pairs as σ → 0. `signed=True` gives 2Φ − 1 for the smooth
    embedding, erf((x_j − x_i)/(2σ)), and sign(x_j − x_i) for the hard one: the
    embedding whose cosine is Kendall's τ-b (`kendall_kernel`).

    The pairs are in the order of `numpy.triu_indices(n, 1)`: (0, 1), (0, 2), …,
    (n − 2, n − 1). O(n²) time and memory.

    Args:
      x: `[..., n, ...]` scores (float16/bfloat16 computed in float32).
      smooth_scale: None (hard) or the noise scale σ > 0, in units of x.
      signed: return the signed embedding (values in [−1, 1]).
      axis: the item axis; the output has the pair axis there.
      mask: optional boolean of the shape of x (or `[n]`), False for padding: a pair
        with a padded item is 0 (its value, NaN included, is not read).

    Returns:
      `[..., n(n − 1)/2, ...]` in the dtype of x (float32 for integer inputs).

    Example:
    >>> kendall_embedding([3.0, 1.0, 2.0]).numpy().tolist()
    [0.0, 0.0, 1.0]
    >>> kendall_embedding([0.0, 0.0], smooth_scale=1.0).numpy().tolist()
    [0.5]
    """
    smooth_scale = _check_smooth_scale(smooth_scale, allow_none=True)
    signed = _checks.check_bool("signed", signed)
    x2d, view = _shapes.to_batch(x, axis, "x")
    valid = _masking.mask_to_batch(mask, view)
    x2d = _masking.replace_padded(x2d, valid)
    i, j = pair_indices(view.static_n if view.static_n is not None else view.n)
    xi = tf.gather(x2d, i, axis=1)
    xj = tf.gather(x2d, j, axis=1)
    if smooth_scale is None:
        less = tf.cast(xi < xj, x2d.dtype)
        phi = less - tf.cast(xj < xi, x2d.dtype) if signed else less
    else:
        z = (xj - xi) / (2.0 * smooth_scale)
        phi = _special.erf(z) if signed else 0.5 * _special.erfc(-z)
    if valid is not None:
        pair_valid = tf.logical_and(tf.gather(valid, i, axis=1), tf.gather(valid, j, axis=1))
        phi = tf.where(pair_valid, phi, tf.zeros_like(phi))
    return _shapes.from_batch(phi, view)


# ------------------------------------------------------------------- pair counting


def _take(a, order):
    return tf.gather(a, order, batch_dims=1)


def _argsort(keys):
    return tf.argsort(keys, axis=-1, stable=True)


def _inverse_permutation(order):
    """The inverse of each row of a `[batch, n]` permutation."""
    shape = tf.shape(order)
    rows = tf.broadcast_to(tf.range(shape[0])[:, None], shape)
    positions = tf.broadcast_to(tf.range(shape[1])[None, :], shape)
    inverse = tf.scatter_nd(tf.stack([rows, order], axis=-1), positions, shape)
    inverse.set_shape(order.shape)
    return inverse


def _cummax(a):
    """Running maximum along the last axis of an int `[batch, n]` tensor: ⌈log₂ n⌉
    doubling steps (a Hillis–Steele scan)."""
    n = tf.shape(a)[1]
    positions = tf.range(n)

    def body(step, acc):
        shifted = tf.gather(acc, tf.maximum(positions - step, 0), axis=1)
        return step * 2, tf.maximum(acc, shifted)

    _, out = tf.while_loop(lambda step, acc: step < n, body, (tf.constant(1), a))
    return out


def _tied_pairs(same_as_previous):
    """Σ over runs of t(t − 1)/2, the runs being the maximal blocks of consecutive
    entries with `same_as_previous` True after their first (bool `[batch, n]`)."""
    n = tf.shape(same_as_previous)[1]
    positions = tf.broadcast_to(tf.range(n)[None, :], tf.shape(same_as_previous))
    starts = _cummax(tf.where(same_as_previous, tf.zeros_like(positions), positions))
    return tf.reduce_sum(tf.cast(positions - starts, tf.int64), axis=1)


def _inversions(z):
    """Number of pairs j < i with z_j > z_i in each row of an int32 `[batch, n]` tensor
    whose rows are permutations of 0..n − 1.

    Most-significant-bit-first radix partition: before the pass of bit b the row holds
    its values grouped by z >> (b + 1) (in increasing order, each group in its
    original order; a group of key k starts at position k·2^(b+1) because the row is a
    permutation). An inversion is counted at the highest bit where its two values
    differ, as a 1 before a 0 of the same group; the row is then stably partitioned by
    the bit within each group. Each pass is O(n) (cumulative sums, a gather and a
    scatter); ⌊log₂ n⌋ + 1 passes.
    """
    shape = tf.shape(z)
    n = shape[1]
    rows = tf.broadcast_to(tf.range(shape[0])[:, None], shape)
    positions = tf.broadcast_to(tf.range(n)[None, :], shape)
    bits = tf.cast(tf.floor(tf.math.log(tf.cast(tf.maximum(n, 2), tf.float64))
                            / math.log(2.0)), tf.int32) + 1

    def body(b, a, count):
        half = tf.bitwise.left_shift(1, b)
        key = tf.bitwise.right_shift(a, b + 1)
        bit = tf.bitwise.bitwise_and(tf.bitwise.right_shift(a, b), 1)
        start = key * (2 * half)
        ones = tf.cumsum(bit, axis=1, exclusive=True)
        ones_before = ones - tf.gather(ones, start, batch_dims=1)
        is_zero = tf.equal(bit, 0)
        count += tf.reduce_sum(
            tf.cast(tf.where(is_zero, ones_before, tf.zeros_like(ones_before)), tf.int64), axis=1)
        zeros_in_group = tf.minimum(half, n - start)
        zeros_before = positions - start - ones_before
        new = start + tf.where(is_zero, zeros_before, zeros_in_group + ones_before)
        a = tf.scatter_nd(tf.stack([rows, new], axis=-1), a, shape)
        a.set_shape(z.shape)
        return b - 1, a, count

    count = tf.zeros(shape[:1], tf.int64)
    _, _, count = tf.while_loop(lambda b, a, c: b >= 0, body, (bits - 1, z, count))
    return count


def _counts_merge(x, y, valid):
    """Pair counts of rows of x and y by sorting: `(n0, n1, n2, n3, nd)` (int64 `[batch]`):
    valid pairs, pairs tied in x, in y, in both, and discordant pairs (Knight's
    algorithm: sorted by (x, y), the discordant pairs are the inversions of y)."""
    padded = tf.cast(tf.logical_not(valid), tf.int32)
    order = _argsort(y)
    order = _take(order, _argsort(_take(x, order)))
    order = _take(order, _argsort(_take(padded, order)))  # valid items first
    xs, ys, vs = _take(x, order), _take(y, order), _take(valid, order)

    def previous(a):
        return tf.concat([a[:, :1], a[:, :-1]], axis=1)

    first = tf.concat([tf.ones_like(vs[:, :1]), tf.zeros_like(vs[:, 1:])], axis=1)
    following = tf.logical_and(vs, tf.logical_not(first))
    same_x = tf.logical_and(following, tf.equal(xs, previous(xs)))
    n1 = _tied_pairs(same_x)
    n3 = _tied_pairs(tf.logical_and(same_x, tf.equal(ys, previous(ys))))
    # Ordinal ranks of y in this order (ties by position, padded items last).
    order_y = _argsort(ys)
    order_y = _take(order_y, _argsort(_take(1 - tf.cast(vs, tf.int32), order_y)))
    y_sorted, v_sorted = _take(ys, order_y), _take(vs, order_y)
    n2 = _tied_pairs(tf.logical_and(tf.logical_and(v_sorted, tf.logical_not(first)),
                                    tf.equal(y_sorted, previous(y_sorted))))
    nd = _inversions(_inverse_permutation(order_y))
    nv = tf.reduce_sum(tf.cast(valid, tf.int64), axis=1)
    return nv * (nv - 1) // 2, n1, n2, n3, nd


def _signs(x):
    """s_ij = sign(x_j − x_i) `[batch, n, n]` from comparisons (±inf handled, NaN → 0)."""
    xi, xj = x[:, :, None], x[:, None, :]
    return tf.cast(xi < xj, tf.float64) - tf.cast(xj < xi, tf.float64)


def _counts_pairwise(x, y, valid):
    """As `_counts_merge`, from the n² pairs (O(n²) time and memory per row)."""
    sx, sy = _signs(x), _signs(y)
    pair_valid = tf.cast(tf.logical_and(valid[:, :, None], valid[:, None, :]), tf.float64)
    eye = 1.0 - tf.eye(tf.shape(x)[1], dtype=tf.float64)
    pair_valid = pair_valid * eye

    def count(t):  # each unordered pair counted once
        return tf.cast(tf.round(tf.reduce_sum(t * pair_valid, axis=[1, 2]) / 2.0), tf.int64)

    tx, ty = 1.0 - tf.abs(sx), 1.0 - tf.abs(sy)
    return (count(tf.ones_like(sx)), count(tx), count(ty), count(tx * ty),
            count(tf.cast(sx * sy < 0, tf.float64)))


def _counts(x, y, valid, algorithm, static_n):
    algorithm = _resolve_algorithm(algorithm, static_n)
    fn = _counts_pairwise if algorithm == "pairwise" else _counts_merge
    return fn(x, y, valid)


def _tau_b(n0, n1, n2, n3, nd):
    """τ-b and its weight (1 where defined, else 0) as float64 `[batch]`."""
    n0, n1, n2, n3, nd = (tf.cast(t, tf.float64) for t in (n0, n1, n2, n3, nd))
    numerator = n0 - n1 - n2 + n3 - 2.0 * nd
    denominator = (n0 - n1) * (n0 - n2)
    defined = denominator > 0
    tau = tf.where(defined, numerator / tf.sqrt(tf.where(defined, denominator, 1.0)), 0.0)
    return tau, tf.cast(defined, tf.float64)


# ------------------------------------------------------------------------ τ (lists)


def _lists(y_true, y_pred, mask, axis, negative_labels_are_padding):
    """`(labels [B, n], scores [B, n], valid [B, n], view, missing [B], exact_scores)`:
    NaN-free values in the compute dtype (integer labels as int64), padding from the
    mask, negative labels and ragged rows; `missing` marks lists with a NaN at a valid
    entry; `exact_scores` are integer scores as int64 (None for floats). Inputs are checked, and
    Keras-RS's dict `y_true` unpacked, by `ranking.check_lists`."""
    y_true, y_pred, mask = ranking.check_lists(y_true, y_pred, mask)
    if _masking.is_ragged(y_true) or _masking.is_ragged(y_pred):
        if axis not in (-1,):
            raise ValueError(f"Ragged lists are read along their last axis, got axis={axis}.")
        ragged = y_true if _masking.is_ragged(y_true) else y_pred
        present = tf.ones_like(ragged, dtype=tf.bool).to_tensor(False)

        def dense(t):
            return t.to_tensor(0) if _masking.is_ragged(t) else tf.convert_to_tensor(t)

        y_true, y_pred = dense(y_true), dense(y_pred)
        mask = present if mask is None else tf.logical_and(
            present, dense(tf.cast(mask, tf.bool)) if not _masking.is_ragged(mask)
            else mask.to_tensor(False))
    y_true = tf.convert_to_tensor(y_true)
    y_pred = tf.convert_to_tensor(y_pred)
    if not y_true.shape.is_compatible_with(y_pred.shape):
        raise ValueError(f"`y_true` and `y_pred` must have the same shape (one target per "
                         f"prediction), got {y_true.shape} and {y_pred.shape}.")
    scores, view = _shapes.to_batch(y_pred, axis, "y_pred")
    labels, _ = _shapes.to_batch(y_true, axis, "y_true")
    dtype = _shapes.batch_compute_dtype(y_pred.dtype)
    labels = tf.cast(labels, dtype)
    # Integers are compared as integers: int64 values above 2⁵³ are not distinct in
    # float64 (the pair counts only compare values; `_signs` and the sorts take int64).
    exact_labels, exact_scores = _integer_batch(y_true, view), _integer_batch(y_pred, view)
    valid = _masking.mask_to_batch(mask, view)
    if valid is None:
        valid = tf.ones_like(scores, dtype=tf.bool)
    if negative_labels_are_padding:
        valid = tf.logical_and(valid, tf.logical_not(labels < 0))
    nan = tf.logical_or(tf.math.is_nan(labels), tf.math.is_nan(scores))
    missing = tf.reduce_any(tf.logical_and(valid, nan), axis=1)
    zero = tf.zeros_like(scores)
    labels = tf.where(tf.logical_and(valid, tf.logical_not(nan)), labels, zero)
    scores = tf.where(tf.logical_and(valid, tf.logical_not(nan)), scores, zero)
    if exact_labels is not None:
        labels = tf.where(valid, exact_labels, tf.zeros_like(exact_labels))
    return labels, scores, valid, view, missing, exact_scores


def _integer_batch(t, view):
    """An integer `t` as int64 `[batch, n]` in the layout of `view` (None for floats)."""
    if not t.dtype.is_integer:
        return None
    t = tf.cast(t, tf.int64)
    moved = tf.transpose(t, view.perm) if view.axis != view.rank - 1 else t
    return tf.reshape(moved, tf.stack([-1, tf.shape(moved)[-1]]))


def _finish(values, weights, missing, view, return_weights: bool):
    values = tf.where(missing, tf.constant(np.nan, values.dtype), values)
    weights = tf.where(missing, tf.ones_like(weights), weights)  # NaN is not skipped
    values = _shapes.from_batch(tf.cast(values, _out_dtype(view)), view, keep_axis=False)
    if not return_weights:
        return values
    weights = _shapes.from_batch(tf.cast(weights, values.dtype), view, keep_axis=False)
    return values, weights


def _out_dtype(view):
    return view.output_dtype


def kendall_tau(y_true, y_pred, *, mask=None, axis: int = -1,
                negative_labels_are_padding: bool = False, algorithm: str = "auto",
                return_weights: bool = False):
    """Kendall's τ-b of each list: (n_c − n_d) / √((n₀ − n₁)(n₀ − n₂)).

    n_c, n_d: concordant and discordant pairs of (y_true, y_pred); n₀ = n(n − 1)/2;
    n₁, n₂: pairs tied in y_true, in y_pred. Equal to `scipy.stats.kendalltau`
    (variant 'b') where the latter is defined; 0, with weight 0, for a list with fewer
    than two valid items or with all targets (or all predictions) tied, where scipy
    returns NaN. NaN for a list with a NaN at a valid entry.

    Args:
      y_true, y_pred: `[..., n, ...]` tensors of the same shape (or ragged
        `[batch, (n)]`).
      mask: optional boolean of the shape of y_true (or `[n]`), False for padding.
      axis: the list axis.
      negative_labels_are_padding: also treat y_true < 0 as padding (default False).
      algorithm: 'pairwise' (O(n²) per list), 'merge' (O(n log n) per list: Knight's
        algorithm with a radix inversion count) or 'auto' (see `PAIRWISE_MAX_N`).
      return_weights: also return the weights (1 where τ is defined, else 0).

    Returns:
      τ with the shape of the inputs without `axis` (the dtype of y_pred; float32 for
      reduced precision), and the weights with `return_weights=True`. Not
      differentiable (see `soft_kendall_tau`). Works with an unknown n and under XLA.

    Example:
    >>> round(float(kendall_tau([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0])), 4)
    0.6667
    """
    algorithm = check_algorithm(algorithm)
    negative_labels_are_padding = _checks.check_bool("negative_labels_are_padding",
                                                     negative_labels_are_padding)
    return_weights = _checks.check_bool("return_weights", return_weights)
    labels, scores, valid, view, missing, exact_scores = _lists(
        y_true, y_pred, mask, axis, negative_labels_are_padding)
    if exact_scores is not None:
        scores = tf.where(valid, exact_scores, tf.zeros_like(exact_scores))
    tau, weights = _tau_b(*_counts(labels, scores, valid, algorithm, view.static_n))
    return _finish(tau, weights, missing, view, return_weights)


def soft_kendall_tau(y_true, y_pred, *, smooth_scale: float = 1.0, mask=None, axis: int = -1,
                     negative_labels_are_padding: bool = False, return_weights: bool = False):
    """Differentiable Kendall's τ: the expected τ-b of y_true and y_pred + ε,
    ε ~ N(0, σ² I), σ = `smooth_scale`.

    The predictions are compared through the smooth signed Kendall embedding
    (`kendall_embedding(signed=True)`), a soft sign of score differences:

        τ̃ = Σ_{i<j} sign(t_j − t_i) · erf((p_j − p_i)/(2σ)) / √((n₀ − n₁) n₀),

    which is exactly E_ε[τ_b(t, p + ε)] (the perturbed predictions have no ties, and
    τ-b is linear in their signs). As σ → 0 it tends to τ-b for predictions without
    ties. In [−1, 1]; 0 with weight 0 for a list with fewer than two valid items or all
    targets tied (then no gradient). O(n²) time and memory per list.

    Args:
      y_true: `[..., n, ...]` targets (or ragged `[batch, (n)]`); not differentiated.
      y_pred: predicted scores of the same shape.
      smooth_scale: σ > 0, in units of the scores (default 1).
      mask, axis, negative_labels_are_padding, return_weights: as in `kendall_tau`.
        Padded entries get zero gradient and their values (NaN included) are not read.

    Returns:
      τ̃ with the shape of the inputs without `axis` (the dtype of y_pred; float32 for
      reduced precision), and the weights with `return_weights=True`.

    Example:
    >>> tau = soft_kendall_tau([1.0, 2.0, 3.0], [0.0, 10.0, 20.0], smooth_scale=0.1)
    >>> round(float(tau), 6)
    1.0
    """
    smooth_scale = _check_smooth_scale(smooth_scale, allow_none=False)
    negative_labels_are_padding = _checks.check_bool("negative_labels_are_padding",
                                                     negative_labels_are_padding)
    return_weights = _checks.check_bool("return_weights", return_weights)
    labels, scores, valid, view, missing, _ = _lists(y_true, y_pred, mask, axis,
                                                      negative_labels_are_padding)
    dtype = scores.dtype
    st = tf.cast(_signs(labels), dtype)
    soft = tf.math.erf((scores[:, None, :] - scores[:, :, None]) / (2.0 * smooth_scale))
    pair_valid = tf.cast(tf.logical_and(valid[:, :, None], valid[:, None, :]), dtype)
    st = st * pair_valid
    nv = tf.reduce_sum(tf.cast(valid, dtype), axis=1)
    untied_true = tf.reduce_sum(tf.abs(st), axis=[1, 2]) / 2.0  # n₀ − n₁
    all_pairs = nv * (nv - 1.0) / 2.0  # n₀
    numerator = tf.reduce_sum(st * soft, axis=[1, 2]) / 2.0
    defined = untied_true > 0
    denominator = tf.sqrt(tf.where(defined, untied_true * all_pairs, tf.ones_like(nv)))
    tau = tf.where(defined, numerator / denominator, tf.zeros_like(nv))
    return _finish(tau, tf.cast(defined, dtype), missing, view, return_weights)


# -------------------------------------------------------------------------- kernels


def _rows(x, name: str):
    _checks.check_dense(name, x, mask=f"{name}_mask")
    x = tf.convert_to_tensor(x)
    _checks.check_real_dtype(name, x.dtype)
    if x.shape.rank is None or x.shape.rank < 2:
        raise ValueError(f"`{name}` must have shape [..., rows, n] (rank >= 2), got "
                         f"{x.shape}.")
    if x.shape[-1] == 0:
        raise ValueError(f"`{name}` must have n >= 1 items along its last axis, got 0.")
    return x


def _row_mask(mask, x, name: str):
    if mask is None:
        return tf.ones_like(x, dtype=tf.bool)
    mask = _masking.checked_mask(mask, x, name, "broadcast to the shape of its rows")
    return tf.broadcast_to(mask, tf.shape(x))


def _prepare_rows(x, y, x_mask, y_mask):
    """Checked rows x `[..., p, n]`, y `[..., q, n]` (y = x when None) in the compute
    dtype with their NaN replaced by 0, their boolean masks (NaN entries of valid
    items kept as a separate flag), and the output dtype."""
    x = _rows(x, "x")
    y_given = y is not None
    y = _rows(y, "y") if y_given else x
    if x.shape[-1] is not None and y.shape[-1] is not None and x.shape[-1] != y.shape[-1]:
        raise ValueError(f"`x` and `y` must rank the same n items (last axis), got "
                         f"{x.shape[-1]} and {y.shape[-1]}.")
    out_dtype = x.dtype if x.dtype.is_floating else tf.float32
    dtype = _shapes.batch_compute_dtype(x.dtype)
    xm = _row_mask(x_mask, x, "x_mask")
    ym = _row_mask(y_mask, y, "y_mask") if (y_given or y_mask is not None) else xm
    x, y = tf.cast(x, dtype), tf.cast(y, dtype)
    x_nan, y_nan = tf.math.is_nan(x), tf.math.is_nan(y)
    x = tf.where(x_nan, tf.zeros_like(x), x)
    y = tf.where(y_nan, tf.zeros_like(y), y)
    return x, y, xm, ym, tf.logical_and(xm, x_nan), tf.logical_and(ym, y_nan), out_dtype


def _gram_shapes(x, y):
    x4, y4 = x[..., :, None, :], y[..., None, :, :]
    shape = tf.broadcast_dynamic_shape(tf.shape(x4), tf.shape(y4))
    static = tf.broadcast_static_shape(x4.shape, y4.shape)
    return x4, y4, shape, static


def _merge_gram(x, y, xm, ym):
    """`(τ-b, discordances with half ties)` float64 `[..., p, q]` by sorting: every pair
    of rows is a `[n]` problem, O(n log n) time and O(n) memory each."""
    x4, y4, shape, static = _gram_shapes(x, y)
    xm4, ym4 = xm[..., :, None, :], ym[..., None, :, :]
    flat = tf.stack([-1, shape[-1]])

    def paired(t):
        return tf.reshape(tf.broadcast_to(t, shape), flat)

    valid = tf.logical_and(paired(xm4), paired(ym4))
    xs = tf.where(valid, paired(x4), tf.zeros([], x.dtype))
    ys = tf.where(valid, paired(y4), tf.zeros([], y.dtype))
    n0, n1, n2, n3, nd = _counts_merge(xs, ys, valid)
    tau, _ = _tau_b(n0, n1, n2, n3, nd)
    discord = tf.cast(nd, tf.float64) + 0.5 * tf.cast(n1 + n2 - 2 * n3, tf.float64)

    def unflat(t):
        t = tf.reshape(t, shape[:-1])
        t.set_shape(static[:-1])
        return t

    return unflat(tau), unflat(discord)


def _pair_embeddings(x, m):
    """Per row, over the ordered pairs (i, j) flattened to n²: Φ = 1[x_i < x_j], its
    signed version, and the validity of the pair (i ≠ j, both valid), all float64 and
    0 at invalid pairs."""
    x = tf.cast(x, tf.float64)
    xi, xj = x[..., :, None], x[..., None, :]
    n = tf.shape(x)[-1]
    valid = tf.logical_and(m[..., :, None], m[..., None, :])
    valid = tf.cast(valid, tf.float64) * (1.0 - tf.eye(n, dtype=tf.float64))
    less = tf.cast(xi < xj, tf.float64) * valid
    signed = less - tf.cast(xj < xi, tf.float64) * valid
    shape = tf.shape(less)
    flat = tf.concat([shape[:-2], [n * n]], axis=0)
    return tuple(tf.reshape(t, flat) for t in (less, signed, valid))


def _pairwise_gram(x, y, xm, ym):
    """As `_merge_gram` by products of the `[rows, n²]` embeddings of the rows."""
    less_x, sign_x, valid_x = _pair_embeddings(x, xm)
    less_y, sign_y, valid_y = _pair_embeddings(y, ym)

    def dot(a, b):
        return tf.linalg.matmul(a, b, transpose_b=True)

    numerator = dot(sign_x, sign_y)
    untied_x, untied_y = dot(tf.abs(sign_x), valid_y), dot(valid_x, tf.abs(sign_y))
    denominator = untied_x * untied_y
    defined = denominator > 0
    tau = tf.where(defined, numerator / tf.sqrt(tf.where(defined, denominator, 1.0)), 0.0)
    discord = 0.5 * (dot(less_x, valid_y) + dot(valid_x, less_y)) - dot(less_x, less_y)
    return tau, tf.round(2.0 * discord) / 2.0


def _kernel_stats(x, y, x_mask, y_mask, algorithm):
    """`(τ-b, discordances, output dtype)` of all pairs of rows, NaN where a pair of rows
    has a NaN at an item valid in both."""
    algorithm = check_algorithm(algorithm)
    x, y, xm, ym, x_nan, y_nan, out_dtype = _prepare_rows(x, y, x_mask, y_mask)
    static_n = x.shape[-1] if x.shape[-1] is not None else y.shape[-1]
    pairwise = _resolve_algorithm(algorithm, static_n, GRAM_PAIRWISE_MAX_N) == "pairwise"
    gram = _pairwise_gram if pairwise else _merge_gram
    tau, discord = gram(x, y, xm, ym)

    def items(t):
        return tf.cast(t, tf.float64)

    missing = (tf.linalg.matmul(items(x_nan), items(ym), transpose_b=True)
               + tf.linalg.matmul(items(xm), items(y_nan), transpose_b=True)) > 0
    nan = tf.constant(np.nan, tf.float64)
    return tf.where(missing, nan, tau), tf.where(missing, nan, discord), out_dtype


def kendall_kernel(x, y=None, *, x_mask=None, y_mask=None, algorithm: str = "auto"):
    """Gram matrix of the Kendall kernel: Kendall's τ-b between the rows of x and y.

    K(x, y) = ⟨s(x), s(y)⟩ / (‖s(x)‖ ‖s(y)‖), s the signed Kendall embedding
    sign(x_j − x_i) (`kendall_embedding(signed=True)`): τ-b = (n_c − n_d)/√((n₀ − n₁)
    (n₀ − n₂)), and (n_c − n_d)/n₀ for rankings without ties (Jiao & Vert 2015,
    Def. 1 up to the normalisation). Positive definite (an inner product of unit
    vectors) and right-invariant: K(x∘π, y∘π) = K(x, y) for a permutation π of the
    items. A row whose items are all tied has s = 0 and gives 0.

    Args:
      x: `[..., p, n]` rows of n scores each (float16/bfloat16 computed in float32).
      y: `[..., q, n]` (leading axes broadcast with those of x), or None for y = x.
      x_mask, y_mask: optional booleans broadcastable to x and y, False for padding:
        τ of a pair of rows is that of the items valid in both.
      algorithm: 'pairwise': products of the `[rows, n²]` embeddings (O(n²) memory per
        row, O(n²) time per pair of rows as matrix products); 'merge': O(n log n) time
        and O(n) memory per pair of rows (no n² array); 'auto' (see
        `GRAM_PAIRWISE_MAX_N`).

    Returns:
      `[..., p, q]` in the dtype of x (float32 for integer x); NaN where a pair of rows
      has a NaN at an item valid in both. Works with an unknown n and under XLA.

    Example:
    >>> k = kendall_kernel([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    >>> k.numpy().tolist()
    [[1.0, -1.0], [-1.0, 1.0]]
    """
    tau, _, out_dtype = _kernel_stats(x, y, x_mask, y_mask, algorithm)
    return tf.cast(tau, out_dtype)


def discordant_pairs(x, y=None, *, x_mask=None, y_mask=None, algorithm: str = "auto"):
    """Matrix of discordant pairs n_d between the rows of x and y, counting a pair tied
    in exactly one of the two rankings as half a discordance, so that n_d = ½‖Φ(x) −
    Φ(y)‖² for the hard embedding Φ over the ordered pairs (talk, "Geometry of the
    embedding"); the plain count of discordant pairs for rankings without ties.

    Args, algorithm and shapes as in `kendall_kernel`; returns `[..., p, q]`.

    Example:
    >>> discordant_pairs([[1.0, 2.0, 3.0]], [[3.0, 1.0, 2.0], [1.0, 1.0, 2.0]]).numpy()
    array([[2. , 0.5]], dtype=float32)
    """
    _, discord, out_dtype = _kernel_stats(x, y, x_mask, y_mask, algorithm)
    return tf.cast(discord, out_dtype)


def mallows_kernel(x, y=None, lam: float = 1.0, *, x_mask=None, y_mask=None,
                   algorithm: str = "auto"):
    """Gram matrix of the Mallows kernel exp(−λ n_d) between the rows of x and y
    (Jiao & Vert 2015, Def. 2; talk, "Kendall and Mallows kernels").

    n_d is `discordant_pairs` (a pair tied in exactly one ranking counts 1/2), so that
    K = exp(−λ ½‖Φ(x) − Φ(y)‖²) is a Gaussian kernel on the Kendall embedding:
    positive definite for every λ ≥ 0, ties included, and right-invariant.

    Args:
      x, y, x_mask, y_mask, algorithm: as in `kendall_kernel`.
      lam: λ ≥ 0 (finite).

    Returns:
      `[..., p, q]` in the dtype of x (float32 for integer x).

    Example:
    >>> k = mallows_kernel([[1.0, 2.0, 3.0]], [[2.0, 1.0, 3.0]], lam=0.5)
    >>> round(float(k[0, 0]), 6)
    0.606531
    """
    try:
        lam_value = float(lam)
    except (TypeError, ValueError):
        raise ValueError(f"`lam` must be a finite number >= 0, got {lam!r}.") from None
    if not math.isfinite(lam_value) or lam_value < 0:
        raise ValueError(f"`lam` must be a finite number >= 0, got {lam!r}.")
    _, discord, out_dtype = _kernel_stats(x, y, x_mask, y_mask, algorithm)
    return tf.cast(tf.exp(-lam_value * discord), out_dtype)


def _ordinal_ranks(x):
    """1-based ordinal ranks along the last axis (ties by position), int32."""
    shape = tf.shape(x)
    flat = tf.reshape(x, tf.stack([-1, shape[-1]]))
    ranks = _inverse_permutation(_argsort(flat)) + 1
    return tf.reshape(ranks, shape)


def weighted_kendall_kernel(x, y=None, rank_weights=None, *,
                            combination: str = "multiplicative"):
    """Gram matrix of the weighted Kendall kernel (Jiao & Vert 2018, §3) between the
    rows of x and y:

        K_U(x, y) = Σ_{i ≠ j} U(r_i(x), r_j(x)) U(r_i(y), r_j(y)) 1[x_i < x_j] 1[y_i < y_j],

    with r(x) the ranks 1..n of x (1 = smallest; tied scores are ranked by position
    and their pair, being tied, contributes 0) and the pair weight U(a, b) = u_a + u_b
    ('additive') or u_a u_b ('multiplicative') of rank weights u ∈ Rⁿ. It is the inner
    product of the weighted embeddings U(r_i, r_j) 1[x_i < x_j]: positive definite,
    and right-invariant. u ≡ 1 ('multiplicative') gives n_c, the unnormalised Kendall
    kernel; u_r = 1[r > n − k] ('multiplicative') the top-k Kendall kernel, which only
    counts pairs of items among the k largest of both rankings. O(n²) time and memory
    per row, one matrix product for the Gram matrix.

    Args:
      x: `[..., p, n]` rows of scores.
      y: `[..., q, n]` or None for y = x.
      rank_weights: u, a length-n vector (index r − 1 for rank r).
      combination: 'additive' or 'multiplicative'.

    Returns:
      `[..., p, q]` in the dtype of x (float32 for integer x).

    Example:
    >>> k = weighted_kendall_kernel([[1.0, 2.0, 3.0]], rank_weights=[1.0, 1.0, 1.0])
    >>> float(k[0, 0])
    3.0
    """
    if combination not in COMBINATIONS:
        raise ValueError(f"`combination` must be one of {COMBINATIONS}, got {combination!r}.")
    if rank_weights is None:
        raise ValueError("`rank_weights` must be a vector of n rank weights, got None.")
    x = _rows(x, "x")
    y = x if y is None else _rows(y, "y")
    if x.shape[-1] is not None and y.shape[-1] is not None and x.shape[-1] != y.shape[-1]:
        raise ValueError(f"`x` and `y` must rank the same n items (last axis), got "
                         f"{x.shape[-1]} and {y.shape[-1]}.")
    out_dtype = x.dtype if x.dtype.is_floating else tf.float32
    dtype = tf.float64 if out_dtype == tf.float64 else tf.float32
    u = tf.cast(tf.convert_to_tensor(rank_weights), dtype)
    if u.shape.rank != 1:
        raise ValueError(f"`rank_weights` must be a vector of n rank weights, got shape "
                         f"{u.shape}.")
    if u.shape[0] is not None and x.shape[-1] is not None and u.shape[0] != x.shape[-1]:
        raise ValueError(f"`rank_weights` must have n = {x.shape[-1]} entries, got "
                         f"{u.shape[0]}.")

    def embed(t):
        t = tf.cast(t, _shapes.batch_compute_dtype(t.dtype))
        w = tf.gather(u, _ordinal_ranks(t) - 1)
        if combination == "additive":
            pair_w = w[..., :, None] + w[..., None, :]
        else:
            pair_w = w[..., :, None] * w[..., None, :]
        less = tf.cast(t[..., :, None] < t[..., None, :], dtype)
        phi = pair_w * less
        shape = tf.shape(phi)
        return tf.reshape(phi, tf.concat([shape[:-2], [shape[-1] * shape[-1]]], axis=0))

    return tf.cast(tf.linalg.matmul(embed(x), embed(y), transpose_b=True), out_dtype)

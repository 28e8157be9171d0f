"""Permutations as inputs: the Kendall embedding, the Kendall and Mallows kernels and
Kendall's τ, hard and smooth (Jiao & Vert, ICML 2015 and ICML 2018).

The embedding lists the pairs i < j in the order of `numpy.triu_indices(n, 1)`. τ is
τ-b (`scipy.stats.kendalltau`), 0 with weight 0 where undefined. `algorithm`:
'pairwise' counts the pairs in O(n²) per list, 'merge' in O(n log n) time and O(n)
memory (Knight's algorithm), 'auto' by the static n (`PAIRWISE_MAX_N` for lists,
`GRAM_PAIRWISE_MAX_N` for kernels; 'merge' when unknown).
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _masking, _special
from softsort_tf import _lists as ranking

PAIRWISE_MAX_N = 32
"""The largest static n at which `algorithm='auto'` of `kendall_tau` counts pairwise."""

GRAM_PAIRWISE_MAX_N = 128
"""The largest static n at which `algorithm='auto'` of the kernels counts pairwise."""

ALGORITHMS = ("auto", "pairwise", "merge")

COMBINATIONS = ("additive", "multiplicative")


def _is_pairwise(algorithm: str, static_n, limit: int) -> bool:
    return algorithm == "pairwise" or (algorithm == "auto" and static_n is not None
                                       and static_n <= limit)


def pair_indices(n):
    """The pairs (i, j), i < j, of n items (a Python int, or a scalar integer tensor) in
    row-major order (`numpy.triu_indices(n, 1)`): two int32 vectors of length n(n − 1)/2.

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
    p = tf.range(n64 * (n64 - 1) // 2, dtype=tf.int64)
    b = tf.cast(2 * n64 - 1, tf.float64)
    disc = tf.maximum(b * b - 8.0 * tf.cast(p, tf.float64), 0.0)
    i = tf.cast(tf.floor((b - tf.sqrt(disc)) / 2.0), tf.int64)
    i = tf.clip_by_value(i, 0, tf.maximum(n64 - 2, 0))

    def start(r):
        return r * (2 * n64 - r - 1) // 2

    i = tf.where(start(i + 1) <= p, i + 1, i)
    i = tf.where(start(i) > p, i - 1, i)
    return tf.cast(i, tf.int32), tf.cast(p - start(i) + i + 1, tf.int32)


def kendall_embedding(x, smooth_scale: float | None = None, *, signed: bool = False,
                      axis: int = -1, mask=None):
    """The Kendall embedding of the ranking of x (Jiao & Vert 2015, §2): Φ_ij = 1[x_i < x_j]
    for the pairs i < j, or with `smooth_scale=σ` its expectation under Gaussian noise
    N(0, σ² I) on x, Φ_N((x_j − x_i) / (σ√2)). O(n²) time and memory.

    Args:
      x: `[..., n, ...]` scores (float16/bfloat16 computed in float32).
      smooth_scale: None (hard) or the noise scale σ > 0, in units of x.
      signed: return sign(x_j − x_i) (smooth: erf((x_j − x_i)/(2σ))) instead.
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
    smooth_scale = _checks.check_positive("smooth_scale", smooth_scale, allow_none=True)
    signed = _checks.check_bool("signed", signed)
    x2d, view = _masking.to_batch(x, axis, "x")
    valid = _masking.mask_to_batch(mask, view)
    x2d = _masking.replace_padded(x2d, valid)
    i, j = pair_indices(view.n)
    xi, xj = tf.gather(x2d, i, axis=1), tf.gather(x2d, j, axis=1)
    if smooth_scale is None:
        less = tf.cast(xi < xj, x2d.dtype)
        phi = less - tf.cast(xj < xi, x2d.dtype) if signed else less
    else:
        z = (xj - xi) / (2.0 * smooth_scale)
        phi = _special.erf(z) if signed else 0.5 * _special.erfc(-z)
    if valid is not None:
        pair_valid = tf.logical_and(tf.gather(valid, i, axis=1), tf.gather(valid, j, axis=1))
        phi = tf.where(pair_valid, phi, tf.zeros_like(phi))
    return _masking.from_batch(phi, view)


def _take(a, order):
    return tf.gather(a, order, batch_dims=1)


def _argsort(keys):
    return tf.argsort(keys, axis=-1, stable=True)


def _cummax(a):
    """Running maximum along the last axis of an int `[batch, n]` tensor (a Hillis–Steele
    scan, ⌈log₂ n⌉ doubling steps)."""
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
    of permutations of 0..n − 1: an MSB-first radix partition (⌊log₂ n⌋ + 1 passes of
    O(n)), counting each 1 before a 0 of a group, then splitting the group by the bit."""
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
    nd = _inversions(_masking.inverse_permutation(order_y))
    nv = tf.reduce_sum(tf.cast(valid, tf.int64), axis=1)
    return nv * (nv - 1) // 2, n1, n2, n3, nd


def _pairs(x, m):
    """`(less, signed, valid)` float64 `[..., n, n]` over the ordered pairs (i, j) of each
    row: 1[x_i < x_j], sign(x_j − x_i) and the validity of the pair (i ≠ j, both valid
    by the bool `m`), the first two 0 at invalid pairs. x is compared in its own dtype."""
    valid = tf.cast(tf.logical_and(m[..., :, None], m[..., None, :]), tf.float64)
    valid = valid * (1.0 - tf.eye(tf.shape(x)[-1], dtype=tf.float64))
    less = tf.cast(x[..., :, None] < x[..., None, :], tf.float64) * valid
    return less, less - tf.cast(x[..., None, :] < x[..., :, None], tf.float64) * valid, valid


def _flat_pairs(t):
    """`[..., n, n]` → `[..., n²]`."""
    shape = tf.shape(t)
    return tf.reshape(t, tf.concat([shape[:-2], [shape[-1] * shape[-1]]], axis=0))


def _counts_pairwise(x, y, valid):
    """As `_counts_merge`, from the n² pairs (O(n²) time and memory per row)."""
    _, sx, pair_valid = _pairs(x, valid)
    _, sy, _ = _pairs(y, valid)

    def count(t):  # each unordered pair counted once
        return tf.cast(tf.round(tf.reduce_sum(t * pair_valid, axis=[1, 2]) / 2.0), tf.int64)

    tx, ty = 1.0 - tf.abs(sx), 1.0 - tf.abs(sy)
    return (count(1.0), count(tx), count(ty), count(tx * ty),
            count(tf.cast(sx * sy < 0, tf.float64)))


def _normalised(numerator, squared_norms):
    """`(numerator / √squared_norms, weight)`: 0 with weight 0 where the norms are 0."""
    defined = squared_norms > 0
    safe = tf.sqrt(tf.where(defined, squared_norms, tf.ones_like(squared_norms)))
    return (tf.where(defined, numerator / safe, tf.zeros_like(numerator)),
            tf.cast(defined, numerator.dtype))


def _tau_b(n0, n1, n2, n3, nd):
    """τ-b and its weight (1 where defined, else 0) as float64 `[batch]`."""
    n0, n1, n2, n3, nd = (tf.cast(t, tf.float64) for t in (n0, n1, n2, n3, nd))
    return _normalised(n0 - n1 - n2 + n3 - 2.0 * nd, (n0 - n1) * (n0 - n2))


def _lists(y_true, y_pred, mask, axis, negative_labels_are_padding, exact_scores=False):
    """`(labels, scores, valid, view, missing)`: checked NaN-free `[B, n]` lists (integer
    labels, and scores with `exact_scores`, as int64) and `missing` `[B]`, the lists
    with a NaN at a valid entry."""
    negative_labels_are_padding = _checks.check_bool("negative_labels_are_padding",
                                                     negative_labels_are_padding)
    y_true, y_pred, mask = ranking.check_lists(y_true, y_pred, mask)
    if _masking.is_ragged(y_true) or _masking.is_ragged(y_pred):
        if axis != -1:
            raise ValueError(f"Ragged lists are read along their last axis, got axis={axis}.")
        ragged = y_true if _masking.is_ragged(y_true) else y_pred
        present = tf.ones_like(ragged, dtype=tf.bool).to_tensor(False)
        y_true, y_pred = (t.to_tensor(0) if _masking.is_ragged(t) else t for t in (y_true, y_pred))
        if _masking.is_ragged(mask):
            mask = mask.to_tensor(False)
        mask = _masking.combine(present, mask)
    y_true, y_pred = ranking.check_same_shape(y_true, y_pred)
    scores, view = _masking.to_batch(y_pred, axis, "y_pred")
    labels, _ = _masking.to_batch(y_true, axis, "y_true")
    labels = tf.cast(labels, _masking.batch_compute_dtype(y_pred.dtype))
    exact_labels = _integer_batch(y_true, view)
    exact_scores = _integer_batch(y_pred, view) if exact_scores else None
    valid = _masking.mask_to_batch(mask, view)
    if valid is None:
        valid = tf.ones_like(scores, dtype=tf.bool)
    if negative_labels_are_padding:
        valid = tf.logical_and(valid, tf.logical_not(labels < 0))
    nan = tf.logical_or(tf.math.is_nan(labels), tf.math.is_nan(scores))
    missing = tf.reduce_any(tf.logical_and(valid, nan), axis=1)
    keep = tf.logical_and(valid, tf.logical_not(nan))
    labels = tf.where(keep, labels, tf.zeros_like(scores))
    scores = tf.where(keep, scores, tf.zeros_like(scores))
    if exact_labels is not None:
        labels = tf.where(valid, exact_labels, tf.zeros_like(exact_labels))
    if exact_scores is not None:
        scores = tf.where(valid, exact_scores, tf.zeros_like(exact_scores))
    return labels, scores, valid, view, missing


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
    values = _masking.from_batch(tf.cast(values, view.output_dtype), view, keep_axis=False)
    if not return_weights:
        return values
    weights = _masking.from_batch(tf.cast(weights, values.dtype), view, keep_axis=False)
    return values, weights


def kendall_tau(y_true, y_pred, *, mask=None, axis: int = -1,
                negative_labels_are_padding: bool = False, algorithm: str = "auto",
                return_weights: bool = False):
    """Kendall's τ-b of each list, (n_c − n_d) / √((n₀ − n₁)(n₀ − n₂)) (n₁, n₂ the pairs
    tied in y_true, y_pred): `scipy.stats.kendalltau`, 0 with weight 0 where it is NaN.

    Args:
      y_true, y_pred: `[..., n, ...]` tensors of the same shape (or ragged
        `[batch, (n)]`).
      mask: optional boolean of the shape of y_true (or `[n]`), False for padding.
      axis: the list axis.
      negative_labels_are_padding: also treat y_true < 0 as padding (default False).
      algorithm: 'pairwise' (O(n²) per list), 'merge' (O(n log n) per list) or 'auto'.
      return_weights: also return the weights (1 where τ is defined, else 0).

    Returns:
      τ with the shape of the inputs without `axis` (the dtype of y_pred; float32 for
      reduced precision), and the weights with `return_weights=True`.

    Example:
    >>> round(float(kendall_tau([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 4.0])), 4)
    0.6667
    """
    algorithm = _checks.check_choice("algorithm", algorithm, ALGORITHMS)
    return_weights = _checks.check_bool("return_weights", return_weights)
    labels, scores, valid, view, missing = _lists(
        y_true, y_pred, mask, axis, negative_labels_are_padding, exact_scores=True)
    counts = (_counts_pairwise if _is_pairwise(algorithm, view.static_n, PAIRWISE_MAX_N)
              else _counts_merge)
    tau, weights = _tau_b(*counts(labels, scores, valid))
    return _finish(tau, weights, missing, view, return_weights)


def soft_kendall_tau(y_true, y_pred, *, smooth_scale: float = 1.0, mask=None, axis: int = -1,
                     negative_labels_are_padding: bool = False, return_weights: bool = False):
    """Differentiable Kendall's τ: the expected τ-b of y_true and y_pred + ε, ε ~ N(0, σ²
    I), τ̃ = Σ_{i<j} sign(t_j − t_i) · erf((p_j − p_i)/(2σ)) / √((n₀ − n₁) n₀) (exact:
    the perturbed predictions have no ties). O(n²) time and memory per list.

    Args:
      y_true: `[..., n, ...]` targets (or ragged `[batch, (n)]`); not differentiated.
      y_pred: predicted scores of the same shape.
      smooth_scale: σ > 0, in units of the scores (default 1).
      mask, axis, negative_labels_are_padding, return_weights: as in `kendall_tau`;
        padded entries get zero gradient and are not read.

    Returns:
      τ̃ and the weights, as in `kendall_tau`.

    Example:
    >>> tau = soft_kendall_tau([1.0, 2.0, 3.0], [0.0, 10.0, 20.0], smooth_scale=0.1)
    >>> round(float(tau), 6)
    1.0
    """
    smooth_scale = _checks.check_positive("smooth_scale", smooth_scale)
    return_weights = _checks.check_bool("return_weights", return_weights)
    labels, scores, valid, view, missing = _lists(y_true, y_pred, mask, axis,
                                                   negative_labels_are_padding)
    dtype = scores.dtype
    st = tf.cast(_pairs(labels, valid)[1], dtype)
    soft = tf.math.erf((scores[:, None, :] - scores[:, :, None]) / (2.0 * smooth_scale))
    nv = tf.reduce_sum(tf.cast(valid, dtype), axis=1)
    untied_true = tf.reduce_sum(tf.abs(st), axis=[1, 2]) / 2.0  # n₀ − n₁
    all_pairs = nv * (nv - 1.0) / 2.0  # n₀
    tau, weights = _normalised(tf.reduce_sum(st * soft, axis=[1, 2]) / 2.0,
                               untied_true * all_pairs)
    return _finish(tau, weights, missing, view, return_weights)


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


def _xy_rows(x, y):
    """Checked rows x `[..., p, n]` and y `[..., q, n]` (y = x when None), and the output
    dtype."""
    x = _rows(x, "x")
    y = x if y is None else _rows(y, "y")
    if x.shape[-1] is not None and y.shape[-1] is not None and x.shape[-1] != y.shape[-1]:
        raise ValueError(f"`x` and `y` must rank the same n items (last axis), got "
                         f"{x.shape[-1]} and {y.shape[-1]}.")
    return x, y, (x.dtype if x.dtype.is_floating else tf.float32)


def _row_mask(mask, x, name: str):
    if mask is None:
        return tf.ones_like(x, dtype=tf.bool)
    mask = _masking.checked_mask(mask, x, name, "broadcast to the shape of its rows")
    return tf.broadcast_to(mask, tf.shape(x))


def _merge_gram(x, y, xm, ym):
    """`(τ-b, discordances with half ties)` float64 `[..., p, q]` by sorting: every pair
    of rows is a `[n]` problem, O(n log n) time and O(n) memory each."""
    x4, y4 = x[..., :, None, :], y[..., None, :, :]
    shape = tf.broadcast_dynamic_shape(tf.shape(x4), tf.shape(y4))
    static = tf.broadcast_static_shape(x4.shape, y4.shape)
    flat = tf.stack([-1, shape[-1]])

    def paired(t):
        return tf.reshape(tf.broadcast_to(t, shape), flat)

    valid = tf.logical_and(paired(xm[..., :, None, :]), paired(ym[..., None, :, :]))
    xs = tf.where(valid, paired(x4), tf.zeros([], x.dtype))
    ys = tf.where(valid, paired(y4), tf.zeros([], y.dtype))
    n0, n1, n2, n3, nd = _counts_merge(xs, ys, valid)
    tau, _ = _tau_b(n0, n1, n2, n3, nd)
    discord = tf.cast(nd, tf.float64) + 0.5 * tf.cast(n1 + n2 - 2 * n3, tf.float64)
    return tuple(tf.ensure_shape(tf.reshape(t, shape[:-1]), static[:-1]) for t in (tau, discord))


def _pairwise_gram(x, y, xm, ym):
    """As `_merge_gram` by products of the `[rows, n²]` embeddings of the rows."""
    less_x, sign_x, valid_x = (_flat_pairs(t) for t in _pairs(x, xm))
    less_y, sign_y, valid_y = (_flat_pairs(t) for t in _pairs(y, ym))

    def dot(a, b):
        return tf.linalg.matmul(a, b, transpose_b=True)

    untied_x, untied_y = dot(tf.abs(sign_x), valid_y), dot(valid_x, tf.abs(sign_y))
    tau, _ = _normalised(dot(sign_x, sign_y), untied_x * untied_y)
    discord = 0.5 * (dot(less_x, valid_y) + dot(valid_x, less_y)) - dot(less_x, less_y)
    return tau, tf.round(2.0 * discord) / 2.0


def _kernel_stats(x, y, x_mask, y_mask, algorithm):
    """`(τ-b, discordances, output dtype)` float64 `[..., p, q]` of all pairs of rows, NaN
    where a pair of rows has a NaN at an item valid in both."""
    algorithm = _checks.check_choice("algorithm", algorithm, ALGORITHMS)
    y_given = y is not None
    x, y, out_dtype = _xy_rows(x, y)
    dtype = _masking.batch_compute_dtype(x.dtype)
    xm = _row_mask(x_mask, x, "x_mask")
    ym = _row_mask(y_mask, y, "y_mask") if (y_given or y_mask is not None) else xm
    x, y = tf.cast(x, dtype), tf.cast(y, dtype)
    x_nan, y_nan = tf.math.is_nan(x), tf.math.is_nan(y)
    x = tf.where(x_nan, tf.zeros_like(x), x)
    y = tf.where(y_nan, tf.zeros_like(y), y)
    static_n = x.shape[-1] if x.shape[-1] is not None else y.shape[-1]
    gram = (_pairwise_gram if _is_pairwise(algorithm, static_n, GRAM_PAIRWISE_MAX_N)
            else _merge_gram)
    tau, discord = gram(x, y, xm, ym)

    def items(t):
        return tf.cast(t, tf.float64)

    missing = (tf.linalg.matmul(items(tf.logical_and(xm, x_nan)), items(ym), transpose_b=True)
               + tf.linalg.matmul(items(xm), items(tf.logical_and(ym, y_nan)),
                                  transpose_b=True)) > 0
    nan = tf.constant(np.nan, tf.float64)
    return tf.where(missing, nan, tau), tf.where(missing, nan, discord), out_dtype


def kendall_kernel(x, y=None, *, x_mask=None, y_mask=None, algorithm: str = "auto"):
    """Gram matrix of the Kendall kernel: Kendall's τ-b between the rows of x and y
    (Jiao & Vert 2015, Def. 1): positive definite and right-invariant; 0 for a row all
    tied.

    Args:
      x: `[..., p, n]` rows of n scores each (float16/bfloat16 computed in float32).
      y: `[..., q, n]` (leading axes broadcast with those of x), or None for y = x.
      x_mask, y_mask: optional booleans broadcastable to x and y, False for padding:
        τ of a pair of rows is that of the items valid in both.
      algorithm: 'pairwise', 'merge' or 'auto' (see the module docstring).

    Returns:
      `[..., p, q]` in the dtype of x (float32 for integer x); NaN where a pair of rows
      has a NaN at an item valid in both.

    Example:
    >>> k = kendall_kernel([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    >>> k.numpy().tolist()
    [[1.0, -1.0], [-1.0, 1.0]]
    """
    tau, _, out_dtype = _kernel_stats(x, y, x_mask, y_mask, algorithm)
    return tf.cast(tau, out_dtype)


def discordant_pairs(x, y=None, *, x_mask=None, y_mask=None, algorithm: str = "auto"):
    """Matrix of discordant pairs n_d between the rows of x and y, a pair tied in exactly
    one of the two rankings counting 1/2, so that n_d = ½‖Φ(x) − Φ(y)‖² for the hard
    embedding Φ over the ordered pairs.

    Args:
      x, y, x_mask, y_mask, algorithm: as in `kendall_kernel` (`[..., p, n]`,
        `[..., q, n]`).

    Returns:
      `[..., p, q]` counts (halves for pairs tied in one ranking) in the dtype of x
      (float32 for integer x).

    Example:
    >>> discordant_pairs([[1.0, 2.0, 3.0]], [[3.0, 1.0, 2.0], [1.0, 1.0, 2.0]]).numpy()
    array([[2. , 0.5]], dtype=float32)
    """
    _, discord, out_dtype = _kernel_stats(x, y, x_mask, y_mask, algorithm)
    return tf.cast(discord, out_dtype)


def mallows_kernel(x, y=None, lam: float = 1.0, *, x_mask=None, y_mask=None,
                   algorithm: str = "auto"):
    """Gram matrix of the Mallows kernel exp(−λ n_d) between the rows of x and y (Jiao &
    Vert 2015, Def. 2), n_d as in `discordant_pairs`: a Gaussian kernel on the Kendall
    embedding, positive definite for every λ ≥ 0 (ties included), right-invariant.

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
        lam_value = math.nan
    if not math.isfinite(lam_value) or lam_value < 0:
        raise ValueError(f"`lam` must be a finite number >= 0, got {lam!r}.")
    _, discord, out_dtype = _kernel_stats(x, y, x_mask, y_mask, algorithm)
    return tf.cast(tf.exp(-lam_value * discord), out_dtype)


def weighted_kendall_kernel(x, y=None, rank_weights=None, *,
                            combination: str = "multiplicative"):
    """Gram matrix of the weighted Kendall kernel (Jiao & Vert 2018, §3) between the
    rows of x and y:

        K_U(x, y) = Σ_{i ≠ j} U(r_i(x), r_j(x)) U(r_i(y), r_j(y)) 1[x_i < x_j] 1[y_i < y_j],

    r(x) the ranks 1..n of x (ties by position) and U(a, b) = u_a + u_b ('additive') or
    u_a u_b ('multiplicative'); u_r = 1[r > n − k] gives the top-k Kendall kernel.

    Args:
      x, y: as in `kendall_kernel`.
      rank_weights: u, a length-n vector (index r − 1 for rank r).
      combination: 'additive' or 'multiplicative'.

    Returns:
      `[..., p, q]` in the dtype of x (float32 for integer x).

    Example:
    >>> k = weighted_kendall_kernel([[1.0, 2.0, 3.0]], rank_weights=[1.0, 1.0, 1.0])
    >>> float(k[0, 0])
    3.0
    """
    _checks.check_choice("combination", combination, COMBINATIONS)
    if rank_weights is None:
        raise ValueError("`rank_weights` must be a vector of n rank weights, got None.")
    x, y, out_dtype = _xy_rows(x, y)
    dtype = tf.float64 if out_dtype == tf.float64 else tf.float32
    u = tf.cast(tf.convert_to_tensor(rank_weights), dtype)
    if u.shape.rank != 1:
        raise ValueError(f"`rank_weights` must be a vector of n rank weights, got shape "
                         f"{u.shape}.")
    if u.shape[0] is not None and x.shape[-1] is not None and u.shape[0] != x.shape[-1]:
        raise ValueError(f"`rank_weights` must have n = {x.shape[-1]} entries, got "
                         f"{u.shape[0]}.")

    def embed(t):
        t = tf.cast(t, _masking.batch_compute_dtype(t.dtype))
        shape = tf.shape(t)
        order = _argsort(tf.reshape(t, tf.stack([-1, shape[-1]])))
        w = tf.gather(u, tf.reshape(_masking.inverse_permutation(order), shape))  # u at rank − 1
        pair_w = (tf.add if combination == "additive" else tf.multiply)(
            w[..., :, None], w[..., None, :])
        return _flat_pairs(pair_w * tf.cast(t[..., :, None] < t[..., None, :], dtype))

    return tf.cast(tf.linalg.matmul(embed(x), embed(y), transpose_b=True), out_dtype)

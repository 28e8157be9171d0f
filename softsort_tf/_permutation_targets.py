"""Targets of the losses and metrics of relaxed permutation matrices P̂ `[..., (S...,) n,
n]` (rows = sorted positions; sample axes before the last two are averaged over).

`y_true` is a permutation matrix `[..., n, n]` or an ordering `[..., n]` (position i
holds the index of the i-th item). `y_true_format='auto'` reads an integer `y_true` as an
ordering, a floating one as a matrix at the rank of `y_pred` and as an ordering below
it (at rank(y_pred) − 1 ≥ 3 it asks for `y_true_format`). Negative entries
after an ordering's n_valid indices, or a `mask` `[..., n]`, mark padding: the rows of
sorted positions >= n_valid are ignored. Results are per example.
"""
from __future__ import annotations

import tensorflow as tf

from softsort_tf import _checks, _masking

Y_TRUE_FORMATS = ("auto", "indices", "matrix")


def check_format(y_true_format: str) -> str:
    return _checks.check_choice("y_true_format", y_true_format, Y_TRUE_FORMATS)


def read_targets(y_true, y_pred, y_true_format: str, mask=None):
    """Returns `(y_true, y_pred, is_matrix, num_sample_axes, rows_valid)`, with `y_true`
    expanded over the sample axes of `y_pred` (integer indices, padded positions
    replaced by 0, or a float matrix), `y_pred` as a tensor, and `rows_valid` the bool
    `[..., n]` valid sorted positions (None: all valid) expanded the same way."""
    y_true_format = check_format(y_true_format)
    _checks.check_dense("y_true", y_true)
    _checks.check_dense("y_pred", y_pred, mask=None)
    _checks.check_dense("mask", mask, mask=None)
    y_pred = tf.convert_to_tensor(y_pred)
    y_true = tf.convert_to_tensor(y_true)
    rank_p, rank_t = y_pred.shape.rank, y_true.shape.rank
    if rank_p is None or rank_t is None:
        raise ValueError("`y_true` and `y_pred` must have known ranks.")
    if rank_p < 2 or y_pred.shape[-1] != y_pred.shape[-2]:
        raise ValueError(f"`y_pred` must be a relaxed permutation matrix [..., n, n], "
                         f"got shape {y_pred.shape}.")
    if y_true_format == "auto":
        is_matrix = not y_true.dtype.is_integer and rank_t == rank_p
        if not y_true.dtype.is_integer and rank_t == rank_p - 1 and rank_p >= 4:
            raise ValueError(
                f"A floating `y_true` of shape {y_true.shape} against `y_pred` of shape "
                f"{y_pred.shape} may be a permutation matrix per example (y_pred with a "
                f"sample axis) or an ordering per list: pass y_true_format='matrix' or "
                f"'indices'.")
    else:
        is_matrix = y_true_format == "matrix"
    num_sample_axes = rank_p - rank_t - (0 if is_matrix else 1)
    kind = "a permutation matrix [..., n, n]" if is_matrix else "an ordering [..., n]"
    misfit = (f"`y_true` of shape {y_true.shape} read as {kind} does not fit `y_pred` of "
              f"shape {y_pred.shape}; pass `y_true_format`.")
    if num_sample_axes < 0 or rank_t < (2 if is_matrix else 1):
        raise ValueError(misfit)
    n = y_pred.shape[-1]
    if y_true.shape[-1] is not None and n is not None and y_true.shape[-1] != n:
        raise ValueError(f"`y_true` must have last dimension n = {n}, got shape {y_true.shape}.")
    rows_valid = None
    if mask is not None:
        mask = tf.convert_to_tensor(mask)
        if mask.dtype != tf.bool:
            mask = tf.not_equal(mask, tf.zeros([], mask.dtype))
        if mask.shape.rank is None or mask.shape.rank < 1:
            raise ValueError(f"`mask` must have shape [..., n], got {mask.shape}.")
        rows_valid = _sorted_prefix(mask)
    if not is_matrix:
        y_true, filled = _checked_ordering(y_true)
        rows_valid = _masking.combine(rows_valid, filled)
        y_true = tf.where(filled, y_true, tf.zeros_like(y_true))
    for _ in range(num_sample_axes):  # the sample axes, before the list (matrix) axes
        y_true = tf.expand_dims(y_true, -3 if is_matrix else -2)
        rows_valid = None if rows_valid is None else rows_valid[..., None, :]
    try:
        tf.broadcast_static_shape(y_true.shape, y_pred.shape if is_matrix else y_pred.shape[:-1])
    except ValueError:
        raise ValueError(misfit) from None
    return y_true, y_pred, is_matrix, num_sample_axes, rows_valid


def _sorted_prefix(mask):
    """bool `[..., n]`: sorted position i < the number of True entries of `mask` `[..., n]`
    (any rank)."""
    count = tf.reduce_sum(tf.cast(mask, tf.int32), axis=-1, keepdims=True)
    return tf.range(tf.shape(mask)[-1]) < count


def _checked_ordering(y_true):
    """`(order, filled)`: `y_true` as int32 orderings and the bool positions holding an
    index (not padding), checked: distinct indices in [0, n), then padding (< 0) only."""
    size = tf.shape(y_true)[-1]
    if y_true.dtype.is_integer:
        integral = tf.constant(True)
        order = tf.cast(y_true, tf.int32)
    elif y_true.dtype.is_floating:
        integral = tf.reduce_all(tf.equal(tf.round(y_true), y_true))
        bound = tf.cast(size, y_true.dtype)
        order = tf.cast(tf.clip_by_value(tf.round(y_true), -1.0, bound), tf.int32)
    else:
        raise ValueError(f"`y_true` must be integer or floating, got {y_true.dtype.name}.")
    filled = order >= 0
    order = tf.where(filled, order, -tf.ones_like(order))
    padding_last = tf.reduce_all(tf.equal(filled, _sorted_prefix(filled)))
    ascending = tf.sort(order, axis=-1)  # the padding (−1) first, then the indices
    distinct = tf.reduce_all(tf.logical_or(ascending[..., 1:] > ascending[..., :-1],
                                           ascending[..., :-1] < 0))
    in_range = tf.reduce_all(order < size)
    valid = tf.logical_and(tf.logical_and(integral, padding_last),
                           tf.logical_and(distinct, in_range))
    order = check_at_run_time(
        valid, order, "`y_true` read as orderings must hold each index 0..n − 1 exactly "
        "once per row (a permutation), or, for a padded list, distinct indices in [0, n) "
        "followed by negative entries (padding) only; got a row that does not (an index "
        "out of range [0, n), a repeated index, padding before an index or a non-integer "
        "value). Pass y_true_format='matrix' for permutation matrices.")
    return order, filled


def check_at_run_time(valid, tensor, message: str):
    """`tensor`, once the scalar boolean `valid` holds: eagerly a `ValueError(message)`
    otherwise; in a graph an `InvalidArgumentError` with `message` from a
    `tf.debugging.Assert` (compiled out under XLA, where nothing is checked)."""
    if tf.executing_eagerly():
        if not bool(valid):
            raise ValueError(message)
        return tensor
    with tf.control_dependencies([tf.debugging.Assert(valid, [message])]):
        return tf.identity(tensor)


def per_example_mean(row_values, num_sample_axes: int, rows_valid=None):
    """Mean of `[..., S..., n]` per-row values over the (valid) rows and the sample axes;
    0 for a list without valid rows."""
    if rows_valid is None:
        total = tf.reduce_sum(row_values, axis=-1)
        count = tf.cast(tf.shape(row_values)[-1], row_values.dtype)
    else:
        valid = tf.broadcast_to(rows_valid, tf.shape(row_values))
        total = tf.reduce_sum(tf.where(valid, row_values, tf.zeros_like(row_values)), axis=-1)
        count = tf.reduce_sum(tf.cast(valid, row_values.dtype), axis=-1)
    mean = total / tf.maximum(count, 1.0)  # 0, not 0/0, for a list of no rows
    if num_sample_axes:
        mean = tf.reduce_mean(mean, axis=list(range(-num_sample_axes, 0)))
    return mean


@tf.custom_gradient
def _gather_flat(flat, index):
    """`tf.gather(flat, index)` for unique indices, with a `scatter_nd` as gradient
    (several times faster on CPU than the default `UnsortedSegmentSum`)."""

    def grad(upstream):
        shape = tf.shape(flat, out_type=tf.int64)
        return tf.scatter_nd(index[:, None], upstream, shape), None

    return tf.gather(flat, index), grad


def pick(p, index):
    """P̂[..., i, index[..., i]] for P̂ `[..., n, n]` and an integer index broadcastable
    to `[..., n]`: one gather from the flattened matrix (O(n) per matrix)."""
    shape = tf.shape(p, out_type=tf.int64)
    n = shape[-1]
    index = tf.broadcast_to(tf.cast(index, tf.int64), shape[:-1])
    rows = tf.range(tf.reduce_prod(shape[:-1]), dtype=tf.int64)
    flat = _gather_flat(tf.reshape(p, [-1]), rows * n + tf.reshape(index, [-1]))
    return tf.reshape(flat, shape[:-1])


def hard_orders(y_true, y_pred, y_true_format, mask=None):
    """`(correct, rows_valid, num_sample_axes)`: where the row-wise argmax of P̂ is the
    true item (broadcast), and the valid rows (None: all)."""
    y_true, y_pred, is_matrix, num_sample_axes, rows_valid = read_targets(
        y_true, y_pred, y_true_format, mask)
    predicted = tf.argmax(y_pred, axis=-1, output_type=tf.int32)
    true = tf.argmax(y_true, axis=-1, output_type=tf.int32) if is_matrix else y_true
    return tf.equal(predicted, true), rows_valid, num_sample_axes

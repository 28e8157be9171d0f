"""Per-example regression errors, shared by the regression losses and metrics."""

from __future__ import annotations

import tensorflow as tf

from softsort_tf.solvers.cost import pair_cost


def align(y_true, y_pred):
    """Squeezes a trailing axis of size 1 so that `y_true` and `y_pred` have equal rank."""
    rank_t, rank_p = y_true.shape.rank, y_pred.shape.rank
    if rank_t == rank_p + 1 and y_true.shape[-1] == 1:
        y_true = y_true[..., 0]
    elif rank_p == rank_t + 1 and y_pred.shape[-1] == 1:
        y_pred = y_pred[..., 0]
    return y_true, y_pred


def regression_errors(y_true, y_pred, power: float = 1.0):
    """Per-example errors e_i = mean over the non-batch axes of |y_i − ŷ_i|^power.

    Args:
      y_true: `[batch]` or `[batch, ...]` targets (a trailing axis of size 1 on either
        side is squeezed to match the other).
      y_pred: predictions of the same shape.
      power: exponent > 0 (1: absolute errors, 2: squared errors); gradients are
        finite where y = ŷ for any power.

    Returns:
      `[batch]` errors in the dtype of `y_pred` (float).

    Example:
    >>> regression_errors([[1.0, 2.0], [0.0, 0.0]], [[0.0, 0.0], [3.0, 1.0]]).numpy()
    array([1.5, 2. ], dtype=float32)
    """
    y_pred = tf.convert_to_tensor(y_pred)
    if not y_pred.dtype.is_floating:
        y_pred = tf.cast(y_pred, tf.float32)
    y_true = tf.cast(tf.convert_to_tensor(y_true), y_pred.dtype)
    y_true, y_pred = align(y_true, y_pred)
    if y_pred.shape.rank is None or y_pred.shape.rank < 1:
        raise ValueError(f"`y_pred` must have a batch axis, got shape {y_pred.shape}.")
    err = pair_cost(y_true, y_pred, power)
    if err.shape.rank > 1:
        err = tf.reduce_mean(err, axis=list(range(1, err.shape.rank)))
    return err

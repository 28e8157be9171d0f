"""Spearman correlation through soft ranks, and the Spearman loss."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from softsort_tf.losses import ranking
from softsort_tf.losses.base import ItemMaskMixin, _check_bool, _SinkhornLoss, split_item_mask
from softsort_tf.ops import hard_stats
from softsort_tf.ops import sinkhorn as sinkhorn_ops
from softsort_tf.options import SinkhornOptions

_PACKAGE = "softsort_tf"


def check_lists(y_true, y_pred):
    """`y_true` and `y_pred` as tensors, checked to have the same (static) shape."""
    y_pred = tf.convert_to_tensor(y_pred)
    y_true = tf.convert_to_tensor(y_true)
    if not y_true.shape.is_compatible_with(y_pred.shape):
        raise ValueError(f"`y_true` and `y_pred` must have the same shape (one target per "
                         f"prediction), got {y_true.shape} and {y_pred.shape}.")
    return y_true, y_pred


def nan_where_missing(corr, y_true, y_pred, axis: int):
    """`corr` with NaN for every list holding a NaN target or prediction (the rank of
    a NaN is undefined; the other losses propagate NaN the same way)."""
    missing = tf.logical_or(
        tf.reduce_any(tf.math.is_nan(tf.cast(y_pred, corr.dtype)), axis=axis),
        tf.reduce_any(tf.math.is_nan(tf.cast(y_true, corr.dtype)), axis=axis))
    return tf.where(missing, tf.constant(np.nan, corr.dtype), corr)


def is_padded(y_true, y_pred, mask, negative_labels_are_padding) -> bool:
    return (mask is not None or negative_labels_are_padding
            or isinstance(y_true, tf.RaggedTensor) or isinstance(y_pred, tf.RaggedTensor))


def padded_lists_last(y_true, y_pred, mask, axis, negative_labels_are_padding):
    """`ranking.padded_lists` with the list axis moved last (dense inputs only)."""
    if axis != -1 and not isinstance(y_pred, tf.RaggedTensor):
        y_true, y_pred = check_lists(y_true, y_pred)
        y_true, y_pred = (tf.experimental.numpy.moveaxis(t, axis, -1) for t in (y_true, y_pred))
        if mask is not None:
            mask = tf.experimental.numpy.moveaxis(tf.convert_to_tensor(mask), axis, -1)
    return ranking.padded_lists(y_true, y_pred, mask,
                                negative_labels_are_padding=negative_labels_are_padding)


def masked_correlation(u, v, mask):
    """Pearson correlation along the last axis over the entries where `mask` is True.

    Each padded entry is replaced by the mean of the valid entries of its list, which
    adds nothing to the covariance or the variances, and then
    `hard_stats.pearson_correlation` is taken over the whole list.
    """
    w = tf.cast(mask, u.dtype)
    count = tf.maximum(tf.reduce_sum(w, axis=-1, keepdims=True), 1.0)

    def filled(t):
        t = tf.cast(t, u.dtype)
        mean = tf.reduce_sum(tf.where(mask, t, tf.zeros_like(t)), axis=-1, keepdims=True) / count
        return tf.where(mask, t, tf.broadcast_to(mean, tf.shape(t)))

    return hard_stats.pearson_correlation(filled(u), filled(v), axis=-1)


def masked_target_ranks(labels, mask):
    """Hard descending ranks (ties averaged) of the valid labels among themselves (0 at
    padded entries, `hard_stats.rankdata` with the mask)."""
    return hard_stats.rankdata(-labels, axis=-1, mask=mask)


@ranking.per_list_over_groups
def soft_spearman_correlation(y_true, y_pred, axis: int = -1, *, mask=None,
                              negative_labels_are_padding: bool = False,
                              options: SinkhornOptions | dict | None = None,
                              **option_kwargs):
    """Pearson correlation of the Sinkhorn ranks of `y_pred` and the hard ranks of `y_true`.

    Target ranks are `hard_stats.rankdata` (ties averaged, as Spearman's ρ); prediction
    ranks are `sinkhorn_rank` (differentiable). As ε → 0 this is Spearman's ρ of
    predictions and targets (for predictions without ties).

    Padded lists (the convention of `softsort_tf.losses.ranking`): with a `mask`,
    `negative_labels_are_padding=True` or `tf.RaggedTensor` inputs, the correlation is
    that of the valid entries alone (`ranking.soft_ranks` with 'sinkhorn'), padded
    entries get no gradient, and a NaN in a padded entry is ignored.

    Args:
      y_true: `[..., n, ...]` target scores (or ragged `[batch, (n)]`).
      y_pred: predicted scores of the same shape.
      axis: the list axis.
      mask: optional boolean of the shape of y_true, False for padding.
      negative_labels_are_padding: treat entries with y_true < 0 as padding
        (TF-Ranking's convention for relevance labels; default False: targets may be
        negative scores).
      options, **option_kwargs: the `SinkhornOptions`, as in `sinkhorn_rank`.

    Returns:
      Correlations in [−1, 1] with the shape of y_pred without `axis`; NaN for a list
      with a NaN target or prediction.

    Example:
    >>> rho = soft_spearman_correlation([[1.0, 2.0, 3.0, 0.0]], [[0.1, 0.2, 0.3, 5.0]],
    ...                                 mask=[[True, True, True, False]], epsilon=1e-3)
    >>> round(float(rho[0]), 3)
    1.0
    """
    if is_padded(y_true, y_pred, mask, negative_labels_are_padding):
        labels, scores, valid = padded_lists_last(y_true, y_pred, mask, axis,
                                                   negative_labels_are_padding)
        options = SinkhornOptions.resolve(options, **option_kwargs)
        soft = ranking.soft_ranks(scores, valid, "sinkhorn", options=options)
        hard = tf.cast(masked_target_ranks(labels, valid), soft.dtype)
        corr = masked_correlation(soft, hard, valid)
        zero = tf.zeros_like(scores)
        return nan_where_missing(corr, tf.where(valid, labels, zero),
                                 tf.where(valid, scores, zero), -1)
    y_true, y_pred = check_lists(y_true, y_pred)
    soft = sinkhorn_ops.sinkhorn_rank(
        y_pred, axis=axis, options=options, **option_kwargs)
    hard = tf.cast(hard_stats.rankdata(y_true, axis=axis), soft.dtype)
    corr = hard_stats.pearson_correlation(soft, hard, axis=axis)
    return nan_where_missing(corr, y_true, y_pred, axis)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SpearmanLoss(ItemMaskMixin, _SinkhornLoss):
    """1 − soft Spearman correlation along `axis`, for learning to rank.

        loss = 1 − Pearson(R̃(ŷ), rankdata(y))

    with R̃ the Sinkhorn ranks of the predictions (talk, Algorithm 2; paper Def. 2)
    and rankdata the hard ranks of the targets with ties averaged
    (`soft_spearman_correlation`). In [0, 2]; as ε → 0 it is 1 − Spearman's ρ. Only the
    order of the predictions matters (the loss is invariant to increasing affine maps
    of each list). A list whose targets are all equal has no order: its correlation is
    taken as 0 (loss 1, zero gradient). A list with a NaN prediction or target has a
    NaN loss (and NaN gradients for that list only), as the other losses.

    Args:
      axis: the list axis of `y_true`/`y_pred` (default −1: rows are lists).
      negative_labels_are_padding: treat y_true < 0 as padding (TF-Ranking's label
        convention, see `softsort_tf.losses.ranking`); `tf.RaggedTensor` inputs and a
        Keras mask of `y_pred` of its shape (one flag per item, `ItemMaskMixin`) are
        always taken as padding. Default False.
      options: a `SinkhornOptions` (or its config dict): the solver settings.
      **kwargs: fields of `SinkhornOptions` overriding those of `options`, e.g.
        `epsilon` (default 1e-2): each soft rank of a list of n items blurs over
        ≈ n·√(ε/2) neighbours (0.35 for n = 5, 7 for n = 100), which smooths the
        loss without biasing the correlation much.
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch, n]` (any rank; lists along `axis`); `sample_weight` has the
    shape of the input without `axis` (one weight per list). Output: a scalar, or the
    per-list losses for reduction 'none'. n and the batch size may be unknown when the
    model is built (lists of several lengths), also under XLA.

    Example:
    >>> loss = SpearmanLoss(epsilon=1e-3)
    >>> round(float(loss([[1.0, 2.0, 3.0]], [[0.1, 0.2, 0.3]])), 3)
    0.0
    """

    def __init__(self, axis: int = -1, *, negative_labels_are_padding: bool = False,
                 options: SinkhornOptions | dict | None = None,
                 reduction: str | None = "sum_over_batch_size",
                 name: str = "spearman_loss", dtype=None, **kwargs):
        super().__init__(options=options, reduction=reduction, name=name, dtype=dtype,
                         **kwargs)
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise ValueError(f"`axis` must be an integer, got {axis!r}.")
        self.axis = int(axis)
        self.negative_labels_are_padding = _check_bool("negative_labels_are_padding",
                                                       negative_labels_are_padding)

    def call(self, y_true, y_pred):
        y_true, mask = split_item_mask(y_true)
        return 1.0 - soft_spearman_correlation(
            y_true, y_pred, axis=self.axis, mask=mask, options=self.options,
            negative_labels_are_padding=self.negative_labels_are_padding)

    def get_config(self) -> dict:
        return {**super().get_config(), "axis": self.axis,
                "negative_labels_are_padding": self.negative_labels_are_padding}


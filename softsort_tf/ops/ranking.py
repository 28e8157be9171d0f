"""Maths of ranked lists shared by the ranking losses, metrics and layers.

Padding convention of lists of labels and scores (`padded_lists`):

- Lists are the last axis of `y_true` (graded relevance labels, 0, 1, 2, …) and
  `y_pred` (scores, larger = ranked higher), shape `[..., n]`.
- An entry is padding when an optional boolean `mask` `[..., n]` is False there, and,
  where `negative_labels_are_padding` is on, when its label is negative
  (TF-Ranking's convention, e.g. −1). One rule sets its default: losses and metrics
  of relevance labels (NDCG, MRR, the listwise and soft-NDCG losses) read a label < 0
  as padding by default; correlations (Spearman, Kendall's τ; their losses and
  metrics) compare real-valued targets and read no label as padding by default. `tf.RaggedTensor`
  inputs are padded with the rows' ends marked as padding: when `y_true` and `y_pred`
  are both ragged, in groups of lists of similar length (`per_list_over_groups`, as
  the operators do; see softsort_tf._masking), else to the longest row.
- The padding becomes the operators' `mask` (softsort_tf._masking): padded entries
  take no part in the ranks, sorts and losses of the valid entries, whatever their
  scores (NaN included), and get a zero gradient.

The list length n may be unknown when the graph is built, also under XLA for dense
padded lists; `tf.RaggedTensor` inputs cannot be compiled by XLA (pad them with
`to_tensor(default_value=-1)` outside the compiled function).

Also here: the DCG gains and discounts (`gains`, `dcg_discounts`, `ideal_dcg`), the
target matrix of the order by relevance (`relevance_permutation_targets`) and the
rank correlation behind Spearman's ρ and its soft version (`rank_correlation`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from softsort_tf import _masking
from softsort_tf.ops import hard_stats


# ---------------------------------------------------------------------------------
# The padding convention.
# ---------------------------------------------------------------------------------
def _dense(t, default):
    """`(dense tensor, row mask or None)` of a tensor or `tf.RaggedTensor`."""
    if isinstance(t, tf.RaggedTensor):
        present = tf.ones_like(t, dtype=tf.bool).to_tensor(default_value=False)
        return t.to_tensor(default_value=default), present
    return tf.convert_to_tensor(t), None


def padded_lists(y_true, y_pred, mask=None, *, negative_labels_are_padding: bool = True):
    """Applies the padding convention: `(labels, scores, valid)` as dense `[..., n]` tensors.

    Args:
      y_true: labels `[..., n]` (tensor or `tf.RaggedTensor`).
      y_pred: scores of the same shape.
      mask: optional boolean `[..., n]`, False for padding.
      negative_labels_are_padding: whether a label < 0 marks padding (TF-Ranking).

    Returns:
      `labels` (floating, 0 at padded entries), `scores` (the input values, floating)
      and `valid` (bool), all of the shape of `y_pred`.

    Example:
    >>> labels, scores, valid = padded_lists([[2.0, -1.0]], [[0.5, 9.0]])
    >>> valid.numpy()
    array([[ True, False]])
    """
    labels, present_t = _dense(y_true, -1)
    scores, present_p = _dense(y_pred, 0)
    if not scores.dtype.is_floating:
        scores = tf.cast(scores, tf.float32)
    if scores.shape.rank is None or scores.shape.rank < 1:
        raise ValueError(f"`y_pred` must have shape [..., n], got {scores.shape}.")
    labels = tf.cast(labels, scores.dtype)
    if labels.shape.rank is not None and labels.shape.rank != scores.shape.rank:
        raise ValueError(f"`y_true` and `y_pred` must have the same shape [..., n], got "
                         f"{labels.shape} and {scores.shape}.")
    valid = _masking.combine(present_t, present_p,
                             None if mask is None else tf.cast(mask, tf.bool),
                             labels >= 0 if negative_labels_are_padding else None)
    if valid is None:
        valid = tf.ones_like(scores, dtype=tf.bool)
    valid = tf.broadcast_to(valid, tf.shape(scores))
    labels = tf.where(valid, labels, tf.zeros_like(labels))
    return labels, scores, valid


def per_list_over_groups(fn: Callable) -> Callable:
    """Decorates a per-list function `fn(y_true, y_pred, ..., mask=None, ...)` (results
    `[...]` without the list axis): for ragged `y_true` and `y_pred` of the same
    partitions, `fn` runs on groups of lists of similar length, each padded to its own
    longest list (`_masking.map_lists`), labels padded with −1 and the row ends in the
    mask; other inputs go to `fn` unchanged."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        y_true, y_pred = bound.arguments["y_true"], bound.arguments["y_pred"]
        if not (isinstance(y_true, tf.RaggedTensor) and isinstance(y_pred, tf.RaggedTensor)
                and y_true.ragged_rank == y_pred.ragged_rank):
            return fn(*args, **kwargs)

        def run(lists, aligned, group):
            del group
            labels = aligned[0].to_tensor(default_value=-1, shape=tf.shape(lists.dense))
            bound.arguments.update(y_true=labels, y_pred=lists.dense, mask=lists.mask)
            return fn(*bound.args, **bound.kwargs)

        return _masking.map_lists(run, y_pred, bound.arguments.get("mask"),
                                  aligned=(y_true,), name="y_pred")

    return wrapper


# ---------------------------------------------------------------------------------
# DCG.
# ---------------------------------------------------------------------------------
def gains(labels):
    """DCG gains 2^label − 1 (a padded entry has label 0 here, hence gain 0)."""
    return tf.pow(tf.constant(2.0, labels.dtype), labels) - 1.0


def dcg_discounts(positions, k: int | None = None):
    """DCG discounts 1 / log₂(1 + position), 0 past position `k` if it is set.

    `positions` are 1-based, hard (1, 2, …) or soft ranks.
    """
    discounts = np.log(2.0) / tf.math.log1p(positions)
    if k is not None:
        discounts = tf.where(positions <= k, discounts, tf.zeros_like(discounts))
    return discounts


def ideal_dcg(labels, k: int | None = None):
    """DCG@k of the labels `[..., n]` in decreasing order (the ideal ranking): `[...]`."""
    g = tf.sort(gains(labels), axis=-1, direction="DESCENDING")
    positions = tf.cast(tf.range(1, tf.shape(g)[-1] + 1), g.dtype)
    return tf.reduce_sum(g * dcg_discounts(positions, k), axis=-1)


def relevance_permutation_targets(labels, mask):
    """Target matrix Y `[..., n, n]` of the order by decreasing relevance, ties shared.

    Row i (the i-th position) spreads mass 1 uniformly over the valid items whose label
    equals the i-th largest valid label; rows of padded positions (i ≥ n_valid) are 0.

    Args:
      labels: `[..., n]` floating labels.
      mask: boolean `[..., n]`, True = valid item.
    """
    low = tf.constant(-np.inf, labels.dtype)
    sorted_labels = tf.sort(tf.where(mask, labels, low), axis=-1, direction="DESCENDING")
    n_valid = tf.reduce_sum(tf.cast(mask, tf.int32), axis=-1, keepdims=True)
    row_valid = tf.range(tf.shape(labels)[-1]) < n_valid  # [..., n] over positions i
    match = tf.logical_and(tf.equal(sorted_labels[..., :, None], labels[..., None, :]),
                           mask[..., None, :])
    match = tf.cast(tf.logical_and(match, row_valid[..., :, None]), labels.dtype)
    count = tf.reduce_sum(match, axis=-1, keepdims=True)
    return match / tf.maximum(count, 1.0)


# ---------------------------------------------------------------------------------
# Rank correlation (Spearman's ρ and its soft version).
# ---------------------------------------------------------------------------------
def _check_same_shape(y_true, y_pred):
    y_pred = tf.convert_to_tensor(y_pred)
    y_true = tf.convert_to_tensor(y_true)
    if not y_true.shape.is_compatible_with(y_pred.shape):
        raise ValueError(f"`y_true` and `y_pred` must have the same shape (one target per "
                         f"prediction), got {y_true.shape} and {y_pred.shape}.")
    return y_true, y_pred


def _nan_where_missing(corr, y_true, y_pred, axis: int):
    """`corr` with NaN for every list holding a NaN target or prediction."""
    missing = tf.logical_or(
        tf.reduce_any(tf.math.is_nan(tf.cast(y_pred, corr.dtype)), axis=axis),
        tf.reduce_any(tf.math.is_nan(tf.cast(y_true, corr.dtype)), axis=axis))
    return tf.where(missing, tf.constant(np.nan, corr.dtype), corr)


def _masked_correlation(u, v, mask):
    """Pearson correlation along the last axis over the entries where `mask` is True:
    each padded entry is replaced by the mean of the valid entries of its list, which
    adds nothing to the covariance or the variances."""
    w = tf.cast(mask, u.dtype)
    count = tf.maximum(tf.reduce_sum(w, axis=-1, keepdims=True), 1.0)

    def filled(t):
        t = tf.cast(t, u.dtype)
        mean = tf.reduce_sum(tf.where(mask, t, tf.zeros_like(t)), axis=-1, keepdims=True) / count
        return tf.where(mask, t, tf.broadcast_to(mean, tf.shape(t)))

    return hard_stats.pearson_correlation(filled(u), filled(v), axis=-1)


def rank_correlation(y_true, y_pred, rank_fn: Callable, axis: int = -1, *, mask=None,
                     negative_labels_are_padding: bool = False):
    """Pearson correlation of `rank_fn` ranks of `y_pred` and the hard ranks of `y_true`.

    The hard ranks are `hard_stats.rankdata` (ascending, ties averaged). With
    `rank_fn = hard_stats.rankdata` this is Spearman's ρ; with soft ranks, its
    differentiable version. Padded lists (a `mask`, `negative_labels_are_padding=True`
    or `tf.RaggedTensor` inputs; see `padded_lists`) give the correlation of the valid
    entries alone, and a NaN in a padded entry is ignored.

    Args:
      y_true: `[..., n, ...]` targets (or ragged `[batch, (n)]`).
      y_pred: predictions of the same shape.
      rank_fn: `rank_fn(x, axis=..., mask=...)` → ascending ranks of x along `axis`
        among the entries where `mask` (None: all) is True.
      axis: the list axis.
      mask: optional boolean of the shape of y_true, False for padding.
      negative_labels_are_padding: treat y_true < 0 as padding.

    Returns:
      Correlations in [−1, 1] with the shape of y_pred without `axis`; NaN for a list
      with a NaN target or prediction at a valid entry; 0 for a list whose targets or
      predictions are constant.
    """
    padded = (mask is not None or negative_labels_are_padding
              or isinstance(y_true, tf.RaggedTensor) or isinstance(y_pred, tf.RaggedTensor))
    if not padded:
        y_true, y_pred = _check_same_shape(y_true, y_pred)
        predicted = rank_fn(y_pred, axis=axis, mask=None)
        target = tf.cast(hard_stats.rankdata(y_true, axis=axis), predicted.dtype)
        corr = hard_stats.pearson_correlation(predicted, target, axis=axis)
        return _nan_where_missing(corr, y_true, y_pred, axis)
    if axis != -1 and not isinstance(y_pred, tf.RaggedTensor):
        y_true, y_pred = (tf.experimental.numpy.moveaxis(t, axis, -1)
                          for t in _check_same_shape(y_true, y_pred))
        if mask is not None:
            mask = tf.experimental.numpy.moveaxis(tf.convert_to_tensor(mask), axis, -1)
    labels, scores, valid = padded_lists(
        y_true, y_pred, mask, negative_labels_are_padding=negative_labels_are_padding)
    predicted = rank_fn(scores, axis=-1, mask=valid)
    target = tf.cast(hard_stats.rankdata(labels, axis=-1, mask=valid), predicted.dtype)
    corr = _masked_correlation(predicted, target, valid)
    zero = tf.zeros_like(scores)
    return _nan_where_missing(corr, tf.where(valid, labels, zero), tf.where(valid, scores, zero),
                              -1)

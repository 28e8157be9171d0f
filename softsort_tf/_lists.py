"""Ranked lists of labels and scores, shared by the ranking losses, metrics and layers.

The padding of lists (`padded_lists`, docs/api.md "Padding": a mask, Keras-RS's dict
`y_true`, negative labels, ragged rows) and its checks (`check_lists`); the DCG gains
and discounts; the target matrix of the order by relevance; the rank correlation behind
Spearman's ρ and its soft version.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
from collections.abc import Callable, Mapping

import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _masking
from softsort_tf.ops import hard_stats

KERAS_RS_KEYS = ("labels", "mask")


def _dense(t, default):
    """`(dense tensor, row mask or None)` of a tensor or `tf.RaggedTensor`."""
    if isinstance(t, tf.RaggedTensor):
        present = tf.ones_like(t, dtype=tf.bool).to_tensor(default_value=False)
        return t.to_tensor(default_value=default), present
    return tf.convert_to_tensor(t), None


def _tensor(t):
    return t if isinstance(t, tf.RaggedTensor) else tf.convert_to_tensor(t)


def split_labels(y_true, mask=None):
    """`(labels, mask)` of `y_true`, unpacking Keras-RS's `{"labels": ..., "mask": ...}`;
    the mask (bool or None) is the AND of `mask` and the dict's.

    Example:
    >>> labels, mask = split_labels({"labels": [[2.0, 1.0]], "mask": [[True, False]]})
    >>> mask.numpy()
    array([[ True, False]])
    """
    masks = [mask]
    if isinstance(y_true, Mapping):
        keys = sorted(map(str, y_true))
        if "labels" not in y_true or not set(y_true) <= set(KERAS_RS_KEYS):
            raise ValueError(f"`y_true` given as a dict must be Keras-RS's {{'labels': ..., "
                             f"'mask': ...}} ('mask' optional), got the keys {keys}.")
        masks.append(y_true.get("mask"))
        y_true = y_true["labels"]
    return y_true, _masking.combine(*(_masking.as_bool(_tensor(m)) for m in masks
                                      if m is not None))


_SHAPE_RULE = "`y_true` and `y_pred` must have the same shape [..., n] (one label per score)"


def _shape_message(a, b) -> str:
    return f"{_SHAPE_RULE}, got {a} and {b}."


def _same_values(a, b):
    """Scalar bool: the int vectors `a` and `b` are equal (sizes may differ)."""
    size = tf.minimum(tf.size(a), tf.size(b))
    return tf.logical_and(tf.equal(tf.size(a), tf.size(b)),
                          tf.reduce_all(tf.equal(a[:size], tf.cast(b[:size], a.dtype))))


def _check_same_lists(labels, scores):
    """`(labels, scores)`, checked to have the same shape (ragged: row lengths): now
    when it is known, else by an assertion the results depend on."""
    if isinstance(labels, tf.RaggedTensor) and isinstance(scores, tf.RaggedTensor):
        if labels.ragged_rank != scores.ragged_rank:
            raise ValueError(_shape_message(labels.shape, scores.shape))
        pairs = list(zip(labels.nested_row_lengths(), scores.nested_row_lengths(),
                         strict=True))
        shown = pairs[-1]
        what = "row lengths"
    elif isinstance(labels, tf.RaggedTensor) or isinstance(scores, tf.RaggedTensor):
        return labels, scores  # checked once padded (`padded_lists`)
    else:
        if labels.shape.is_fully_defined() and scores.shape.is_fully_defined():
            return labels, scores  # equal: `check_lists` compared the static shapes
        shown = (tf.shape(labels), tf.shape(scores))
        pairs = [shown]
        what = "shapes"
    same = tf.reduce_all(tf.stack([_same_values(a, b) for a, b in pairs]))
    if tf.executing_eagerly():
        if not bool(same):
            raise ValueError(_shape_message(*(f"{what} {t.numpy().tolist()}" for t in shown)))
        return labels, scores
    with tf.control_dependencies([tf.debugging.Assert(
            same, [f"{_SHAPE_RULE}, got {what}", shown[0], "and", shown[1]])]):
        identity = (lambda t: t.with_flat_values(tf.identity(t.flat_values))
                    if isinstance(t, tf.RaggedTensor) else tf.identity(t))
        return identity(labels), identity(scores)


_LISTS_CHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "softsort_tf_lists_checked", default=False)


@contextlib.contextmanager
def lists_checked():
    """Within it `check_lists` only unpacks: for a caller (a loss's `__call__`) that has
    just checked the lists it hands on."""
    token = _LISTS_CHECKED.set(True)
    try:
        yield
    finally:
        _LISTS_CHECKED.reset(token)


def check_lists(y_true, y_pred, mask=None):
    """Checks and unpacks the lists of a ranking loss or metric: `(labels, scores, mask)`.

    `y_true` may be Keras-RS's dict; labels and scores must be real tensors (a
    `ValueError` naming `y_true` or `y_pred`) of the same shape, the mask boolean or
    0/1 (returned as bool or None).

    Example:
    >>> labels, scores, mask = check_lists({"labels": [[1.0, 0.0]], "mask": [[1, 0]]},
    ...                                    [[0.5, 0.2]])
    >>> mask.numpy()
    array([[ True, False]])
    """
    labels, mask = split_labels(y_true, mask)
    labels, scores = _tensor(labels), _tensor(y_pred)
    if _LISTS_CHECKED.get():
        return labels, scores, mask
    _checks.check_real_dtype("y_true", labels.dtype)
    _checks.check_real_dtype("y_pred", scores.dtype)
    if not labels.shape.is_compatible_with(scores.shape):
        raise ValueError(_shape_message(labels.shape, scores.shape))
    labels, scores = _check_same_lists(labels, scores)
    return labels, scores, mask


def padded_lists(y_true, y_pred, mask=None, *, negative_labels_are_padding: bool = True):
    """Applies the padding convention: `(labels, scores, valid)` as dense `[..., n]` tensors.

    Args:
      y_true: labels `[..., n]` (tensor or `tf.RaggedTensor`), or Keras-RS's dict
        `{"labels": ..., "mask": ...}`.
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
    y_true, y_pred, mask = check_lists(y_true, y_pred, mask)
    mixed = isinstance(y_true, tf.RaggedTensor) != isinstance(y_pred, tf.RaggedTensor)
    labels, present_t = _dense(y_true, -1)
    scores, present_p = _dense(y_pred, 0)
    if mixed:  # one ragged, one dense: compare the padded shapes
        if not labels.shape.is_compatible_with(scores.shape):
            raise ValueError(_shape_message(labels.shape, scores.shape))
        labels, scores = _check_same_lists(labels, scores)
    if not scores.dtype.is_floating:
        scores = tf.cast(scores, tf.float32)
    if scores.shape.rank is None or scores.shape.rank < 1:
        raise ValueError(f"`y_pred` must have shape [..., n], got {scores.shape}.")
    labels = tf.cast(labels, scores.dtype)
    if isinstance(mask, tf.RaggedTensor):
        mask = mask.to_tensor(False)
    if mask is not None:
        mask = _masking.checked_mask(mask, scores, "mask",
                                     "have the shape of `y_pred` (or broadcast to it)")
    valid = _masking.combine(present_t, present_p, mask,
                             labels >= 0 if negative_labels_are_padding else None)
    if valid is None:
        valid = tf.ones_like(scores, dtype=tf.bool)
    valid = tf.broadcast_to(valid, tf.shape(scores))
    labels = tf.where(valid, labels, tf.zeros_like(labels))
    return labels, scores, valid


def per_list_over_groups(fn: Callable) -> Callable:
    """Decorates a per-list function `fn(y_true, y_pred, ..., mask=None, ...)`: inputs
    checked (`check_lists`); ragged `y_true` and `y_pred` of the same partitions run in
    groups of similar length (`_masking.map_lists`, labels padded with −1)."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        y_true, y_pred, mask = check_lists(bound.arguments["y_true"],
                                           bound.arguments["y_pred"],
                                           bound.arguments.get("mask"))
        bound.arguments.update(y_true=y_true, y_pred=y_pred, mask=mask)
        if not (isinstance(y_true, tf.RaggedTensor) and isinstance(y_pred, tf.RaggedTensor)
                and y_true.ragged_rank == y_pred.ragged_rank):
            return fn(*bound.args, **bound.kwargs)

        def run(lists, aligned, group):
            del group
            labels = aligned[0].to_tensor(default_value=-1, shape=tf.shape(lists.dense))
            bound.arguments.update(y_true=labels, y_pred=lists.dense, mask=lists.mask)
            return fn(*bound.args, **bound.kwargs)

        return _masking.map_lists(run, y_pred, bound.arguments.get("mask"),
                                  aligned=(y_true,), name="y_pred")

    return wrapper


def gains(labels):
    """DCG gains 2^label − 1 of the lists `[..., n]`, each list's scaled by 2^−m, m =
    max(0, its largest label): at most 1, so no label overflows, and NDCG is unchanged.

    Example:
    >>> gains(tf.constant([[2.0, 0.0, 1.0], [300.0, 299.0, 0.0]])).numpy()
    array([[0.75, 0.  , 0.25],
           [1.  , 0.5 , 0.  ]], dtype=float32)
    """
    two = tf.constant(2.0, labels.dtype)
    top = tf.maximum(tf.reduce_max(labels, axis=-1, keepdims=True), 0.0)
    return tf.pow(two, labels - top) - tf.pow(two, -top)


def dcg_discounts(positions, k: int | None = None):
    """DCG discounts 1 / log₂(1 + position) of 1-based (hard or soft) positions, 0 past
    position `k` if it is set."""
    discounts = np.log(2.0) / tf.math.log1p(positions)
    if k is not None:
        discounts = tf.where(positions <= k, discounts, tf.zeros_like(discounts))
    return discounts


def ideal_dcg(labels, k: int | None = None):
    """DCG@k of the labels `[..., n]` in decreasing order (the ideal ranking): `[...]`,
    in the scaled units of `gains`."""
    g = tf.sort(gains(labels), axis=-1, direction="DESCENDING")
    positions = tf.cast(tf.range(1, tf.shape(g)[-1] + 1), g.dtype)
    return tf.reduce_sum(g * dcg_discounts(positions, k), axis=-1)


def relevance_permutation_targets(labels, mask):
    """Target matrix Y `[..., n, n]` of the order by decreasing relevance of `labels`
    `[..., n]`: row i spreads mass 1 over the valid items (`mask`) whose label is the i-th
    largest valid one; rows i ≥ n_valid are 0."""
    low = tf.constant(-np.inf, labels.dtype)
    sorted_labels = tf.sort(tf.where(mask, labels, low), axis=-1, direction="DESCENDING")
    n_valid = tf.reduce_sum(tf.cast(mask, tf.int32), axis=-1, keepdims=True)
    row_valid = tf.range(tf.shape(labels)[-1]) < n_valid  # [..., n] over positions i
    match = tf.logical_and(tf.equal(sorted_labels[..., :, None], labels[..., None, :]),
                           mask[..., None, :])
    match = tf.cast(tf.logical_and(match, row_valid[..., :, None]), labels.dtype)
    count = tf.reduce_sum(match, axis=-1, keepdims=True)
    return match / tf.maximum(count, 1.0)


def check_same_shape(y_true, y_pred):
    """`(y_true, y_pred)` as tensors, a `ValueError` unless their shapes match."""
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
    """Pearson correlation along the last axis over the entries where `mask` is True
    (padded entries replaced by their list's valid mean, which adds nothing)."""
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

    With `rank_fn = hard_stats.rankdata` (ties averaged) this is Spearman's ρ; with soft
    ranks, its differentiable version. Padded lists (see `padded_lists`) give the
    correlation of the valid entries alone.

    Args:
      y_true: `[..., n, ...]` targets (or ragged `[batch, (n)]`, or Keras-RS's dict
        `{"labels": ..., "mask": ...}`).
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
    y_true, y_pred, mask = check_lists(y_true, y_pred, mask)
    padded = (mask is not None or negative_labels_are_padding
              or isinstance(y_true, tf.RaggedTensor) or isinstance(y_pred, tf.RaggedTensor))
    if not padded:
        y_true, y_pred = check_same_shape(y_true, y_pred)
        predicted = rank_fn(y_pred, axis=axis, mask=None)
        target = tf.cast(hard_stats.rankdata(y_true, axis=axis), predicted.dtype)
        corr = hard_stats.pearson_correlation(predicted, target, axis=axis)
        return _nan_where_missing(corr, y_true, y_pred, axis)
    if axis != -1 and not isinstance(y_pred, tf.RaggedTensor):
        y_true, y_pred = (tf.experimental.numpy.moveaxis(t, axis, -1)
                          for t in check_same_shape(y_true, y_pred))
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

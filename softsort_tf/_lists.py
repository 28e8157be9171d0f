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
- Keras-RS's form `y_true = {"labels": labels, "mask": mask}` (`mask` optional) is
  accepted wherever `y_true` is: its mask marks padding too (`split_labels`).

Inputs are checked before any arithmetic (`check_lists`): labels and scores must be
real tensors (floating point or integer; bool, complex and string raise a `ValueError`
naming `y_true` or `y_pred`), a mask boolean or 0/1, and `y_true` and `y_pred` of the
same shape (ragged: the same row lengths) — a `ValueError` naming both and their shapes
when the shapes are known at trace time, else an `InvalidArgumentError` with the same
message when the graph runs (not checked under XLA, which compiles assertions out).

The list length n may be unknown when the graph is built, also under XLA for dense
padded lists; `tf.RaggedTensor` inputs cannot be compiled by XLA (pad them with
`to_tensor(default_value=-1)` outside the compiled function).

Also here: the DCG gains and discounts (`gains`, `dcg_discounts`, `ideal_dcg`; the
gains of each list are scaled by its largest one, so that labels of any size give
finite NDCGs), the target matrix of the order by relevance (`relevance_permutation_targets`) and the
rank correlation behind Spearman's ρ and its soft version (`rank_correlation`).
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


# ---------------------------------------------------------------------------------
# The padding convention.
# ---------------------------------------------------------------------------------
def _dense(t, default):
    """`(dense tensor, row mask or None)` of a tensor or `tf.RaggedTensor`."""
    if isinstance(t, tf.RaggedTensor):
        present = tf.ones_like(t, dtype=tf.bool).to_tensor(default_value=False)
        return t.to_tensor(default_value=default), present
    return tf.convert_to_tensor(t), None


def _tensor(t):
    return t if isinstance(t, tf.RaggedTensor) else tf.convert_to_tensor(t)


def _bool_mask(mask, name: str = "mask"):
    """A checked mask as bool (ragged stays ragged)."""
    if isinstance(mask, tf.RaggedTensor):
        return mask.with_flat_values(_masking.as_bool(mask.flat_values, name))
    return _masking.as_bool(mask, name)


def _and_masks(a, b):
    """Logical AND of two masks (None, dense or ragged); a ragged and a dense mask give
    a dense one, the ragged one padded with False."""
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, tf.RaggedTensor) != isinstance(b, tf.RaggedTensor):
        a, b = (t.to_tensor(False) if isinstance(t, tf.RaggedTensor) else t for t in (a, b))
    return tf.logical_and(a, b)


def split_labels(y_true, mask=None):
    """`(labels, mask)` of `y_true`, unpacking Keras-RS's `{"labels": ..., "mask": ...}`.

    Args:
      y_true: labels (tensor, array or `tf.RaggedTensor`), or a dict with the key
        'labels' and optionally 'mask' (boolean or 0/1, True = valid entry).
      mask: an optional mask of the labels, combined (logical AND) with the dict's.

    Returns:
      The labels, and the combined mask as bool (None if there is none).

    Example:
    >>> labels, mask = split_labels({"labels": [[2.0, 1.0]], "mask": [[True, False]]})
    >>> mask.numpy()
    array([[ True, False]])
    """
    if isinstance(y_true, Mapping):
        keys = sorted(map(str, y_true))
        if "labels" not in y_true or not set(y_true) <= set(KERAS_RS_KEYS):
            raise ValueError(f"`y_true` given as a dict must be Keras-RS's {{'labels': ..., "
                             f"'mask': ...}} ('mask' optional), got the keys {keys}.")
        dict_mask = y_true.get("mask")
        y_true = y_true["labels"]
        if dict_mask is not None:
            mask = _and_masks(None if mask is None else _bool_mask(_tensor(mask)),
                              _bool_mask(_tensor(dict_mask)))
    if mask is not None:
        mask = _bool_mask(_tensor(mask))
    return y_true, mask


_SHAPE_RULE = "`y_true` and `y_pred` must have the same shape [..., n] (one label per score)"


def _shape_message(a, b) -> str:
    return f"{_SHAPE_RULE}, got {a} and {b}."


def _same_values(a, b):
    """Scalar bool: the int vectors `a` and `b` are equal (sizes may differ)."""
    size = tf.minimum(tf.size(a), tf.size(b))
    return tf.logical_and(tf.equal(tf.size(a), tf.size(b)),
                          tf.reduce_all(tf.equal(a[:size], tf.cast(b[:size], a.dtype))))


def _check_same_lists(labels, scores):
    """`(labels, scores)`, checked to have the same shape (ragged: row lengths): at once
    when it is known (always in eager mode), else by an assertion the results depend on."""
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


# Set while a loss computes on lists it has checked already (`lists_checked`): the
# functional forms it calls then unpack their inputs without checking them again.
_LISTS_CHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "softsort_tf_lists_checked", default=False)


@contextlib.contextmanager
def lists_checked():
    """Within this context `check_lists` unpacks without checking: for a caller (a
    loss's `__call__`) that has just checked the lists it hands on, so that they are
    checked once per call."""
    token = _LISTS_CHECKED.set(True)
    try:
        yield
    finally:
        _LISTS_CHECKED.reset(token)


def check_lists(y_true, y_pred, mask=None):
    """Checks and unpacks the lists of a ranking loss or metric: `(labels, scores, mask)`.

    `y_true` may be Keras-RS's dict (`split_labels`); the labels and scores must be real
    tensors and of the same shape, the mask boolean or 0/1 (the checks of the module
    docstring). Tensors and `tf.RaggedTensor`s are returned as such (arrays and lists
    converted), the mask as bool or None. Inside `lists_checked()` the lists are only
    unpacked (their caller has checked them).

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
    return _checked_lists(labels, scores, mask)


def _checked_lists(labels, scores, mask):
    """The checks of `check_lists` (dtypes, shapes, the same lists)."""
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
    """Decorates a per-list function `fn(y_true, y_pred, ..., mask=None, ...)` (results
    `[...]` without the list axis): the inputs are checked and Keras-RS's dict `y_true`
    unpacked (`check_lists`); for ragged `y_true` and `y_pred` of the same
    partitions, `fn` runs on groups of lists of similar length, each padded to its own
    longest list (`_masking.map_lists`), labels padded with −1 and the row ends in the
    mask; other inputs go to `fn` unchanged."""
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


# ---------------------------------------------------------------------------------
# DCG.
# ---------------------------------------------------------------------------------
def gains(labels):
    """DCG gains 2^label − 1 of the lists `[..., n]`, each list's scaled by 2^−m.

    m = max(0, the list's largest label): the gains are 2^(label − m) − 2^−m, at most 1,
    so that no label overflows (2^128 is beyond float32, 2^1024 beyond float64) and a
    ratio of DCGs of one list (NDCG) is that of the unscaled gains. A padded entry has
    label 0 here, hence gain 0.

    Example:
    >>> gains(tf.constant([[2.0, 0.0, 1.0], [300.0, 299.0, 0.0]])).numpy()
    array([[0.75, 0.  , 0.25],
           [1.  , 0.5 , 0.  ]], dtype=float32)
    """
    two = tf.constant(2.0, labels.dtype)
    top = tf.maximum(tf.reduce_max(labels, axis=-1, keepdims=True), 0.0)
    return tf.pow(two, labels - top) - tf.pow(two, -top)


def dcg_discounts(positions, k: int | None = None):
    """DCG discounts 1 / log₂(1 + position), 0 past position `k` if it is set.

    `positions` are 1-based, hard (1, 2, …) or soft ranks.
    """
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

"""Listwise learning-to-rank losses over padded and ragged lists.

Lists are the last axis of the labels `y_true` `[..., n]` (graded relevance) and the
scores `y_pred`; padding follows `softsort_tf._lists` (label < 0, a mask, a Keras mask
of the scores, ragged rows: no part in the loss, zero gradient; a list without a valid
entry has loss 0), and n may be unknown when the model is built.

- `SoftNDCGLoss` (`soft_ndcg`): 1 − NDCG of the soft ranks of any family.
- `ListwisePermutationLoss` (`listwise_permutation_loss`): the cross-entropy of a
  row-stochastic relaxed permutation against the order by relevance (NeuralSort, PiRank).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _docs, _keras
from softsort_tf._lists import (
    dcg_discounts,
    gains,
    ideal_dcg,
    padded_lists,
    per_list_over_groups,
    relevance_permutation_targets,
)
from softsort_tf.losses.base import ListLoss
from softsort_tf.losses.method import MethodLoss
from softsort_tf.losses.permutation import DEFAULT_PROBABILITY_FLOOR, permutation_cross_entropy
from softsort_tf.ops.family import MATRIX_FAMILIES, get_family
from softsort_tf.ops.soft import permutation_matrix, soft_rank, temperature_kwargs
from softsort_tf.ops.squash import standardize

_PACKAGE = "softsort_tf"
# The row-stochastic relaxations: each row of P̂ is the distribution of the item at that
# position (Grover et al. 2019, §6).
LISTWISE_METHODS = tuple(name for name, op in MATRIX_FAMILIES.items()
                         if not op.doubly_stochastic)
# The gains of a soft NDCG: NDCG's 2^y − 1, or y (each grade step counts alike; the
# scale-free default, measured in docs/RESULTS.md, "A listwise benchmark").
GAINS = ("exponential", "linear")


def resolve_gain(gain: str | None, scale_free: bool) -> str:
    """The gain of a soft NDCG: `gain`, or (None) 'linear' when `scale_free`, else
    'exponential' (a sharp explicit temperature: the NDCG itself as it → 0)."""
    if gain is None:
        return "linear" if scale_free else "exponential"
    if gain not in GAINS:
        raise ValueError(f"`gain` must be one of {GAINS} or None, got {gain!r}.")
    return gain


def _gain_labels(labels, gain: str):
    """Labels whose DCG gains 2^label − 1 are the `gain` of `labels` (linear: log₂(1 + y),
    so that 2^label − 1 = y; padded entries, any value, are left as they are)."""
    if gain == "exponential":
        return labels
    linear = tf.math.log1p(tf.maximum(labels, 0.0)) / tf.constant(np.log(2.0), labels.dtype)
    return tf.where(labels >= 0, linear, labels)


def standardized_scores(scores, mask=None, axis: int = -1):
    """(s − mean) / std of each list along `axis` over its valid entries (`mask`).

    Differentiated through the mean and the standard deviation, computed in float64
    without overflow (`softsort_tf.ops.squash.standardize`). A list of equal scores (or
    one valid entry) gives 0 with the gradient of s − mean, so that tied scores still
    get a direction; padded entries give 0 with zero gradient (NaN and ±inf included).

    Example:
    >>> z = standardized_scores(tf.constant([[1.0, 2.0, 3.0, 7.0]]),
    ...                         tf.constant([[True, True, True, False]]))
    >>> np.round(z.numpy(), 4)
    array([[-1.2247,  0.    ,  1.2247,  0.    ]], dtype=float32)
    """
    scores = tf.convert_to_tensor(scores)
    if mask is None:
        return standardize(scores, axis=axis)
    mask = tf.broadcast_to(tf.cast(mask, tf.bool), tf.shape(scores))
    zeros = tf.zeros_like(scores)
    z = standardize(tf.where(mask, scores, zeros), axis=axis,
                    weights=tf.cast(mask, scores.dtype))
    return tf.where(mask, z, zeros)


def resolve_scale_free(method: str, temperature, scale_free, kwargs: dict,
                       spread: float | None = None):
    """`(temperature, scale_free, kwargs)` of a rank-based loss.

    `scale_free=None` means True when no temperature is given (neither `temperature`, nor
    the family's own temperature keyword in `kwargs`, e.g. `epsilon`, nor Sinkhorn
    `options`). A scale-free loss without a temperature ranks each list's standardised
    scores at `spread` standard deviations (`Family.temperature_for_scale`) or, for
    None, at the family's `scale_free_temperature` with its `scale_free_settings` where
    `kwargs` does not set them.
    """
    family = get_family(method)
    given = any(value is not None for value in (
        temperature, kwargs.get(family.temperature), kwargs.get("options")))
    scale_free = _checks.check_bool("scale_free", not given if scale_free is None
                                    else scale_free)
    if scale_free and not given:
        if spread is not None:
            return family.temperature_for_scale(spread), scale_free, kwargs
        temperature = family.scale_free_temperature
        if temperature is None:
            temperature = family.default_temperature
        kwargs = {**kwargs, **{k: v for k, v in family.scale_free_settings.items()
                               if kwargs.get(k) is None}}
    return temperature, scale_free, kwargs


def _rank_loss_arguments(method, temperature, scale_free, negative_labels_are_padding,
                         kwargs, spread=None):
    """`(padding, temperature, scale_free, kwargs)` of a rank-based `ListLoss`, checked."""
    padding = _checks.check_bool("negative_labels_are_padding", negative_labels_are_padding)
    _keras.check_padding(method, padding, "negative_labels_are_padding=True")
    return (padding, *resolve_scale_free(method, temperature, scale_free, kwargs, spread))


@per_list_over_groups
def soft_ndcg(y_true, y_pred, mask=None, *, method: str = "sinkhorn",
              temperature: float | None = None, negative_labels_are_padding: bool = True,
              scale_free: bool | None = None, gain: str | None = None, **kwargs):
    """NDCG of soft ranks: Σ_j g(y_j) / log₂(1 + r̃_j) / IDCG over the valid entries.

    r̃ are the descending `soft_rank`s of the scores among the valid entries; IDCG is
    the DCG of the label-sorted order. A list without a positive label (IDCG = 0) has
    soft NDCG 1 and no gradient.

    Scale-free (the default, no temperature given): each list's scores are standardised
    (`standardized_scores`) and ranked at the family's `scale_free_temperature` in
    standard deviations, with gains g(y) = y: a smooth surrogate (above 1 − NDCG) that
    does not depend on a list's shift or scale, so inflating the scores cannot lower it
    (docs/RESULTS.md, "The scale-free default"). With a temperature (in the family's
    units, or in standard deviations with `scale_free=True`) and the gains 2^y − 1, it
    tends to the NDCG as the temperature → 0.

    Args:
      y_true: relevance labels `[..., n]` (graded, ≥ 0; < 0 = padding), or ragged.
      y_pred: scores of the same shape, or ragged.
      mask: optional boolean `[..., n]`, False for padding.
      method, temperature, **kwargs: as in `softsort_tf.ops.soft.soft_rank`.
      scale_free: standardise each list's scores first (None: without a temperature).
      gain: 'exponential' (2^y − 1) or 'linear' (y); None: `resolve_gain`.
      negative_labels_are_padding: treat y_true < 0 as padding (default True); False
        for lists without padding with method='permutahedron', which takes none.

    Returns:
      `[...]` soft NDCG values in (0, 1].

    Example:
    >>> v = soft_ndcg([[2.0, 0.0, 1.0, -1.0]], [[3.0, 1.0, 2.0, 9.0]],
    ...               method="neuralsort", temperature=0.01)
    >>> round(float(v[0]), 4)
    1.0
    """
    labels, scores, valid = padded_lists(y_true, y_pred, mask,
                                         negative_labels_are_padding=negative_labels_are_padding)
    padded = mask is not None or negative_labels_are_padding or isinstance(
        y_pred, tf.RaggedTensor) or isinstance(y_true, tf.RaggedTensor)
    temperature, scale_free, kwargs = resolve_scale_free(method, temperature, scale_free,
                                                         kwargs)
    labels = _gain_labels(labels, resolve_gain(gain, scale_free))
    if scale_free:
        scores = standardized_scores(scores, valid)
    ranks = soft_rank(scores, method, "DESCENDING", mask=valid if padded else None,
                      temperature=temperature, **kwargs)
    ranks = tf.where(valid, ranks, tf.ones_like(ranks))
    dcg = tf.reduce_sum(gains(labels) * dcg_discounts(ranks), axis=-1)
    ideal = ideal_dcg(labels)
    positive = ideal > 0
    return tf.where(positive, dcg / tf.where(positive, ideal, tf.ones_like(ideal)),
                    tf.ones_like(ideal))


def soft_ndcg_loss(y_true, y_pred, mask=None, **kwargs):
    """1 − `soft_ndcg(y_true, y_pred, mask, **kwargs)`: `[...]` losses in [0, 1)."""
    return 1.0 - soft_ndcg(y_true, y_pred, mask, **kwargs)


@_docs.fill
@keras.saving.register_keras_serializable(package=_PACKAGE)
class SoftNDCGLoss(ListLoss, MethodLoss):
    """1 − soft NDCG (`soft_ndcg`) of each list: a listwise learning-to-rank loss.

    Args:
      {method}
      temperature: the family's temperature; None (default): the scale-free default of
        `soft_ndcg`; a number: in the family's units (a sharper soft NDCG), or in
        standard deviations with `scale_free=True`.
      scale_free, gain: as in `soft_ndcg` (the config holds the resolved values).
      {method_kwargs}
      negative_labels_are_padding: treat y_true < 0 as padding (default True); False
        for method='permutahedron', which takes no padding.
      {sinkhorn_settings}
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch, n]` labels and scores (or ragged); `sample_weight` `[batch]`.
    Output: a scalar, or `[batch]` for reduction 'none'.

    Example:
    >>> loss = SoftNDCGLoss(method="softsort", temperature=0.01)
    >>> round(float(loss([[2.0, 0.0, 1.0, -1.0]], [[3.0, 1.0, 2.0, 9.0]])), 4)
    0.0
    """

    def __init__(self, method: str = "sinkhorn", temperature: float | None = None, *,
                 method_kwargs: dict | None = None, negative_labels_are_padding: bool = True,
                 reduction: str = "sum_over_batch_size", name: str = "soft_ndcg_loss",
                 dtype=None, scale_free: bool | None = None, gain: str | None = None,
                 **kwargs):
        padding, temperature, scale_free, kwargs = _rank_loss_arguments(
            method, temperature, scale_free, negative_labels_are_padding, kwargs)
        super().__init__(soft_ndcg_loss, dict(negative_labels_are_padding=padding,
                                              scale_free=scale_free,
                                              gain=resolve_gain(gain, scale_free)),
                         method=method, temperature=temperature,
                         method_kwargs=method_kwargs, reduction=reduction, name=name,
                         dtype=dtype, **kwargs)


@per_list_over_groups
def listwise_permutation_loss(y_true, y_pred, mask=None, *, method: str = "neuralsort",
                              temperature: float | None = None,
                              probability_floor: float = DEFAULT_PROBABILITY_FLOOR):
    """NeuralSort/PiRank-style listwise cross-entropy against the order by relevance.

    With P̂ the family's relaxed permutation matrix of the scores (rows = positions in
    decreasing score order; its valid block is the P̂ of the unpadded list) and Y the
    relevance ordering (`relevance_permutation_targets`: tied labels share a row's
    mass), the loss is the mean over the n_v valid positions of
    −Σ_j Y_ij log(δ + (1 − δ) P̂_ij) (`permutation_cross_entropy`; Grover et al. 2019,
    §6). A list whose valid labels are all equal has no order to learn: loss 0, zero
    gradient.

    Args:
      y_true: relevance labels `[..., n]` (< 0 = padding), or ragged.
      y_pred: scores of the same shape, or ragged.
      mask: optional boolean `[..., n]`, False for padding.
      method: 'neuralsort' (default) or 'softsort' (`LISTWISE_METHODS`).
      temperature: τ (None: the family's default).
      probability_floor: δ in (0, 1), as in `permutation_cross_entropy`.

    Returns:
      `[...]` per-list losses ≥ 0.

    Example:
    >>> v = listwise_permutation_loss([[2.0, 0.0, 1.0]], [[3.0, 1.0, 2.0]], temperature=0.01)
    >>> float(v[0]) < 1e-6
    True
    """
    _checks.check_choice("method", method, LISTWISE_METHODS)
    labels, scores, valid = padded_lists(y_true, y_pred, mask)
    perm = permutation_matrix(scores, method, mask=valid,
                              **temperature_kwargs(method, temperature))
    target = relevance_permutation_targets(labels, valid)
    per_row_mean = permutation_cross_entropy(target, perm, probability_floor,
                                             y_true_format="matrix")
    n = tf.cast(tf.shape(scores)[-1], per_row_mean.dtype)
    n_valid = tf.reduce_sum(tf.cast(valid, per_row_mean.dtype), axis=-1)
    infinity = tf.constant(np.inf, labels.dtype)
    ordered = (tf.reduce_max(tf.where(valid, labels, -infinity), axis=-1)
               > tf.reduce_min(tf.where(valid, labels, infinity), axis=-1))
    loss = per_row_mean * n / tf.maximum(n_valid, 1.0)
    return tf.where(ordered, loss, tf.zeros_like(loss))


@keras.saving.register_keras_serializable(package=_PACKAGE)
class ListwisePermutationLoss(ListLoss):
    """`listwise_permutation_loss` as a Keras loss.

    Args:
      method: 'neuralsort' (default) or 'softsort'.
      temperature: τ (None: the family's default).
      probability_floor: δ in (0, 1) (default 1e-7): each row costs at most −log δ.
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch, n]` labels and scores (or ragged); `sample_weight` `[batch]`.

    Example:
    >>> loss = ListwisePermutationLoss(temperature=0.01)
    >>> float(loss([[2.0, 0.0, 1.0, -1.0]], [[3.0, 1.0, 2.0, 0.0]])) < 1e-6
    True
    """

    def __init__(self, method: str = "neuralsort", temperature: float | None = None,
                 probability_floor: float = DEFAULT_PROBABILITY_FLOOR,
                 reduction: str = "sum_over_batch_size",
                 name: str = "listwise_permutation_loss", dtype=None):
        method = _checks.check_choice("method", method, LISTWISE_METHODS)
        temperature = _keras.check_temperature(method, temperature, _keras.compute_dtype(dtype))
        super().__init__(
            listwise_permutation_loss, reduction=reduction, name=name, dtype=dtype,
            method=method, temperature=temperature,
            probability_floor=_checks.check_in_open_interval(
                "probability_floor", probability_floor, 0.0, 1.0))

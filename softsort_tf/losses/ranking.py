"""Listwise learning-to-rank losses over padded and ragged lists.

Lists are the last axis of the labels `y_true` `[..., n]` (graded relevance, < 0 =
padding) and the scores `y_pred`; `tf.RaggedTensor` inputs and a Keras mask of the
scores of their shape (one flag per item) are padding too. The convention is that of
`softsort_tf.ops.ranking` (padded entries take no part, whatever their scores, and get
zero gradient; a list without a valid entry has loss 0), and lists may be of a length
unknown when the model is built.

- `SoftNDCGLoss` (`soft_ndcg`): 1 − NDCG of the soft ranks of any family of
  `softsort_tf.ops.soft.METHODS`.
- `ListwisePermutationLoss` (`listwise_permutation_loss`): the cross-entropy of a
  row-stochastic relaxed permutation ('neuralsort', 'softsort') against the order by
  relevance (NeuralSort / PiRank style).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _keras, _methods
from softsort_tf.losses.base import LossFunctionWrapper
from softsort_tf.losses.method import MethodLoss
from softsort_tf.losses.permutation import DEFAULT_PROBABILITY_FLOOR, permutation_cross_entropy
from softsort_tf.ops.ranking import (
    dcg_discounts,
    gains,
    ideal_dcg,
    padded_lists,
    per_list_over_groups,
    relevance_permutation_targets,
)
from softsort_tf.ops.soft import (
    PERMUTATION_OPERATORS,
    permutation_matrix,
    soft_rank,
    temperature_kwargs,
)
from softsort_tf.options import SinkhornOptions

_PACKAGE = "softsort_tf"
# The listwise cross-entropy reads each row of P̂ as the distribution of the item at
# that position (Grover et al. 2019, §6): the row-stochastic relaxations.
LISTWISE_METHODS = tuple(name for name, op in PERMUTATION_OPERATORS.items()
                         if not op.doubly_stochastic)


def _check_listwise_method(method: str) -> str:
    if method not in LISTWISE_METHODS:
        raise ValueError(f"`method` must be one of {LISTWISE_METHODS}, got {method!r}.")
    return method


# ---------------------------------------------------------------------------------
# Soft NDCG.
# ---------------------------------------------------------------------------------
@per_list_over_groups
def soft_ndcg(y_true, y_pred, mask=None, *, method: str = "sinkhorn",
              temperature: float | None = None, negative_labels_are_padding: bool = True,
              **kwargs):
    """NDCG of soft ranks: Σ_j (2^{y_j} − 1) / log₂(1 + r̃_j) / IDCG over the valid entries.

    r̃ are the descending `soft_rank`s of the scores among the valid entries (rank 1 =
    highest score); IDCG is the DCG of the ideal (label-sorted) order. As the
    temperature → 0 this is the NDCG of the predicted order. A list without a positive
    label (IDCG = 0) has soft NDCG 1 and no gradient (nothing to rank).

    Args:
      y_true: relevance labels `[..., n]` (graded, ≥ 0; < 0 = padding), or ragged.
      y_pred: scores of the same shape, or ragged.
      mask: optional boolean `[..., n]`, False for padding.
      method, temperature, **kwargs: as in `softsort_tf.ops.soft.soft_rank`.
      negative_labels_are_padding: treat y_true < 0 as padding (default True, the
        padding rule of `softsort_tf.ops.ranking`); set False for lists without padding
        with method='permutahedron', which takes no padding.

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


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SoftNDCGLoss(MethodLoss):
    """1 − soft NDCG (`soft_ndcg`) of each list: a listwise learning-to-rank loss.

    Args:
      method: a key of `softsort_tf.ops.soft.METHODS` (default 'sinkhorn').
      temperature: the method's temperature (None: its default; for 'sinkhorn', ε).
      method_kwargs: the family's own arguments, e.g. `{"regularization": "kl"}` for
        'permutahedron' (the rule of `softsort_tf._methods`).
      negative_labels_are_padding: treat y_true < 0 as padding (default True); False
        is needed by method='permutahedron', which takes no padding.
      options, squash, targets, **kwargs: the Sinkhorn settings, as in every Sinkhorn
        loss (`SinkhornLoss`); only with method='sinkhorn'. `temperature` is then ε
        (give one of `temperature` and `epsilon`).
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch, n]` labels and scores (or ragged), padding as in the module
    docstring; `sample_weight` `[batch]`. Output: a scalar, or `[batch]` for reduction
    'none'.

    Example:
    >>> loss = SoftNDCGLoss(method="softsort", temperature=0.01)
    >>> round(float(loss([[2.0, 0.0, 1.0, -1.0]], [[3.0, 1.0, 2.0, 9.0]])), 4)
    0.0
    """

    item_mask = True
    list_labels = True

    def __init__(self, method: str = "sinkhorn", temperature: float | None = None, *,
                 method_kwargs: dict | None = None, negative_labels_are_padding: bool = True,
                 options: SinkhornOptions | dict | None = None, squash="logistic",
                 targets: str = "regular", reduction: str = "sum_over_batch_size",
                 name: str = "soft_ndcg_loss", dtype=None, **kwargs):
        padding = _checks.check_bool("negative_labels_are_padding",
                                     negative_labels_are_padding)
        _methods.check_padding(method, padding, "negative_labels_are_padding=True")
        super().__init__(soft_ndcg_loss, dict(negative_labels_are_padding=padding),
                         method=method, temperature=temperature,
                         method_kwargs=method_kwargs, options=options, squash=squash,
                         targets=targets, reduction=reduction, name=name, dtype=dtype,
                         **kwargs)


# ---------------------------------------------------------------------------------
# Listwise permutation cross-entropy.
# ---------------------------------------------------------------------------------
@per_list_over_groups
def listwise_permutation_loss(y_true, y_pred, mask=None, *, method: str = "neuralsort",
                              temperature: float | None = None,
                              probability_floor: float = DEFAULT_PROBABILITY_FLOOR):
    """NeuralSort/PiRank-style listwise cross-entropy against the order by relevance.

    With P̂ the operator's relaxed permutation matrix of the scores (rows = positions
    in decreasing score order) and Y the relevance ordering
    (`relevance_permutation_targets`, tied labels share a row's mass), the loss is the
    mean over the n_v valid positions of −Σ_j Y_ij log(δ + (1 − δ) P̂_ij)
    (`permutation_cross_entropy`, the objective of the NeuralSort sorting experiments,
    Grover et al. 2019 §6, with the ties of graded labels spread uniformly). P̂ is the
    operator's masked matrix: its valid block is the P̂ of the unpadded list. A list
    whose valid labels are all equal (no relevant item, one item, or all tied) has no
    order to learn: its loss is 0, with zero gradient (Y would be uniform and pull the
    scores together).

    Args:
      y_true: relevance labels `[..., n]` (< 0 = padding), or ragged.
      y_pred: scores of the same shape, or ragged.
      mask: optional boolean `[..., n]`, False for padding.
      method: 'neuralsort' (default) or 'softsort' (`LISTWISE_METHODS`).
      temperature: τ (default that of the operator).
      probability_floor: δ in (0, 1), as in `permutation_cross_entropy`.

    Returns:
      `[...]` per-list losses ≥ 0 (0 for a list without valid entries or without an
      order).

    Example:
    >>> v = listwise_permutation_loss([[2.0, 0.0, 1.0]], [[3.0, 1.0, 2.0]], temperature=0.01)
    >>> float(v[0]) < 1e-6
    True
    """
    _check_listwise_method(method)
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
class ListwisePermutationLoss(LossFunctionWrapper):
    """`listwise_permutation_loss` as a Keras loss (NeuralSort/SoftSort, padded lists).

    Args:
      method: 'neuralsort' (default) or 'softsort'.
      temperature: τ; default that of `PERMUTATION_OPERATORS[method]`.
      probability_floor: δ in (0, 1) (default 1e-7): each row costs at most −log δ.
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch, n]` labels and scores (or ragged), padding as in the module
    docstring; `sample_weight` `[batch]`.

    Example:
    >>> loss = ListwisePermutationLoss(temperature=0.01)
    >>> float(loss([[2.0, 0.0, 1.0, -1.0]], [[3.0, 1.0, 2.0, 0.0]])) < 1e-6
    True
    """

    item_mask = True
    list_labels = True

    def __init__(self, method: str = "neuralsort", temperature: float | None = None,
                 probability_floor: float = DEFAULT_PROBABILITY_FLOOR,
                 reduction: str = "sum_over_batch_size",
                 name: str = "listwise_permutation_loss", dtype=None):
        temperature = _methods.check_temperature(_check_listwise_method(method), temperature,
                                                 _keras.compute_dtype(dtype))
        super().__init__(
            listwise_permutation_loss, reduction=reduction, name=name, dtype=dtype,
            method=method, temperature=temperature,
            probability_floor=_checks.check_in_open_interval(
                "probability_floor", probability_floor, 0.0, 1.0))

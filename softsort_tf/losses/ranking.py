"""Listwise learning-to-rank losses over padded and ragged lists.

Lists are the last axis of the labels `y_true` `[..., n]` (graded relevance, < 0 =
padding) and the scores `y_pred`; `tf.RaggedTensor` inputs and a Keras mask of the
scores of their shape (one flag per item) are padding too. The convention is that of
`softsort_tf._lists` (padded entries take no part, whatever their scores, and get
zero gradient; a list without a valid entry has loss 0), and lists may be of a length
unknown when the model is built.

- `SoftNDCGLoss` (`soft_ndcg`): 1 − NDCG of the soft ranks of any family of
  `softsort_tf.FAMILIES`.
- `ListwisePermutationLoss` (`listwise_permutation_loss`): the cross-entropy of a
  row-stochastic relaxed permutation ('neuralsort', 'softsort') against the order by
  relevance (NeuralSort / PiRank style).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _keras, _methods
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
from softsort_tf.ops.soft import (
    permutation_matrix,
    soft_rank,
    temperature_kwargs,
)
from softsort_tf.ops.squash import standardize
from softsort_tf.options import SinkhornOptions

_PACKAGE = "softsort_tf"
# The listwise cross-entropy reads each row of P̂ as the distribution of the item at
# that position (Grover et al. 2019, §6): the row-stochastic relaxations.
LISTWISE_METHODS = tuple(name for name, op in MATRIX_FAMILIES.items()
                         if not op.doubly_stochastic)


def _check_listwise_method(method: str) -> str:
    if method not in LISTWISE_METHODS:
        raise ValueError(f"`method` must be one of {LISTWISE_METHODS}, got {method!r}.")
    return method


# ---------------------------------------------------------------------------------
# The scale-free default temperature of the rank-based losses.
# ---------------------------------------------------------------------------------
# Scale-free (`scale_free=True`, the default when no temperature is given): the scores
# of each list are standardised over its valid entries, z = (s − mean) / std,
# differentiated through the mean and the standard deviation, and soft-ranked at a
# temperature in units of each list's own score standard deviation. The loss is then
# invariant to any shift and positive scale of a list's scores, and its gradient has no
# component along the scores themselves (the direction that would only inflate or
# shrink them). The relative temperatures, keyed by what a family's temperature is (its
# record's `temperature` name; a family with another name uses its own default,
# read in standard deviations), were measured (docs/RESULTS.md, issue 40): on 2,000
# random standardised lists of 5 with labels 0–4, the value at which the gradient of
# each family's soft NDCG is best aligned with the gains (mean cosine with gain − mean
# gain; LapSum: 0.53, 0.76, 0.86 at 0.1, 1, 30 standard deviations; lists where it
# points against the gains: 3.7 %, 0.8 %, 0 %), and on the pipeline of issue 40 the
# values that learnt. LapSum's α and the permutahedron's strength put the soft ranks
# near their linear regime, where the gradient moves every item by its gain minus the
# list's mean gain. SoftSort's and NeuralSort's row-stochastic ranks turn against the
# gains as they blur (SoftSort: 4 % of lists at τ = 0.1, 17 % at 30), so their τ is
# sharp. A steepness is per standard deviation. Sinkhorn's squash standardises
# already: its ε is in the units of the squashed cost on [0, 1].
SCALE_FREE_TEMPERATURES = {
    "epsilon": 3.0,
    "alpha": 30.0,
    "regularization_strength": 30.0,
    "tau": 0.1,
    "steepness": 1.0,
}
# Settings that go with a relative temperature of the table, unless given: at ε = 3
# Sinkhorn's default stopping threshold (1e-3) stops after one iteration with a
# marginal error of 1.2e-4; 1e-6 takes two.
SCALE_FREE_SETTINGS = {"epsilon": {"threshold": 1e-6}}
# The gains of a soft NDCG: 'exponential' 2^y − 1 (NDCG's own), or 'linear' y (each
# grade step counts alike). The scale-free default takes 'linear' (`resolve_gain`):
# near the linear regime its loss is about −Σ_j gain_j · z_j, and with 2^y − 1 the
# top grade of a list outweighs the others (grades 0–4: gains 0, 1, 3, 7, 15). Measured
# on scripts/bench_ltr.py (docs/RESULTS.md, issue 40; validation NDCG, 8 epochs):
# Keras-RS-style lists of 5, seeds 0–2, Sinkhorn +0.0085, +0.0140, +0.0103, LapSum
# +0.0067, −0.0008, +0.0017; lists of 10–200 with 5 % relevant, LapSum +0.0025 (mean of
# seeds 0–2), SoftSort +0.0030, Sinkhorn +0.0025 (seed 0).
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
    """(s − mean) / std of each list along `axis` over its valid entries.

    Differentiable through the mean and the standard deviation (the result is invariant
    to a shift and a positive scale of each list, so its gradient is orthogonal to
    both). Computed without overflow or underflow (`softsort_tf.ops.squash.standardize`,
    in float64). A list whose valid scores are all equal (or with one valid entry)
    gives 0, with the gradient of s − mean (its spread taken as 1): finite, and not
    zero, so that scores that start tied (e.g. a zero-initialised last layer) still
    get a direction. Padded entries give 0 with zero gradient whatever their value
    (NaN and ±inf included).

    Args:
      scores: `[..., n, ...]` real tensor.
      mask: optional boolean of its shape, False for padding.
      axis: the list axis.

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
                       table: dict = SCALE_FREE_TEMPERATURES,
                       settings: dict = SCALE_FREE_SETTINGS):
    """`(temperature, scale_free, kwargs)` of a rank-based loss.

    `scale_free=None` (the default) means True when no temperature is given: neither
    `temperature`, nor the family's own temperature keyword in `kwargs` (e.g.
    `epsilon`), nor Sinkhorn `options`. A scale-free loss without a temperature gets
    the relative one of `table` for the meaning of the family's temperature (its
    record's `temperature` name), or the family's default, in standard deviations,
    and `kwargs` gets the `settings` that go with it where it does not set them.
    """
    family = get_family(method)
    given = temperature is not None or kwargs.get(family.temperature) is not None
    if scale_free is None:
        scale_free = not given and kwargs.get("options") is None
    scale_free = _checks.check_bool("scale_free", scale_free)
    if scale_free and not given and kwargs.get("options") is None:
        temperature = table.get(family.temperature, family.default_temperature)
        extra = settings.get(family.temperature, {})
        kwargs = {**kwargs, **{k: v for k, v in extra.items() if kwargs.get(k) is None}}
    return temperature, scale_free, kwargs


# ---------------------------------------------------------------------------------
# Soft NDCG.
# ---------------------------------------------------------------------------------
@per_list_over_groups
def soft_ndcg(y_true, y_pred, mask=None, *, method: str = "sinkhorn",
              temperature: float | None = None, negative_labels_are_padding: bool = True,
              scale_free: bool | None = None, gain: str | None = None, **kwargs):
    """NDCG of soft ranks: Σ_j g(y_j) / log₂(1 + r̃_j) / IDCG over the valid entries.

    r̃ are the descending `soft_rank`s of the scores among the valid entries (rank 1 =
    highest score); IDCG is the DCG of the ideal (label-sorted) order; the gain g is
    NDCG's 2^y − 1 with an explicit temperature (then as the temperature → 0 this is
    the NDCG of the predicted order) and the grade y itself for the scale-free default
    (`gain`). A list without a positive label (IDCG = 0) has soft NDCG 1 and no
    gradient (nothing to rank).

    Temperature: by default (`scale_free=None` and no temperature given, neither as
    `temperature`, nor under the family's own name, nor in Sinkhorn `options`) the loss
    is scale-free: the scores of each list are standardised over its valid entries
    (`standardized_scores`, differentiated through the mean and standard deviation) and
    ranked at the relative temperature `SCALE_FREE_TEMPERATURES` gives the family's
    temperature, a temperature in units of each list's own score standard deviation
    (LapSum's α = 30 standard deviations, SoftSort's and NeuralSort's τ = 0.1,
    Sinkhorn's ε = 3). Value and gradient then do not depend on the shift or scale of a
    list's scores: nothing to tune to the model's score scale, and the loss cannot be
    lowered by inflating the scores. This default is a smooth surrogate, not the NDCG
    itself: for LapSum, the permutahedron and Sinkhorn its soft ranks are near their
    linear regime, where the gradient moves each item by its gain minus the list's
    mean gain (all pairs count), and its value stays above 1 − the hard NDCG; its
    gains are linear (g(y) = y, so that each grade step counts alike rather than the
    top grade of a list outweighing the rest; measured in `GAINS`' comment). A
    temperature given without `scale_free=True` is in the family's units (the scores'
    for LapSum, SoftSort, NeuralSort, the permutahedron), as before, and gives the
    sharper soft NDCG, equal to the NDCG as it → 0; with `scale_free=True` it is read
    in standard deviations. Measured in docs/RESULTS.md (issue 40): with a temperature
    in the units of the scores, scores that start much smaller than it were inflated by
    the optimiser until the soft ranks were hard and the gradient vanished, before any
    order was learnt; sharp scale-free temperatures (Sinkhorn's ε = 1e-2) learnt little.

    Args:
      y_true: relevance labels `[..., n]` (graded, ≥ 0; < 0 = padding), or ragged.
      y_pred: scores of the same shape, or ragged.
      mask: optional boolean `[..., n]`, False for padding.
      method, temperature, **kwargs: as in `softsort_tf.ops.soft.soft_rank`; None: the
        scale-free default above.
      scale_free: standardise each list's scores first, the temperature then in
        standard deviations (None: when no temperature is given; see above).
      gain: 'exponential' (2^y − 1) or 'linear' (y); None: 'linear' when scale-free,
        else 'exponential' (`resolve_gain`).
      negative_labels_are_padding: treat y_true < 0 as padding (default True, the
        padding rule of `softsort_tf._lists`); set False for lists without padding
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


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SoftNDCGLoss(ListLoss, MethodLoss):
    """1 − soft NDCG (`soft_ndcg`) of each list: a listwise learning-to-rank loss.

    Args:
      method: a key of `softsort_tf.FAMILIES` (default 'sinkhorn').
      temperature: the method's temperature (for 'sinkhorn', ε). None (default): the
        scale-free temperature of `soft_ndcg` (`SCALE_FREE_TEMPERATURES`: each list's
        scores standardised, LapSum's α = 30 standard deviations, SoftSort's and
        NeuralSort's τ = 0.1, Sinkhorn's ε = 3): nothing to tune to the model's score
        scale; a smooth surrogate of NDCG. A number: in the family's units (the
        scores' for LapSum, SoftSort, NeuralSort), for a sharper soft NDCG (→ the NDCG
        as it → 0), or in standard deviations with `scale_free=True`.
      scale_free: standardise each list's scores before ranking them (None: True when
        no temperature is given; the config holds the resolved value).
      gain: 'exponential' (2^y − 1) or 'linear' (the grade y); None: 'linear' when
        scale-free, else 'exponential' (the config holds the resolved value).
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


    def __init__(self, method: str = "sinkhorn", temperature: float | None = None, *,
                 method_kwargs: dict | None = None, negative_labels_are_padding: bool = True,
                 options: SinkhornOptions | dict | None = None, squash="logistic",
                 targets: str = "regular", reduction: str = "sum_over_batch_size",
                 name: str = "soft_ndcg_loss", dtype=None, scale_free: bool | None = None,
                 gain: str | None = None, **kwargs):
        padding = _checks.check_bool("negative_labels_are_padding",
                                     negative_labels_are_padding)
        _methods.check_padding(method, padding, "negative_labels_are_padding=True")
        temperature, scale_free, kwargs = resolve_scale_free(
            method, temperature, scale_free, {**kwargs, "options": options})
        del kwargs["options"]
        super().__init__(soft_ndcg_loss, dict(negative_labels_are_padding=padding,
                                              scale_free=scale_free,
                                              gain=resolve_gain(gain, scale_free)),
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
class ListwisePermutationLoss(ListLoss):
    """`listwise_permutation_loss` as a Keras loss (NeuralSort/SoftSort, padded lists).

    Args:
      method: 'neuralsort' (default) or 'softsort'.
      temperature: τ; default that of `FAMILIES[method]`.
      probability_floor: δ in (0, 1) (default 1e-7): each row costs at most −log δ.
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch, n]` labels and scores (or ragged), padding as in the module
    docstring; `sample_weight` `[batch]`.

    Example:
    >>> loss = ListwisePermutationLoss(temperature=0.01)
    >>> float(loss([[2.0, 0.0, 1.0, -1.0]], [[3.0, 1.0, 2.0, 0.0]])) < 1e-6
    True
    """


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

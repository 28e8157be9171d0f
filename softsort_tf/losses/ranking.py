"""Listwise learning-to-rank losses over padded and ragged lists.

Padding convention (shared by these losses, `softsort_tf.metrics.ranking` and the
masked Spearman functions):

- Lists are the last axis of `y_true` (graded relevance labels, 0, 1, 2, …) and
  `y_pred` (scores, larger = ranked higher), shape `[..., n]`.
- An entry is padding when its label is negative (TF-Ranking's convention, e.g. −1),
  or when the optional boolean `mask` `[..., n]` is False there (for the Keras losses:
  a Keras mask of `y_pred` of its shape, e.g. from `keras.layers.Masking` on the
  items). `tf.RaggedTensor` inputs are padded with the rows' ends marked as padding:
  when `y_true` and `y_pred` are both ragged, in groups of lists of similar length
  (`per_list_over_groups`, as the operators do; see softsort_tf._masking), else to the
  longest row.
- The padding becomes the operators' `mask` (see softsort_tf._masking, the package's
  one convention): padded entries get no mass, the soft ranks, sorts and losses of
  the valid entries are those of the valid entries alone (exactly for SoftSort and
  NeuralSort, up to the Sinkhorn solver's `threshold`), whatever the padded scores
  (NaN included), and padded scores get a zero gradient. A list with no valid entry
  has loss 0.

Soft ranks come from one of the package's operators, chosen by `method`:
'sinkhorn' (`sinkhorn_rank` with the mask, O(n²) per list) or a relaxed permutation
matrix of `PERMUTATION_OPERATORS` ('softsort', 'neuralsort') with the mask, read out
with `ranks_from_permutation`.

The list length n may be unknown when the graph is built (a Keras model fed lists of
several lengths, `tf.function` with `None` dimensions), also under XLA
(`jit_compile=True`) for dense padded lists; `tf.RaggedTensor` inputs cannot be
compiled by XLA (TensorFlow has no XLA kernel for densifying them): pad them with
`to_tensor(default_value=-1)` outside the compiled function. The former
`list_size` argument (a static length to pad to) is no longer needed: it is still
accepted and validated, so that saved configs load, and has no effect.
"""

from __future__ import annotations

import functools
import inspect

import keras
import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _masking
from softsort_tf.losses.base import ItemMaskMixin, full_precision_dtype, split_item_mask
from softsort_tf.losses.permutation import DEFAULT_PROBABILITY_FLOOR, permutation_cross_entropy
from softsort_tf.ops import sinkhorn as sinkhorn_ops
from softsort_tf.ops.permutation_readout import ranks_from_permutation
from softsort_tf.ops.registry import PERMUTATION_OPERATORS, get_permutation_operator
from softsort_tf.options import SinkhornOptions

_PACKAGE = "softsort_tf"
RANK_METHODS = tuple(PERMUTATION_OPERATORS)  # 'sinkhorn' reads Sinkhorn ranks, not the plan
PERMUTATION_LOSS_METHODS = tuple(m for m in PERMUTATION_OPERATORS if m != "sinkhorn")


# ---------------------------------------------------------------------------------
# The padding convention.
# ---------------------------------------------------------------------------------
def _dense(t, default):
    """`(dense tensor, row mask or None)` of a tensor or `tf.RaggedTensor`."""
    if isinstance(t, tf.RaggedTensor):
        present = tf.ones_like(t, dtype=tf.bool).to_tensor(default_value=False)
        return t.to_tensor(default_value=default), present
    return tf.convert_to_tensor(t), None


def per_list_over_groups(fn):
    """Decorates a per-list function `fn(y_true, y_pred, ..., mask=None, ...)` (results
    `[...]` without the list axis): for ragged `y_true` and `y_pred` of the same
    partitions, `fn` runs on groups of lists of similar length, each padded to its own
    longest list (`_masking.map_lists`), labels padded with −1, and the row ends in the
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
            bound.arguments.update(y_true=aligned[0].to_tensor(default_value=-1),
                                   y_pred=lists.dense, mask=lists.mask)
            return fn(*bound.args, **bound.kwargs)

        return _masking.map_lists(run, y_pred, bound.arguments.get("mask"),
                                  aligned=(y_true,), name="y_pred")

    return wrapper


def check_list_size(list_size) -> int | None:
    """`list_size` as an int ≥ 1, or None."""
    if list_size is None:
        return None
    return _checks.check_positive_int("list_size", list_size)


def padded_lists(y_true, y_pred, mask=None, *, negative_labels_are_padding: bool = True,
                 list_size: int | None = None):
    """Applies the padding convention: `(labels, scores, mask)` as dense `[..., n]` tensors.

    Args:
      y_true: labels `[..., n]` (tensor or `tf.RaggedTensor`).
      y_pred: scores of the same shape.
      mask: optional boolean `[..., n]`, False for padding.
      negative_labels_are_padding: whether a label < 0 marks padding (TF-Ranking).
      list_size: no longer needed (lists of unknown length work as they are); accepted
        for compatibility and ignored.

    Returns:
      `labels` (floating, 0 at padded entries), `scores` (the input values, floating)
      and `mask` (bool), all of the shape of `y_pred`.
    """
    labels, present_t = _dense(y_true, -1)
    scores, present_p = _dense(y_pred, 0)
    if not scores.dtype.is_floating:
        scores = tf.cast(scores, tf.float32)
    labels = tf.cast(labels, scores.dtype)
    if labels.shape.rank is not None and labels.shape.rank != scores.shape.rank:
        raise ValueError(f"`y_true` and `y_pred` must have the same shape [..., n], got "
                         f"{labels.shape} and {scores.shape}.")
    valid = tf.ones_like(scores, dtype=tf.bool)
    for present in (present_t, present_p, mask):
        if present is not None:
            valid = tf.logical_and(valid, tf.cast(present, tf.bool))
    if negative_labels_are_padding:
        valid = tf.logical_and(valid, labels >= 0)
    if scores.shape.rank is None or scores.shape.rank < 1:
        raise ValueError(f"`y_pred` must have shape [..., n], got {scores.shape}.")
    check_list_size(list_size)  # no longer needed (module docstring)
    labels = tf.where(valid, labels, tf.zeros_like(labels))
    return labels, scores, valid


def _operator_kwargs(method: str, temperature: float | None) -> tuple[dict, float]:
    """`({name: temperature} or {} for the default, the temperature's value)`."""
    op = get_permutation_operator(method)
    if temperature is None:
        return {}, op.default_temperature
    return {op.temperature: _checks.check_positive("temperature", temperature)}, temperature


def check_method(method: str, allowed: tuple) -> str:
    if method not in allowed:
        raise ValueError(f"`method` must be one of {allowed}, got {method!r}.")
    return method


def soft_ranks(scores, mask=None, method: str = "sinkhorn", temperature: float | None = None,
               **operator_kwargs):
    """Differentiable 1-based ranks of the valid entries among the valid entries alone.

    Rank 1 goes to the largest score ('DESCENDING', the ranking convention). The mask
    is the operators' own (see softsort_tf._masking):

    - 'sinkhorn': `sinkhorn_rank(scores, direction='DESCENDING', mask=mask)`, the ranks
      of the transport problem of the valid list (its n_valid target bins), equal to
      those of the unpadded list up to the solver's `threshold`.
    - 'softsort', 'neuralsort': `ranks_from_permutation` of the operator's masked P̂,
      whose valid block is the P̂ of the unpadded list (exactly).

    Args:
      scores: `[..., n]` real scores (n may be unknown when the graph is built).
      mask: optional boolean `[..., n]` (default: all valid).
      method: one of `RANK_METHODS` ('softsort', 'neuralsort', 'sinkhorn').
      temperature: the operator's temperature (τ for SoftSort/NeuralSort, ε for
        Sinkhorn); default that of `PERMUTATION_OPERATORS[method]`.
      **operator_kwargs: further arguments of the operator (e.g. `options=` for
        Sinkhorn).

    Returns:
      `[..., n]` ranks in [1, n_valid] at valid entries, 0 at padded entries.

    Example:
    >>> r = soft_ranks([[0.5, 3.0, 1.0, 0.0]], [[True, True, True, False]],
    ...                method="softsort", temperature=0.01)
    >>> np.round(r.numpy()[0], 3)
    array([3., 1., 2., 0.], dtype=float32)
    """
    check_method(method, RANK_METHODS)
    scores = tf.convert_to_tensor(scores)
    if not scores.dtype.is_floating:
        scores = tf.cast(scores, tf.float32)
    kwargs, _ = _operator_kwargs(method, temperature)
    kwargs.update(operator_kwargs)
    if method == "sinkhorn":
        options = SinkhornOptions.resolve(kwargs.pop("options", None), **kwargs)
        return sinkhorn_ops.sinkhorn_rank(scores, direction="DESCENDING", mask=mask,
                                          options=options)
    perm = PERMUTATION_OPERATORS[method].matrix(scores, mask=mask, **kwargs)
    return ranks_from_permutation(perm)


# ---------------------------------------------------------------------------------
# Soft NDCG.
# ---------------------------------------------------------------------------------
def gains(labels):
    """NDCG gains 2^label − 1 (labels of padded entries are 0 here: gain 0)."""
    return tf.pow(tf.constant(2.0, labels.dtype), labels) - 1.0


def ideal_dcg(labels, k=None):
    """DCG of the labels sorted in decreasing order (the ideal ranking), top k if set."""
    g = tf.sort(gains(labels), axis=-1, direction="DESCENDING")
    positions = tf.cast(tf.range(1, tf.shape(g)[-1] + 1), g.dtype)
    discounts = 1.0 / (tf.math.log1p(positions) / np.log(2.0))
    if k is not None:
        discounts = tf.where(positions <= k, discounts, tf.zeros_like(discounts))
    return tf.reduce_sum(g * discounts, axis=-1)


@per_list_over_groups
def soft_ndcg(y_true, y_pred, mask=None, *, method: str = "sinkhorn",
              temperature: float | None = None, list_size: int | None = None,
              **operator_kwargs):
    """NDCG of soft ranks: Σ_j (2^{y_j} − 1) / log₂(1 + r̃_j) / IDCG over the valid entries.

    r̃ are `soft_ranks` of the predictions among the valid entries; IDCG is the DCG of
    the ideal (label-sorted) order. As the temperature → 0 this is the NDCG of the
    predicted order. A list without a positive label (IDCG = 0) has soft NDCG 1 and
    no gradient (nothing to rank).

    Args:
      y_true: relevance labels `[..., n]` (graded, ≥ 0; < 0 = padding), or ragged.
      y_pred: scores of the same shape, or ragged.
      mask: optional boolean `[..., n]`, False for padding.
      method, temperature, **operator_kwargs: see `soft_ranks`.
      list_size: no longer needed, ignored (see `padded_lists`).

    Returns:
      `[...]` soft NDCG values in (0, 1].

    Example:
    >>> v = soft_ndcg([[2.0, 0.0, 1.0, -1.0]], [[3.0, 1.0, 2.0, 9.0]],
    ...               method="neuralsort", temperature=0.01)
    >>> round(float(v[0]), 4)
    1.0
    """
    labels, scores, valid = padded_lists(y_true, y_pred, mask, list_size=list_size)
    ranks = soft_ranks(scores, valid, method, temperature, **operator_kwargs)
    ranks = tf.where(valid, ranks, tf.ones_like(ranks))
    dcg = tf.reduce_sum(gains(labels) / (tf.math.log1p(ranks) / np.log(2.0)), axis=-1)
    ideal = ideal_dcg(labels)
    positive = ideal > 0
    return tf.where(positive, dcg / tf.where(positive, ideal, tf.ones_like(ideal)),
                    tf.ones_like(ideal))


class _ListwiseLoss(ItemMaskMixin, keras.losses.Loss):
    """Shared arguments of the listwise losses: method, temperature, list_size (ignored).

    Padding: labels < 0, the ends of ragged rows, and a Keras mask of `y_pred` of its
    shape `[batch, n]` (one flag per item, see `ItemMaskMixin`); `sample_weight` is one
    weight per list `[batch]`.
    """

    _methods: tuple = RANK_METHODS

    def __init__(self, method, temperature, list_size, reduction, name, dtype):
        super().__init__(name=name, reduction=reduction, dtype=full_precision_dtype(dtype))
        self.method = check_method(method, self._methods)
        _operator_kwargs(method, temperature)  # validates the temperature
        self.temperature = None if temperature is None else float(temperature)
        self.list_size = check_list_size(list_size)

    def get_config(self) -> dict:
        return {**super().get_config(), "method": self.method,
                "temperature": self.temperature, "list_size": self.list_size}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SoftNDCGLoss(_ListwiseLoss):
    """1 − soft NDCG (`soft_ndcg`) of each list: a listwise learning-to-rank loss.

    Padded entries (label < 0, or the ends of `tf.RaggedTensor` rows) take no part;
    see the module docstring for the convention.

    Args:
      method: 'sinkhorn' (default), 'softsort' or 'neuralsort' (`soft_ranks`).
      temperature: the operator's temperature (ε for Sinkhorn, τ otherwise); default
        that of `PERMUTATION_OPERATORS[method]`. For Sinkhorn, each soft rank of a list
        of n items blurs over ≈ n·√(ε/2) neighbours.
      list_size: no longer needed (lists of any length, also unknown when the model is
        built, work as they are); accepted so that saved configs load, and ignored.
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch, n]` labels and scores (or ragged); `sample_weight` `[batch]`.
    Output: a scalar, or `[batch]` for reduction 'none'.

    Example:
    >>> loss = SoftNDCGLoss(method="softsort", temperature=0.01)
    >>> round(float(loss([[2.0, 0.0, 1.0, -1.0]], [[3.0, 1.0, 2.0, 9.0]])), 4)
    0.0
    """

    def __init__(self, method: str = "sinkhorn", temperature: float | None = None,
                 list_size: int | None = None, reduction: str = "sum_over_batch_size",
                 name: str = "soft_ndcg_loss", dtype=None):
        super().__init__(method, temperature, list_size, reduction, name, dtype)

    def call(self, y_true, y_pred):
        y_true, mask = split_item_mask(y_true)
        return 1.0 - soft_ndcg(y_true, y_pred, mask, method=self.method,
                               temperature=self.temperature)


# ---------------------------------------------------------------------------------
# Listwise permutation cross-entropy.
# ---------------------------------------------------------------------------------
def relevance_permutation_targets(labels, mask):
    """Target matrix Y `[..., n, n]` of the ordering by decreasing relevance, ties shared.

    Row i (the i-th position) spreads mass 1 uniformly over the valid items whose
    label equals the i-th largest valid label; rows of padded positions (i > n_v)
    are 0 (they cost nothing in the cross-entropy).
    """
    low = tf.constant(-np.inf, labels.dtype)
    sorted_labels = tf.sort(tf.where(mask, labels, low), axis=-1, direction="DESCENDING")
    n_valid = tf.reduce_sum(tf.cast(mask, tf.int32), axis=-1, keepdims=True)
    positions = tf.range(tf.shape(labels)[-1])
    row_valid = positions < n_valid  # [..., n] over positions i
    match = tf.logical_and(tf.equal(sorted_labels[..., :, None], labels[..., None, :]),
                           mask[..., None, :])
    match = tf.logical_and(match, row_valid[..., :, None])
    match = tf.cast(match, labels.dtype)
    count = tf.reduce_sum(match, axis=-1, keepdims=True)
    return match / tf.maximum(count, 1.0)


@per_list_over_groups
def listwise_permutation_loss(y_true, y_pred, mask=None, *, method: str = "neuralsort",
                              temperature: float | None = None,
                              probability_floor: float = DEFAULT_PROBABILITY_FLOOR,
                              list_size: int | None = None):
    """NeuralSort/PiRank-style listwise cross-entropy against the order by relevance.

    With P̂ the operator's relaxed permutation matrix of the scores (rows = positions
    in decreasing score order) and Y the relevance ordering (`relevance_permutation_
    targets`, tied labels share a row's mass), the loss is the mean over the n_v valid
    positions of −Σ_j Y_ij log(δ + (1 − δ) P̂_ij) (`permutation_cross_entropy`, the
    objective of the NeuralSort sorting experiments, Grover et al. 2019 §6, with the
    ties of graded labels spread uniformly). P̂ is the operator's masked matrix: its
    valid block is the P̂ of the unpadded list, and padded scores take no mass.

    Args:
      y_true: relevance labels `[..., n]` (< 0 = padding), or ragged.
      y_pred: scores of the same shape, or ragged.
      mask: optional boolean `[..., n]`, False for padding.
      method: 'neuralsort' (default) or 'softsort'.
      temperature: τ (default that of the operator).
      probability_floor: δ in (0, 1), as in `permutation_cross_entropy`.
      list_size: no longer needed, ignored (see `padded_lists`).

    Returns:
      `[...]` per-list losses ≥ 0 (0 for a list without valid entries).

    Example:
    >>> v = listwise_permutation_loss([[2.0, 0.0, 1.0]], [[3.0, 1.0, 2.0]], temperature=0.01)
    >>> float(v[0]) < 1e-6
    True
    """
    check_method(method, PERMUTATION_LOSS_METHODS)
    labels, scores, valid = padded_lists(y_true, y_pred, mask, list_size=list_size)
    kwargs, _ = _operator_kwargs(method, temperature)
    perm = PERMUTATION_OPERATORS[method].matrix(scores, mask=valid, **kwargs)
    target = relevance_permutation_targets(labels, valid)
    per_row_mean = permutation_cross_entropy(target, perm, probability_floor,
                                             y_true_format="matrix")
    n = tf.cast(tf.shape(scores)[-1], per_row_mean.dtype)
    n_valid = tf.reduce_sum(tf.cast(valid, per_row_mean.dtype), axis=-1)
    return per_row_mean * n / tf.maximum(n_valid, 1.0)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class ListwisePermutationLoss(_ListwiseLoss):
    """`listwise_permutation_loss` as a Keras loss (NeuralSort/SoftSort, padded lists).

    Args:
      method: 'neuralsort' (default) or 'softsort'.
      temperature: τ; default that of `PERMUTATION_OPERATORS[method]`.
      probability_floor: δ in (0, 1) (default 1e-7): each row costs at most −log δ.
      list_size: no longer needed; accepted so that saved configs load, and ignored.
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch, n]` labels and scores (or ragged); `sample_weight` `[batch]`.

    Example:
    >>> loss = ListwisePermutationLoss(temperature=0.01)
    >>> float(loss([[2.0, 0.0, 1.0, -1.0]], [[3.0, 1.0, 2.0, 0.0]])) < 1e-6
    True
    """

    _methods = PERMUTATION_LOSS_METHODS

    def __init__(self, method: str = "neuralsort", temperature: float | None = None,
                 probability_floor: float = DEFAULT_PROBABILITY_FLOOR,
                 list_size: int | None = None, reduction: str = "sum_over_batch_size",
                 name: str = "listwise_permutation_loss", dtype=None):
        super().__init__(method, temperature, list_size, reduction, name, dtype)
        self.probability_floor = _checks.check_in_open_interval(
            "probability_floor", probability_floor, 0.0, 1.0)

    def call(self, y_true, y_pred):
        y_true, mask = split_item_mask(y_true)
        return listwise_permutation_loss(
            y_true, y_pred, mask, method=self.method, temperature=self.temperature,
            probability_floor=self.probability_floor)

    def get_config(self) -> dict:
        return {**super().get_config(), "probability_floor": self.probability_floor}

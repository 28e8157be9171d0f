"""Hard ranking metrics over padded and ragged lists: NDCG@k and MRR.

Padding as in docs/api.md ("Padding"; Keras-RS's `{"labels": ..., "mask": ...}` too).
Items are ranked by decreasing score, ties in input order. NDCG@k and MRR@k equal
`keras_rs.metrics.NDCG(k)` and `MeanReciprocalRank(k)` except that a list without a
relevant item is left out of the means by default (`lists_without_relevant='skip'`;
'zero' counts it as 0, as Keras-RS) and that Keras-RS orders tied scores at random.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from softsort_tf import _checks
from softsort_tf._keras import get_keras_mask
from softsort_tf._lists import (
    dcg_discounts,
    gains,
    ideal_dcg,
    padded_lists,
    per_list_over_groups,
)

_PACKAGE = "softsort_tf"
LISTS_WITHOUT_RELEVANT = ("skip", "zero")


def _check_k(k) -> int | None:
    return None if k is None else _checks.check_positive_int("k", k)


def check_lists_without_relevant(value) -> str:
    """Validates `lists_without_relevant`: 'skip' (weight 0) or 'zero' (value 0, weight
    1, as Keras-RS)."""
    if value not in LISTS_WITHOUT_RELEVANT:
        raise ValueError(f"`lists_without_relevant` must be 'skip' (leave such lists out) "
                         f"or 'zero' (count them with value 0, as Keras-RS), got {value!r}.")
    return value


def _values_and_weights(values, has_relevant, valid, lists_without_relevant: str):
    """Per list: the value (0 without a relevant item) and the weight: 1 with a relevant
    item; for the others 0 ('skip') or, if they have a valid item, 1 ('zero')."""
    counted = has_relevant
    if check_lists_without_relevant(lists_without_relevant) == "zero":
        counted = tf.reduce_any(valid, axis=-1)
    return (tf.where(has_relevant, values, tf.zeros_like(values)),
            tf.cast(counted, values.dtype))


def _ordered_lists(y_true, y_pred, mask, k):
    """`(k, labels, valid, order, positions)`: the checked cut-off, the padded lists
    (`padded_lists`), the indices of the items in decreasing score order (padded items
    last, stable) and the 1-based positions."""
    k = _check_k(k)
    labels, scores, valid = padded_lists(y_true, y_pred, mask)
    low = tf.constant(-np.inf, scores.dtype)
    keyed = tf.where(valid, tf.where(tf.math.is_nan(scores), low, scores), low)
    order = tf.argsort(keyed, axis=-1, direction="DESCENDING", stable=True)
    positions = tf.cast(tf.range(1, tf.shape(order)[-1] + 1), labels.dtype)
    return k, labels, valid, order, positions


@per_list_over_groups
def ndcg(y_true, y_pred, mask=None, k: int | None = None, *,
         lists_without_relevant: str = "skip"):
    """NDCG@k of each list: DCG@k of the predicted order over the ideal DCG@k.

    DCG@k = Σ_{i ≤ k} (2^{label of the i-th item} − 1) / log₂(1 + i), with the gains
    of each list scaled by its largest (`_lists.gains`: finite for labels of any size).

    Args:
      y_true: relevance labels `[..., n]` (< 0 = padding), or ragged, or Keras-RS's
        `{"labels": ..., "mask": ...}`.
      y_pred: scores of the same shape, or ragged.
      mask: optional boolean `[..., n]`, False for padding.
      k: cut-off (default: the whole list).
      lists_without_relevant: 'skip' (default: weight 0) or 'zero' (weight 1 if the
        list has a valid item, as Keras-RS; see the module docstring).

    Returns:
      `(values, weights)`, both `[...]`: NDCG@k in [0, 1] (0 for a list without a
      relevant item), and the weights (1 for lists with a relevant item, for the others
      as `lists_without_relevant` says).

    Example:
    >>> v, w = ndcg([[0.0, 1.0, 2.0, -1.0]], [[3.0, 2.0, 1.0, 9.0]], k=2)
    >>> round(float(v[0]), 4), float(w[0])
    (0.1738, 1.0)
    """
    k, labels, valid, order, positions = _ordered_lists(y_true, y_pred, mask, k)
    g = tf.gather(gains(labels), order, batch_dims=order.shape.rank - 1)
    dcg = tf.reduce_sum(g * dcg_discounts(positions, k), axis=-1)
    ideal = ideal_dcg(labels, k)
    has_relevant = ideal > 0
    return _values_and_weights(dcg / tf.where(has_relevant, ideal, tf.ones_like(ideal)),
                               has_relevant, valid, lists_without_relevant)


@per_list_over_groups
def reciprocal_rank(y_true, y_pred, mask=None, k: int | None = None, *,
                    lists_without_relevant: str = "skip"):
    """1 / (position of the first relevant item, label > 0; Keras-RS: ≥ 1) in the
    predicted order.

    Args:
      y_true, y_pred, mask: as in `ndcg`.
      k: only the first k positions count (0 if no relevant item is there).
      lists_without_relevant: as in `ndcg`.

    Returns:
      `(values, weights)`, both `[...]`, as in `ndcg`.

    Example:
    >>> v, w = reciprocal_rank([[0.0, 1.0, 0.0]], [[3.0, 2.0, 1.0]])
    >>> float(v[0]), float(w[0])
    (0.5, 1.0)
    """
    k, labels, valid, order, positions = _ordered_lists(y_true, y_pred, mask, k)
    relevant = tf.gather(tf.logical_and(labels > 0, valid), order,
                         batch_dims=order.shape.rank - 1)
    reciprocal = tf.where(relevant, 1.0 / positions, tf.zeros_like(labels))
    if k is not None:
        reciprocal = tf.where(positions <= k, reciprocal, tf.zeros_like(reciprocal))
    best = tf.reduce_max(reciprocal, axis=-1)  # −inf for an empty list
    return _values_and_weights(best, tf.reduce_any(relevant, axis=-1), valid,
                               lists_without_relevant)


class PerListMean(keras.metrics.Mean):
    """A `keras.metrics.Mean` of per-list values over all lists seen (TF-Ranking's
    `_RankingMetric`).

    Subclasses set `_fn(y_true, y_pred, mask=None, **fn_kwargs)` → `(values, weights)`,
    both `[...]` (weight 0 leaves a list out, whatever its value, NaN included);
    `sample_weight` multiplies the weights. A Keras mask of `y_pred` of its own shape is
    the padding of the lists, passed to `_fn` as `mask`. An empty stream gives 0.

    Args:
      name, dtype: as in `keras.metrics.Metric`.
      **fn_kwargs: the (validated) keyword arguments of `_fn`, also attributes; with
        name and dtype, the config.
    """

    _fn = None

    def __init__(self, name: str, dtype, **fn_kwargs):
        super().__init__(name=name, dtype=dtype)
        self.fn_kwargs = fn_kwargs
        self.__dict__.update(fn_kwargs)
        self._direction = "up"

    def update_state(self, y_true, y_pred, sample_weight=None):
        kwargs = dict(self.fn_kwargs)
        mask = get_keras_mask(y_pred)
        if mask is not None and mask.shape.rank == y_pred.shape.rank:
            kwargs["mask"] = tf.cast(mask, tf.bool)
        values, weights = type(self)._fn(y_true, y_pred, **kwargs)
        values = tf.cast(values, self.dtype)
        weights = tf.cast(weights, self.dtype)
        if sample_weight is not None:
            weights = weights * tf.broadcast_to(tf.cast(sample_weight, self.dtype),
                                                tf.shape(weights))
        values = tf.where(weights > 0, values, tf.zeros_like(values))
        return super().update_state(values, sample_weight=weights)

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, **self.fn_kwargs}


class _RelevanceMetric(PerListMean):
    """A `PerListMean` of relevance labels, at a cut-off k, named `<prefix>[_at_<k>]`."""

    _prefix = None

    def __init__(self, k: int | None = None, name: str | None = None, dtype=None, *,
                 lists_without_relevant: str = "skip"):
        k = _check_k(k)
        default = self._prefix if k is None else f"{self._prefix}_at_{k}"
        super().__init__(name or default, dtype, k=k,
                         lists_without_relevant=check_lists_without_relevant(
                             lists_without_relevant))


@keras.saving.register_keras_serializable(package=_PACKAGE)
class NDCGMetric(_RelevanceMetric):
    """Mean NDCG@k (`ndcg`) over the lists that have a relevant item.

    Args:
      k: cut-off (default None: the whole list).
      name, dtype: as in `keras.metrics.Metric`.
      lists_without_relevant: 'skip' (default: lists without a relevant item are left
        out) or 'zero' (they count with NDCG 0, as `keras_rs.metrics.NDCG`).

    `update_state(y_true, y_pred, sample_weight=None)`: labels and scores `[batch, n]`
    (padded as in the module docstring), `sample_weight` `[batch]`.

    Example:
    >>> m = NDCGMetric(k=2)
    >>> m.update_state([[0.0, 1.0, 2.0, -1.0]], [[3.0, 2.0, 1.0, 9.0]])
    >>> round(float(m.result()), 4)
    0.1738
    """

    _fn = staticmethod(ndcg)
    _prefix = "ndcg"


@keras.saving.register_keras_serializable(package=_PACKAGE)
class MRRMetric(_RelevanceMetric):
    """Mean reciprocal rank of the first relevant item (`reciprocal_rank`) over the
    lists that have one.

    Args:
      k: only the first k positions count (default None: the whole list).
      name, dtype: as in `keras.metrics.Metric`.
      lists_without_relevant: 'skip' (default) or 'zero', as in `NDCGMetric`.

    Example:
    >>> m = MRRMetric()
    >>> m.update_state([[0.0, 1.0, 0.0], [1.0, 0.0, -1.0]], [[3.0, 2.0, 1.0], [5.0, 1.0, 9.0]])
    >>> float(m.result())
    0.75
    """

    _fn = staticmethod(reciprocal_rank)
    _prefix = "mrr"

"""Spearman correlation through soft ranks, and the Spearman loss."""

from __future__ import annotations

import keras

from softsort_tf import _checks, _docs
from softsort_tf._lists import per_list_over_groups, rank_correlation
from softsort_tf.losses.base import ListLoss
from softsort_tf.losses.method import MethodLoss
from softsort_tf.losses.ranking import (
    _rank_loss_arguments,
    resolve_scale_free,
    standardized_scores,
)
from softsort_tf.ops.soft import soft_rank

_PACKAGE = "softsort_tf"
# The scale-free default of the Spearman loss: each list's standardised predictions
# ranked at one standard deviation (Sinkhorn at its default ε), so that the loss stays
# near 1 − ρ (docs/RESULTS.md, "The scale-free default").
SPREAD = 1.0


@per_list_over_groups
def soft_spearman_correlation(y_true, y_pred, axis: int = -1, *, mask=None,
                              negative_labels_are_padding: bool = False,
                              method: str = "sinkhorn", temperature: float | None = None,
                              scale_free: bool | None = None, **kwargs):
    """Pearson correlation of the soft ranks of `y_pred` and the hard ranks of `y_true`.

    Target ranks are `hard_stats.rankdata` (ties averaged), prediction ranks the
    ascending `soft_rank(y_pred, method)`: Spearman's ρ as the temperature → 0. Padded
    lists give the correlation of the valid entries alone.

    Args:
      y_true: `[..., n, ...]` target scores (or ragged `[batch, (n)]`).
      y_pred: predicted scores of the same shape.
      axis: the list axis.
      mask: optional boolean of the shape of y_true, False for padding.
      negative_labels_are_padding: treat entries with y_true < 0 as padding (default
        False: targets are real values).
      method, temperature, **kwargs: as in `softsort_tf.ops.soft.soft_rank`; no
        temperature: the scale-free default (each list's predictions standardised and
        ranked at one standard deviation; Sinkhorn at ε = 1e-2).
      scale_free: standardise each list's predictions first, the temperature then in
        standard deviations (None: when no temperature is given; `resolve_scale_free`).

    Returns:
      Correlations in [−1, 1] with the shape of y_pred without `axis`; NaN for a list
      with a NaN target or prediction.

    Example:
    >>> rho = soft_spearman_correlation([[1.0, 2.0, 3.0, 0.0]], [[0.1, 0.2, 0.3, 5.0]],
    ...                                 mask=[[True, True, True, False]], epsilon=1e-3)
    >>> round(float(rho[0]), 3)
    1.0
    """
    temperature, scale_free, kwargs = resolve_scale_free(method, temperature, scale_free,
                                                         kwargs, SPREAD)

    def soft_ranks(x, axis, mask):
        if scale_free:
            x = standardized_scores(x, mask, axis)
        return soft_rank(x, method, "ASCENDING", axis=axis, mask=mask,
                         temperature=temperature, **kwargs)

    return rank_correlation(y_true, y_pred, soft_ranks, axis, mask=mask,
                            negative_labels_are_padding=negative_labels_are_padding)


def spearman_loss(y_true, y_pred, axis: int = -1, **kwargs):
    """1 − `soft_spearman_correlation(y_true, y_pred, axis, **kwargs)`, in [0, 2]."""
    return 1.0 - soft_spearman_correlation(y_true, y_pred, axis, **kwargs)


@_docs.fill
@keras.saving.register_keras_serializable(package=_PACKAGE)
class SpearmanLoss(ListLoss, MethodLoss):
    """1 − Pearson(R̃(ŷ), rankdata(y)) along `axis` (`soft_spearman_correlation`), for
    learning to rank: in [0, 2], 1 − Spearman's ρ as the temperature → 0. A list whose
    targets are all equal has loss 1 and zero gradient; a list with a NaN has a NaN
    loss (and NaN gradients for that list only).

    Args:
      axis: the list axis of `y_true`/`y_pred` (default −1: rows are lists).
      {method}
      temperature: the family's temperature; None: the scale-free default (each list's
        predictions standardised and ranked at one standard deviation).
      {method_kwargs}
      scale_free: as in `soft_spearman_correlation` (the config holds the resolved value).
      negative_labels_are_padding: treat y_true < 0 as padding (default False: the
        targets of a correlation are real values). Ragged inputs and a Keras mask of
        `y_pred` of its shape are always padding ('permutahedron' takes none).
      {sinkhorn_settings}
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch, n]` (lists along `axis`; n and the batch size may be unknown
    when the model is built, also under XLA); `sample_weight` one weight per list.
    Output: a scalar, or the per-list losses for reduction 'none'.

    Example:
    >>> loss = SpearmanLoss(epsilon=1e-3)
    >>> round(float(loss([[1.0, 2.0, 3.0]], [[0.1, 0.2, 0.3]])), 3)
    0.0
    >>> loss = SpearmanLoss(method="lapsum", temperature=0.01)
    >>> round(float(loss([[1.0, 2.0, 3.0]], [[0.1, 0.2, 0.3]])), 3)
    0.0
    """

    def __init__(self, axis: int = -1, *, method: str = "sinkhorn",
                 temperature: float | None = None, method_kwargs: dict | None = None,
                 negative_labels_are_padding: bool = False,
                 reduction: str | None = "sum_over_batch_size", name: str = "spearman_loss",
                 dtype=None, scale_free: bool | None = None, **kwargs):
        padding, temperature, scale_free, kwargs = _rank_loss_arguments(
            method, temperature, scale_free, negative_labels_are_padding, kwargs, SPREAD)
        super().__init__(
            spearman_loss,
            dict(axis=_checks.check_int("axis", axis), negative_labels_are_padding=padding,
                 scale_free=scale_free),
            method=method, temperature=temperature, method_kwargs=method_kwargs,
            reduction=reduction, name=name, dtype=dtype, **kwargs)

"""Spearman correlation through soft ranks, and the Spearman loss."""

from __future__ import annotations

import keras

from softsort_tf import _checks
from softsort_tf.losses.base import SinkhornLoss
from softsort_tf.ops.ranking import per_list_over_groups, rank_correlation
from softsort_tf.ops.sinkhorn import sinkhorn_rank
from softsort_tf.options import SinkhornOptions

_PACKAGE = "softsort_tf"


@per_list_over_groups
def soft_spearman_correlation(y_true, y_pred, axis: int = -1, *, mask=None,
                              negative_labels_are_padding: bool = False,
                              squash="logistic", targets: str = "regular",
                              options: SinkhornOptions | dict | None = None,
                              **option_kwargs):
    """Pearson correlation of the Sinkhorn ranks of `y_pred` and the hard ranks of `y_true`.

    Target ranks are `hard_stats.rankdata` (ties averaged, as Spearman's ρ); prediction
    ranks are `sinkhorn_rank` (differentiable; talk, Algorithm 2). As ε → 0 this is
    Spearman's ρ of predictions and targets (for predictions without ties). Padded
    lists (a `mask`, `negative_labels_are_padding=True` or `tf.RaggedTensor` inputs; the
    convention of `softsort_tf.ops.ranking`) give the correlation of the valid entries
    alone, and padded entries get no gradient (`rank_correlation`).

    Args:
      y_true: `[..., n, ...]` target scores (or ragged `[batch, (n)]`).
      y_pred: predicted scores of the same shape.
      axis: the list axis.
      mask: optional boolean of the shape of y_true, False for padding.
      negative_labels_are_padding: treat entries with y_true < 0 as padding
        (TF-Ranking's convention for relevance labels; default False: targets may be
        negative scores).
      squash, targets, options, **option_kwargs: the Sinkhorn settings, as in
        `sinkhorn_rank`.

    Returns:
      Correlations in [−1, 1] with the shape of y_pred without `axis`; NaN for a list
      with a NaN target or prediction.

    Example:
    >>> rho = soft_spearman_correlation([[1.0, 2.0, 3.0, 0.0]], [[0.1, 0.2, 0.3, 5.0]],
    ...                                 mask=[[True, True, True, False]], epsilon=1e-3)
    >>> round(float(rho[0]), 3)
    1.0
    """
    options = SinkhornOptions.resolve(options, **option_kwargs)

    def soft_ranks(x, axis, mask):
        return sinkhorn_rank(x, axis=axis, mask=mask, squash=squash, targets=targets,
                             options=options)

    return rank_correlation(y_true, y_pred, soft_ranks, axis, mask=mask,
                            negative_labels_are_padding=negative_labels_are_padding)


def spearman_loss(y_true, y_pred, axis: int = -1, **kwargs):
    """1 − `soft_spearman_correlation(y_true, y_pred, axis, **kwargs)`, in [0, 2]."""
    return 1.0 - soft_spearman_correlation(y_true, y_pred, axis, **kwargs)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SpearmanLoss(SinkhornLoss):
    """1 − soft Spearman correlation along `axis`, for learning to rank.

        loss = 1 − Pearson(R̃(ŷ), rankdata(y))

    with R̃ the Sinkhorn ranks of the predictions (talk, Algorithm 2; paper Def. 2)
    and rankdata the hard ranks of the targets with ties averaged
    (`soft_spearman_correlation`). In [0, 2]; as ε → 0 it is 1 − Spearman's ρ. Only the
    order of the predictions matters (the loss is invariant to increasing affine maps
    of each list). A list whose targets are all equal has no order: its correlation is
    taken as 0 (loss 1, zero gradient). A list with a NaN prediction or target has a
    NaN loss (and NaN gradients for that list only).

    Args:
      axis: the list axis of `y_true`/`y_pred` (default −1: rows are lists).
      negative_labels_are_padding: treat y_true < 0 as padding (TF-Ranking's label
        convention); `tf.RaggedTensor` inputs and a Keras mask of `y_pred` of its shape
        (one flag per item) are always padding. Default False.
      options, squash, targets, **kwargs: the Sinkhorn settings (`SinkhornLoss`), e.g.
        `epsilon` (default 1e-2).
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch, n]` (any rank; lists along `axis`); `sample_weight` has the
    shape of the input without `axis` (one weight per list). Output: a scalar, or the
    per-list losses for reduction 'none'. n and the batch size may be unknown when the
    model is built, also under XLA.

    Example:
    >>> loss = SpearmanLoss(epsilon=1e-3)
    >>> round(float(loss([[1.0, 2.0, 3.0]], [[0.1, 0.2, 0.3]])), 3)
    0.0
    """

    item_mask = True

    def __init__(self, axis: int = -1, *, negative_labels_are_padding: bool = False,
                 options: SinkhornOptions | dict | None = None, squash="logistic",
                 targets: str = "regular", reduction: str | None = "sum_over_batch_size",
                 name: str = "spearman_loss", dtype=None, **kwargs):
        super().__init__(
            spearman_loss,
            dict(axis=_checks.check_int("axis", axis),
                 negative_labels_are_padding=_checks.check_bool(
                     "negative_labels_are_padding", negative_labels_are_padding)),
            options=options, squash=squash, targets=targets, reduction=reduction,
            name=name, dtype=dtype, **kwargs)

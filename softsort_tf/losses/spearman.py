"""Spearman correlation through soft ranks, and the Spearman loss."""

from __future__ import annotations

import keras

from softsort_tf import _checks, _docs, _methods
from softsort_tf._lists import per_list_over_groups, rank_correlation
from softsort_tf.losses.base import ListLoss
from softsort_tf.losses.method import MethodLoss
from softsort_tf.losses.ranking import resolve_scale_free, standardized_scores
from softsort_tf.ops.soft import soft_rank
from softsort_tf.options import DEFAULT_EPSILON, SinkhornOptions

_PACKAGE = "softsort_tf"
# The scale-free default of the Spearman loss (`softsort_tf.losses.ranking`): each
# list's standardised scores ranked at one standard deviation (a steepness of one per
# standard deviation), Sinkhorn at its ε of 1e-2 (its squash standardises already), so
# that the loss stays near 1 − ρ. Measured on the pipeline of issue 40
# (docs/RESULTS.md): LapSum at α = 1 in the units of the scores let the optimiser
# inflate the scores (list std 0.007 -> 399) until its gradient vanished (test NDCG@5
# 0.709 -> 0.714); at 1 and 30 standard deviations it learnt alike (+0.061/+0.054 and
# +0.077/+0.052 test NDCG@5 on two seeds of the small pipeline of
# tests/losses/test_ranking_scale_free.py).
SPEARMAN_SCALE_FREE_TEMPERATURES = {"epsilon": DEFAULT_EPSILON, "alpha": 1.0,
                                    "regularization_strength": 1.0, "tau": 1.0,
                                    "steepness": 1.0}


@per_list_over_groups
def soft_spearman_correlation(y_true, y_pred, axis: int = -1, *, mask=None,
                              negative_labels_are_padding: bool = False,
                              method: str = "sinkhorn", temperature: float | None = None,
                              scale_free: bool | None = None, **kwargs):
    """Pearson correlation of the soft ranks of `y_pred` and the hard ranks of `y_true`.

    Target ranks are `hard_stats.rankdata` (ties averaged, as Spearman's ρ); prediction
    ranks are the ascending `soft_rank(y_pred, method)` (differentiable; for
    'sinkhorn', talk, Algorithm 2). As the temperature → 0 this is Spearman's ρ of
    predictions and targets (for predictions without ties). Padded lists (a `mask`,
    `negative_labels_are_padding=True` or `tf.RaggedTensor` inputs; the convention of
    `softsort_tf._lists`) give the correlation of the valid entries alone, and
    padded entries get no gradient (`rank_correlation`); 'permutahedron' takes no
    padding.

    Args:
      y_true: `[..., n, ...]` target scores (or ragged `[batch, (n)]`).
      y_pred: predicted scores of the same shape.
      axis: the list axis.
      mask: optional boolean of the shape of y_true, False for padding.
      negative_labels_are_padding: treat entries with y_true < 0 as padding (default
        False: targets are real values and may be negative).
      method, temperature, **kwargs: as in `softsort_tf.ops.soft.soft_rank` (the
        Sinkhorn settings `options`, `squash`, `targets`, `epsilon`, ... for
        'sinkhorn'; `regularization` for 'permutahedron'; ...). No temperature: the
        scale-free default (each list's scores standardised and ranked at one standard
        deviation, `SPEARMAN_SCALE_FREE_TEMPERATURES`; Sinkhorn at ε = 1e-2).
      scale_free: standardise each list's predictions first (differentiated through
        the mean and standard deviation), the temperature then in standard deviations
        (None: True when no temperature is given; see
        `softsort_tf.losses.ranking.resolve_scale_free`).

    Returns:
      Correlations in [−1, 1] with the shape of y_pred without `axis`; NaN for a list
      with a NaN target or prediction.

    Example:
    >>> rho = soft_spearman_correlation([[1.0, 2.0, 3.0, 0.0]], [[0.1, 0.2, 0.3, 5.0]],
    ...                                 mask=[[True, True, True, False]], epsilon=1e-3)
    >>> round(float(rho[0]), 3)
    1.0
    """

    temperature, scale_free, kwargs = resolve_scale_free(
        method, temperature, scale_free, kwargs, SPEARMAN_SCALE_FREE_TEMPERATURES, {})

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
    """1 − soft Spearman correlation along `axis`, for learning to rank.

        loss = 1 − Pearson(R̃(ŷ), rankdata(y))

    with R̃ the soft ranks of the predictions by `method` (`soft_rank`; for
    'sinkhorn', talk, Algorithm 2 and paper Def. 2) and rankdata the hard ranks of the
    targets with ties averaged (`soft_spearman_correlation`). In [0, 2]; as the
    temperature → 0 it is 1 − Spearman's ρ. Only the order of the predictions matters
    for 'sinkhorn' (its squash makes the loss invariant to increasing affine maps of
    each list). Without a temperature every family is scale-free the same way: each
    list's predictions are standardised and ranked at one standard deviation
    (`SPEARMAN_SCALE_FREE_TEMPERATURES`), so nothing is tuned to the model's score
    scale; a temperature given without `scale_free=True` is in the family's units (the
    scores' for LapSum, SoftSort, NeuralSort, the permutahedron). A
    list whose targets are all equal has no order: its correlation is taken as 0 (loss
    1, zero gradient). A list with a NaN prediction or target has a NaN loss (and NaN
    gradients for that list only).

    Args:
      axis: the list axis of `y_true`/`y_pred` (default −1: rows are lists).
      {method}
      temperature: the method's temperature (for 'sinkhorn', ε). None: the
        scale-free default (one standard deviation of each list's predictions; ε =
        1e-2 for 'sinkhorn').
      {method_kwargs}
      scale_free: standardise each list's predictions before ranking them (None: True
        when no temperature is given; the config holds the resolved value).
      negative_labels_are_padding: treat y_true < 0 as padding (default False: the
        targets of a correlation are real values; the padding rule of
        `softsort_tf._lists`). `tf.RaggedTensor` inputs and a Keras mask of
        `y_pred` of its shape (one flag per item) are always padding ('permutahedron'
        takes none).
      options, squash, targets, **kwargs: the Sinkhorn settings (`SinkhornLoss`), e.g.
        `epsilon` (default 1e-2); only with method='sinkhorn'.
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch, n]` (any rank; lists along `axis`); `sample_weight` has the
    shape of the input without `axis` (one weight per list). Output: a scalar, or the
    per-list losses for reduction 'none'. n and the batch size may be unknown when the
    model is built, also under XLA.

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
                 options: SinkhornOptions | dict | None = None, squash="logistic",
                 targets: str = "regular", reduction: str | None = "sum_over_batch_size",
                 name: str = "spearman_loss", dtype=None, scale_free: bool | None = None,
                 **kwargs):
        padding = _checks.check_bool("negative_labels_are_padding",
                                     negative_labels_are_padding)
        _methods.check_padding(method, padding, "negative_labels_are_padding=True")
        temperature, scale_free, kwargs = resolve_scale_free(
            method, temperature, scale_free, {**kwargs, "options": options},
            SPEARMAN_SCALE_FREE_TEMPERATURES, {})
        del kwargs["options"]
        super().__init__(
            spearman_loss,
            dict(axis=_checks.check_int("axis", axis), negative_labels_are_padding=padding,
                 scale_free=scale_free),
            method=method, temperature=temperature, method_kwargs=method_kwargs,
            options=options, squash=squash, targets=targets, reduction=reduction,
            name=name, dtype=dtype, **kwargs)

"""Spearman rank correlation as a function and a Keras metric."""

from __future__ import annotations

import keras
import tensorflow as tf

from softsort_tf import _checks
from softsort_tf._lists import rank_correlation
from softsort_tf.metrics.ranking import PerListMean
from softsort_tf.ops import hard_stats

_PACKAGE = "softsort_tf"


def spearman_correlation(y_true, y_pred, axis: int = -1, *, mask=None,
                         negative_labels_are_padding: bool = False):
    """Spearman's ρ of `y_true` and `y_pred` along `axis`, ties averaged.

    The Pearson correlation of `hard_stats.rankdata` of both (as `scipy.stats.spearmanr`);
    0 for a list whose targets or predictions are constant, NaN for a list holding a
    NaN. Padded lists (a `mask`, `negative_labels_are_padding=True` or ragged inputs)
    give ρ of the valid entries alone.

    Args:
      y_true, y_pred: `[..., n, ...]` tensors of the same shape (or ragged `[batch, (n)]`).
      axis: the list axis.
      mask: optional boolean of the shape of y_true, False for padding.
      negative_labels_are_padding: treat y_true < 0 as padding (default False).

    Returns:
      The shape of the inputs without `axis`.

    Example:
    >>> rho = spearman_correlation([1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0], axis=0)
    >>> round(float(rho), 4)
    0.8
    """
    return rank_correlation(y_true, y_pred, hard_stats.rankdata, axis, mask=mask,
                            negative_labels_are_padding=negative_labels_are_padding)


def _spearman_and_weights(y_true, y_pred, **kwargs):
    rho = spearman_correlation(y_true, y_pred, **kwargs)
    return rho, tf.ones_like(rho)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SpearmanCorrelation(PerListMean):
    """Mean Spearman's ρ (ties averaged) over lists along `axis` (hard counterpart of
    1 − `SpearmanLoss`).

    The (sample-weighted) mean of `spearman_correlation` over all lists seen
    (`PerListMean`); a Keras mask of `y_pred` of its shape marks padding. Lists of any
    length, also unknown when the model is built, and XLA are supported.

    Args:
      axis: the list axis (default −1).
      negative_labels_are_padding: treat y_true < 0 as padding (default False: the
        targets of a correlation are real values).
      name, dtype: as in `keras.metrics.Metric`.

    Example:
    >>> m = SpearmanCorrelation()
    >>> m.update_state([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], [[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    >>> float(m.result())
    0.0
    """

    _fn = staticmethod(_spearman_and_weights)

    def __init__(self, axis: int = -1, name: str = "spearman_correlation", dtype=None, *,
                 negative_labels_are_padding: bool = False):
        super().__init__(name, dtype, axis=_checks.check_int("axis", axis),
                         negative_labels_are_padding=_checks.check_bool(
                             "negative_labels_are_padding", negative_labels_are_padding))

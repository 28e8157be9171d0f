"""Spearman rank correlation as a function and a Keras metric."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from softsort_tf.losses import spearman as spearman_losses
from softsort_tf.losses.base import _check_bool
from softsort_tf.losses.spearman import check_lists, nan_where_missing
from softsort_tf.ops import hard_stats

_PACKAGE = "softsort_tf"


def spearman_correlation(y_true, y_pred, axis: int = -1, *, mask=None,
                         negative_labels_are_padding: bool = False):
    """Spearman's ρ of `y_true` and `y_pred` along `axis`, ties averaged.

    The Pearson correlation of `hard_stats.rankdata` of both (as
    `scipy.stats.spearmanr`); 0 for a list whose targets or predictions are constant,
    NaN for a list holding a NaN. Padded lists (a `mask`,
    `negative_labels_are_padding=True` or ragged inputs; see
    `softsort_tf.losses.ranking`) give ρ of the valid entries alone.

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
    if spearman_losses.is_padded(y_true, y_pred, mask, negative_labels_are_padding):
        labels, scores, valid = spearman_losses.padded_lists_last(
            y_true, y_pred, mask, axis, negative_labels_are_padding)
        corr = spearman_losses.masked_correlation(
            spearman_losses.masked_target_ranks(scores, valid),
            spearman_losses.masked_target_ranks(labels, valid), valid)
        zero = tf.zeros_like(scores)
        return nan_where_missing(corr, tf.where(valid, labels, zero),
                                 tf.where(valid, scores, zero), -1)
    y_true, y_pred = check_lists(y_true, y_pred)
    corr = hard_stats.pearson_correlation(hard_stats.rankdata(y_pred, axis=axis),
                                          hard_stats.rankdata(y_true, axis=axis), axis=axis)
    return nan_where_missing(corr, y_true, y_pred, axis)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SpearmanCorrelation(keras.metrics.MeanMetricWrapper):
    """Mean Spearman's ρ (ties averaged) over lists along `axis` (hard counterpart of
    1 − `SpearmanLoss`).

    Each list contributes `spearman_correlation` of its targets and predictions; the
    metric is their (sample-weighted) mean over all lists seen. Lists of any length,
    also unknown when the model is built, and XLA are supported.

    Args:
      axis: the list axis (default −1).
      negative_labels_are_padding: treat y_true < 0 as padding (default False; ragged
        inputs are always taken as padded lists).
      name, dtype: as in `keras.metrics.Metric`.

    Example:
    >>> m = SpearmanCorrelation()
    >>> m.update_state([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], [[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    >>> float(m.result())
    0.0
    """

    def __init__(self, axis: int = -1, name: str = "spearman_correlation", dtype=None, *,
                 negative_labels_are_padding: bool = False):
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise ValueError(f"`axis` must be an integer, got {axis!r}.")
        padding = _check_bool("negative_labels_are_padding", negative_labels_are_padding)
        super().__init__(fn=spearman_correlation, name=name, dtype=dtype, axis=int(axis),
                         negative_labels_are_padding=padding)
        self.axis = int(axis)
        self.negative_labels_are_padding = padding
        self._direction = "up"

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "axis": self.axis,
                "negative_labels_are_padding": self.negative_labels_are_padding}

"""Kendall's τ-b as a streaming Keras metric over lists."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from softsort_tf.ops import kendall as kendall_ops

_PACKAGE = "softsort_tf"


@keras.saving.register_keras_serializable(package=_PACKAGE)
class KendallTau(keras.metrics.Metric):
    """Mean Kendall's τ-b (`softsort_tf.ops.kendall.kendall_tau`) over lists.

    Each list (along `axis`) contributes τ-b of its targets and predictions, equal to
    `scipy.stats.kendalltau`; the metric is their (sample-weighted) mean over all
    lists seen. Padding follows the ranking metrics (`softsort_tf.metrics.ranking`): a
    negative label (with `negative_labels_are_padding=True`, the default), a False
    entry of the Keras mask of `y_pred` (one flag per item) or the end of a ragged row
    is padding, and τ is that of the valid items. A list with fewer than two valid
    items, or whose valid targets or predictions are all tied, has no concordant or
    discordant structure: it is skipped (weight 0). An empty stream gives 0, never NaN;
    a NaN at a valid entry gives NaN, as the other metrics.

    Args:
      axis: the list axis (default −1).
      negative_labels_are_padding: treat y_true < 0 as padding (default True, the
        relevance-label convention; set False for targets that may be negative).
      method: 'auto', 'pairwise' or 'merge' (see `kendall_tau`).
      name, dtype: as in `keras.metrics.Metric`.

    `update_state(y_true, y_pred, sample_weight=None)`: `[..., n]` targets and scores
    (n may vary between batches, also under XLA), `sample_weight` one per list.

    Example:
    >>> m = KendallTau()
    >>> m.update_state([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]], [[1.0, 3.0, 2.0], [1.0, 2.0, 3.0]])
    >>> round(float(m.result()), 4)
    0.3333
    """

    def __init__(self, axis: int = -1, *, negative_labels_are_padding: bool = True,
                 method: str = "auto", name: str = "kendall_tau", dtype=None):
        super().__init__(name=name, dtype=dtype)
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise ValueError(f"`axis` must be an integer, got {axis!r}.")
        self.axis = int(axis)
        self.negative_labels_are_padding = kendall_ops._check_bool(
            "negative_labels_are_padding", negative_labels_are_padding)
        self.method = kendall_ops._check_method(method)
        self.total = self.add_variable(shape=(), initializer="zeros", dtype=self.dtype,
                                       name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", dtype=self.dtype,
                                       name="count")
        self._direction = "up"

    def update_state(self, y_true, y_pred, sample_weight=None):
        mask = getattr(y_pred, "_keras_mask", None)
        if mask is not None and (mask.shape.rank != y_pred.shape.rank):
            mask = None
        values, weights = kendall_ops.kendall_tau(
            y_true, y_pred, mask=mask, axis=self.axis, method=self.method,
            negative_labels_are_padding=self.negative_labels_are_padding,
            return_weights=True)
        values = tf.cast(values, self.dtype)
        weights = tf.cast(weights, self.dtype)
        if sample_weight is not None:
            weights = weights * tf.broadcast_to(tf.cast(sample_weight, self.dtype),
                                                tf.shape(weights))
        contributions = tf.where(weights > 0, values * weights, tf.zeros_like(values))
        self.total.assign_add(tf.reduce_sum(contributions))
        self.count.assign_add(tf.reduce_sum(weights))

    def result(self):
        return tf.math.divide_no_nan(self.total, self.count)

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "axis": self.axis,
                "negative_labels_are_padding": self.negative_labels_are_padding,
                "method": self.method}

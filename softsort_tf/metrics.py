"""Hard (exact) metrics matching the soft losses of `softsort_tf.losses`.

- `QuantileError`: the τ-quantile of the batch errors |y − ŷ|^power, the exact
  counterpart of `SoftLeastQuantileRegressionLoss`.
- `TrimmedError`: the mean of the batch errors between two quantiles, the exact
  counterpart of `SoftTrimmedRegressionLoss`.
- `SpearmanCorrelation`: Spearman's ρ along an axis with ties averaged, the exact
  counterpart of 1 − `SpearmanLoss`.

For `SoftTopKLoss` no new metric is needed: Keras' own
`keras.metrics.SparseTopKCategoricalAccuracy(k)` (integer labels) and
`keras.metrics.TopKCategoricalAccuracy(k)` (one-hot labels) are its hard
counterparts (1 − accuracy is the mean hard top-k 0/1 loss).

Streaming. `QuantileError` and `TrimmedError` describe a *batch* (like the losses
they match, which are batch statistics): each `update_state` call computes the
statistic of that batch, and `result()` is the mean of these per-batch values
weighted by batch size, which is how `Model.fit` averages a loss over an epoch. It is
not the quantile of all the errors of the epoch (that would need to keep every error);
evaluate with one large batch to get that. `SpearmanCorrelation` is a per-list value
and streams as an ordinary (sample-weighted) mean over lists.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from softsort_tf import _checks, hard_stats
from softsort_tf.losses import regression_errors

_PACKAGE = "softsort_tf"


def spearman_correlation(y_true, y_pred, axis: int = -1):
    """Spearman's ρ of `y_true` and `y_pred` along `axis`, ties averaged.

    The Pearson correlation of `hard_stats.rankdata` of both (as
    `scipy.stats.spearmanr`); 0 for a list whose targets or predictions are constant.

    Args:
      y_true, y_pred: `[..., n, ...]` tensors of the same shape.
      axis: the list axis.

    Returns:
      The shape of the inputs without `axis`.

    Example:
    >>> rho = spearman_correlation([1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0], axis=0)
    >>> round(float(rho), 4)
    0.8
    """
    y_pred = tf.convert_to_tensor(y_pred)
    y_true = tf.convert_to_tensor(y_true)
    if y_true.shape.rank != y_pred.shape.rank:
        raise ValueError(f"`y_true` and `y_pred` must have the same shape, got {y_true.shape} "
                         f"and {y_pred.shape}.")
    return hard_stats.pearson_correlation(hard_stats.rankdata(y_pred, axis=axis),
                                          hard_stats.rankdata(y_true, axis=axis), axis=axis)


class _BatchErrorMetric(keras.metrics.Metric):
    """Batch-size-weighted mean over batches of a statistic of the batch errors.

    Args:
      power: exponent of the per-example error |y − ŷ|^power (mean over non-batch axes).
      name, dtype: as in `keras.metrics.Metric`.
    """

    def __init__(self, power: float, name: str, dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.power = _checks.check_positive("power", power)
        self._direction = "down"
        self.total = self.add_variable(shape=(), initializer="zeros", dtype=self.dtype,
                                       name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", dtype=self.dtype,
                                       name="count")

    def statistic(self, errors, weights):
        raise NotImplementedError

    def update_state(self, y_true, y_pred, sample_weight=None):
        errors = regression_errors(y_true, tf.cast(y_pred, self.dtype), self.power)
        weights = None
        if sample_weight is not None:
            weights = tf.reshape(tf.cast(sample_weight, errors.dtype), [-1])
            weights = tf.broadcast_to(weights, tf.shape(errors))
        value = tf.cast(self.statistic(errors, weights), self.dtype)
        batch = tf.cast(tf.shape(errors)[0], self.dtype)
        self.total.assign_add(value * batch)
        self.count.assign_add(batch)

    def result(self):
        return tf.math.divide_no_nan(self.total, self.count)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "power": self.power}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class QuantileError(_BatchErrorMetric):
    """The τ-quantile of the batch errors |y − ŷ|^power (hard counterpart of
    `SoftLeastQuantileRegressionLoss`).

    Per batch: `hard_stats.weighted_quantile` of the errors with the sample weights as
    masses (numpy's 'averaged_inverted_cdf' for uniform weights), or, with `width=t`,
    the mean of the errors whose cumulative mass lies in [τ − t/2, τ + t/2], the exact
    (ε → 0) value of the soft loss with the same width. Streams as the
    batch-size-weighted mean of the per-batch values (module docstring).

    Args:
      quantile: τ in (0, 1) (default 0.5: the median error).
      power: error exponent (default 1).
      width: None (default) for the exact quantile, or the window mass t.
      name, dtype: as in `keras.metrics.Metric`.

    Example:
    >>> m = QuantileError(quantile=0.5)
    >>> m.update_state(np.zeros(5), np.array([1.0, -2.0, 3.0, 50.0, -90.0]))
    >>> float(m.result())
    3.0
    """

    def __init__(self, quantile: float = 0.5, power: float = 1.0, width: float | None = None,
                 name: str = "quantile_error", dtype=None):
        super().__init__(power=power, name=name, dtype=dtype)
        self.quantile = _checks.check_in_open_interval("quantile", quantile, 0.0, 1.0)
        self.width = None if width is None else _checks.check_positive("width", width)
        if self.width is not None:
            hard_stats.check_mass_interval(self.quantile - self.width / 2,
                                           self.quantile + self.width / 2,
                                           "quantile - width/2", "quantile + width/2")

    def statistic(self, errors, weights):
        if self.width is None:
            return hard_stats.weighted_quantile(errors, self.quantile, axis=0, weights=weights)
        return hard_stats.interval_mean(errors, self.quantile - self.width / 2,
                                        self.quantile + self.width / 2, axis=0,
                                        weights=weights)

    def get_config(self) -> dict:
        return {**super().get_config(), "quantile": self.quantile, "width": self.width}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TrimmedError(_BatchErrorMetric):
    """Mean of the batch errors |y − ŷ|^power between two quantiles (hard counterpart
    of `SoftTrimmedRegressionLoss`).

    Per batch: `hard_stats.interval_mean` of the errors over the cumulative masses
    [start, end], sample weights as masses; streams as the batch-size-weighted mean of
    the per-batch values (module docstring).

    Args:
      start_quantile: s in [0, 1) (default 0).
      end_quantile: e in (s, 1] (default 0.5).
      power: error exponent (default 1).
      name, dtype: as in `keras.metrics.Metric`.

    Example:
    >>> m = TrimmedError(0.0, 0.8)
    >>> m.update_state(np.zeros(5), np.array([1.0, -2.0, 3.0, 2.0, -90.0]))
    >>> float(m.result())
    2.0
    """

    def __init__(self, start_quantile: float = 0.0, end_quantile: float = 0.5,
                 power: float = 1.0, name: str = "trimmed_error", dtype=None):
        super().__init__(power=power, name=name, dtype=dtype)
        self.start_quantile, self.end_quantile = hard_stats.check_mass_interval(
            start_quantile, end_quantile, "start_quantile", "end_quantile")

    def statistic(self, errors, weights):
        return hard_stats.interval_mean(errors, self.start_quantile, self.end_quantile,
                                        axis=0, weights=weights)

    def get_config(self) -> dict:
        return {**super().get_config(), "start_quantile": self.start_quantile,
                "end_quantile": self.end_quantile}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SpearmanCorrelation(keras.metrics.MeanMetricWrapper):
    """Mean Spearman's ρ (ties averaged) over lists along `axis` (hard counterpart of
    1 − `SpearmanLoss`).

    Each list contributes `spearman_correlation` of its targets and predictions; the
    metric is their (sample-weighted) mean over all lists seen.

    Args:
      axis: the list axis (default −1).
      name, dtype: as in `keras.metrics.Metric`.

    Example:
    >>> m = SpearmanCorrelation()
    >>> m.update_state([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], [[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    >>> float(m.result())
    0.0
    """

    def __init__(self, axis: int = -1, name: str = "spearman_correlation", dtype=None):
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise ValueError(f"`axis` must be an integer, got {axis!r}.")
        super().__init__(fn=spearman_correlation, name=name, dtype=dtype, axis=int(axis))
        self.axis = int(axis)
        self._direction = "up"

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "axis": self.axis}

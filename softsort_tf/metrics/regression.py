"""Hard batch-statistic metrics of regression errors: quantile and trimmed mean."""

from __future__ import annotations

import keras
import tensorflow as tf

from softsort_tf import _checks
from softsort_tf._regression_errors import regression_errors
from softsort_tf.ops import hard_stats

_PACKAGE = "softsort_tf"


class _BatchErrorMetric(keras.metrics.Mean):
    """A `keras.metrics.Mean` of a statistic of each batch's errors |y − ŷ|^error_power
    (mean over the non-batch axes), weighted by the batch's number of examples.

    Args:
      name, dtype: as in `keras.metrics.Metric`.
      interval: the cumulative masses `(start, end)` whose errors are averaged
        (`hard_stats.interval_mean`), or None for the weighted τ-quantile
        (`hard_stats.weighted_quantile`) of `config["quantile"]`.
      **config: the validated arguments (`error_power`, ...), also attributes.

    `sample_weight` gives the masses of the examples in each batch statistic: finite and
    ≥ 0 (a negative or NaN weight raises a `ValueError` when its value is known, i.e.
    eagerly). A weight 0 is padding: the example is left out of the statistic whatever
    its values (NaN included) and of the count. The batch size may be unknown when the
    metric is traced, also under XLA.
    """

    def __init__(self, name: str, dtype, interval: tuple[float, float] | None, **config):
        super().__init__(name=name, dtype=dtype)
        self._interval, self._config = interval, config
        self.__dict__.update(config)
        self._direction = "down"

    def update_state(self, y_true, y_pred, sample_weight=None):
        errors = regression_errors(y_true, tf.cast(y_pred, self.dtype), self.error_power)
        weights = valid = None
        count = tf.cast(tf.shape(errors)[0], self.dtype)
        if sample_weight is not None:
            weights = tf.cast(tf.convert_to_tensor(sample_weight), errors.dtype)
            # Zeros are padding (allowed even for a whole batch); the others are masses.
            _checks.check_weight_values("sample_weight", tf.where(
                weights == 0, tf.ones_like(weights), weights), allow_zero=True)
            weights = tf.broadcast_to(tf.reshape(weights, [-1]), tf.shape(errors))
            valid = weights != 0
            count = tf.reduce_sum(tf.cast(valid, self.dtype))
            weights = tf.where(valid, weights, tf.ones_like(weights))
        if self._interval is None:
            value = hard_stats.weighted_quantile(errors, self.quantile, axis=0,
                                                 weights=weights, mask=valid)
        else:
            value = hard_stats.interval_mean(errors, *self._interval, axis=0, weights=weights,
                                             mask=valid)
        return super().update_state(value, sample_weight=count)

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, **self._config}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class QuantileError(_BatchErrorMetric):
    """The τ-quantile of the batch errors |y − ŷ|^error_power (hard counterpart of
    `SoftLeastQuantileRegressionLoss`).

    Per batch: `hard_stats.weighted_quantile` of the errors, sample weights as masses
    (numpy's 'averaged_inverted_cdf' for uniform weights), or, with `width=t`, the mean
    of the errors whose cumulative mass lies in [τ − t/2, τ + t/2] (the ε → 0 value of
    the soft loss with the same width); streamed as in `_BatchErrorMetric`.

    Args:
      quantile: τ in (0, 1) (default 0.5: the median error).
      error_power: error exponent (default 1).
      width: None (default) for the exact quantile, or the window mass t.
      name, dtype: as in `keras.metrics.Metric`.

    Example:
    >>> m = QuantileError(quantile=0.5)
    >>> m.update_state(np.zeros(5), np.array([1.0, -2.0, 3.0, 50.0, -90.0]))
    >>> float(m.result())
    3.0
    """

    def __init__(self, quantile: float = 0.5, error_power: float = 1.0,
                 width: float | None = None, name: str = "quantile_error", dtype=None):
        error_power = _checks.check_positive("error_power", error_power)
        quantile = _checks.check_in_open_interval("quantile", quantile, 0.0, 1.0)
        width = _checks.check_positive("width", width, allow_none=True)
        interval = None if width is None else hard_stats.check_mass_interval(
            quantile - width / 2, quantile + width / 2, "quantile - width/2",
            "quantile + width/2")
        super().__init__(name, dtype, interval, error_power=error_power, quantile=quantile,
                         width=width)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TrimmedError(_BatchErrorMetric):
    """Mean of the batch errors |y − ŷ|^error_power between two quantiles (hard counterpart
    of `SoftTrimmedRegressionLoss`).

    Per batch: `hard_stats.interval_mean` of the errors over the cumulative masses
    [start, end], sample weights as masses; streamed as in `_BatchErrorMetric`.

    Args:
      start_quantile: s in [0, 1) (default 0).
      end_quantile: e in (s, 1] (default 0.5).
      error_power: error exponent (default 1).
      name, dtype: as in `keras.metrics.Metric`.

    Example:
    >>> m = TrimmedError(0.0, 0.8)
    >>> m.update_state(np.zeros(5), np.array([1.0, -2.0, 3.0, 2.0, -90.0]))
    >>> float(m.result())
    2.0
    """

    def __init__(self, start_quantile: float = 0.0, end_quantile: float = 0.5,
                 error_power: float = 1.0, name: str = "trimmed_error", dtype=None):
        error_power = _checks.check_positive("error_power", error_power)
        start, end = hard_stats.check_mass_interval(start_quantile, end_quantile,
                                                    "start_quantile", "end_quantile")
        super().__init__(name, dtype, (start, end), error_power=error_power,
                         start_quantile=start, end_quantile=end)

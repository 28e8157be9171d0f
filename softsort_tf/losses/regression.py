"""Robust regression losses: soft least-quantile and trimmed regression (paper §4)."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import tensorflow as tf

from softsort_tf import _checks
from softsort_tf.losses.base import _SinkhornLoss, keras_mask
from softsort_tf.ops import hard_stats
from softsort_tf.ops import sinkhorn as sinkhorn_ops
from softsort_tf.ops.transport import Transport
from softsort_tf.options import SinkhornOptions
from softsort_tf.solvers.sinkhorn import pair_cost

_PACKAGE = "softsort_tf"
DEFAULT_QUANTILE_WIDTH = 0.1
DEFAULT_ERROR_POWER = 1.0


def trimmed_target_weights(start_quantile: float, end_quantile: float) -> tuple[np.ndarray, int]:
    """Target weights b = [start, end − start, 1 − end] (empty bins dropped) and the
    index of the middle bin."""
    start, end = hard_stats.check_mass_interval(start_quantile, end_quantile,
                                                "start_quantile", "end_quantile")
    bins = [start, end - start, 1.0 - end]
    index = 1 if start > 0 else 0
    return np.array([b for b in bins if b > 0]), index


def sinkhorn_trimmed_mean(x, start_quantile: float, end_quantile: float, axis: int = -1, *,
                          weights=None, options: SinkhornOptions | dict | None = None,
                          **option_kwargs):
    """Soft mean of the values between two quantiles (soft trimmed mean).

    The same transport problem as the S-quantile (eq. 4) with the target measure
    b = [s, e − s, 1 − e] for s = `start_quantile` and e = `end_quantile`: the middle
    value of `sinkhorn_sort(x, target_weights=b)`, b⁻¹ ∘ (Pᵀ x), averages the inputs
    sent to the middle bin. As ε → 0 it is the mean of the values whose cumulative
    mass lies in [s, e] (`hard_stats.interval_mean`); s = 0 or e = 1 drop the empty bin.

    Args:
      x: `[..., n, ...]` real tensor.
      start_quantile, end_quantile: 0 ≤ s < e ≤ 1.
      axis: the sample axis.
      weights: positive input weights a `[n]` or of the shape of x (default uniform).
      options, **option_kwargs: the `SinkhornOptions`, as in `sinkhorn_sort`.

    Returns:
      The shape of x without `axis`.

    Example:
    >>> m = sinkhorn_trimmed_mean([4.0, 1.0, 3.0, 2.0, 100.0], 0.2, 0.8, epsilon=1e-4)
    >>> round(float(m), 2)
    3.0
    """
    b, index = trimmed_target_weights(start_quantile, end_quantile)
    x = tf.convert_to_tensor(x)
    axis = _checks.check_axis(axis, x.shape.rank)
    values = sinkhorn_ops.sinkhorn_sort(
        x, axis=axis, target_weights=b, weights=weights, options=options, **option_kwargs)
    return tf.gather(values, index, axis=axis)


def _align(y_true, y_pred):
    """Squeezes a trailing axis of size 1 so that y_true and y_pred have equal rank."""
    rank_t, rank_p = y_true.shape.rank, y_pred.shape.rank
    if rank_t == rank_p + 1 and y_true.shape[-1] == 1:
        y_true = y_true[..., 0]
    elif rank_p == rank_t + 1 and y_pred.shape[-1] == 1:
        y_pred = y_pred[..., 0]
    return y_true, y_pred


def regression_errors(y_true, y_pred, power: float = 1.0):
    """Per-example errors e_i = mean over the non-batch axes of |y_i − ŷ_i|^power.

    Args:
      y_true: `[batch]` or `[batch, ...]` targets (a trailing axis of size 1 on either
        side is squeezed to match the other).
      y_pred: predictions of the same shape.
      power: exponent > 0 (1: absolute errors, 2: squared errors); gradients are
        finite where y = ŷ for any power.

    Returns:
      `[batch]` errors in the dtype of `y_pred` (float).
    """
    y_pred = tf.convert_to_tensor(y_pred)
    if not y_pred.dtype.is_floating:
        y_pred = tf.cast(y_pred, tf.float32)
    y_true = tf.cast(tf.convert_to_tensor(y_true), y_pred.dtype)
    y_true, y_pred = _align(y_true, y_pred)
    if y_pred.shape.rank is None or y_pred.shape.rank < 1:
        raise ValueError(f"`y_pred` must have a batch axis, got shape {y_pred.shape}.")
    err = pair_cost(y_true, y_pred, power)
    if err.shape.rank > 1:
        err = tf.reduce_mean(err, axis=list(range(1, err.shape.rank)))
    return err


def _per_example(flags):
    """`[B, ...]` booleans to `[B]`: an example counts where any of its entries does."""
    if flags.shape.rank is not None and flags.shape.rank > 1:
        flags = tf.reduce_any(flags, axis=list(range(1, flags.shape.rank)))
    return flags


def _valid_examples(sample_weight, mask):
    """`[B]`-broadcastable boolean: examples with a non-zero weight and not masked (None
    when neither is given)."""
    valid = None
    if sample_weight is not None:
        valid = _per_example(tf.not_equal(tf.convert_to_tensor(sample_weight), 0))
    if mask is not None:
        mask = _per_example(tf.cast(mask, tf.bool))
        valid = mask if valid is None else tf.logical_and(valid, mask)
    return valid


class _BatchStatisticLoss(_SinkhornLoss):
    """A loss whose value is one soft statistic of the errors of the whole batch.

    The per-example errors e_i = mean over non-batch axes of |y_i − ŷ_i|^power are
    transported, with uniform masses 1/B, onto a target measure b of a few bins; the
    statistic S is the mean of the errors sent to one bin (`middle_bin`),

        S = Σ_i c_i,   c_i = P_{i,mid} e_i / b_mid,

    P the transport plan (b_mid read as the column's own sum Σ_i P_{i,mid}).
    `call(y_true, y_pred)` returns each example's share `B·c_i` `[B]`, and Keras
    reduces it like any other per-example loss (`__call__` only hands the padding,
    below, to `call` and leaves the reduction to `keras.losses.Loss.__call__`):

    - 'sum_over_batch_size' (default), 'mean': the mean share, S itself;
    - 'sum': B·S; 'none' (or None): the `[B]` shares, whose mean is S.

    Padding (the package's mask convention, see softsort_tf._masking): an example whose
    `sample_weight` is 0, or that a Keras mask of `y_pred` marks False, is padding: it has
    no mass in the transport, so it neither takes a place in the sort nor moves the
    statistic (whatever its values, NaN included: they are replaced before any
    arithmetic and get a zero gradient). The statistic S is then that of the B_v valid
    examples alone, each valid example's share is B_v·c_i (mean S over the valid
    examples) and a padded example's share is 0. Keras then reduces the shares as for
    any loss: with sample weights w ∈ {0, 1} the default 'sum_over_batch_size' gives
    (B_v/B)·S, as it scales every Keras loss by the fraction of non-zero weights
    ('mean_with_sample_weight' gives S); with a Keras mask it gives S. Non-zero
    `sample_weight`s multiply each example's share: unit weights give S, a scalar c
    gives c·S, a negative weight reverses the sign of its share (the hard metrics
    `QuantileError` and `TrimmedError`, which use weights as masses, reject negative
    weights). A batch without a valid example has loss 0 and zero gradient.

    Shapes: the batch size may be unknown when the loss is traced (`tf.data` without
    `drop_remainder`, `evaluate`, `tf.function` with a `None` batch dimension), and the
    loss runs under XLA (`jit_compile=True`).

    Distribution: under `tf.distribute` each replica computes S over its own slice
    of the global batch and Keras averages the replicas' losses (and sums their
    gradients scaled by 1/R): the loss of R replicas is the mean of the statistics of
    the R per-replica batches, not the statistic of the global batch, exactly as a
    `BatchNormalization` without synchronisation sees per-replica statistics.

    Args:
      error_power: exponent of the per-example error |y − ŷ|^error_power (default 1,
        absolute error). Deprecated: without `error_power`, a `power` argument is
        still read as the error exponent (its former name), with a warning.
      other arguments: see `_SinkhornLoss`.
    """

    def __init__(self, *, error_power: float | None, **kwargs):
        if error_power is None:
            error_power = DEFAULT_ERROR_POWER
            if "power" in kwargs:  # the former name of the error exponent
                warnings.warn("The error exponent `power` of the regression losses is now "
                              "`error_power` (`power` is the Sinkhorn cost exponent when "
                              "`error_power` is given too).", DeprecationWarning,
                              stacklevel=3)
                error_power = kwargs.pop("power")
        super().__init__(**kwargs)
        self.error_power = _checks.check_positive("error_power", error_power)

    def errors(self, y_true, y_pred):
        """Per-example errors `[B]` (see `regression_errors`), in the loss dtype."""
        y_pred = tf.convert_to_tensor(y_pred)
        return regression_errors(y_true, tf.cast(y_pred, self.dtype), self.error_power)

    def middle_bin(self) -> tuple[np.ndarray, int]:
        """The target weights b and the index of the bin whose mean is the statistic."""
        raise NotImplementedError

    def statistic(self, errors, weights=None):
        """The soft statistic of the errors `[B]` with masses `weights` `[B]`: a scalar."""
        raise NotImplementedError

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Zero sample weights and Keras-masked examples are padding: they are left out
        # of the statistic itself, so `call` needs them. They travel with `y_true`
        # through `Loss.__call__`, which then reduces the shares as for any Keras loss
        # (the distribution scaling included).
        valid = _valid_examples(sample_weight, keras_mask(y_pred))
        if valid is not None:
            y_true = (y_true, valid)
        return super().__call__(y_true, y_pred, sample_weight)

    def call(self, y_true, y_pred):
        valid = keras_mask(y_pred)
        if isinstance(y_true, tuple):  # (targets, valid examples) from `__call__`
            y_true, valid = y_true
        errors, valid = self._masked_errors(y_true, y_pred, valid)
        b, index = self.middle_bin()
        # Padding is the transport's mask: no mass, whatever the (replaced) errors.
        transport = Transport(errors[None, :], axis=-1, direction="ASCENDING", weights=None,
                              targets=(b.size, b), options=self.options,
                              check_numerics=False,
                              mask=None if valid is None else valid[None, :])
        plan = transport.plan[0, :, index]  # P_{i,mid}
        # Divided by the column's own sum (b_mid up to the solver's rounding), as the
        # operators' read-out: the mean share is an exact convex combination of errors.
        column = tf.reduce_sum(plan)
        column = tf.where(column > 0, column, tf.cast(b[index], plan.dtype))
        shares = plan * transport.values[0] / column
        if valid is None:
            count = tf.shape(errors)[0]
        else:
            count = tf.reduce_sum(tf.cast(valid, tf.int32))
            shares = tf.where(valid, shares, tf.zeros_like(shares))
        return tf.cast(tf.cast(count, plan.dtype) * shares, errors.dtype)

    def _masked_errors(self, y_true, y_pred, valid):
        """`(errors [B], valid [B] bool or None)`: the targets and predictions of padded
        examples are replaced by 0 before any arithmetic (no NaN reaches a gradient)."""
        if valid is None:
            return self.errors(y_true, y_pred), None
        y_pred = tf.cast(tf.convert_to_tensor(y_pred), self.dtype)
        y_true = tf.cast(tf.convert_to_tensor(y_true), self.dtype)
        y_true, y_pred = _align(y_true, y_pred)
        valid = tf.cast(valid, tf.bool)
        valid = tf.reshape(valid, [-1]) if valid.shape.rank != 1 else valid
        valid = tf.broadcast_to(valid, tf.shape(y_pred)[:1])

        def masked(t):
            if t.shape.rank is None or t.shape.rank < 1:
                return t
            v = tf.reshape(valid, tf.concat([tf.shape(valid), tf.ones([t.shape.rank - 1],
                                                                     tf.int32)], axis=0))
            return tf.where(v, t, tf.zeros_like(t))

        return self.errors(masked(y_true), masked(y_pred)), valid

    def get_config(self) -> dict:
        return {**super().get_config(), "error_power": self.error_power}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SoftLeastQuantileRegressionLoss(_BatchStatisticLoss):
    """Soft τ-quantile of the batch errors: least-quantile regression (paper §4, eq. 4).

    With errors e_i = |y_i − ŷ_i|^error_power over the B examples of the batch and uniform
    masses a = 1/B, the loss is the τ-S-quantile of eq. (4),

        loss = ( Q̃(a, e; [τ − t/2, t, 1 − τ − t/2]) )_2,

    the average of the errors that Sinkhorn transports onto a bin of mass t centred
    on level τ (`sinkhorn_ops.sinkhorn_quantile`). As ε → 0 it is the mean of the
    errors whose cumulative mass lies in [τ − t/2, τ + t/2] (for t → 0, the τ-quantile
    of the errors). Minimising it with τ = 0.5 gives a least-median regression that
    ignores up to half of the batch as outliers; see `_BatchStatisticLoss` for how
    `sample_weight` and reductions apply to this batch statistic.

    Args:
      quantile: τ in (0, 1) (default 0.5, least median).
      error_power: error exponent (default 1: absolute errors; 2: squared).
      width: bin mass t; default min(0.1, τ, 1 − τ) (the paper's t = 0.1): larger
        widths average more errors around the quantile (smoother, more examples get a
        gradient), smaller ones approach the exact quantile.
      options: a `SinkhornOptions` (or its config dict): the solver settings.
      **kwargs: fields of `SinkhornOptions` overriding those of `options`, e.g.
        `epsilon` (default 1e-2, as in the paper's experiments; with B errors spread
        over [0, 1] after squashing, the quantile blurs over ≈ B·√(ε/2) examples).
      reduction, name, dtype: as in `keras.losses.Loss` (see `_BatchStatisticLoss`).

    Input shapes: `y_true`, `y_pred` `[batch]` or `[batch, d]`; `sample_weight`
    `[batch]`. Output: a scalar (or the `[batch]` shares for reduction 'none').

    Example:
    >>> loss = SoftLeastQuantileRegressionLoss(quantile=0.5, epsilon=1e-4)
    >>> y = np.array([0.0, 0.0, 0.0, 0.0, 0.0])
    >>> round(float(loss(y, np.array([1.0, -2.0, 3.0, 50.0, -90.0]))), 2)
    3.0
    """

    def __init__(self, quantile: float = 0.5, error_power: float | None = None,
                 width: float | None = None, *,
                 options: SinkhornOptions | dict | None = None,
                 reduction: str | None = "sum_over_batch_size",
                 name: str = "soft_least_quantile_regression_loss", dtype=None, **kwargs):
        super().__init__(error_power=error_power, options=options, reduction=reduction,
                         name=name, dtype=dtype, **kwargs)
        self.quantile = _checks.check_in_open_interval("quantile", quantile, 0.0, 1.0)
        self.width = None if width is None else _checks.check_positive("width", width)
        sinkhorn_ops.quantile_target_weights(self.quantile, self._width())  # validates

    def _width(self) -> float:
        if self.width is not None:
            return self.width
        return min(DEFAULT_QUANTILE_WIDTH, self.quantile, 1.0 - self.quantile)

    def middle_bin(self) -> tuple[np.ndarray, int]:
        b, _ = sinkhorn_ops.quantile_target_weights(self.quantile, self._width())
        return b, 1

    def statistic(self, errors, weights=None):
        return sinkhorn_ops.sinkhorn_quantile(errors, self.quantile, width=self._width(),
                                              axis=0, weights=weights,
                                              options=self.options)

    def get_config(self) -> dict:
        return {**super().get_config(), "quantile": self.quantile, "width": self.width}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SoftTrimmedRegressionLoss(_BatchStatisticLoss):
    """Soft mean of the batch errors between two quantiles: trimmed regression (§4).

    With errors e_i = |y_i − ŷ_i|^error_power over the B examples of the batch and uniform
    masses a = 1/B,

        loss = ( S̃(a, e; b) )_mid,   b = [s, e − s, 1 − e],

    the middle value of the Sinkhorn sort of the errors onto a three-bin target
    (`sinkhorn_trimmed_mean`): the same transport problem as the S-quantile of eq. (4)
    with a wider middle bin. As ε → 0 it is the mean of the errors between the s- and
    e-quantiles, i.e. a trimmed mean (least trimmed absolute/squared deviations:
    e.g. s = 0, e = 0.7 ignores the largest 30% of errors). See `_BatchStatisticLoss`
    for `sample_weight` and reductions.

    Args:
      start_quantile: s in [0, 1) (default 0).
      end_quantile: e in (s, 1] (default 0.5).
      error_power: error exponent (default 1).
      options: a `SinkhornOptions` (or its config dict): the solver settings.
      **kwargs: fields of `SinkhornOptions` overriding those of `options` (e.g.
        `epsilon`, default 1e-2).
      reduction, name, dtype: as in `keras.losses.Loss` (see `_BatchStatisticLoss`).

    Input shapes: `y_true`, `y_pred` `[batch]` or `[batch, d]`; `sample_weight`
    `[batch]`. Output: a scalar (or the `[batch]` shares for reduction 'none').

    Example:
    >>> loss = SoftTrimmedRegressionLoss(0.0, 0.8, epsilon=1e-4)
    >>> y = np.zeros(5)
    >>> round(float(loss(y, np.array([1.0, -2.0, 3.0, 2.0, -90.0]))), 2)
    2.0
    """

    def __init__(self, start_quantile: float = 0.0, end_quantile: float = 0.5,
                 error_power: float | None = None, *,
                 options: SinkhornOptions | dict | None = None,
                 reduction: str | None = "sum_over_batch_size",
                 name: str = "soft_trimmed_regression_loss", dtype=None, **kwargs):
        super().__init__(error_power=error_power, options=options, reduction=reduction,
                         name=name, dtype=dtype, **kwargs)
        self.start_quantile, self.end_quantile = hard_stats.check_mass_interval(
            start_quantile, end_quantile, "start_quantile", "end_quantile")

    def middle_bin(self) -> tuple[np.ndarray, int]:
        return trimmed_target_weights(self.start_quantile, self.end_quantile)

    def statistic(self, errors, weights=None):
        return sinkhorn_trimmed_mean(errors, self.start_quantile, self.end_quantile, axis=0,
                                     weights=weights, options=self.options)

    def get_config(self) -> dict:
        return {**super().get_config(), "start_quantile": self.start_quantile,
                "end_quantile": self.end_quantile}

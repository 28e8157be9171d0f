"""Regression losses: soft least-quantile, trimmed and quantile regression (paper §4),
and the pinball loss.

The soft losses are batch statistics: the per-example values of the whole batch (the
errors |y − ŷ|^p, or the residuals y − ŷ) are transported, with uniform masses, onto a
few target bins, and the statistic is read off the transport plan as one share per
example whose mean is the statistic (`batch_statistic_shares`). Each loss is a
`SinkhornLoss` around its functional form, which returns those shares; Keras reduces
them like any per-example loss.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from softsort_tf import _checks
from softsort_tf._keras import get_keras_mask
from softsort_tf._regression_errors import align, regression_errors
from softsort_tf.losses.base import LossFunctionWrapper, SinkhornLoss
from softsort_tf.ops import hard_stats
from softsort_tf.ops import sinkhorn as sinkhorn_ops
from softsort_tf.ops.transport import TargetMeasure, Transport
from softsort_tf.ops.wrapper import ListResult, list_operator
from softsort_tf.options import SinkhornOptions

_PACKAGE = "softsort_tf"
DEFAULT_QUANTILE_WIDTH = 0.1


def trimmed_target_weights(start_quantile: float, end_quantile: float) -> tuple[np.ndarray, int]:
    """Target weights b = [start, end − start, 1 − end] (empty bins dropped) and the
    index of the middle bin."""
    start, end = hard_stats.check_mass_interval(start_quantile, end_quantile,
                                                "start_quantile", "end_quantile")
    bins = [start, end - start, 1.0 - end]
    index = 1 if start > 0 else 0
    return np.array([b for b in bins if b > 0]), index


def sinkhorn_trimmed_mean(x, start_quantile: float, end_quantile: float, axis: int = -1, *,
                          weights=None, squash="logistic", targets: str = "regular",
                          options: SinkhornOptions | dict | None = None, **option_kwargs):
    """Soft mean of the values between two quantiles (soft trimmed mean).

    The same transport problem as the S-quantile (eq. 4) with the target measure
    b = [s, e − s, 1 − e] for s = `start_quantile` and e = `end_quantile`: the middle
    value of `sinkhorn_sort(x, target_weights=b)`, b⁻¹ ∘ (Pᵀ x), averages the inputs
    sent to the middle bin. As ε → 0 it is the mean of the values whose cumulative
    mass lies in [s, e] (`hard_stats.interval_mean`); s = 0 or e = 1 drop the empty bin.

    Args:
      x: `[..., n, ...]` real tensor, or a `tf.RaggedTensor` `[..., (n)]` ragged along
        its last axis (lists of several lengths, see `softsort_tf._masking`).
      start_quantile, end_quantile: 0 ≤ s < e ≤ 1.
      axis: the sample axis (-1 for a ragged x).
      weights: positive input weights a `[n]` or of the shape of x (default uniform;
        not with a ragged x).
      squash, targets, options, **option_kwargs: as in `sinkhorn_sort`.

    Returns:
      The shape of x without `axis` (a ragged x: dense `[lists]` for `[lists, (n)]`,
      ragged over its outer axes otherwise; 0 for an empty list).

    Example:
    >>> m = sinkhorn_trimmed_mean([4.0, 1.0, 3.0, 2.0, 100.0], 0.2, 0.8, epsilon=1e-4)
    >>> round(float(m), 2)
    3.0
    """
    b, index = trimmed_target_weights(start_quantile, end_quantile)
    if isinstance(x, tf.RaggedTensor):
        values = sinkhorn_ops.sinkhorn_sort(
            x, axis=axis, target_weights=b, weights=weights, squash=squash,
            targets=targets, options=options, **option_kwargs)
        return _middle_of_lists(values, len(b), index)
    x = tf.convert_to_tensor(x)
    axis = _checks.check_axis(axis, x.shape.rank)
    values = sinkhorn_ops.sinkhorn_sort(
        x, axis=axis, target_weights=b, weights=weights, squash=squash, targets=targets,
        options=options, **option_kwargs)
    return tf.gather(values, index, axis=axis)


def _middle_of_lists(values: tf.RaggedTensor, bins: int, index: int):
    """Entry `index` of each list of ragged sorted `values` `[..., (bins)]` (an empty
    list's row is empty: 0), without the list axis: dense `[lists]`, or ragged over the
    outer axes."""
    splits = values.nested_row_splits
    lists = tf.RaggedTensor.from_row_splits(values.flat_values, splits[-1], validate=False)
    middle = lists.to_tensor(default_value=0, shape=[None, bins])[:, index]
    if len(splits) == 1:
        return middle
    return tf.RaggedTensor.from_nested_row_splits(middle, splits[:-1], validate=False)


def quantile_bins(quantile: float, width: float | None = None) -> tuple[np.ndarray, float]:
    """The three bins of the S-quantile at level τ (eq. 4): b = [τ − t/2, t, 1 − τ − t/2].

    Args:
      quantile: τ in (0, 1).
      width: t, the mass of the middle bin; default min(0.1, τ, 1 − τ) (the paper's
        t = 0.1, capped so that every bin has a positive mass).

    Returns:
      `(b, t)`: the target weights `[3]` and the width.

    Raises:
      ValueError: τ outside (0, 1), or t not in (0, 2·min(τ, 1 − τ)).
    """
    quantile = _checks.check_in_open_interval("quantile", quantile, 0.0, 1.0)
    if width is None:
        width = min(DEFAULT_QUANTILE_WIDTH, quantile, 1.0 - quantile)
    return sinkhorn_ops.quantile_target_weights(quantile, width)


@list_operator
def batch_statistic_shares(values, *, mask=None, target_weights, shares_fn,
                           squash="logistic", targets: str = "regular",
                           options: SinkhornOptions | dict | None = None, **option_kwargs):
    """Per-example shares of a soft statistic of a batch of values (one list).

    The values v_i (`[B]`, the list axis) are transported, with uniform masses over the
    B_v valid entries (`mask`), onto the target bins b (`target_weights`, ascending
    order). With P the plan, the mean of the values sent to bin j is

        Q̃_j = Σ_i c_ij,   c_ij = P_ij v_i / b_j

    (b_j read as the column's own sum Σ_i P_ij, as the operators' read-out: each Q̃_j
    is an exact convex combination of values). `shares_fn(c, v, count)` (c `[1, B, m]`,
    v `[1, B]`, count = B_v `[1, 1]`, ≥ 1; c is 0 on padded rows) returns the `[1, B]`
    shares s_i whose sum over the valid entries is the statistic S.

    Returns:
      `[B]`: B_v·s_i for a valid entry (their mean over the valid entries is S), 0 for
      a padded one and for a batch without a valid entry.
    """
    t = Transport(values, TargetMeasure.bins(None, target_weights), direction="ASCENDING",
                  squash=squash, targets=targets,
                  options=SinkhornOptions.resolve(options, **option_kwargs))
    plan, v = t.plan, t.values  # [1, B, m], [1, B]
    columns = tf.reduce_sum(plan, axis=1, keepdims=True)
    columns = tf.where(columns > 0, columns, tf.cast(t.bcast_b()[:, None, :], plan.dtype))
    contributions = plan * v[:, :, None] / columns
    count = t.count[:, None]
    if t.mask is not None:
        contributions = tf.where(t.mask[:, :, None], contributions,
                                 tf.zeros_like(contributions))
    shares = count * shares_fn(contributions, v, tf.maximum(count, 1.0))
    return ListResult(shares, "elementwise")


def _dense(name: str, t):
    """`t` as a tensor: the examples of a batch statistic are a dense `[batch, ...]`
    tensor (a `tf.RaggedTensor` raises a `ValueError` naming `name`)."""
    _checks.check_dense(name, t, mask=None)
    return tf.convert_to_tensor(t)


def _zero_padded(y_true, y_pred, mask):
    """`(y_true, y_pred)` with the examples that `mask` (`[batch]`, False = padding)
    marks replaced by 0 before any arithmetic, so that NaN/Inf padding reaches neither
    the values nor the gradients."""
    y_pred, y_true = _dense("y_pred", y_pred), _dense("y_true", y_true)
    if not y_pred.dtype.is_floating:
        y_pred = tf.cast(y_pred, tf.float32)
    y_true = tf.cast(y_true, y_pred.dtype)
    if mask is None:
        return y_true, y_pred
    valid = tf.reshape(tf.cast(mask, tf.bool), [-1])

    def zeroed(t):
        if t.shape.rank is None or t.shape.rank < 1:
            return t
        shape = tf.concat([tf.shape(t)[:1], tf.ones([t.shape.rank - 1], tf.int32)], axis=0)
        return tf.where(tf.reshape(valid, shape), t, tf.zeros_like(t))

    return zeroed(y_true), zeroed(y_pred)


def _mean_of_bin(index: int):
    """`shares_fn` of the mean of one bin: s_i = c_i,index."""
    return lambda contributions, values, count: contributions[..., index]


def _checked_level(quantile, width) -> tuple[float, float | None]:
    """`(τ, t)` of an S-quantile loss, validated (`quantile_bins` checks t against τ);
    t stays None for the default width."""
    quantile = _checks.check_in_open_interval("quantile", quantile, 0.0, 1.0)
    width = None if width is None else _checks.check_positive("width", width)
    quantile_bins(quantile, width)
    return quantile, width


def _checked_error_power(error_power) -> float:
    return _checks.check_positive("error_power", error_power)


def soft_least_quantile_regression_loss(y_true, y_pred, quantile: float = 0.5,
                                        width: float | None = None,
                                        error_power: float = 1.0, *, mask=None,
                                        squash="logistic", targets: str = "regular",
                                        options: SinkhornOptions | dict | None = None,
                                        **option_kwargs):
    """Per-example shares of the soft τ-quantile of the batch errors (paper §4, eq. 4).

    With errors e_i = |y_i − ŷ_i|^error_power (mean over the non-batch axes), the
    statistic is the τ-S-quantile Q̃_2 of the errors on the bins
    b = [τ − t/2, t, 1 − τ − t/2] (`quantile_bins`), see
    `SoftLeastQuantileRegressionLoss`.

    Args:
      y_true, y_pred: `[batch]` or `[batch, d]`.
      quantile, width, error_power: as in `SoftLeastQuantileRegressionLoss`.
      mask: optional boolean `[batch]`, False for padding (left out of the statistic).
      squash, targets, options, **option_kwargs: the Sinkhorn settings, as in
        `sinkhorn_sort`.

    Returns:
      `[batch]` shares, whose mean over the valid examples is the statistic.
    """
    b, _ = quantile_bins(quantile, width)
    y_true, y_pred = _zero_padded(y_true, y_pred, mask)
    errors = regression_errors(y_true, y_pred, _checked_error_power(error_power))
    return batch_statistic_shares(errors, mask=mask, target_weights=b,
                                  shares_fn=_mean_of_bin(1), squash=squash, targets=targets,
                                  options=options, **option_kwargs)


def soft_trimmed_regression_loss(y_true, y_pred, start_quantile: float = 0.0,
                                 end_quantile: float = 0.5, error_power: float = 1.0, *,
                                 mask=None, squash="logistic", targets: str = "regular",
                                 options: SinkhornOptions | dict | None = None,
                                 **option_kwargs):
    """Per-example shares of the soft mean of the batch errors between two quantiles.

    The statistic is the middle value of the Sinkhorn sort of the errors
    |y − ŷ|^error_power onto b = [s, e − s, 1 − e] (`sinkhorn_trimmed_mean`), see
    `SoftTrimmedRegressionLoss`. Arguments and return value as in
    `soft_least_quantile_regression_loss`.
    """
    b, index = trimmed_target_weights(start_quantile, end_quantile)
    y_true, y_pred = _zero_padded(y_true, y_pred, mask)
    errors = regression_errors(y_true, y_pred, _checked_error_power(error_power))
    return batch_statistic_shares(errors, mask=mask, target_weights=b,
                                  shares_fn=_mean_of_bin(index), squash=squash,
                                  targets=targets, options=options, **option_kwargs)


def _residuals(y_true, y_pred):
    """Residuals y − ŷ `[batch]` of targets and predictions `[batch]` or `[batch, 1]` (a
    trailing axis of size 1 on either side is squeezed), in the float dtype of
    `y_pred`."""
    y_pred, y_true = _dense("y_pred", y_pred), _dense("y_true", y_true)
    if not y_pred.dtype.is_floating:
        y_pred = tf.cast(y_pred, tf.float32)
    y_true = tf.cast(y_true, y_pred.dtype)
    y_true, y_pred = align(y_true, y_pred)
    if y_pred.shape.rank == 2 and y_pred.shape[-1] == 1:
        y_true, y_pred = y_true[:, 0], y_pred[:, 0]
    if y_pred.shape.rank != 1:
        raise ValueError(f"`y_pred` must have shape [batch] or [batch, 1] (one quantile "
                         f"per example), got {y_pred.shape}.")
    return y_true - y_pred


def soft_quantile_regression_loss(y_true, y_pred, quantile: float = 0.5,
                                  width: float | None = None, *, mask=None,
                                  squash="logistic", targets: str = "regular",
                                  options: SinkhornOptions | dict | None = None,
                                  **option_kwargs):
    """Per-example shares of the τ-S-quantile loss of the batch residuals (§4, Table 1).

    With residuals x = y − ŷ and Q̃ the means of the three bins
    b = [τ − t/2, t, 1 − τ − t/2] (`quantile_bins`), the statistic is

        L = τ · mean(x) − b_1 · Q̃_1 − (t/2) · Q̃_2 + Q̃_2²

    (see `SoftQuantileRegressionLoss`); example i's share is
    τ x_i / B − b_1 c_i1 − (t/2) c_i2 + Q̃_2² / B (c_ij = P_ij x_i / b_j).

    Args:
      y_true, y_pred: `[batch]` or `[batch, 1]`.
      quantile, width: as in `SoftQuantileRegressionLoss`.
      mask, squash, targets, options, **option_kwargs: as in
        `soft_least_quantile_regression_loss`.

    Returns:
      `[batch]` shares, whose mean over the valid examples is L.
    """
    quantile = _checks.check_in_open_interval("quantile", quantile, 0.0, 1.0)
    b, width = quantile_bins(quantile, width)

    def shares_fn(contributions, values, count):
        dtype = contributions.dtype
        middle = tf.reduce_sum(contributions[..., 1], axis=-1, keepdims=True)  # Q̃_2
        return (tf.constant(quantile, dtype) * values / count
                - tf.constant(b[0], dtype) * contributions[..., 0]
                - tf.constant(width / 2, dtype) * contributions[..., 1]
                + tf.square(middle) / count)

    residuals = _residuals(*_zero_padded(y_true, y_pred, mask))
    return batch_statistic_shares(residuals, mask=mask, target_weights=b,
                                  shares_fn=shares_fn, squash=squash, targets=targets,
                                  options=options, **option_kwargs)


def _per_example(flags):
    """`[B, ...]` booleans to `[B]`: an example counts where any of its entries does."""
    if flags.shape.rank is not None and flags.shape.rank > 1:
        flags = tf.reduce_any(flags, axis=list(range(1, flags.shape.rank)))
    return flags


class _BatchStatisticLoss(SinkhornLoss):
    """A `SinkhornLoss` whose functional form returns the shares of a batch statistic.

    `fn(y_true, y_pred, ..., mask=...)` returns per-example shares `[B]` whose mean is
    a soft statistic S of the whole batch (`batch_statistic_shares`), and Keras reduces
    them like any other per-example loss:

    - 'sum_over_batch_size' (default), 'mean': the mean share, S itself;
    - 'sum': B·S; 'none' (or None): the `[B]` shares, whose mean is S.

    Padding (the package's mask convention, see softsort_tf._masking): an example whose
    `sample_weight` is 0, or that a Keras mask of `y_pred` marks False, is padding: it has
    no mass in the transport, so it neither takes a place in the sort nor moves the
    statistic (whatever its values, NaN included: they are replaced before any
    arithmetic and get a zero gradient). The statistic S is then that of the B_v valid
    examples alone, each valid example's share is B_v·s_i (mean S over the valid
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

    Sinkhorn's ε must be one the loss's compute dtype holds (at least 3.8e-6 in
    float32; `SinkhornLoss`), checked at construction.
    """

    def call_arguments(self, y_pred, sample_weight=None):
        """The padded examples (zero `sample_weight`, False in a Keras mask of `y_pred`)
        become the `mask` of `fn`; the Keras mask stays on `y_pred` for Keras' own
        reduction."""
        valid = None
        if sample_weight is not None:
            valid = _per_example(tf.not_equal(tf.convert_to_tensor(sample_weight), 0))
        mask = get_keras_mask(y_pred)
        if mask is not None:
            mask = _per_example(tf.cast(mask, tf.bool))
            valid = mask if valid is None else tf.logical_and(valid, mask)
        if valid is None:
            return y_pred, {}
        batch = tf.shape(tf.convert_to_tensor(y_pred))[:1]
        return y_pred, {"mask": tf.broadcast_to(tf.reshape(valid, [-1]), batch)}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SoftLeastQuantileRegressionLoss(_BatchStatisticLoss):
    """Soft τ-quantile of the batch errors: least-quantile regression (paper §4, eq. 4).

    Sinkhorn only (no `method=`): the statistic is read off the target bins of the
    Sinkhorn transport plan, which the other families of `FAMILIES` do not define.

    With errors e_i = |y_i − ŷ_i|^error_power over the B examples of the batch and uniform
    masses a = 1/B, the loss is the τ-S-quantile of eq. (4),

        loss = ( Q̃(a, e; [τ − t/2, t, 1 − τ − t/2]) )_2,

    the average of the errors that Sinkhorn transports onto a bin of mass t centred
    on level τ (`sinkhorn_quantile`). As ε → 0 it is the mean of the errors whose
    cumulative mass lies in [τ − t/2, τ + t/2] (for t → 0, the τ-quantile of the
    errors). Minimising it with τ = 0.5 gives a least-median regression that ignores up
    to half of the batch as outliers; see `_BatchStatisticLoss` for how `sample_weight`,
    masks and reductions apply to this batch statistic.

    Args:
      quantile: τ in (0, 1) (default 0.5, least median).
      error_power: error exponent (default 1: absolute errors; 2: squared).
      width: bin mass t; default min(0.1, τ, 1 − τ) (the paper's t = 0.1): larger
        widths average more errors around the quantile (smoother, more examples get a
        gradient), smaller ones approach the exact quantile.
      options, squash, targets, **kwargs: the Sinkhorn settings (`SinkhornLoss`), e.g.
        `epsilon` (default 1e-2, as in the paper's experiments).
      reduction, name, dtype: as in `keras.losses.Loss` (see `_BatchStatisticLoss`).

    Input shapes: `y_true`, `y_pred` `[batch]` or `[batch, d]`; `sample_weight`
    `[batch]`. Output: a scalar (or the `[batch]` shares for reduction 'none').

    Example:
    >>> loss = SoftLeastQuantileRegressionLoss(quantile=0.5, epsilon=1e-4)
    >>> y = np.array([0.0, 0.0, 0.0, 0.0, 0.0])
    >>> round(float(loss(y, np.array([1.0, -2.0, 3.0, 50.0, -90.0]))), 2)
    3.0
    """

    def __init__(self, quantile: float = 0.5, error_power: float = 1.0,
                 width: float | None = None, *,
                 options: SinkhornOptions | dict | None = None, squash="logistic",
                 targets: str = "regular", reduction: str | None = "sum_over_batch_size",
                 name: str = "soft_least_quantile_regression_loss", dtype=None, **kwargs):
        quantile, width = _checked_level(quantile, width)
        super().__init__(
            soft_least_quantile_regression_loss,
            dict(quantile=quantile, width=width, error_power=_checked_error_power(error_power)),
            options=options, squash=squash, targets=targets, reduction=reduction, name=name,
            dtype=dtype, **kwargs)
        self.quantile, self.width, self.error_power = quantile, width, float(error_power)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SoftTrimmedRegressionLoss(_BatchStatisticLoss):
    """Soft mean of the batch errors between two quantiles: trimmed regression (§4).

    Sinkhorn only (no `method=`): the statistic is read off the target bins of the
    Sinkhorn transport plan, which the other families of `FAMILIES` do not define.

    With errors e_i = |y_i − ŷ_i|^error_power over the B examples of the batch and uniform
    masses a = 1/B,

        loss = ( S̃(a, e; b) )_mid,   b = [s, e − s, 1 − e],

    the middle value of the Sinkhorn sort of the errors onto a three-bin target
    (`sinkhorn_trimmed_mean`): the same transport problem as the S-quantile of eq. (4)
    with a wider middle bin. As ε → 0 it is the mean of the errors between the s- and
    e-quantiles, i.e. a trimmed mean (least trimmed absolute/squared deviations:
    e.g. s = 0, e = 0.7 ignores the largest 30% of errors). See `_BatchStatisticLoss`
    for `sample_weight`, masks and reductions.

    Args:
      start_quantile: s in [0, 1) (default 0).
      end_quantile: e in (s, 1] (default 0.5).
      error_power: error exponent (default 1).
      options, squash, targets, **kwargs: the Sinkhorn settings (`SinkhornLoss`), e.g.
        `epsilon` (default 1e-2).
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
                 error_power: float = 1.0, *, options: SinkhornOptions | dict | None = None,
                 squash="logistic", targets: str = "regular",
                 reduction: str | None = "sum_over_batch_size",
                 name: str = "soft_trimmed_regression_loss", dtype=None, **kwargs):
        start, end = hard_stats.check_mass_interval(start_quantile, end_quantile,
                                                    "start_quantile", "end_quantile")
        super().__init__(
            soft_trimmed_regression_loss,
            dict(start_quantile=start, end_quantile=end,
                 error_power=_checked_error_power(error_power)),
            options=options, squash=squash, targets=targets, reduction=reduction, name=name,
            dtype=dtype, **kwargs)
        self.start_quantile, self.end_quantile = start, end
        self.error_power = float(error_power)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SoftQuantileRegressionLoss(_BatchStatisticLoss):
    """Quantile regression with the τ-S-quantile of the batch residuals (paper §4, Table 1).

    Sinkhorn only (no `method=`): the statistic is read off the target bins of the
    Sinkhorn transport plan, which the other families of `FAMILIES` do not define.

    §4 states quantile regression as minimising the τ-quantile of ξ, the measure with
    uniform weights on the residuals x_i = y_i − ŷ_i of the batch. Taken literally this
    is unbounded below (a constant added to ŷ lowers every quantile of ξ), so the loss
    reads it through the variational definition of the quantile that the pinball loss
    encodes: the τ-quantile of ξ is q = argmin_c ∫ ρ_τ(x − c) dξ(x), and at that c

        min_c ∫ ρ_τ(x − c) dξ = τ · mean(x) − (mass τ of ξ below q) · (mean of that mass).

    Both terms are read off the transport of eq. (4): ξ is sent onto three bins of masses
    b = [τ − t/2, t, 1 − τ − t/2] (`quantile_bins`), whose means Q̃ = b⁻¹ ∘ (Pᵀ x)
    (Definition 2) give the τ-S-quantile Q̃_2. The mass τ below q is bin 1 plus half of
    bin 2, so

        loss = τ · mean(x) − b_1 · Q̃_1 − (t/2) · Q̃_2 + Q̃_2².

    The first three terms are the τ-quantile loss of the residuals (as ε → 0 exactly
    min_c of the mean pinball loss when τ·B and t·B/2 are integers); they do not change
    when a constant is added to ŷ, so the last term places ŷ: it drives the
    τ-S-quantile of the residuals to 0, i.e. a fraction τ of the targets below the
    predictions. The gradient reaches every residual through the transport plan. See
    `_BatchStatisticLoss` for how `sample_weight`, masks and reductions apply to this
    batch statistic, and `soft_quantile_regression_loss` for the shares.

    Args:
      quantile: τ in (0, 1) (default 0.5).
      width: t, the mass of the middle bin; default min(0.1, τ, 1 − τ) (the paper's
        t = 0.1).
      options, squash, targets, **kwargs: the Sinkhorn settings (`SinkhornLoss`):
        `epsilon` (default 1e-2, the paper's ε), `squash` (how the residuals are mapped
        into [0, 1]; default 'logistic', as in the paper), `targets` (where the three
        bins sit on [0, 1]; default 'regular': 0, 1/2, 1, the paper's grid), ...
      reduction, name, dtype: as in `keras.losses.Loss` (see `_BatchStatisticLoss`).

    Input shapes: `y_true`, `y_pred` `[batch]` or `[batch, 1]`; `sample_weight`
    `[batch]`. Output: a scalar (or the `[batch]` shares for reduction 'none').

    Example:
    >>> loss = SoftQuantileRegressionLoss(quantile=0.5, epsilon=1e-3)
    >>> y = np.linspace(-1.0, 1.0, 101).astype("float32")
    >>> bool(abs(float(loss(y, np.zeros_like(y))) - np.mean(np.abs(y)) / 2) < 0.02)
    True
    """

    def __init__(self, quantile: float = 0.5, width: float | None = None, *,
                 options: SinkhornOptions | dict | None = None, squash="logistic",
                 targets: str = "regular", reduction: str | None = "sum_over_batch_size",
                 name: str = "soft_quantile_regression_loss", dtype=None, **kwargs):
        quantile, width = _checked_level(quantile, width)
        super().__init__(soft_quantile_regression_loss, dict(quantile=quantile, width=width),
                         options=options, squash=squash, targets=targets,
                         reduction=reduction, name=name, dtype=dtype, **kwargs)
        self.quantile, self.width = quantile, width


def pinball_loss(y_true, y_pred, quantile: float):
    """Per-example pinball loss ρ_q(y − ŷ) = max(q (y − ŷ), (q − 1)(y − ŷ)).

    Its expectation is minimised by the q-quantile of y: the loss of quantile
    regression (Koenker & Bassett, 1978).

    Args:
      y_true: targets `[batch]` or `[batch, 1]`.
      y_pred: predictions of the same shape.
      quantile: the level q in (0, 1).

    Returns:
      `[batch]` losses, in the float dtype of `y_pred`.

    Example:
    >>> pinball_loss([1.0, 0.0], [0.0, 1.0], quantile=0.1).numpy().round(2)
    array([0.1, 0.9], dtype=float32)
    """
    quantile = _checks.check_in_open_interval("quantile", quantile, 0.0, 1.0)
    r = _residuals(y_true, y_pred)
    return tf.maximum(quantile * r, (quantile - 1.0) * r)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class PinballLoss(LossFunctionWrapper):
    """The mean pinball loss at level `quantile` (see `pinball_loss`).

    Args:
      quantile: the level q in (0, 1) (default 0.5: half the absolute error).
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch]` or `[batch, 1]`. Output: a scalar (`[batch]` for reduction
    'none').

    Example:
    >>> float(PinballLoss(quantile=0.5)([1.0, 3.0], [2.0, 2.0]))
    0.5
    """

    def __init__(self, quantile: float = 0.5, *,
                 reduction: str | None = "sum_over_batch_size", name: str = "pinball_loss",
                 dtype=None):
        self.quantile = _checks.check_in_open_interval("quantile", quantile, 0.0, 1.0)
        super().__init__(pinball_loss, reduction=reduction, name=name, dtype=dtype,
                         quantile=self.quantile)

"""Regression losses: soft least-quantile, trimmed and quantile regression (paper §4),
and the pinball loss.

The soft losses are batch statistics read off the transport of the batch's errors (or
residuals) onto a few target bins, as one share per example (`batch_statistic_shares`),
which Keras reduces like any per-example loss. They are Sinkhorn only (the other
families define no target bins), ε by default 1e-2, the paper's.
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

    The middle value of `sinkhorn_sort(x, target_weights=b)` with b = [s, e − s, 1 − e]
    for s = `start_quantile`, e = `end_quantile` (the transport of the S-quantile,
    eq. 4, with a wider middle bin). As ε → 0 it is the mean of the values whose
    cumulative mass lies in [s, e] (`hard_stats.interval_mean`).

    Args:
      x: `[..., n, ...]` real tensor, or a `tf.RaggedTensor` ragged along its last axis.
      start_quantile, end_quantile: 0 ≤ s < e ≤ 1.
      axis: the sample axis (-1 for a ragged x).
      weights, squash, targets, options, **option_kwargs: as in `sinkhorn_sort`.

    Returns:
      The shape of x without `axis` (ragged x: dense `[lists]` for `[lists, (n)]`,
      ragged over its outer axes otherwise; 0 for an empty list).

    Example:
    >>> m = sinkhorn_trimmed_mean([4.0, 1.0, 3.0, 2.0, 100.0], 0.2, 0.8, epsilon=1e-4)
    >>> round(float(m), 2)
    3.0
    """
    b, index = trimmed_target_weights(start_quantile, end_quantile)
    ragged = isinstance(x, tf.RaggedTensor)
    if not ragged:
        x = tf.convert_to_tensor(x)
        axis = _checks.check_axis(axis, x.shape.rank)
    values = sinkhorn_ops.sinkhorn_sort(
        x, axis=axis, target_weights=b, weights=weights, squash=squash, targets=targets,
        options=options, **option_kwargs)
    if not ragged:
        return tf.gather(values, index, axis=axis)
    # Entry `index` of each ragged list (an empty list's row is empty: 0).
    splits = values.nested_row_splits
    lists = tf.RaggedTensor.from_row_splits(values.flat_values, splits[-1], validate=False)
    middle = lists.to_tensor(default_value=0, shape=[None, len(b)])[:, index]
    if len(splits) == 1:
        return middle
    return tf.RaggedTensor.from_nested_row_splits(middle, splits[:-1], validate=False)


def quantile_bins(quantile: float, width: float | None = None) -> tuple[np.ndarray, float]:
    """`(b, t)`: the three bins b = [τ − t/2, t, 1 − τ − t/2] of the S-quantile at level
    τ = `quantile` in (0, 1) (eq. 4) and the width t of the middle bin, by default
    min(0.1, τ, 1 − τ) (the paper's t = 0.1, capped so that every bin has a positive
    mass); a `ValueError` for t outside (0, 2·min(τ, 1 − τ))."""
    quantile = _checks.check_in_open_interval("quantile", quantile, 0.0, 1.0)
    if width is None:
        width = min(DEFAULT_QUANTILE_WIDTH, quantile, 1.0 - quantile)
    return sinkhorn_ops.quantile_target_weights(quantile, width)


@list_operator
def batch_statistic_shares(values, *, mask=None, target_weights, shares_fn,
                           squash="logistic", targets: str = "regular",
                           options: SinkhornOptions | dict | None = None, **option_kwargs):
    """Per-example shares of a soft statistic of a batch of values (one list).

    The values v_i (`[B]`, uniform masses over the B_v valid entries) are transported
    onto the bins b (`target_weights`, ascending); with P the plan, the mean of bin j is
    Q̃_j = Σ_i c_ij, c_ij = P_ij v_i / (column j's sum). `shares_fn(c, v, count)` (c
    `[1, B, m]`, 0 on padded rows; v `[1, B]`; count = B_v `[1, 1]`, ≥ 1) returns the
    `[1, B]` shares s_i whose sum over the valid entries is the statistic S.

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


def _float_examples(y_true, y_pred, mask=None):
    """`(y_true, y_pred)` as dense tensors in the float dtype of `y_pred`, the examples
    `mask` (`[batch]`) marks False replaced by 0 before any arithmetic."""
    _checks.check_dense("y_pred", y_pred, mask=None)
    _checks.check_dense("y_true", y_true, mask=None)
    y_pred = tf.convert_to_tensor(y_pred)
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


def _error_shares(y_true, y_pred, error_power, mask, bins, index, settings):
    """Shares of the mean of bin `index` of the errors |y − ŷ|^error_power on `bins`."""
    errors = regression_errors(*_float_examples(y_true, y_pred, mask),
                               _checks.check_positive("error_power", error_power))
    return batch_statistic_shares(
        errors, mask=mask, target_weights=bins,
        shares_fn=lambda contributions, values, count: contributions[..., index], **settings)


def _checked_level(quantile, width) -> dict:
    """`{quantile: τ, width: t}` of an S-quantile loss, validated (`quantile_bins` checks
    t against τ); t stays None for the default width."""
    quantile = _checks.check_in_open_interval("quantile", quantile, 0.0, 1.0)
    width = _checks.check_positive("width", width, allow_none=True)
    quantile_bins(quantile, width)
    return dict(quantile=quantile, width=width)


def soft_least_quantile_regression_loss(y_true, y_pred, quantile: float = 0.5,
                                        width: float | None = None,
                                        error_power: float = 1.0, *, mask=None,
                                        **settings):
    """`[batch]` shares of the soft τ-quantile of the batch errors (paper §4, eq. 4),
    whose mean over the valid examples is the statistic of
    `SoftLeastQuantileRegressionLoss`.

    Args:
      y_true, y_pred: `[batch]` or `[batch, d]`.
      quantile, width, error_power: as in `SoftLeastQuantileRegressionLoss`.
      mask: optional boolean `[batch]`, False for padding (left out of the statistic).
      **settings: the Sinkhorn settings (`squash`, `targets`, `options`, `epsilon`, ...).

    Returns:
      `[batch]` shares in the dtype of `y_pred` (0 at padding).

    Example:
    >>> errors = soft_least_quantile_regression_loss(
    ...     np.zeros(5), np.array([1.0, -2.0, 3.0, 50.0, -90.0]), epsilon=1e-4)
    >>> round(float(tf.reduce_mean(errors)), 2)
    3.0
    """
    b, _ = quantile_bins(quantile, width)
    return _error_shares(y_true, y_pred, error_power, mask, b, 1, settings)


def soft_trimmed_regression_loss(y_true, y_pred, start_quantile: float = 0.0,
                                 end_quantile: float = 0.5, error_power: float = 1.0, *,
                                 mask=None, **settings):
    """`[batch]` shares of the soft mean of the batch errors between two quantiles, the
    statistic of `SoftTrimmedRegressionLoss`.

    Args:
      y_true, y_pred, error_power, mask, **settings: as in
        `soft_least_quantile_regression_loss`.
      start_quantile, end_quantile: the quantiles between which errors are averaged
        (0 ≤ start < end ≤ 1).

    Returns:
      `[batch]` shares in the dtype of `y_pred` (0 at padding).

    Example:
    >>> shares = soft_trimmed_regression_loss(
    ...     np.zeros(4), np.array([1.0, -2.0, 3.0, 100.0]), 0.0, 0.5, epsilon=1e-4)
    >>> round(float(tf.reduce_mean(shares)), 2)
    1.5
    """
    b, index = trimmed_target_weights(start_quantile, end_quantile)
    return _error_shares(y_true, y_pred, error_power, mask, b, index, settings)


def _residuals(y_true, y_pred, mask=None):
    """Residuals y − ŷ `[batch]` of targets and predictions `[batch]` or `[batch, 1]`, in
    the float dtype of `y_pred` (padding as in `_float_examples`)."""
    y_true, y_pred = align(*_float_examples(y_true, y_pred, mask))
    if y_pred.shape.rank == 2 and y_pred.shape[-1] == 1:
        y_true, y_pred = y_true[:, 0], y_pred[:, 0]
    if y_pred.shape.rank != 1:
        raise ValueError(f"`y_pred` must have shape [batch] or [batch, 1] (one quantile "
                         f"per example), got {y_pred.shape}.")
    return y_true - y_pred


def soft_quantile_regression_loss(y_true, y_pred, quantile: float = 0.5,
                                  width: float | None = None, *, mask=None, **settings):
    """`[batch]` shares of the τ-S-quantile loss L of the batch residuals (§4, Table 1;
    `SoftQuantileRegressionLoss`): example i's is τ x_i / B − b_1 c_i1 − (t/2) c_i2 +
    Q̃_2² / B (c as in `batch_statistic_shares`).

    Args:
      y_true, y_pred: `[batch]` or `[batch, 1]` (one predicted quantile per example).
      quantile, width, mask, **settings: as in `soft_least_quantile_regression_loss`.

    Returns:
      `[batch]` shares in the dtype of `y_pred` (0 at padding); their sum is L.

    Example (L of a constant prediction c is smallest where c is the targets' median,
    here between 2 and 3; at τ = 0.75 between 3 and 4):
    >>> y = np.array([1.0, 2.0, 3.0, 4.0])
    >>> def loss(c, tau):
    ...     shares = soft_quantile_regression_loss(y, np.full(4, c), quantile=tau)
    ...     return round(float(tf.reduce_sum(shares)), 1)
    >>> [loss(c, 0.5) for c in (1.5, 2.5, 3.5)]
    [5.9, 1.9, 5.9]
    >>> [loss(c, 0.75) for c in (2.5, 3.5)]
    [5.4, 1.4]
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

    return batch_statistic_shares(_residuals(y_true, y_pred, mask), mask=mask,
                                  target_weights=b, shares_fn=shares_fn, **settings)


def _per_example(flags):
    """`[B, ...]` booleans to `[B]`: an example counts where any of its entries does."""
    if flags.shape.rank is not None and flags.shape.rank > 1:
        flags = tf.reduce_any(flags, axis=list(range(1, flags.shape.rank)))
    return flags


class _BatchStatisticLoss(SinkhornLoss):
    """A `SinkhornLoss` whose functional form returns the shares of a batch statistic S
    (`batch_statistic_shares`).

    Reductions: 'sum_over_batch_size' (default): S; 'sum': B·S; 'none': the shares.
    Padding: an example whose `sample_weight` is 0, or that a Keras mask of `y_pred`
    marks False, has no mass in the transport (whatever its values, NaN included, and
    with zero gradient): S is that of the B_v valid examples, a padded example's share
    is 0. Keras then reduces as for any loss: with 0/1 sample weights the default
    reduction gives (B_v/B)·S ('mean_with_sample_weight' gives S), with a Keras mask S.
    Other weights multiply each example's share. A batch without a valid example has
    loss 0 and zero gradient.

    The batch size may be unknown when traced, also under XLA. Under `tf.distribute`
    each replica computes S over its own slice of the batch (as an unsynchronised
    `BatchNormalization`), and Keras averages the replicas' losses.
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

    With errors e_i = |y_i − ŷ_i|^error_power over the batch and uniform masses, the loss
    is the τ-S-quantile of eq. (4), (Q̃(a, e; [τ − t/2, t, 1 − τ − t/2]))_2: the mean of
    the errors transported onto a bin of mass t centred on level τ. As ε → 0 it is the
    mean of the errors whose cumulative mass lies in [τ − t/2, τ + t/2]. With τ = 0.5, a
    least-median regression that ignores up to half of the batch as outliers.

    Args:
      quantile: τ in (0, 1) (default 0.5, least median).
      error_power: error exponent (default 1: absolute errors; 2: squared).
      width: bin mass t; default min(0.1, τ, 1 − τ) (the paper's t = 0.1); larger widths
        average more errors (smoother), smaller ones approach the exact quantile.
      options, squash, targets, **kwargs: the Sinkhorn settings (`SinkhornLoss`).
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch]` or `[batch, d]`; `sample_weight` `[batch]`.

    Example:
    >>> loss = SoftLeastQuantileRegressionLoss(quantile=0.5, epsilon=1e-4)
    >>> y = np.array([0.0, 0.0, 0.0, 0.0, 0.0])
    >>> round(float(loss(y, np.array([1.0, -2.0, 3.0, 50.0, -90.0]))), 2)
    3.0
    """

    def __init__(self, quantile: float = 0.5, error_power: float = 1.0,
                 width: float | None = None, *, reduction: str | None = "sum_over_batch_size",
                 name: str = "soft_least_quantile_regression_loss", dtype=None, **kwargs):
        super().__init__(
            soft_least_quantile_regression_loss,
            dict(**_checked_level(quantile, width),
                 error_power=_checks.check_positive("error_power", error_power)),
            reduction=reduction, name=name, dtype=dtype, **kwargs)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SoftTrimmedRegressionLoss(_BatchStatisticLoss):
    """Soft mean of the batch errors between two quantiles: trimmed regression (§4).

    With errors e_i = |y_i − ŷ_i|^error_power over the batch, the loss is the middle
    value of their Sinkhorn sort onto b = [s, e − s, 1 − e] (`sinkhorn_trimmed_mean`). As
    ε → 0 it is the mean of the errors between the s- and e-quantiles, a trimmed mean
    (e.g. s = 0, e = 0.7 ignores the largest 30% of errors).

    Args:
      start_quantile: s in [0, 1) (default 0).
      end_quantile: e in (s, 1] (default 0.5).
      error_power: error exponent (default 1).
      options, squash, targets, **kwargs: the Sinkhorn settings (`SinkhornLoss`).
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch]` or `[batch, d]`; `sample_weight` `[batch]`.

    Example:
    >>> loss = SoftTrimmedRegressionLoss(0.0, 0.8, epsilon=1e-4)
    >>> y = np.zeros(5)
    >>> round(float(loss(y, np.array([1.0, -2.0, 3.0, 2.0, -90.0]))), 2)
    2.0
    """

    def __init__(self, start_quantile: float = 0.0, end_quantile: float = 0.5,
                 error_power: float = 1.0, *, reduction: str | None = "sum_over_batch_size",
                 name: str = "soft_trimmed_regression_loss", dtype=None, **kwargs):
        start, end = hard_stats.check_mass_interval(start_quantile, end_quantile,
                                                    "start_quantile", "end_quantile")
        super().__init__(
            soft_trimmed_regression_loss,
            dict(start_quantile=start, end_quantile=end,
                 error_power=_checks.check_positive("error_power", error_power)),
            reduction=reduction, name=name, dtype=dtype, **kwargs)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SoftQuantileRegressionLoss(_BatchStatisticLoss):
    """Quantile regression with the τ-S-quantile of the batch residuals (§4, Table 1).

    The τ-quantile q of the residuals x_i = y_i − ŷ_i is read through the pinball loss
    (the τ-quantile of x itself is unbounded below in ŷ): min_c mean ρ_τ(x − c) =
    τ · mean(x) − (mass τ of x below q) · (mean of that mass). With the three bins
    b = [τ − t/2, t, 1 − τ − t/2] of eq. (4) (`quantile_bins`) and their means
    Q̃ = b⁻¹ ∘ (Pᵀ x) (Definition 2), the mass below q is bin 1 plus half of bin 2:

        loss = τ · mean(x) − b_1 · Q̃_1 − (t/2) · Q̃_2 + Q̃_2².

    The first three terms (as ε → 0, min_c of the mean pinball loss when τ·B and t·B/2
    are integers) do not change when a constant is added to ŷ; the last places ŷ, driving
    the τ-S-quantile of the residuals to 0.

    Args:
      quantile: τ in (0, 1) (default 0.5).
      width: t, the mass of the middle bin; default min(0.1, τ, 1 − τ).
      options, squash, targets, **kwargs: the Sinkhorn settings (`SinkhornLoss`).
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch]` or `[batch, 1]`; `sample_weight` `[batch]`.

    Example:
    >>> loss = SoftQuantileRegressionLoss(quantile=0.5, epsilon=1e-3)
    >>> y = np.linspace(-1.0, 1.0, 101).astype("float32")
    >>> bool(abs(float(loss(y, np.zeros_like(y))) - np.mean(np.abs(y)) / 2) < 0.02)
    True
    """

    def __init__(self, quantile: float = 0.5, width: float | None = None, *,
                 reduction: str | None = "sum_over_batch_size",
                 name: str = "soft_quantile_regression_loss", dtype=None, **kwargs):
        super().__init__(soft_quantile_regression_loss, _checked_level(quantile, width),
                         reduction=reduction, name=name, dtype=dtype, **kwargs)


def pinball_loss(y_true, y_pred, quantile: float):
    """Per-example pinball loss ρ_q(y − ŷ) = max(q (y − ŷ), (q − 1)(y − ŷ)), whose
    expectation the q-quantile of y minimises (Koenker & Bassett, 1978).

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

    Example:
    >>> float(PinballLoss(quantile=0.5)([1.0, 3.0], [2.0, 2.0]))
    0.5
    """

    def __init__(self, quantile: float = 0.5, *,
                 reduction: str | None = "sum_over_batch_size", name: str = "pinball_loss",
                 dtype=None):
        super().__init__(pinball_loss, reduction=reduction, name=name, dtype=dtype,
                         quantile=_checks.check_in_open_interval("quantile", quantile,
                                                                 0.0, 1.0))

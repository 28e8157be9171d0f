"""The Kendall τ loss: 1 − the smooth Kendall's τ of each list."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from softsort_tf.ops import kendall as kendall_ops

_PACKAGE = "softsort_tf"


def _full_precision(dtype):
    """`dtype`, or 'float32' where it (or the global policy, for None) computes in
    float16/bfloat16: the loss is computed and returned in float32 under mixed
    precision."""
    policy = keras.dtype_policies.get(dtype) if dtype is not None else (
        keras.config.dtype_policy())
    return "float32" if policy.compute_dtype in ("float16", "bfloat16") else dtype


@keras.saving.register_keras_serializable(package=_PACKAGE)
class KendallTauLoss(keras.losses.Loss):
    """1 − smooth Kendall's τ per list, for learning to rank.

        loss = 1 − τ̃(y, ŷ),   τ̃ = E_ε[τ_b(y, ŷ + ε)],  ε ~ N(0, σ² I),

    the expected Kendall's τ-b of the targets and the predictions perturbed by
    Gaussian noise (`softsort_tf.ops.kendall.soft_kendall_tau`): a sum over pairs of
    target signs times the soft sign erf((ŷ_j − ŷ_i)/(2σ)), the smooth signed Kendall
    embedding of the predictions (Jiao & Vert 2015, §2). In [0, 2]; as σ → 0 it tends
    to 1 − τ-b. σ is in units of the scores: pairs of predictions further apart than a
    few σ have a saturated soft sign and no gradient, so the loss also rewards
    separating the scores. O(n²) time and memory per list. A list with fewer than two
    valid items or all targets tied has no order: loss 1, zero gradient. A NaN
    prediction or target at a valid entry gives a NaN loss for that list.

    Args:
      smooth_scale: σ > 0 (default 1).
      axis: the list axis (default −1).
      negative_labels_are_padding: treat y_true < 0 as padding (default True, as
        `KendallTau`; set False for targets that may be negative). A Keras mask of
        `y_pred` of its shape (one flag per item) also marks padding; padded entries
        get zero gradient.
      reduction, name, dtype: as in `keras.losses.Loss`; under a float16/bfloat16
        policy the loss computes in float32.

    Input shapes: `[batch, n]` (lists along `axis`; n may be unknown when the model is
    built, also under XLA); `sample_weight` one weight per list. Output: a scalar, or
    the per-list losses for reduction 'none'.

    Example:
    >>> loss = KendallTauLoss(smooth_scale=0.01)
    >>> round(float(loss([[1.0, 2.0, 3.0]], [[0.1, 0.2, 0.3]])), 4)
    0.0
    """

    def __init__(self, smooth_scale: float = 1.0, axis: int = -1, *,
                 negative_labels_are_padding: bool = True,
                 reduction: str | None = "sum_over_batch_size",
                 name: str = "kendall_tau_loss", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=_full_precision(dtype))
        self.smooth_scale = kendall_ops._check_smooth_scale(smooth_scale, allow_none=False)
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise ValueError(f"`axis` must be an integer, got {axis!r}.")
        self.axis = int(axis)
        self.negative_labels_are_padding = kendall_ops._check_bool(
            "negative_labels_are_padding", negative_labels_are_padding)

    def __call__(self, y_true, y_pred, sample_weight=None):
        # A Keras mask of y_pred with one flag per item marks padding; Keras would
        # otherwise apply it to the per-list losses.
        mask = getattr(y_pred, "_keras_mask", None)
        if mask is not None and mask.shape.rank == y_pred.shape.rank:
            y_pred = tf.identity(y_pred)
            y_true = (y_true, tf.cast(mask, tf.bool))
        return super().__call__(y_true, y_pred, sample_weight)

    def call(self, y_true, y_pred):
        mask = None
        if isinstance(y_true, tuple):
            y_true, mask = y_true
        tau = kendall_ops.soft_kendall_tau(
            y_true, y_pred, smooth_scale=self.smooth_scale, mask=mask, axis=self.axis,
            negative_labels_are_padding=self.negative_labels_are_padding)
        return 1.0 - tau

    def get_config(self) -> dict:
        return {**super().get_config(), "smooth_scale": self.smooth_scale,
                "axis": self.axis,
                "negative_labels_are_padding": self.negative_labels_are_padding}

"""The Kendall τ loss: 1 − the smooth Kendall's τ of each list."""

from __future__ import annotations

import keras

from softsort_tf import _checks
from softsort_tf.losses.base import ListLoss
from softsort_tf.ops.kendall import soft_kendall_tau

_PACKAGE = "softsort_tf"


def kendall_tau_loss(y_true, y_pred, axis: int = -1, *, smooth_scale: float = 1.0,
                     mask=None, negative_labels_are_padding: bool = False):
    """1 − `soft_kendall_tau(y_true, y_pred, ...)` per list: `[...]` losses in [0, 2].

    Example:
    >>> round(float(kendall_tau_loss([1.0, 2.0, 3.0], [0.1, 0.2, 0.3], smooth_scale=0.01)), 4)
    0.0
    """
    return 1.0 - soft_kendall_tau(y_true, y_pred, smooth_scale=smooth_scale, mask=mask,
                                  axis=axis,
                                  negative_labels_are_padding=negative_labels_are_padding)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class KendallTauLoss(ListLoss):
    """1 − smooth Kendall's τ per list, for learning to rank (`kendall_tau_loss`).

        loss = 1 − τ̃(y, ŷ),   τ̃ = E_ε[τ_b(y, ŷ + ε)],  ε ~ N(0, σ² I),

    the expected Kendall's τ-b of the targets and the predictions perturbed by Gaussian
    noise (`softsort_tf.ops.kendall.soft_kendall_tau`; Jiao & Vert 2015, §2). In [0, 2];
    → 1 − τ-b as σ → 0. σ is in units of the scores: pairs further apart than a few σ
    get no gradient, so the loss also rewards separating the scores. O(n²) per list. A
    list with fewer than two valid items or all targets tied has loss 1 and zero
    gradient; a NaN at a valid entry gives a NaN loss for that list.

    Args:
      smooth_scale: σ > 0 (default 1).
      axis: the list axis (default −1).
      negative_labels_are_padding: treat y_true < 0 as padding (default False: the
        targets of a correlation are real values). A Keras mask of `y_pred` of its
        shape also marks padding.
      reduction, name, dtype: as in `keras.losses.Loss`.

    Input shapes: `[batch, n]` (lists along `axis`; n may be unknown when the model is
    built, also under XLA); `sample_weight` one weight per list.

    Example:
    >>> loss = KendallTauLoss(smooth_scale=0.01)
    >>> round(float(loss([[1.0, 2.0, 3.0]], [[0.1, 0.2, 0.3]])), 4)
    0.0
    """

    def __init__(self, smooth_scale: float = 1.0, axis: int = -1, *,
                 negative_labels_are_padding: bool = False,
                 reduction: str | None = "sum_over_batch_size",
                 name: str = "kendall_tau_loss", dtype=None):
        super().__init__(
            kendall_tau_loss, reduction=reduction, name=name, dtype=dtype,
            axis=_checks.check_int("axis", axis),
            smooth_scale=_checks.check_positive("smooth_scale", smooth_scale),
            negative_labels_are_padding=_checks.check_bool(
                "negative_labels_are_padding", negative_labels_are_padding))

"""Kendall's τ-b as a streaming Keras metric over lists."""

from __future__ import annotations

import keras

from softsort_tf import _checks
from softsort_tf.metrics.ranking import PerListMean
from softsort_tf.ops import kendall as kendall_ops

_PACKAGE = "softsort_tf"


def _kendall_tau_and_weights(y_true, y_pred, **kwargs):
    return kendall_ops.kendall_tau(y_true, y_pred, return_weights=True, **kwargs)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class KendallTau(PerListMean):
    """Mean Kendall's τ-b (`softsort_tf.ops.kendall.kendall_tau`) over lists.

    The (sample-weighted) mean over all lists seen (`PerListMean`) of τ-b of each
    list's valid targets and predictions (`scipy.stats.kendalltau`); padding as for
    `SpearmanCorrelation`. A list with fewer than two valid items, or whose valid
    targets or predictions are all tied, is skipped (weight 0). An empty stream gives
    0; a NaN at a valid entry gives NaN.

    Args:
      axis: the list axis (default −1).
      negative_labels_are_padding: treat y_true < 0 as padding (default False: the
        targets of a correlation are real values).
      algorithm: 'auto', 'pairwise' or 'merge' (see `kendall_tau`).
      name, dtype: as in `keras.metrics.Metric`.

    `update_state(y_true, y_pred, sample_weight=None)`: `[..., n]` targets and scores
    (n may vary between batches, also under XLA), `sample_weight` one per list.

    Example:
    >>> m = KendallTau()
    >>> m.update_state([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]], [[1.0, 3.0, 2.0], [1.0, 2.0, 3.0]])
    >>> round(float(m.result()), 4)
    0.3333
    """

    _fn = staticmethod(_kendall_tau_and_weights)

    def __init__(self, axis: int = -1, *, negative_labels_are_padding: bool = False,
                 algorithm: str = "auto", name: str = "kendall_tau", dtype=None):
        super().__init__(name, dtype, axis=_checks.check_int("axis", axis),
                         negative_labels_are_padding=_checks.check_bool(
                             "negative_labels_are_padding", negative_labels_are_padding),
                         algorithm=_checks.check_choice("algorithm", algorithm,
                                                        kendall_ops.ALGORITHMS))

"""Exact and element-wise accuracies of a relaxed permutation matrix."""

from __future__ import annotations

import keras
import tensorflow as tf

from softsort_tf._permutation_targets import check_format, hard_orders, per_example_mean

_PACKAGE = "softsort_tf"


def exact_permutation_accuracy(y_true, y_pred, y_true_format: str = "auto", *, mask=None):
    """1.0 where the row-wise argmax of P̂ recovers the whole true permutation, else 0.0
    (the papers' "proportion of whole permutations correct"); averaged over the sample
    axes of a stochastic `y_pred`.

    Args:
      y_true: the true permutation matrix `[..., n, n]` or ordering `[..., n]`.
      y_pred: P̂ `[..., (S,) n, n]`.
      y_true_format: 'auto' (default), 'indices' or 'matrix'.
      mask: optional boolean `[..., n]` of the valid items (orderings may instead hold
        −1 after the n_valid indices): only the valid rows count; a list without any
        gives 0.

    Returns:
      float32 per-example values, the leading shape of `y_true`.

    Example:
    >>> P = tf.constant([[[0.9, 0.1], [0.2, 0.8]], [[0.9, 0.1], [0.6, 0.4]]])
    >>> exact_permutation_accuracy([[0, 1], [0, 1]], P).numpy()
    array([1., 0.], dtype=float32)
    """
    correct, rows_valid, num_sample_axes = hard_orders(y_true, y_pred, y_true_format, mask)
    if rows_valid is not None:
        valid = tf.broadcast_to(rows_valid, tf.shape(correct))
        correct = tf.logical_and(tf.logical_or(correct, tf.logical_not(valid)),
                                 tf.reduce_any(valid, axis=-1, keepdims=True))
    whole = tf.cast(tf.reduce_all(correct, axis=-1), tf.float32)
    return tf.reduce_mean(whole[..., None], axis=list(range(-1 - num_sample_axes, 0)))


def elementwise_permutation_accuracy(y_true, y_pred, y_true_format: str = "auto", *,
                                     mask=None):
    """Fraction of positions whose row-wise argmax of P̂ is the true item (the papers'
    "proportion of elements correctly placed"), averaged over the sample axes of a
    stochastic `y_pred`.

    Args:
      y_true, y_pred, y_true_format, mask: as in `exact_permutation_accuracy`; only the
        valid rows count.

    Returns:
      float32 per-example values in [0, 1], the leading shape of `y_true`.

    Example:
    >>> P = tf.constant([[[0.9, 0.1, 0.0], [0.6, 0.4, 0.0], [0.0, 0.0, 1.0]]])
    >>> elementwise_permutation_accuracy([[0, 1, 2]], P).numpy()
    array([0.6666667], dtype=float32)
    """
    correct, rows_valid, num_sample_axes = hard_orders(y_true, y_pred, y_true_format, mask)
    return per_example_mean(tf.cast(correct, tf.float32), num_sample_axes, rows_valid)


class _PermutationAccuracy(keras.metrics.MeanMetricWrapper):
    """A `keras.metrics.Mean` of a per-example accuracy (`_metric_fn`) of the row-wise
    argmax permutations.

    Args:
      name, dtype: as in `keras.metrics.Metric` (default name: that of `_metric_fn`).
      y_true_format: 'auto' (default), 'indices' or 'matrix'.
    """

    def __init__(self, name: str | None = None, dtype=None, y_true_format: str = "auto"):
        fn = type(self)._metric_fn
        super().__init__(fn=fn, name=name or fn.__name__, dtype=dtype,
                         y_true_format=check_format(y_true_format))
        self.y_true_format = y_true_format
        self._direction = "up"

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "y_true_format": self.y_true_format}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class ExactPermutationAccuracy(_PermutationAccuracy):
    """Proportion of examples whose whole permutation is recovered by the row-wise
    argmax of P̂ (`exact_permutation_accuracy`), a running mean over the batches.

    Args:
      name: the metric's name (default 'exact_permutation_accuracy').
      dtype: the dtype of the result (default float32).
      y_true_format: 'auto' (default), 'indices' (`y_true` `[batch, n]` orderings) or
        'matrix' (`[batch, n, n]` permutation matrices).

    `update_state(y_true, y_pred, sample_weight=None)` takes P̂ `[batch, (S,) n, n]`
    as `y_pred` and weights the examples by `sample_weight` `[batch]`.

    Example:
    >>> m = ExactPermutationAccuracy()
    >>> m.update_state([[1, 0]], tf.constant([[[0.2, 0.8], [0.7, 0.3]]]))
    >>> float(m.result())
    1.0
    """

    _metric_fn = staticmethod(exact_permutation_accuracy)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class ElementwisePermutationAccuracy(_PermutationAccuracy):
    """Proportion of positions placed right by the row-wise argmax of P̂, averaged over
    examples (`elementwise_permutation_accuracy`), a running mean over the batches.

    Args:
      name: the metric's name (default 'elementwise_permutation_accuracy').
      dtype, y_true_format: as in `ExactPermutationAccuracy`.

    Example:
    >>> m = ElementwisePermutationAccuracy()
    >>> m.update_state([[0, 1]], tf.constant([[[0.6, 0.4], [0.9, 0.1]]]))
    >>> float(m.result())
    0.5
    """

    _metric_fn = staticmethod(elementwise_permutation_accuracy)

"""Cross-entropy loss for learning to sort with relaxed permutation matrices."""

from __future__ import annotations

import keras
import tensorflow as tf

from softsort_tf import _checks, _shapes
from softsort_tf.ops.permutation_targets import _check_format, _per_example, _pick, _read_targets

_PACKAGE = "softsort_tf"
_not_converted = tf.autograph.experimental.do_not_convert  # no tensor-dependent control flow
DEFAULT_EPSILON = 1e-7


@_not_converted
def permutation_cross_entropy(y_true, y_pred, epsilon: float = DEFAULT_EPSILON,
                              y_true_format: str = "auto"):
    """Row-wise cross-entropy between the true permutation and P̂.

    For each position i, −Σ_j Y[i, j] log p̃[i, j] with the true permutation matrix Y
    (for an ordering y: −log p̃[i, y_i], read with a gather in O(n) per matrix), the
    mean over the n rows, as in the NeuralSort and SoftSort sorting experiments. To
    stay finite where P̂ underflows to 0, probabilities are mixed with a uniform floor,
    p̃ = ε + (1 − ε)·P̂: a row costs at most −log ε (≈ 16.1 for the default 1e-7), is
    exactly 0 for a perfect row, and its gradient never vanishes (unlike clipping).

    Args:
      y_true: the true permutation matrix `[..., n, n]` or ordering `[..., n]` (see the
        module docstring).
      y_pred: P̂ `[..., (S,) n, n]`.
      epsilon: the probability floor ε in (0, 1) (default 1e-7).
      y_true_format: 'auto' (default), 'indices' or 'matrix'.

    Returns:
      Per-example loss: the leading shape of `y_true`, e.g. `[batch]`.

    Example:
    >>> P = tf.constant([[[0.5, 0.5], [0.0, 1.0]]])
    >>> round(float(permutation_cross_entropy([[0, 1]], P)[0]), 4)   # (−log 0.5 + 0) / 2
    0.3466
    """
    epsilon = _checks.check_in_open_interval("epsilon", epsilon, 0.0, 1.0)
    y_true, y_pred, is_matrix, num_sample_axes = _read_targets(y_true, y_pred, y_true_format)
    dtype = _shapes.compute_dtype(y_pred.dtype)
    p = tf.cast(y_pred, dtype)
    if is_matrix:
        log_p = tf.math.log(epsilon + (1.0 - epsilon) * p)
        rows = -tf.reduce_sum(tf.cast(y_true, dtype) * log_p, axis=-1)
    else:
        rows = -tf.math.log(epsilon + (1.0 - epsilon) * _pick(p, y_true))
    return _per_example(rows, num_sample_axes)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class PermutationCrossEntropy(keras.losses.Loss):
    """Row-wise cross-entropy between the true permutation and P̂ (learning to sort).

    A thin wrapper over `permutation_cross_entropy`; the per-example values (mean over
    the n rows and any sample axes) are reduced by Keras with `sample_weight`
    (`[batch]`).

    Args:
      epsilon: probability floor ε in (0, 1) (default 1e-7): the loss uses
        log(ε + (1 − ε)·P̂), so each row costs at most −log ε.
      y_true_format: 'auto' (default), 'indices' (orderings `[batch, n]`, position i
        holding the index of the i-th item) or 'matrix' (`[batch, n, n]`).
      reduction: Keras reduction (default 'sum_over_batch_size').
      name: loss name.
      dtype: dtype of the loss computation (default: Keras floatx).

    Example:
    >>> loss = PermutationCrossEntropy()
    >>> P = tf.constant([[[1.0, 0.0], [0.0, 1.0]]])
    >>> float(loss([[0, 1]], P)) < 1e-6
    True
    """

    def __init__(self, epsilon: float = DEFAULT_EPSILON, y_true_format: str = "auto",
                 reduction: str = "sum_over_batch_size",
                 name: str = "permutation_cross_entropy", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.epsilon = _checks.check_in_open_interval("epsilon", epsilon, 0.0, 1.0)
        self.y_true_format = _check_format(y_true_format)

    def call(self, y_true, y_pred):
        return permutation_cross_entropy(y_true, y_pred, epsilon=self.epsilon,
                                         y_true_format=self.y_true_format)

    def get_config(self) -> dict:
        return {**super().get_config(), "epsilon": self.epsilon,
                "y_true_format": self.y_true_format}

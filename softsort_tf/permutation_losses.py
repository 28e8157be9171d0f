"""Loss and metrics for learning to sort with relaxed permutation matrices.

`y_pred` is a relaxed permutation matrix P̂ `[..., n, n]` from any operator of
`softsort_tf.permutation_ops` (rows = positions in sorted order). `y_true` is given
either as

- a permutation matrix `[..., n, n]` (row i one-hot on the item at position i), or
- an ordering `[..., n]` of item indices: position i holds the index of the i-th
  item in sorted order, i.e. `argsort(values, direction)` — integer, or float
  holding integers (Keras casts `y_true` to float before calling a loss).

`y_true_format='auto'` (default) tells them apart: an integer `y_true` is an ordering;
a floating one is a matrix when it has the rank of `y_pred`, and an ordering when it
has a smaller rank. `y_pred` may carry extra sample axes just before its last two
axes (the stochastic operators' `[..., S, n, n]`); `y_true` is broadcast over them
and the result is averaged over them. With sample axes, a floating `y_true` is read as
an ordering unless you pass `y_true_format='matrix'`.

Every function returns one value per example: the shape of `y_true` without its
last axis (ordering) or last two axes (matrix), e.g. `[batch]`.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from softsort_tf import _checks, _shapes

_PACKAGE = "softsort_tf"
_not_converted = tf.autograph.experimental.do_not_convert  # no tensor-dependent control flow
Y_TRUE_FORMATS = ("auto", "indices", "matrix")
DEFAULT_EPSILON = 1e-7


def _check_format(y_true_format: str) -> str:
    if y_true_format not in Y_TRUE_FORMATS:
        raise ValueError(f"`y_true_format` must be one of {Y_TRUE_FORMATS}, "
                         f"got {y_true_format!r}.")
    return y_true_format


def _read_targets(y_true, y_pred, y_true_format: str):
    """Returns `(y_true, is_matrix, num_sample_axes)`, with `y_true` expanded over the
    sample axes of `y_pred` (integer indices or a float matrix) and `y_pred` as a tensor."""
    y_true_format = _check_format(y_true_format)
    y_pred = tf.convert_to_tensor(y_pred)
    y_true = tf.convert_to_tensor(y_true)
    rank_p, rank_t = y_pred.shape.rank, y_true.shape.rank
    if rank_p is None or rank_t is None:
        raise ValueError("`y_true` and `y_pred` must have known ranks.")
    if rank_p < 2 or y_pred.shape[-1] != y_pred.shape[-2]:
        raise ValueError(f"`y_pred` must be a relaxed permutation matrix [..., n, n], "
                         f"got shape {y_pred.shape}.")
    if y_true_format == "auto":
        is_matrix = not y_true.dtype.is_integer and rank_t == rank_p
    else:
        is_matrix = y_true_format == "matrix"
    num_sample_axes = rank_p - rank_t - (0 if is_matrix else 1)
    if num_sample_axes < 0 or rank_t < (2 if is_matrix else 1):
        kind = "a permutation matrix [..., n, n]" if is_matrix else "an ordering [..., n]"
        raise ValueError(f"`y_true` of shape {y_true.shape} read as {kind} does not fit "
                         f"`y_pred` of shape {y_pred.shape}; pass `y_true_format`.")
    n = y_pred.shape[-1]
    if y_true.shape[-1] is not None and n is not None and y_true.shape[-1] != n:
        raise ValueError(f"`y_true` must have last dimension n = {n}, got shape {y_true.shape}.")
    if is_matrix:
        for _ in range(num_sample_axes):
            y_true = y_true[..., None, :, :]
        target_shape = y_pred.shape
    else:
        if not y_true.dtype.is_integer:
            y_true = tf.round(y_true)
        y_true = tf.cast(y_true, tf.int32)
        for _ in range(num_sample_axes):
            y_true = y_true[..., None, :]
        target_shape = y_pred.shape[:-1]
    try:
        tf.broadcast_static_shape(y_true.shape, target_shape)
    except ValueError:
        kind = "a permutation matrix" if is_matrix else "an ordering"
        raise ValueError(f"`y_true` of shape {y_true.shape} read as {kind} does not fit "
                         f"`y_pred` of shape {y_pred.shape}; pass `y_true_format`.") from None
    return y_true, y_pred, is_matrix, num_sample_axes


def _per_example(row_values, num_sample_axes: int):
    """Mean of `[..., S..., n]` per-row values over the rows and the sample axes."""
    return tf.reduce_mean(row_values, axis=list(range(-1 - num_sample_axes, 0)))


@tf.custom_gradient
def _gather_flat(flat, index):
    """`tf.gather(flat, index)` for unique indices, with a scatter as gradient.

    The default gradient of a gather goes through an `UnsortedSegmentSum` over the
    whole n²-sized output, several times slower on CPU than this `scatter_nd`.
    """

    def grad(upstream):
        shape = tf.shape(flat, out_type=tf.int64)
        return tf.scatter_nd(index[:, None], upstream, shape), None

    return tf.gather(flat, index), grad


def _pick(p, index):
    """P̂[..., i, index[..., i]] for P̂ `[..., n, n]` and an integer index broadcastable
    to `[..., n]`: one gather from the flattened matrix (O(n) per matrix)."""
    shape = tf.shape(p, out_type=tf.int64)
    n = shape[-1]
    index = tf.broadcast_to(tf.cast(index, tf.int64), shape[:-1])
    rows = tf.range(tf.reduce_prod(shape[:-1]), dtype=tf.int64)
    flat = _gather_flat(tf.reshape(p, [-1]), rows * n + tf.reshape(index, [-1]))
    return tf.reshape(flat, shape[:-1])


def _hard_orders(y_true, y_pred, y_true_format):
    """Predicted (row-wise argmax of P̂) and true orderings, broadcast, int32."""
    y_true, y_pred, is_matrix, num_sample_axes = _read_targets(y_true, y_pred, y_true_format)
    predicted = tf.argmax(y_pred, axis=-1, output_type=tf.int32)
    true = tf.argmax(y_true, axis=-1, output_type=tf.int32) if is_matrix else y_true
    return tf.equal(predicted, true), num_sample_axes


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


@_not_converted
def exact_permutation_accuracy(y_true, y_pred, y_true_format: str = "auto"):
    """1.0 where the row-wise argmax of P̂ recovers the whole true permutation, else 0.0.

    Averaged over sample axes for stochastic `y_pred`. This is the papers'
    "proportion of whole permutations correct".

    Args:
      y_true: the true permutation matrix `[..., n, n]` or ordering `[..., n]`.
      y_pred: P̂ `[..., (S,) n, n]`.
      y_true_format: 'auto' (default), 'indices' or 'matrix'.

    Returns:
      float32 per-example values, the leading shape of `y_true`.

    Example:
    >>> P = tf.constant([[[0.9, 0.1], [0.2, 0.8]], [[0.9, 0.1], [0.6, 0.4]]])
    >>> exact_permutation_accuracy([[0, 1], [0, 1]], P).numpy()
    array([1., 0.], dtype=float32)
    """
    correct, num_sample_axes = _hard_orders(y_true, y_pred, y_true_format)
    whole = tf.cast(tf.reduce_all(correct, axis=-1), tf.float32)
    return tf.reduce_mean(whole[..., None], axis=list(range(-1 - num_sample_axes, 0)))


@_not_converted
def elementwise_permutation_accuracy(y_true, y_pred, y_true_format: str = "auto"):
    """Fraction of positions whose row-wise argmax of P̂ is the true item.

    The papers' "proportion of elements correctly placed"; averaged over sample axes
    for stochastic `y_pred`.

    Args:
      y_true: the true permutation matrix `[..., n, n]` or ordering `[..., n]`.
      y_pred: P̂ `[..., (S,) n, n]`.
      y_true_format: 'auto' (default), 'indices' or 'matrix'.

    Returns:
      float32 per-example values in [0, 1], the leading shape of `y_true`.

    Example:
    >>> P = tf.constant([[[0.9, 0.1, 0.0], [0.6, 0.4, 0.0], [0.0, 0.0, 1.0]]])
    >>> elementwise_permutation_accuracy([[0, 1, 2]], P).numpy()
    array([0.6666667], dtype=float32)
    """
    correct, num_sample_axes = _hard_orders(y_true, y_pred, y_true_format)
    return _per_example(tf.cast(correct, tf.float32), num_sample_axes)


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


class _PermutationAccuracy(keras.metrics.MeanMetricWrapper):
    """Mean of a per-example accuracy of hard (row-wise argmax) permutations."""

    def __init__(self, name: str, dtype=None, y_true_format: str = "auto"):
        super().__init__(fn=type(self)._metric_fn, name=name, dtype=dtype,
                         y_true_format=_check_format(y_true_format))
        self.y_true_format = y_true_format
        self._direction = "up"

    def get_config(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "y_true_format": self.y_true_format}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class ExactPermutationAccuracy(_PermutationAccuracy):
    """Proportion of examples whose whole permutation is recovered by the row-wise
    argmax of P̂ (see `exact_permutation_accuracy`); honours `sample_weight`.

    Args:
      name: metric name (default 'exact_permutation_accuracy').
      dtype: dtype of the result.
      y_true_format: 'auto' (default), 'indices' or 'matrix'.

    Example:
    >>> m = ExactPermutationAccuracy()
    >>> m.update_state([[1, 0]], tf.constant([[[0.2, 0.8], [0.7, 0.3]]]))
    >>> float(m.result())
    1.0
    """

    _metric_fn = staticmethod(exact_permutation_accuracy)

    def __init__(self, name: str = "exact_permutation_accuracy", dtype=None,
                 y_true_format: str = "auto"):
        super().__init__(name=name, dtype=dtype, y_true_format=y_true_format)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class ElementwisePermutationAccuracy(_PermutationAccuracy):
    """Proportion of positions placed right by the row-wise argmax of P̂, averaged
    over examples (see `elementwise_permutation_accuracy`); honours `sample_weight`.

    Args:
      name: metric name (default 'elementwise_permutation_accuracy').
      dtype: dtype of the result.
      y_true_format: 'auto' (default), 'indices' or 'matrix'.

    Example:
    >>> m = ElementwisePermutationAccuracy()
    >>> m.update_state([[0, 1]], tf.constant([[[0.6, 0.4], [0.9, 0.1]]]))
    >>> float(m.result())
    0.5
    """

    _metric_fn = staticmethod(elementwise_permutation_accuracy)

    def __init__(self, name: str = "elementwise_permutation_accuracy", dtype=None,
                 y_true_format: str = "auto"):
        super().__init__(name=name, dtype=dtype, y_true_format=y_true_format)

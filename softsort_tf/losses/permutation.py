"""Cross-entropy loss for learning to sort with relaxed permutation matrices."""

from __future__ import annotations

import keras
import tensorflow as tf

from softsort_tf import _checks, _shapes
from softsort_tf._permutation_targets import check_format, per_example_mean, pick, read_targets
from softsort_tf.losses.base import LossFunctionWrapper

_PACKAGE = "softsort_tf"
DEFAULT_PROBABILITY_FLOOR = 1e-7


def permutation_cross_entropy(y_true, y_pred,
                              probability_floor: float = DEFAULT_PROBABILITY_FLOOR,
                              y_true_format: str = "auto", *, mask=None,
                              from_log: bool = False):
    """Row-wise cross-entropy between the true permutation and P̂.

    For each position i, −Σ_j Y[i, j] log p̃[i, j] with the true permutation matrix Y
    (for an ordering y: −log p̃[i, y_i], read with a gather in O(n) per matrix), the
    mean over the n rows, as in the NeuralSort and SoftSort sorting experiments. To
    stay finite where P̂ underflows to 0, probabilities are mixed with a uniform floor
    δ (`probability_floor`), p̃ = δ + (1 − δ)·P̂: a row costs at most −log δ (≈ 16.1
    for the default 1e-7), is exactly 0 for a perfect row, and its gradient never
    vanishes (unlike clipping).

    Args:
      y_true: the true permutation matrix `[..., n, n]` or ordering `[..., n]` (see
        `softsort_tf._permutation_targets`).
      y_pred: P̂ `[..., (S,) n, n]`.
      probability_floor: the probability floor δ in (0, 1) (default 1e-7).
      y_true_format: 'auto' (default), 'indices' or 'matrix'.
      from_log: `y_pred` is log P̂ (e.g. `permutation_matrix(..., log=True)`): the
        row loss is −log P̂[i, y_i] exactly, without the floor, so a row whose true
        entry is far below δ keeps a gradient of full size (with the floor, its
        gradient is scaled by about P̂/δ).
      mask: optional boolean `[..., n]` of the valid items: the rows of sorted
        positions >= n_valid and the padded columns are ignored. Orderings may also
        mark padding with negative entries after the n_valid indices (no `mask`
        needed). The loss is then the mean over the valid rows (0 for a list without
        any), and padded entries of P̂ get zero gradient. See softsort_tf._masking.

    Returns:
      Per-example loss: the leading shape of `y_true`, e.g. `[batch]`.

    Example:
    >>> P = tf.constant([[[0.5, 0.5], [0.0, 1.0]]])
    >>> round(float(permutation_cross_entropy([[0, 1]], P)[0]), 4)   # (−log 0.5 + 0) / 2
    0.3466

    A list of 2 valid items padded to 3 (ordering, then −1; P̂'s padded row and column
    are 0, e.g. from `softsort_permutation_matrix(scores, mask=...)`): the mean over the 2 rows.

    >>> P = tf.constant([[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]])
    >>> round(float(permutation_cross_entropy([[0, 1, -1]], P)[0]), 4)
    0.3466
    """
    floor = _checks.check_in_open_interval("probability_floor", probability_floor, 0.0, 1.0)
    from_log = _checks.check_bool("from_log", from_log)
    y_true, y_pred, is_matrix, num_sample_axes, rows_valid = read_targets(
        y_true, y_pred, y_true_format, mask)
    dtype = _shapes.compute_dtype(y_pred.dtype)
    p = tf.cast(y_pred, dtype)
    if from_log:
        if is_matrix:
            target = tf.cast(y_true, dtype)
            if mask is not None:
                columns = tf.cast(mask, tf.bool)[..., None, :]
                for _ in range(num_sample_axes):
                    columns = columns[..., None, :, :]
                target = tf.where(columns, target, tf.zeros([], dtype))
            picked = tf.where(target > 0, target * p, tf.zeros_like(p))
            rows = -tf.reduce_sum(picked, axis=-1)
        else:
            rows = -pick(p, y_true)
        # Padded rows (ignored by the mean) may hold −inf: keep them finite.
        rows = tf.where(tf.math.is_finite(rows), rows, tf.zeros_like(rows))
        return per_example_mean(rows, num_sample_axes, rows_valid)
    if is_matrix:
        target = tf.cast(y_true, dtype)
        if mask is not None:  # padded columns: no target mass (whatever y_true holds)
            columns = tf.cast(mask, tf.bool)[..., None, :]
            for _ in range(num_sample_axes):
                columns = columns[..., None, :, :]
            target = tf.where(columns, target, tf.zeros([], dtype))
        log_p = tf.math.log(floor + (1.0 - floor) * p)
        rows = -tf.reduce_sum(target * log_p, axis=-1)
    else:
        rows = -tf.math.log(floor + (1.0 - floor) * pick(p, y_true))
    return per_example_mean(rows, num_sample_axes, rows_valid)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class PermutationCrossEntropy(LossFunctionWrapper):
    """Row-wise cross-entropy between the true permutation and P̂ (learning to sort).

    `permutation_cross_entropy` as a Keras loss: the per-example values (mean over
    the n rows and any sample axes) are reduced by Keras with `sample_weight`
    (`[batch]`). Padded lists: orderings `[batch, n]` holding the n_valid indices then
    −1 (see `permutation_cross_entropy`); the mean is over the valid rows.

    Args:
      probability_floor: δ in (0, 1) (default 1e-7): the loss uses
        log(δ + (1 − δ)·P̂), so each row costs at most −log δ.
      y_true_format: 'auto' (default), 'indices' (orderings `[batch, n]`, position i
        holding the index of the i-th item) or 'matrix' (`[batch, n, n]`).
      from_log: `y_pred` is log P̂ (see `permutation_cross_entropy`).
      reduction: Keras reduction (default 'sum_over_batch_size').
      name: loss name.
      dtype: dtype of the loss computation (default: Keras floatx); float16 and
        bfloat16 (or a mixed policy) compute in float32, as the permutation layers do.

    Example:
    >>> loss = PermutationCrossEntropy()
    >>> P = tf.constant([[[1.0, 0.0], [0.0, 1.0]]])
    >>> float(loss([[0, 1]], P)) < 1e-6
    True
    """

    def __init__(self, probability_floor: float = DEFAULT_PROBABILITY_FLOOR,
                 y_true_format: str = "auto", reduction: str = "sum_over_batch_size",
                 name: str = "permutation_cross_entropy", dtype=None, *,
                 from_log: bool = False):
        super().__init__(
            permutation_cross_entropy, reduction=reduction, name=name, dtype=dtype,
            probability_floor=_checks.check_in_open_interval(
                "probability_floor", probability_floor, 0.0, 1.0),
            y_true_format=check_format(y_true_format),
            from_log=_checks.check_bool("from_log", from_log))

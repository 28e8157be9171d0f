"""Reading values and ranks out of a relaxed permutation matrix P̂ `[..., n, n]`."""

from __future__ import annotations

import tensorflow as tf

from softsort_tf import _shapes
from softsort_tf.ops.permutation import _not_converted


# ---------------------------------------------------------------------------------
# Reading a relaxed permutation matrix.
# ---------------------------------------------------------------------------------
def _align_values(perm, values):
    """Casts both to one compute dtype and inserts sample axes into `values`.

    `values` of shape `[..., n]` may have fewer leading axes than `perm[..., :, 0]`
    (e.g. `[batch, n]` against a stochastic `[batch, S, n, n]`): the missing axes are
    inserted just before its last axis.
    """
    perm = tf.convert_to_tensor(perm)
    values = tf.convert_to_tensor(values)
    if perm.shape.rank is None or perm.shape.rank < 2 or perm.shape[-1] != perm.shape[-2]:
        raise ValueError(f"`perm` must have shape [..., n, n], got {perm.shape}.")
    n = perm.shape[-1]
    if values.shape.rank is None or values.shape.rank < 1 or (
            n is not None and values.shape[-1] is not None and values.shape[-1] != n):
        raise ValueError(f"`values` must have shape [..., n] with n = {n}, got {values.shape}.")
    extra = perm.shape.rank - 1 - values.shape.rank
    if extra < 0:
        raise ValueError(f"`values` of shape {values.shape} has more leading axes than "
                         f"`perm` of shape {perm.shape}.")
    for _ in range(extra):
        values = values[..., None, :]
    out_dtype = values.dtype if values.dtype.is_floating else perm.dtype
    if not out_dtype.is_floating:
        out_dtype = tf.float32
    dtype = _shapes.compute_dtype(out_dtype)
    if perm.dtype == tf.float64 or values.dtype == tf.float64:
        dtype = tf.float64
    return tf.cast(perm, dtype), tf.cast(values, dtype), out_dtype


@_not_converted
def permute_values(perm, values):
    """Soft-sorted values P̂ @ x for any relaxed permutation matrix P̂.

    Entry i is the P̂[i]-weighted average of `values`: in the hard limit, the value
    of the item at position i of the sort.

    Args:
      perm: `[..., n, n]` relaxed permutation matrix (rows = sorted positions).
      values: `[..., n]` values to sort; leading axes broadcast against those of
        `perm`, and missing sample axes are inserted before the last axis (so
        `[batch, n]` values go with a stochastic `[batch, S, n, n]`).

    Returns:
      `[..., n]` (the broadcast leading shape), in the floating dtype of `values`
      (that of `perm` for integer values).

    Example:
    >>> from softsort_tf.ops.permutation import hard_permutation_matrix
    >>> P = hard_permutation_matrix([[0.3, 2.0, 1.0]])
    >>> permute_values(P, [[10.0, 20.0, 30.0]]).numpy()
    array([[20., 30., 10.]], dtype=float32)
    """
    perm, values, out_dtype = _align_values(perm, values)
    return tf.cast(tf.linalg.matvec(perm, values), out_dtype)


@_not_converted
def ranks_from_permutation(perm, zero_based: bool = False):
    """Soft ranks P̂ᵀ @ (1, …, n) for any relaxed permutation matrix P̂.

    Entry j is Σ_i i·P̂[i, j]: the rank of item j in the operator's `direction`
    (rank 1 = first position, i.e. the largest score for 'DESCENDING'). Exact for a
    hard permutation. For a doubly-stochastic P̂ (Sinkhorn) it is a weighted average
    of positions; for the URS matrices of SoftSort/NeuralSort the columns need not
    sum to 1, so soft ranks of nearly tied items can leave [1, n] slightly.

    Args:
      perm: `[..., n, n]` relaxed permutation matrix.
      zero_based: ranks in 0..n − 1 instead of 1..n.

    Returns:
      `[..., n]` ranks in the dtype of `perm` (float32 for integer inputs).

    Example:
    >>> from softsort_tf.ops.permutation import hard_permutation_matrix
    >>> ranks_from_permutation(hard_permutation_matrix([[0.3, 2.0, 1.0]])).numpy()
    array([[3., 1., 2.]], dtype=float32)
    """
    perm = tf.convert_to_tensor(perm)
    if (perm.shape.rank is None or perm.shape.rank < 2 or perm.shape[-1] is None
            or perm.shape[-1] != perm.shape[-2]):
        raise ValueError(f"`perm` must have a static shape [..., n, n], got {perm.shape}.")
    out_dtype = perm.dtype if perm.dtype.is_floating else tf.float32
    dtype = _shapes.compute_dtype(out_dtype)
    p = tf.cast(perm, dtype)
    start = 0 if zero_based else 1
    positions = tf.range(start, start + perm.shape[-1], dtype=dtype)
    ranks = tf.reduce_sum(p * positions[:, None], axis=-2)
    return tf.cast(ranks, out_dtype)

"""Reading values and ranks out of a relaxed permutation matrix P̂ `[..., n, n]`."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from softsort_tf import _masking


def _square(perm):
    """`perm` as a tensor, checked `[..., n, n]`."""
    perm = tf.convert_to_tensor(perm)
    if perm.shape.rank is None or perm.shape.rank < 2 or not perm.shape[-1:].is_compatible_with(
            perm.shape[-2:-1]):
        raise ValueError(f"`perm` must have shape [..., n, n], got {perm.shape}.")
    return perm


def _align_values(perm, values):
    """Both cast to one compute dtype, with the sample axes that `values` `[..., n]` lacks
    against `perm[..., :, 0]` (e.g. `[batch, n]` against `[batch, S, n, n]`) inserted
    before its last axis; and the output dtype."""
    perm = _square(perm)
    values = tf.convert_to_tensor(values)
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
    out_dtype = next((t for t in (values.dtype, perm.dtype) if t.is_floating), tf.float32)
    dtype = (tf.float64 if tf.float64 in (perm.dtype, values.dtype)
             else _masking.compute_dtype(out_dtype))
    return tf.cast(perm, dtype), tf.cast(values, dtype), out_dtype


def _masked_values(values, mask):
    """`values` with padded entries (by `mask` `[..., n]` or `[n]`) replaced by 0 before
    any arithmetic, so that NaN or inf padding reaches no product or gradient."""
    if mask is None:
        return values
    mask = _masking.checked_mask(mask, values, "mask", "have shape [n] or that of `values`")
    return tf.where(mask, values, tf.zeros([], values.dtype))


def _values_per_matrix(perm: tf.RaggedTensor, values: tf.RaggedTensor) -> tf.RaggedTensor:
    """Ragged `values` `[..., (n)]` repeated along the sample axes of a ragged `perm`
    `[..., (S), (n), (n)]`: one list per matrix, with the partitions of `perm`."""
    outer = values.ragged_rank - 1
    splits = perm.nested_row_splits
    matrices = splits[-2]
    # The list of `values` each matrix belongs to: up through the sample partitions.
    rows = tf.range(tf.size(matrices, out_type=matrices.dtype) - 1)
    for partition in reversed(splits[outer:-2]):
        rows = tf.gather(tf.ragged.row_splits_to_segment_ids(partition, out_type=rows.dtype),
                         rows)
    lists = _masking.gather_rows(_masking._list_level(values, outer), rows)
    return tf.RaggedTensor.from_nested_row_splits(
        lists.flat_values, tuple(splits[:-2]) + tuple(lists.nested_row_splits), validate=False)


def permute_values(perm, values, *, mask=None):
    """Soft-sorted values P̂ @ x for any relaxed permutation matrix P̂: entry i is the
    P̂[i]-weighted average of `values`.

    Args:
      perm: `[..., n, n]` relaxed permutation matrix (rows = sorted positions), or
        ragged `[batch, (S,) (n), (n)]`.
      values: `[..., n]` values to sort (ragged `[batch, (n)]` with a ragged `perm`);
        leading axes broadcast against those of `perm`, missing sample axes are
        inserted before the last axis (`[batch, n]` with `[batch, S, n, n]`).
      mask: optional boolean `[..., n]` (or `[n]`) of the valid entries of `values`:
        padded values are read as 0 (zero gradient). With a P̂ masked the same way,
        the first n_valid outputs are the soft-sorted valid values, the others 0.

    Returns:
      `[..., n]` (the broadcast leading shape), in the floating dtype of `values`
      (that of `perm` for integer values). A ±inf value is read as itself: a row with
      mass on it is ±inf (on both +inf and −inf: NaN), the other rows are P̂ @ x of the
      finite values; infinite values get zero gradient.

    Example:
    >>> from softsort_tf.ops.permutation import hard_permutation_matrix
    >>> P = hard_permutation_matrix([[0.3, 2.0, 1.0]])
    >>> permute_values(P, [[10.0, 20.0, 30.0]]).numpy()
    array([[20., 30., 10.]], dtype=float32)
    """
    if isinstance(values, tf.RaggedTensor):
        if isinstance(perm, tf.RaggedTensor) and perm.ragged_rank > values.ragged_rank + 1:
            values = _values_per_matrix(perm, values)
            if isinstance(mask, tf.RaggedTensor):
                mask = _values_per_matrix(perm, mask)
        # Ragged matrices, one per list, are gathered with their lists (groups of
        # similar length); a dense `perm` serves all the lists in one group.
        per_list = isinstance(perm, tf.RaggedTensor) and perm.ragged_rank == values.ragged_rank + 1
        return _masking.map_lists(
            lambda lists, aligned, group: lists.to_elementwise(permute_values(
                lists.pad_matrices(aligned[0] if per_list else perm), lists.dense,
                mask=lists.mask)),
            values, mask, aligned=(perm,) if per_list else (), name="values",
            num_buckets=None if per_list else 1)
    if isinstance(perm, tf.RaggedTensor):
        perm = perm.to_tensor()
    perm, values, out_dtype = _align_values(perm, values)
    if mask is not None:
        mask = tf.convert_to_tensor(mask)
        for _ in range(values.shape.rank - mask.shape.rank if mask.shape.rank > 1 else 0):
            mask = mask[..., None, :]
    values = _masked_values(values, mask)
    return tf.cast(_matvec_with_infinities(perm, values), out_dtype)


def _matvec_with_infinities(perm, values):
    """P̂ @ x with ±inf values read as themselves: a row putting mass on +inf (−inf) is
    +inf (−inf), on both NaN, and the other rows are P̂ @ x of the finite values (no
    0 · inf = NaN); the infinite values get zero gradient. One product of P̂ with the
    finite values and the indicators of +inf and −inf."""
    dtype = values.dtype
    zero = tf.zeros([], dtype)
    columns = tf.stack([tf.where(tf.math.is_inf(values), zero, values),
                        tf.cast(tf.equal(values, np.inf), dtype),
                        tf.cast(tf.equal(values, -np.inf), dtype)], axis=-1)
    out = tf.linalg.matmul(perm, columns)
    finite, up, down = out[..., 0], out[..., 1] > 0, out[..., 2] > 0
    inf = tf.constant(np.inf, dtype)
    return tf.where(up, tf.where(down, tf.constant(np.nan, dtype), inf),
                    tf.where(down, -inf, finite))


def ranks_from_permutation(perm, zero_based: bool = False, *, mask=None):
    """Soft ranks P̂ᵀ @ (1, …, n) for any relaxed permutation matrix P̂.

    Entry j is Σ_i i·P̂[i, j], the rank of item j in the operator's `direction`; exact
    for a hard permutation. The columns of SoftSort's and NeuralSort's P̂ need not sum
    to 1, so ranks of nearly tied items may leave [1, n] slightly.

    Args:
      perm: `[..., n, n]` relaxed permutation matrix, or ragged `[batch, (S,) (n), (n)]`
        (ragged ranks).
      zero_based: ranks in 0..n − 1 instead of 1..n.
      mask: optional boolean `[..., n]` (or `[n]`) of the valid entries: padded ranks
        are 0 (zero gradient; a P̂ masked by its operator has them 0 already).

    Returns:
      `[..., n]` ranks in the dtype of `perm` (float32 for integer inputs).

    Example:
    >>> from softsort_tf.ops.permutation import hard_permutation_matrix
    >>> ranks_from_permutation(hard_permutation_matrix([[0.3, 2.0, 1.0]])).numpy()
    array([[3., 1., 2.]], dtype=float32)
    """
    if isinstance(perm, tf.RaggedTensor):
        # One matrix per list (after the outer and sample partitions), padded with zeros.
        matrices = tf.RaggedTensor.from_nested_row_splits(
            perm.flat_values, perm.nested_row_splits[-2:], validate=False)
        ragged_mask = isinstance(mask, tf.RaggedTensor)
        ranks = ranks_from_permutation(matrices.to_tensor(), zero_based,
                                       mask=None if ragged_mask else mask)
        ranks = tf.RaggedTensor.from_tensor(ranks, lengths=matrices.row_lengths())
        if ragged_mask:
            ranks = ranks.with_flat_values(_masked_values(ranks.flat_values, mask.flat_values))
        return tf.RaggedTensor.from_nested_row_splits(
            ranks.flat_values, perm.nested_row_splits[:-1], validate=False)
    perm = _square(perm)
    out_dtype = perm.dtype if perm.dtype.is_floating else tf.float32
    dtype = _masking.compute_dtype(out_dtype)
    p = tf.cast(perm, dtype)
    start = 0 if zero_based else 1
    positions = tf.cast(tf.range(start, start + tf.shape(perm)[-1]), dtype)
    ranks = tf.reduce_sum(p * positions[:, None], axis=-2)
    return tf.cast(_masked_values(ranks, mask), out_dtype)

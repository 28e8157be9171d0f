"""Reading values and ranks out of a relaxed permutation matrix P̂ `[..., n, n]`."""

from __future__ import annotations

import tensorflow as tf

from softsort_tf import _masking, _shapes


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
    if perm.shape.rank is None or perm.shape.rank < 2 or not perm.shape[-1:].is_compatible_with(
            perm.shape[-2:-1]):
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


def _dense_square(perm):
    """A ragged `[batch, (n), (n)]` P̂ as a dense zero-padded `[batch, longest, longest]`."""
    return perm.to_tensor() if isinstance(perm, tf.RaggedTensor) else perm


def _masked_values(values, mask, name: str = "mask"):
    """`values` with padded entries replaced by 0 before any arithmetic (so NaN/inf
    padding never reaches P̂ @ x or a gradient); `mask` `[..., n]` or `[n]`."""
    if mask is None:
        return values
    mask = _masking.checked_mask(mask, values, name, "have shape [n] or that of `values`")
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
    """Soft-sorted values P̂ @ x for any relaxed permutation matrix P̂.

    Entry i is the P̂[i]-weighted average of `values`: in the hard limit, the value
    of the item at position i of the sort.

    Args:
      perm: `[..., n, n]` relaxed permutation matrix (rows = sorted positions).
      values: `[..., n]` values to sort; leading axes broadcast against those of
        `perm`, and missing sample axes are inserted before the last axis (so
        `[batch, n]` values go with a stochastic `[batch, S, n, n]`).

      mask: optional boolean `[..., n]` (or `[n]`) of the valid entries of `values`:
        padded values (NaN and ±inf included) are replaced by 0 before the product and
        get zero gradient. With a P̂ masked the same way (e.g. `softsort_permutation_matrix(s,
        mask=mask)`), the first n_valid outputs are the soft-sorted valid values and
        the others 0. Ragged `perm` `[batch, (n), (n)]` and `values` `[batch, (n)]`
        give a ragged `[batch, (n)]` output (`[batch, (S), (n)]` for a sampled ragged
        `perm` `[batch, (S), (n), (n)]`). See softsort_tf._masking.

    Returns:
      `[..., n]` (the broadcast leading shape), in the floating dtype of `values`
      (that of `perm` for integer values).

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
        if isinstance(perm, tf.RaggedTensor) and perm.ragged_rank == values.ragged_rank + 1:
            # The lists' matrices are gathered with them (groups of similar length).
            return _masking.map_lists(
                lambda lists, aligned, group: lists.to_elementwise(permute_values(
                    lists.pad_matrices(aligned[0]), lists.dense, mask=lists.mask)),
                values, mask, aligned=(perm,), name="values")
        return _masking.map_lists(
            lambda lists, aligned, group: lists.to_elementwise(permute_values(
                lists.pad_matrices(perm), lists.dense, mask=lists.mask)),
            values, mask, name="values", num_buckets=1)
    perm, values, out_dtype = _align_values(_dense_square(perm), values)
    if mask is not None:
        mask = tf.convert_to_tensor(mask)
        for _ in range(values.shape.rank - mask.shape.rank if mask.shape.rank > 1 else 0):
            mask = mask[..., None, :]
    values = _masked_values(values, mask)
    return tf.cast(tf.linalg.matvec(perm, values), out_dtype)


def ranks_from_permutation(perm, zero_based: bool = False, *, mask=None):
    """Soft ranks P̂ᵀ @ (1, …, n) for any relaxed permutation matrix P̂.

    Entry j is Σ_i i·P̂[i, j]: the rank of item j in the operator's `direction`
    (rank 1 = first position, i.e. the largest score for 'DESCENDING'). Exact for a
    hard permutation. For a doubly-stochastic P̂ (Sinkhorn) it is a weighted average
    of positions; for the URS matrices of SoftSort/NeuralSort the columns need not
    sum to 1, so soft ranks of nearly tied items can leave [1, n] slightly.

    Args:
      perm: `[..., n, n]` relaxed permutation matrix.
      zero_based: ranks in 0..n − 1 instead of 1..n.
      mask: optional boolean `[..., n]` (or `[n]`) of the valid entries: ranks at padded
        entries are set to 0 (zero gradient). A P̂ masked by its operator already has
        zero columns there, so its padded ranks are 0 without `mask` (1-based ranks of
        the valid entries lie in [1, n_valid]). A ragged `[batch, (n), (n)]` `perm`
        gives ragged `[batch, (n)]` ranks (`[batch, (S), (n)]` for a sampled ragged
        `perm` `[batch, (S), (n), (n)]`). See softsort_tf._masking.

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
    perm = tf.convert_to_tensor(perm)
    if perm.shape.rank is None or perm.shape.rank < 2 or not perm.shape[-1:].is_compatible_with(
            perm.shape[-2:-1]):
        raise ValueError(f"`perm` must have shape [..., n, n], got {perm.shape}.")
    out_dtype = perm.dtype if perm.dtype.is_floating else tf.float32
    dtype = _shapes.compute_dtype(out_dtype)
    p = tf.cast(perm, dtype)
    start = 0 if zero_based else 1
    positions = tf.cast(tf.range(start, start + tf.shape(perm)[-1]), dtype)
    ranks = tf.reduce_sum(p * positions[:, None], axis=-2)
    if mask is not None:
        ranks = _masked_values(ranks, mask)
    return tf.cast(ranks, out_dtype)

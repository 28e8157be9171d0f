"""Lists in the layout operators compute in, and the one padding convention (docs/api.md,
"Padding"): `to_batch` moves the list axis last and flattens the rest into `[batch, n]`
in float32 or float64 (float16/bfloat16 in float32, integers wider than float32's
significand in float64), `from_batch` undoes it; masks in that layout, padded values
replaced before any arithmetic, outputs filled at padding, and ragged lists computed in
groups of similar length."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from softsort_tf import _checks

_REDUCED = (tf.float16, tf.bfloat16)


def inverse_permutation(order):
    """The inverse of each row of a `[batch, n]` int32 permutation (a scatter, O(n))."""
    shape = tf.shape(order)
    rows = tf.broadcast_to(tf.range(shape[0])[:, None], shape)
    positions = tf.broadcast_to(tf.range(shape[1])[None, :], shape)
    inverse = tf.scatter_nd(tf.stack([rows, order], axis=-1), positions, shape)
    inverse.set_shape(order.shape)
    return inverse


def compute_dtype(dtype: tf.DType) -> tf.DType:
    """The dtype an operator computes in: float32 for float16/bfloat16 inputs."""
    dtype = tf.as_dtype(dtype)
    if dtype in _REDUCED:
        return tf.float32
    if dtype in (tf.float32, tf.float64):
        return dtype
    if dtype.is_integer:
        return tf.float32
    raise ValueError(f"Inputs must be floating point (float16, bfloat16, float32 or float64), "
                     f"got {dtype.name}.")


_WIDE_INTEGERS = (tf.int32, tf.uint32, tf.int64, tf.uint64)


def batch_compute_dtype(dtype: tf.DType) -> tf.DType:
    """The dtype `to_batch` computes in: `compute_dtype`, float64 for wide integers."""
    dtype = tf.as_dtype(dtype)
    return tf.float64 if dtype in _WIDE_INTEGERS else compute_dtype(dtype)


@dataclasses.dataclass
class BatchView:
    """How a `[..., n, ...]` tensor was turned into `[batch, n]`."""

    axis: int
    rank: int
    perm: list
    moved_shape: tf.Tensor  # dynamic shape of the tensor with `axis` moved last
    static_moved_shape: tf.TensorShape
    input_dtype: tf.DType
    n: int | tf.Tensor  # a Python int when known at trace time, else a scalar tensor
    static_n: int | None = None

    @property
    def output_dtype(self) -> tf.DType:
        """The dtype of results: the input's if floating, else float64 for 64-bit
        integers and float32 for the others."""
        if self.input_dtype.is_floating:
            return self.input_dtype
        return tf.float64 if self.input_dtype.size == 8 else tf.float32


def to_batch(x, axis: int = -1, name: str = "x"):
    """Moves `axis` last, flattens the rest into a batch axis, casts to the compute dtype.

    Returns `(x2d, view)`, `x2d` `[batch, n]`; `name` names `x` in error messages.
    """
    _checks.check_dense(name, x)
    x = tf.convert_to_tensor(x)
    _checks.check_real_dtype(name, x.dtype)
    rank = x.shape.rank
    axis = _checks.check_axis(axis, rank)
    static = x.shape[axis]
    if static == 0:
        raise ValueError(
            f"`{name}` must have at least one element along `axis` (n >= 1), got n = 0.")
    perm = [i for i in range(rank) if i != axis] + [axis]
    moved = tf.transpose(x, perm) if axis != rank - 1 else x
    moved_shape = tf.shape(moved)
    n = int(static) if static is not None else moved_shape[-1]
    view = BatchView(axis=axis, rank=rank, perm=perm, moved_shape=moved_shape,
                     static_moved_shape=moved.shape, input_dtype=x.dtype, n=n,
                     static_n=None if static is None else int(static))
    x2d = tf.reshape(moved, [-1, n])
    x2d = tf.cast(x2d, batch_compute_dtype(x.dtype))
    return x2d, view


def from_batch(y2d, view: BatchView, keep_axis: bool = True, cast: bool = True):
    """Inverse of `to_batch` for a result `[batch, m]`, or `[batch]` with
    `keep_axis=False` (the axis removed); `cast`: back to a floating input's dtype
    (results of integer inputs are always `view.output_dtype`)."""
    lead = view.moved_shape[:-1]
    static_lead = view.static_moved_shape[:-1]
    if keep_axis:
        m = y2d.shape[-1]
        out = tf.reshape(y2d, tf.concat([lead, [tf.shape(y2d)[-1]]], axis=0))
        out.set_shape(static_lead.concatenate([m]))
        if view.axis != view.rank - 1:
            out = tf.transpose(out, np.argsort(view.perm))
    else:
        out = tf.reshape(y2d, lead)
        out.set_shape(static_lead)
    if view.input_dtype.is_integer or (cast and view.input_dtype.is_floating):
        out = tf.cast(out, view.output_dtype)
    return out


def moved_entries(t, view: BatchView, name: str, *, length_one: bool = False):
    """Per-entry values `[n]` as `[batch, n]` (length 1 too with `length_one`), or of the
    shape of `x` with its list axis moved last; a `ValueError` naming `name` otherwise."""
    if t.shape.rank == 1:
        if t.shape[0] is not None and view.static_n is not None and \
                t.shape[0] not in ((1, view.static_n) if length_one else (view.static_n,)):
            raise ValueError(f"`{name}` of rank 1 must have length n = {view.static_n}, got "
                             f"{t.shape[0]}.")
        batch = tf.reduce_prod(view.moved_shape[:-1])
        return tf.broadcast_to(t[tf.newaxis, :], tf.stack([batch, view.n]))
    if t.shape.rank != view.rank:
        raise ValueError(f"`{name}` must have shape [n] or the shape of `x`; got rank "
                         f"{t.shape.rank} for an input of rank {view.rank}.")
    return tf.transpose(t, view.perm) if view.axis != view.rank - 1 else t


def weights_to_batch(weights, view: BatchView, dtype, name: str = "weights"):
    """Weights `[n]` or of the shape of `x` as `[batch, n]`, normalised to sum to 1 (finite,
    non-negative, a positive sum: checked when known at trace time)."""
    if weights is None:
        return None
    w = tf.convert_to_tensor(weights)
    _checks.check_weight_values(name, w, allow_zero=True)
    full = w.shape.rank != 1
    w = moved_entries(tf.cast(w, dtype), view, name)
    if full:
        if not w.shape.is_compatible_with(view.static_moved_shape):
            raise ValueError(f"`{name}` must have shape [n] or the shape of `x`; got a "
                             f"tensor of rank {view.rank} that does not match `x` (with "
                             f"the sorted axis last: {w.shape} vs {view.static_moved_shape}).")
        w = tf.reshape(w, [-1, view.n])
    return w / tf.reduce_sum(w, axis=-1, keepdims=True)




def as_bool(mask, name: str = "mask"):
    """`mask` as a bool tensor (True where non-zero; ragged stays ragged), checked
    (`_checks.check_mask`)."""
    if isinstance(mask, tf.RaggedTensor):
        return mask.with_flat_values(as_bool(mask.flat_values, name))
    mask = tf.convert_to_tensor(mask)
    _checks.check_mask(name, mask)
    if mask.dtype != tf.bool:
        mask = tf.not_equal(mask, tf.zeros([], mask.dtype))
    return mask


def checked_mask(mask, x, name: str = "mask", shape_rule: str | None = None):
    """`mask` as bool (not yet broadcast), checked to broadcast to the static shape of
    `x`; `shape_rule` is what the error message says the shape must be."""
    mask = as_bool(mask, name)
    try:
        tf.broadcast_static_shape(mask.shape, x.shape)
    except ValueError:
        rule = shape_rule or f"broadcast to the shape {x.shape}"
        raise ValueError(f"`{name}` must {rule}, got {mask.shape} for an input of shape "
                         f"{x.shape}.") from None
    return mask


def mask_to_batch(mask, view: BatchView, name: str = "mask"):
    """A mask `[n]` or of the shape of `x` (or None) as bool `[batch, n]`, the layout of
    `to_batch` (`view`)."""
    if mask is None:
        return None
    if isinstance(mask, tf.RaggedTensor):
        raise ValueError(f"A ragged `{name}` needs a ragged `x` of the same row lengths.")
    mask = as_bool(mask, name)
    if mask.shape.rank == 1:
        return moved_entries(mask, view, name, length_one=True)
    mask = moved_entries(mask, view, name)
    try:
        tf.broadcast_static_shape(mask.shape, view.static_moved_shape)
    except ValueError:
        raise ValueError(f"`{name}` must have shape [n] or the shape of `x` (with the "
                         f"operated axis last: {mask.shape} vs {view.static_moved_shape})."
                         ) from None
    mask = tf.broadcast_to(mask, view.moved_shape)
    return tf.reshape(mask, tf.stack([tf.reduce_prod(view.moved_shape[:-1]), view.n]))


def n_valid(mask2d, dtype=tf.int32, keepdims: bool = False):
    """Number of valid entries of each row of a bool `[batch, n]` mask."""
    return tf.reduce_sum(tf.cast(mask2d, dtype), axis=-1, keepdims=keepdims)


def valid_prefix(count, length):
    """bool `[batch, length]`: position j < count[b] (the valid positions of a sorted
    output). `count`: `[batch]` integer tensor; `length`: int or scalar tensor."""
    positions = tf.range(length, dtype=count.dtype)
    return positions[tf.newaxis, :] < count[:, tf.newaxis]


def replace_padded(x2d, mask2d, fill=None):
    """`[batch, n]` values with the padded entries (`mask2d` False; None: none) replaced
    by `fill` through a `tf.where`, so NaN/±inf padding reaches neither the results nor
    the gradient. Default fill: the row's largest valid value (inside its range, so
    scale statistics do not move), 0 for a row without valid entry."""
    if mask2d is None:
        return x2d
    if fill is None:
        lowest = tf.constant(x2d.dtype.min, x2d.dtype)
        largest = tf.reduce_max(tf.where(mask2d, x2d, lowest), axis=-1, keepdims=True)
        has_valid = tf.reduce_any(mask2d, axis=-1, keepdims=True)
        fill = tf.where(has_valid, largest, tf.zeros_like(largest))
    fill = tf.stop_gradient(tf.cast(fill, x2d.dtype))
    return tf.where(mask2d, x2d, tf.broadcast_to(fill, tf.shape(x2d)))


def fill_padded(y2d, mask2d, value=0.0):
    """Output values with the padded positions set to `value` (default 0); zero gradient
    flows through the fill. `mask2d` None: y unchanged."""
    if mask2d is None:
        return y2d
    return tf.where(mask2d, y2d, tf.cast(tf.broadcast_to(value, tf.shape(y2d)), y2d.dtype))


def combine(*masks):
    """Logical AND of the masks that are not None (None if all are); a ragged and a dense
    mask give a dense one, the ragged one padded with False."""
    out = None
    for mask in masks:
        if mask is None:
            continue
        mask = tf.cast(mask, tf.bool)
        if out is not None and is_ragged(out) != is_ragged(mask):
            out, mask = (t.to_tensor(False) if is_ragged(t) else t for t in (out, mask))
        out = mask if out is None else tf.logical_and(out, mask)
    return out


def is_ragged(x) -> bool:
    return isinstance(x, tf.RaggedTensor)


RAGGED_BUCKETS = 4
"""How many groups of similar length a ragged input's lists are computed in: more pad
less but run the operator more times (more dispatch, a larger graph)."""


def check_ragged_call(x: tf.RaggedTensor, axis, weights, name: str = "x"):
    """Raises a `ValueError` unless a ragged `x` is computed along its last (ragged)
    axis and without `weights` (weights of padded lists are a dense tensor's)."""
    rank = x.shape.rank
    if not (axis == -1 or (rank is not None and axis == rank - 1)):
        raise ValueError(f"A ragged `{name}` is computed along its last (ragged) axis: "
                         f"`axis` must be -1, got {axis!r}.")
    if weights is not None:
        raise ValueError(f"`weights` are not supported with a ragged `{name}`: pad it "
                         f"(`{name}.to_tensor()`) and pass dense `weights`, 0 at the "
                         "padding, or `mask`.")


def _check_list_axis(x: tf.RaggedTensor, name: str):
    if x.flat_values.shape.rank != 1:
        raise ValueError(f"A ragged `{name}` must be ragged along its last axis (the "
                         f"list axis), got flat values of shape {x.flat_values.shape}.")


def _list_level(t: tf.RaggedTensor, outer: int) -> tf.RaggedTensor:
    """`t` without its first `outer` ragged partitions: axis 0 indexes the lists."""
    if outer == 0:
        return t
    return tf.RaggedTensor.from_nested_row_splits(t.flat_values, t.nested_row_splits[outer:],
                                                  validate=False)


def _reattach(source: tf.RaggedTensor, inner):
    """Re-attaches the outer ragged partitions of `source` to a per-list `inner`."""
    outer = source.nested_row_splits[:-1]
    if not outer:
        return inner
    if isinstance(inner, tf.RaggedTensor):
        return tf.RaggedTensor.from_nested_row_splits(
            inner.flat_values, tuple(outer) + tuple(inner.nested_row_splits), validate=False)
    return tf.RaggedTensor.from_nested_row_splits(inner, outer, validate=False)


def gather_rows(t, rows):
    """Rows `rows` of a tensor or `tf.RaggedTensor` (dense gathers of the flat values,
    whose gradient is a plain scatter; uniform partitions stay uniform)."""
    if not isinstance(t, tf.RaggedTensor):
        return tf.gather(t, rows)
    splits = t.row_splits
    starts, limits = tf.gather(splits[:-1], rows), tf.gather(splits[1:], rows)
    values = gather_rows(t.values, tf.ragged.range(starts, limits).flat_values)
    if t.uniform_row_length is not None:
        return tf.RaggedTensor.from_uniform_row_length(values, t.uniform_row_length,
                                                       validate=False)
    return tf.RaggedTensor.from_row_lengths(values, limits - starts, validate=False)


def map_lists(fn, x: tf.RaggedTensor, mask=None, aligned=(), name: str = "x",
              num_buckets: int | None = None):
    """Applies `fn` to the lists of a ragged `x` in groups of similar length.

    The lists are sorted by length and cut into `num_buckets` (default
    `RAGGED_BUCKETS`) groups of consecutive lengths, each padded to its own longest
    list; the groups' results (nests whose axis 0 indexes the group's lists) are put
    back in the order of `x`, with its outer ragged partitions. With an unknown number
    of lists, an empty group computes the shortest list and drops the result.

    Args:
      fn: `fn(lists, aligned, group)`: the group's `RaggedLists` (mask combined with
        `mask`), its rows of the `aligned` tensors, the group's index (0: shortest).
      x: ragged `[..., (n)]`.
      mask: optional ragged bool of the row lengths of `x`, or dense of its padded shape.
      aligned: ragged tensors with the lists of `x` as rows, e.g. `[batch, (n), (n)]`.
      name: the argument name used in error messages.
      num_buckets: the number of groups (>= 1).

    Returns:
      The nest of `fn`'s results for all lists of `x`.
    """
    _check_list_axis(x, name)
    outer = len(x.nested_row_splits) - 1
    lists = _list_level(x, outer)
    lengths = lists.row_lengths()
    count = tf.shape(lengths, out_type=tf.int32)[0]
    if mask is not None:
        if isinstance(mask, tf.RaggedTensor):
            mask = lists.with_flat_values(tf.cast(mask.flat_values, tf.bool))
        else:
            longest = tf.reduce_max(tf.concat([lengths, tf.zeros([1], lengths.dtype)], 0))
            dense = tf.reshape(tf.cast(mask, tf.bool), tf.stack([tf.cast(count, lengths.dtype),
                                                                 longest]))
            mask = tf.RaggedTensor.from_tensor(dense, lengths=lengths)
    aligned = tuple(_list_level(a, outer) for a in aligned)
    groups = RAGGED_BUCKETS if num_buckets is None else int(num_buckets)
    static_count = tf.get_static_value(count)
    if static_count is not None:
        groups = max(1, min(groups, int(static_count)))
    if groups == 1:
        out = fn(RaggedLists.from_ragged(lists, mask, name=name), aligned, 0)
        return tf.nest.map_structure(lambda t: _reattach(x, t), out)
    order = tf.argsort(lengths, stable=True)
    outs, rows_in_concat = [], []
    offset = tf.zeros([], tf.int32)
    for group in range(groups):
        start, stop = group * count // groups, (group + 1) * count // groups
        size = stop - start
        computed = tf.maximum(size, 1)
        rows = tf.where(size > 0, start + tf.range(computed), tf.zeros([computed], tf.int32))
        take = tf.gather(order, rows)
        part = RaggedLists.from_ragged(
            gather_rows(lists, take), None if mask is None else gather_rows(mask, take),
            name=name)
        outs.append(fn(part, tuple(gather_rows(a, take) for a in aligned), group))
        rows_in_concat.append(offset + tf.range(size))
        offset += computed
    # Sorted position r of a list → its row among the concatenated groups' rows.
    back = tf.gather(tf.concat(rows_in_concat, 0), tf.math.invert_permutation(order))
    return tf.nest.map_structure(
        lambda *parts: _reattach(x, gather_rows(tf.concat(parts, 0), back)), *outs)


@dataclasses.dataclass
class RaggedLists:
    """The lists of a `tf.RaggedTensor` ragged along its last axis, padded to a dense
    tensor (`from_ragged`); the `to_*` methods turn results back into ragged form.

    Attributes:
      source: the ragged input.
      dense: `[lists, longest]` values (padding 0; `[lists, 1]` when every list is
        empty, so that operators see at least one (padded) entry).
      mask: bool `[lists, longest]`, True at the entries of the lists.
      lengths: `[lists]` int64 list lengths.
    """

    source: tf.RaggedTensor
    dense: tf.Tensor
    mask: tf.Tensor
    lengths: tf.Tensor

    @classmethod
    def from_ragged(cls, x: tf.RaggedTensor, mask=None, name: str = "x") -> RaggedLists:
        """Pads the lists of `x`; an optional ragged bool `mask` of its row lengths is
        combined with the lists' own."""
        _check_list_axis(x, name)
        lists = tf.RaggedTensor.from_row_splits(x.flat_values, x.nested_row_splits[-1],
                                                validate=False)
        dense = lists.to_tensor(default_value=tf.zeros([], x.dtype))
        present = tf.ones_like(lists.flat_values, tf.bool)
        present = lists.with_flat_values(present).to_tensor(default_value=False)
        if mask is not None:
            user = lists.with_flat_values(tf.cast(mask.flat_values, tf.bool))
            present = tf.logical_and(present, user.to_tensor(default_value=False))
        if dense.shape[-1] == 0:  # only empty lists (known when tracing): one padded entry
            dense = tf.zeros(tf.stack([tf.shape(dense)[0], 1]), dense.dtype)
            present = tf.zeros(tf.shape(dense), tf.bool)
        return cls(source=x, dense=dense, mask=present, lengths=lists.row_lengths())

    def pad_matrices(self, matrices):
        """One `[m, m]` matrix per list (or sample), dense `[..., m, m]` or ragged
        `[lists, (n), (n)]`, as dense matrices; m = 0 (empty lists only) is padded with
        zeros to the one padded entry of `dense`."""
        if isinstance(matrices, tf.RaggedTensor):
            matrices = matrices.to_tensor()
        matrices = tf.convert_to_tensor(matrices)
        width, size = self.dense.shape[-1], matrices.shape[-1]
        if width is not None and size is not None:
            missing = width if size == 0 else 0
            if missing == 0:
                return matrices
        else:
            width, size = tf.shape(self.dense)[-1], tf.shape(matrices)[-1]
            missing = tf.where(tf.equal(size, 0), width, tf.zeros_like(width))
        paddings = [[0, 0]] * (matrices.shape.rank - 2) + [[0, missing], [0, missing]]
        return tf.pad(matrices, paddings)

    def to_elementwise(self, out):
        """`[lists, longest]` result → ragged with the row lengths of `source`."""
        return _reattach(self.source, tf.RaggedTensor.from_tensor(out, lengths=self.lengths))

    def to_prefix(self, out, lengths):
        """`[lists, k]` result → ragged lists of the given lengths (e.g. min(k, n))."""
        inner = tf.RaggedTensor.from_tensor(out, lengths=tf.cast(lengths, tf.int64))
        return _reattach(self.source, inner)

    def to_per_list(self, out):
        """`[lists, ...]` result without a list axis → dense `[lists, ...]` for a source
        `[batch, (n)]`, else ragged over the outer partitions of `source`."""
        return _reattach(self.source, out)

    def to_square(self, out):
        """`[lists, longest, longest]` result → ragged `[lists, (n), (n)]` (with the
        outer partitions of `source`)."""
        rows = tf.RaggedTensor.from_tensor(out, lengths=self.lengths)  # [lists, (n), longest]
        inner_lengths = tf.repeat(self.lengths, self.lengths)
        cells = tf.RaggedTensor.from_tensor(rows.flat_values, lengths=inner_lengths)
        square = tf.RaggedTensor.from_row_lengths(cells, self.lengths, validate=False)
        return _reattach(self.source, square)

"""Variable-length lists: the one padding / mask convention, and its helpers.

Every operator, layer, loss and metric of the package honours this convention.

Masks
-----
- Functional operators take a keyword `mask=None`: boolean (or 0/1), of the shape of
  `x` or of shape `[n]` (broadcast over the other axes); True marks a valid entry,
  False padding. n_valid is the number of valid entries of a list.
- Layers honour Keras masking (`supports_masking = True`; the Keras mask of the input,
  e.g. from `keras.layers.Masking` or `Embedding(mask_zero=True)`, is used as `mask`;
  a Keras mask of the input's shape without its last axis is broadcast along it) and
  also accept an explicit `mask` call argument. `compute_mask` returns the input mask
  for elementwise outputs (ranks, CDFs, quantile normalisation, top-k masks); for
  sorted outputs the mask of their valid positions, the first n_valid (min(k, n_valid)
  with `topk=k`) along the list axis; None where the output has no list axis
  (quantiles) or one of a fixed length m (`num_targets`).
- `weights=` keeps its meaning (zero weight = zero mass); where both are given, the
  mask is applied on top of the weights.

What padding means
------------------
- Padded entries get no mass and do not move the valid entries' results: values and
  gradients on the valid entries equal those of the op on the unpadded list (exactly
  for SoftSort, NeuralSort and the hard operators; up to the solver's `threshold` for
  the Sinkhorn operators), whatever the padded values are. NaN and ±inf included: they
  are replaced (`replace_padded`, a `tf.where` before any arithmetic) so no NaN reaches
  the results or the gradient. Padded entries receive exactly zero gradient.
- Ranks and sorts are those of the valid entries alone: ranks of valid entries lie in
  [1, n_valid] ([0, n_valid − 1] with `zero_based=True`); CDF values in [0, 1].
- Fill value 0 at padded positions of every elementwise output (ranks, CDFs, quantile
  normalisation, top-k masks). Sorted outputs of length n: the first n_valid positions
  hold the valid sorted values, the remaining positions are 0 (`topk=k` with
  n_valid < k: the n_valid sorted values, then 0). Permutation matrices `[n, n]`: the
  rows of sorted positions >= n_valid and the columns of padded entries are 0, so the
  valid block is the unpadded P̂. Zero gradient flows through the fill.
- A list without any valid entry: outputs 0 everywhere (quantiles included), no NaN,
  zero gradient.
- Sinkhorn operators: the default target of m = n bins becomes, per list, the n_valid
  bins of the unpadded list (on either target grid, `targets='centres'` or
  `'regular'`: y_j = (j − 1)/(n_valid − 1) on the regular grid); an explicit
  `num_targets` or `target_weights` is the target of the valid entries (ranks are then
  n_valid · CDF), and `topk=k`/`k` are read per list against n_valid (rows with
  n_valid <= k: all valid entries are selected).

Non-finite scores
-----------------
One rule for every family, at valid entries (padded ones are never read):

- A NaN makes its whole list NaN (every output of that list; the other lists of the
  batch are untouched, and no NaN reaches their gradient).
- A ±inf score is the limit of a score growing without bound: +inf ranks and sorts
  last in ascending order (first in descending), takes the top-k mass first (mass 1,
  or k shared among tied +inf), and −inf the reverse; infinities of one sign are
  tied; the finite entries get the results of the finite entries alone (permutahedron
  ranks: their projection onto the ranks left between the infinities). A family
  whose limit is not that (it moves every result, or depends on how the scores grow)
  returns NaN for the whole list instead. Infinite entries get zero gradient.
- Which families take the limits: LapSum (every operation) and the permutahedron
  ranks; the permutahedron sort (its projection keeps the sum of the values), SoftSort,
  NeuralSort, the sorting networks and Sinkhorn (its squashing standardises the
  scores) return NaN lists. `tests/ops/test_family_properties.py` checks the rule.

Ragged tensors
--------------
A `tf.RaggedTensor` ragged along the operated axis, which must be the last axis (its
`flat_values` of rank 1), is accepted wherever a list is: the op pads the lists to a
dense `[lists, longest]` tensor with a mask (`RaggedLists`) and returns a ragged
output with the same row lengths (elementwise outputs and sorts), ragged rows of
length min(k, n_valid) for `topk`, one ragged `[(n), (n)]` matrix per list for
permutation matrices, and a dense (or outer-ragged) tensor when the output has no list
axis (quantiles).

Padding every list to the longest one would make a batch of lists of lengths 10–1000
cost as much as a batch of 1000-long lists (the permutation and Sinkhorn operators are
quadratic in n). So the op sorts the lists by length and computes them in
`RAGGED_BUCKETS` groups of consecutive lengths, each padded only to its own longest
list (`map_lists`); the results are put back in the input's order. For Gumbel-perturbed
operators the seed of group g > 0 is `stateless_fold_in(seed, g)`, so every list gets
its own noise; as with masks, the noise of a list depends on its padded shape and
group. docs/benchmarks.md ("Variable-length lists") measures the gain.

Dynamic shapes
--------------
The list length n may be unknown when a graph is traced (`tf.function` with an
`input_signature` of `None` dimensions, Keras `Input((None,))` fed several lengths):
`_shapes.to_batch` then carries n as a scalar tensor (`view.n`, `view.static_n` is
None) and arguments that must be compared with n (`k <= n`, ...) are checked at run
time with `tf.debugging` assertions naming the argument.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from softsort_tf import _checks, _shapes


def as_bool(mask, name: str = "mask"):
    """`mask` as a bool tensor (a 0/1 or other numeric mask: True where non-zero); a
    string or complex mask raises a `ValueError` naming `name` (`_checks.check_mask`)."""
    mask = tf.convert_to_tensor(mask)
    _checks.check_mask(name, mask)
    if mask.dtype != tf.bool:
        mask = tf.not_equal(mask, tf.zeros([], mask.dtype))
    return mask


def checked_mask(mask, x, name: str = "mask", shape_rule: str | None = None):
    """`mask` as bool, checked to broadcast to the static shape of `x`.

    Args:
      mask: boolean or 0/1 tensor.
      x: the tensor the mask belongs to.
      name: the argument name used in error messages.
      shape_rule: what the message says the shape must be (default: "broadcast to the
        shape of x").

    Returns:
      The bool mask, not yet broadcast.
    """
    mask = as_bool(mask, name)
    try:
        tf.broadcast_static_shape(mask.shape, x.shape)
    except ValueError:
        rule = shape_rule or f"broadcast to the shape {x.shape}"
        raise ValueError(f"`{name}` must {rule}, got {mask.shape} for an input of shape "
                         f"{x.shape}.") from None
    return mask


def mask_to_batch(mask, view: _shapes.BatchView, name: str = "mask"):
    """The mask in the `[batch, n]` layout of `_shapes.to_batch`, as bool.

    Args:
      mask: boolean or 0/1 tensor of shape `[n]` or of the shape of `x` (broadcastable
        to it), or None.
      view: the `BatchView` of `x`.
      name: the argument name used in error messages.

    Returns:
      A bool `[batch, n]` tensor, or None for `mask=None`.
    """
    if mask is None:
        return None
    if isinstance(mask, tf.RaggedTensor):
        raise ValueError(f"A ragged `{name}` needs a ragged `x` of the same row lengths.")
    mask = as_bool(mask, name)
    rank = mask.shape.rank
    batch = tf.reduce_prod(view.moved_shape[:-1])
    if rank == 1:
        if mask.shape[0] is not None and view.static_n is not None and \
                mask.shape[0] not in (1, view.static_n):
            raise ValueError(f"`{name}` of rank 1 must have length n = {view.static_n}, got "
                             f"{mask.shape[0]}.")
        return tf.broadcast_to(mask[tf.newaxis, :], tf.stack([batch, view.n]))
    if rank != view.rank:
        raise ValueError(f"`{name}` must have shape [n] or the shape of `x`; got rank {rank} "
                         f"for an input of rank {view.rank}.")
    if view.axis != view.rank - 1:
        mask = tf.transpose(mask, view.perm)
    try:
        tf.broadcast_static_shape(mask.shape, view.static_moved_shape)
    except ValueError:
        raise ValueError(f"`{name}` must have shape [n] or the shape of `x` (with the "
                         f"operated axis last: {mask.shape} vs {view.static_moved_shape})."
                         ) from None
    mask = tf.broadcast_to(mask, view.moved_shape)
    return tf.reshape(mask, tf.stack([batch, view.n]))


def n_valid(mask2d, dtype=tf.int32, keepdims: bool = False):
    """Number of valid entries of each row of a bool `[batch, n]` mask."""
    return tf.reduce_sum(tf.cast(mask2d, dtype), axis=-1, keepdims=keepdims)


def valid_prefix(count, length):
    """bool `[batch, length]`: position j < count[b] (the valid positions of a sorted
    output). `count`: `[batch]` integer tensor; `length`: int or scalar tensor."""
    positions = tf.range(length, dtype=count.dtype)
    return positions[tf.newaxis, :] < count[:, tf.newaxis]


def replace_padded(x2d, mask2d, fill=None):
    """x with its padded entries replaced by a constant, before any arithmetic.

    The replacement is a `tf.where`, so NaN/±inf padded values never reach the results
    or the gradient, and padded entries get exactly zero gradient.

    Args:
      x2d: `[batch, n]` values.
      mask2d: bool `[batch, n]` (True = valid), or None (x returned unchanged).
      fill: the replacement, broadcastable to x (no gradient flows into it). Default:
        the largest valid value of the row (a value inside the row's range, so that
        scale statistics are not moved), 0 for a row without valid entry.

    Returns:
      `[batch, n]` values, finite wherever x is finite at valid entries.
    """
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
    """Logical AND of the masks that are not None (None if all are)."""
    out = None
    for mask in masks:
        if mask is None:
            continue
        mask = tf.cast(mask, tf.bool)
        out = mask if out is None else tf.logical_and(out, mask)
    return out


def is_ragged(x) -> bool:
    return isinstance(x, tf.RaggedTensor)


RAGGED_BUCKETS = 4
"""How many groups of similar length the lists of a ragged input are computed in (see
"Ragged tensors" above): 1 pads every list to the longest; more groups pad less but run
the operator more times per call (more dispatch in eager mode, a larger graph)."""


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
    """Rows `rows` (integer `[k]`) of a tensor or `tf.RaggedTensor` along axis 0.

    Written with dense `tf.gather`s of the flat values (whose gradient is a plain
    scatter), keeping uniform partitions uniform."""
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

    The lists (the rows of the last ragged partition) are sorted by length and cut into
    `num_buckets` (default `RAGGED_BUCKETS`) groups of consecutive lengths, as equal in
    count as possible; each group is padded to its own longest list only. `fn` returns,
    for a group, a nest of tensors (ragged or dense) whose axis 0 indexes the group's
    lists, typically through the `RaggedLists.to_*` methods; the groups' results are
    concatenated, put back in the order of `x` and given the outer ragged partitions of
    `x`. Runs in eager mode and in graphs with an unknown number of lists (a group
    without lists then computes the shortest list and its result is dropped); not
    under XLA, which cannot compile ragged tensors.

    Args:
      fn: `fn(lists, aligned, group)`: `lists` a `RaggedLists` of the group (its mask
        combines the lists' and `mask`), `aligned` the group's rows of the `aligned`
        tensors, `group` the int index of the group (0 is the shortest lists).
      x: ragged `[..., (n)]` (ragged along its last axis).
      mask: optional ragged bool of the row lengths of `x`, or dense of its padded shape.
      aligned: ragged tensors with the outer partitions of `x` whose rows (after them)
        are those of `x`'s lists, e.g. ragged `[batch, (n), (n)]` matrices.
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
    """The lists of a `tf.RaggedTensor` ragged along its last axis, as a dense tensor.

    `RaggedLists.from_ragged(x)` pads the innermost rows (the lists) to
    `dense: [lists, longest]` with `mask` False at the padding; the `to_*` methods
    turn a result computed on `dense` back into ragged form.

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
        """Pads the lists of `x`; `mask` (optional) is a ragged bool tensor of the same
        row lengths (`map_lists` turns a dense mask into one), combined with the lists'."""
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
        """Square matrices of the lists, dense `[..., lists, longest, longest]` like `dense`.

        Args:
          matrices: one `[m, m]` matrix per list (or per sample of a list), dense
            `[..., m, m]` or ragged `[lists, (n), (n)]` (padded with zeros). Matrices of
            a group of empty lists only (m = 0) are padded with zeros to the one padded
            entry of `dense`, so that they apply to it; other sizes are returned as they
            are.

        Returns:
          The dense matrices.
        """
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

    def _outer(self, inner):
        """Re-attaches the outer ragged partitions of `source` to per-list `inner`."""
        return _reattach(self.source, inner)

    def to_elementwise(self, out):
        """`[lists, longest]` result → ragged with the row lengths of `source`."""
        inner = tf.RaggedTensor.from_tensor(out, lengths=self.lengths)
        return self._outer(inner)

    def to_prefix(self, out, lengths):
        """`[lists, k]` result → ragged lists of the given lengths (e.g. min(k, n))."""
        inner = tf.RaggedTensor.from_tensor(out, lengths=tf.cast(lengths, tf.int64))
        return self._outer(inner)

    def to_per_list(self, out):
        """`[lists, ...]` result without a list axis → dense `[lists, ...]` for a source
        `[batch, (n)]`, else ragged over the outer partitions of `source`."""
        return self._outer(out)

    def to_square(self, out):
        """`[lists, longest, longest]` result → ragged `[lists, (n), (n)]` (with the
        outer partitions of `source`)."""
        rows = tf.RaggedTensor.from_tensor(out, lengths=self.lengths)  # [lists, (n), longest]
        inner_lengths = tf.repeat(self.lengths, self.lengths)
        cells = tf.RaggedTensor.from_tensor(rows.flat_values, lengths=inner_lengths)
        square = tf.RaggedTensor.from_row_lengths(cells, self.lengths, validate=False)
        return self._outer(square)

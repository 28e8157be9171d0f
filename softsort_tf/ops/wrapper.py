"""The one operator wrapper: axis, dynamic shapes, masks, ragged lists, dtype, info.

An operator of the package is written as its read-out on a batch of lists: a function
whose first argument is a `Lists` (`[batch, n]` values in the compute dtype, with their
mask, weights and valid counts) and which returns a `ListResult` (the values and the
kind of output). `list_operator` turns it into the public operator, which

- moves `axis` last and flattens the other axes into a batch axis (any rank, a list
  length n unknown at trace time included);
- reads `mask` (the package's padding convention, see `softsort_tf._masking`) and
  replaces padded values before any arithmetic (NaN/Inf padding is harmless);
- reads per-entry `weights` for the operators that take them;
- computes float16/bfloat16 in float32 and returns the input dtype;
- runs a `tf.RaggedTensor` input (ragged along its last axis) in groups of lists of
  similar length (`_masking.map_lists`) and returns a ragged output;
- returns `(output, info)` with `return_info=True` for operators that report one.

Output kinds (`ListResult.kind`):

- 'elementwise': `[batch, n]`, one value per input entry, 0 at padded entries;
- 'sorted': `[batch, m]` values in sorted order; with `lengths` (`[batch]`), the
  positions past a row's length are 0 (ragged: rows of that length);
- 'per_list': `[batch, q]` or `[batch]` (the list axis removed), 0 for a list without
  valid entries;
- 'square': `[batch, n, n]` matrices (ragged: `[lists, (n), (n)]`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

import tensorflow as tf

from softsort_tf import _masking, _shapes

OUTPUT_KINDS = ("elementwise", "sorted", "per_list", "square")


@dataclasses.dataclass
class Lists:
    """A batch of lists in the layout operators compute in.

    Attributes:
      values: `[batch, n]` values in the compute dtype (float32 or float64); padded
        entries replaced by a valid value of their row.
      mask: bool `[batch, n]` (True = valid), or None when every entry is valid.
      weights: `[batch, n]` non-negative input weights summing to 1 per row (before
        the mask is applied), or None (uniform).
      view: how the input was flattened (`_shapes.BatchView`).
    """

    values: tf.Tensor
    mask: tf.Tensor | None
    weights: tf.Tensor | None
    view: _shapes.BatchView

    @property
    def dtype(self) -> tf.DType:
        return self.values.dtype

    @property
    def n(self):
        """The list length: a Python int when known at trace time, else a scalar tensor."""
        return self.view.n

    @property
    def static_n(self) -> int | None:
        return self.view.static_n

    def count(self, dtype=None):
        """`[batch]` number of valid entries of each list (n for every row without a
        mask), in `dtype` (default the compute dtype)."""
        dtype = self.dtype if dtype is None else dtype
        if self.mask is None:
            return tf.fill(tf.shape(self.values)[:1], tf.cast(self.n, dtype))
        return _masking.n_valid(self.mask, dtype)


@dataclasses.dataclass
class ListResult:
    """What an operator body returns (see the module docstring for `kind`).

    Attributes:
      values: the `[batch, ...]` result.
      kind: one of `OUTPUT_KINDS`.
      lengths: for 'sorted' outputs, `[batch]` integer lengths of the valid prefixes
        (None: every position is valid).
      info: a namedtuple of `[batch]` tensors reported with `return_info=True`, or None.
    """

    values: tf.Tensor
    kind: str
    lengths: tf.Tensor | None = None
    info: tuple | None = None


def _dense_output(result: ListResult, lists: Lists):
    """The public dense output of a `ListResult`, in the input's layout and dtype."""
    view, values = lists.view, result.values
    if result.kind == "elementwise":
        return _shapes.from_batch(_masking.fill_padded(values, lists.mask), view)
    if result.kind == "sorted":
        if result.lengths is not None:
            keep = _masking.valid_prefix(tf.cast(result.lengths, tf.int32), tf.shape(values)[-1])
            values = _masking.fill_padded(values, keep)
        return _shapes.from_batch(values, view)
    if result.kind == "per_list":
        keep_axis = values.shape.rank == 2
        if lists.mask is not None:
            has_valid = tf.reduce_any(lists.mask, axis=-1)
            values = _masking.fill_padded(values, has_valid[:, None] if keep_axis else has_valid)
        return _shapes.from_batch(values, view, keep_axis=keep_axis)
    if result.kind == "square":
        n = view.n
        out = tf.reshape(values, tf.concat([view.moved_shape[:-1], tf.stack([n, n])], axis=0))
        out.set_shape(view.static_moved_shape[:-1].concatenate([view.static_n, view.static_n]))
        return tf.cast(out, view.output_dtype)
    raise ValueError(f"Unknown output kind {result.kind!r}; expected one of {OUTPUT_KINDS}.")


def _ragged_output(result: ListResult, lists: _masking.RaggedLists):
    """The ragged output of a `ListResult` computed on padded ragged lists."""
    values = tf.cast(result.values, lists.source.dtype) if lists.source.dtype.is_floating \
        else result.values
    if result.kind == "elementwise":
        return lists.to_elementwise(_masking.fill_padded(values, lists.mask))
    if result.kind == "sorted":
        lengths = result.lengths if result.lengths is not None else tf.fill(
            tf.shape(values)[:1], tf.shape(values)[1])
        return lists.to_prefix(values, lengths)
    if result.kind == "per_list":
        return lists.to_per_list(values)
    return lists.to_square(values)


def _info_output(info, view: _shapes.BatchView):
    lead = view.moved_shape[:-1]
    return type(info)(*(tf.reshape(v, lead) for v in info))


def _lists(x, axis, mask, weights, check_numerics, name):
    """`Lists` of a dense input."""
    x2d, view = _shapes.to_batch(x, axis, name)
    mask2d = _masking.mask_to_batch(mask, view)
    x2d = _masking.replace_padded(x2d, mask2d)
    if check_numerics:
        x2d = tf.debugging.check_numerics(x2d, f"softsort_tf: `{name}` has NaN or Inf")
    w2d = None if weights is None else _shapes.weights_to_batch(weights, view, x2d.dtype)
    return Lists(values=x2d, mask=mask2d, weights=w2d, view=view)


def list_operator(body):
    """Makes the public operator of an operator body (see the module docstring).

    `body` has the operator's public signature, its first parameter the input tensor
    (named `x` or `scores`). It is called with a `Lists` in place of that tensor and
    without `axis`, `mask`, `weights`, `check_numerics` and `return_info` (handled
    here; parameters the signature lacks are not accepted: an operator without `axis`
    sorts along the last axis). It returns a `ListResult`.
    """
    signature = inspect.signature(body)
    params = list(signature.parameters)
    name = params[0]

    @functools.wraps(body)
    def operator(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        x = arguments.pop(name)
        axis = arguments.pop("axis", -1)
        mask = arguments.pop("mask", None)
        weights = arguments.pop("weights", None)
        check_numerics = arguments.pop("check_numerics", False)
        return_info = arguments.pop("return_info", False)
        extra = {}
        if signature.parameters and any(p.kind == p.VAR_KEYWORD
                                        for p in signature.parameters.values()):
            var_kw = next(p.name for p in signature.parameters.values()
                          if p.kind == p.VAR_KEYWORD)
            extra = arguments.pop(var_kw, {})

        def compute(values, axis_, mask_):
            lists = _lists(values, axis_, mask_, weights, check_numerics, name)
            return body(lists, **arguments, **extra), lists

        if _masking.is_ragged(x):
            _masking.check_ragged_call(x, axis, weights, name)

            def run(ragged_lists, aligned, group):
                del aligned, group
                result, _ = compute(ragged_lists.dense, -1, ragged_lists.mask)
                out = _ragged_output(result, ragged_lists)
                if not return_info:
                    return out
                info = type(result.info)(*(ragged_lists.to_per_list(v) for v in result.info))
                return out, info

            return _masking.map_lists(run, x, mask, name=name)
        result, lists = compute(x, axis, mask)
        out = _dense_output(result, lists)
        if return_info:
            if result.info is None:
                raise ValueError("This operator reports no `return_info`.")
            return out, _info_output(result.info, lists.view)
        return out

    return operator

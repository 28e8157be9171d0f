"""The one operator wrapper: axis, dynamic shapes, masks, ragged lists, dtype, info.

An operator is written as a body on a batch of lists: it takes a `Lists` (`[batch, n]`
values in the compute dtype, padding replaced, with mask and weights) and returns a
`ListResult`. `list_operator` makes it the public operator: any axis and rank (n
unknown at trace time included), `mask` and `weights`, float16/bfloat16 computed in
float32, ragged lists in groups (`_masking.map_lists`), `return_info=True`.

Output kinds (`ListResult.kind`): 'elementwise' `[batch, n]` (0 at padding); 'sorted'
`[batch, m]` (with `lengths`, 0 past each row's length); 'per_list' `[batch, q]` or
`[batch]` (0 for a list without valid entries); 'square' `[batch, n, n]`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

import tensorflow as tf

from softsort_tf import _masking

OUTPUT_KINDS = ("elementwise", "sorted", "per_list", "square")


@dataclasses.dataclass
class Lists:
    """A batch of lists in the layout operators compute in: `values` `[batch, n]`
    (padding replaced), `mask` (bool, or None: all valid), `weights` (summing to 1 per
    row before the mask, or None: uniform) and the `view` of the input's flattening."""

    values: tf.Tensor
    mask: tf.Tensor | None
    weights: tf.Tensor | None
    view: _masking.BatchView

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
    """What an operator body returns: `values` `[batch, ...]` of a `kind` of
    `OUTPUT_KINDS`; for 'sorted', the `lengths` `[batch]` of the valid prefixes (None:
    all valid); `info`, a namedtuple of `[batch]` tensors for `return_info=True`."""

    values: tf.Tensor
    kind: str
    lengths: tf.Tensor | None = None
    info: tuple | None = None


def _dense_output(result: ListResult, lists: Lists):
    """The public dense output of a `ListResult`, in the input's layout and dtype."""
    view, values = lists.view, result.values
    if result.kind == "elementwise":
        return _masking.from_batch(_masking.fill_padded(values, lists.mask), view)
    if result.kind == "sorted":
        if result.lengths is not None:
            keep = _masking.valid_prefix(tf.cast(result.lengths, tf.int32), tf.shape(values)[-1])
            values = _masking.fill_padded(values, keep)
        return _masking.from_batch(values, view)
    if result.kind == "per_list":
        keep_axis = values.shape.rank == 2
        if lists.mask is not None:
            has_valid = tf.reduce_any(lists.mask, axis=-1)
            values = _masking.fill_padded(values, has_valid[:, None] if keep_axis else has_valid)
        return _masking.from_batch(values, view, keep_axis=keep_axis)
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


def _lists(x, axis, mask, weights, check_numerics, name):
    """`Lists` of a dense input."""
    x2d, view = _masking.to_batch(x, axis, name)
    mask2d = _masking.mask_to_batch(mask, view)
    x2d = _masking.replace_padded(x2d, mask2d)
    if check_numerics:
        x2d = tf.debugging.check_numerics(x2d, f"softsort_tf: `{name}` has NaN or Inf")
    w2d = None if weights is None else _masking.weights_to_batch(weights, view, x2d.dtype)
    return Lists(values=x2d, mask=mask2d, weights=w2d, view=view)


def list_operator(body):
    """The public operator of `body`, which has the operator's signature (first the
    input) and is called with a `Lists` for the input and without `axis`, `mask`,
    `weights`, `check_numerics` and `return_info` (handled here, if in the signature)."""
    signature = inspect.signature(body)
    name = next(iter(signature.parameters))

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
        var_kw = [p.name for p in signature.parameters.values() if p.kind == p.VAR_KEYWORD]
        extra = arguments.pop(var_kw[0], {}) if var_kw else {}

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
            lead = lists.view.moved_shape[:-1]
            return out, type(result.info)(*(tf.reshape(v, lead) for v in result.info))
        return out

    return operator

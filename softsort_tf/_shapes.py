"""Axis and dtype plumbing: every operator computes on a `[batch, n]` matrix in float32
or float64 (`to_batch`: the axis moved last, the others flattened, float16/bfloat16 in
float32, integers wider than float32's 24-bit significand in float64 so that distinct
integers stay distinct); `from_batch` undoes it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from softsort_tf import _checks

_REDUCED = (tf.float16, tf.bfloat16)


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

"""Axis and dtype plumbing shared by the operators.

Every operator works internally on a `[batch, n]` matrix in float32 or float64.
`to_batch` moves the chosen axis last, flattens the other axes into one batch axis
and casts reduced-precision inputs (float16, bfloat16) to float32; `from_batch`
undoes both on the result.

Integer inputs are computed in float64 when their type holds integers that float32
cannot represent (above 2²⁴: int32, uint32, int64, uint64), so that distinct large
integers stay distinct (float32 made 16777216 and 16777217 a tie), and in float32
otherwise. Results are float64 for 64-bit integers and float32 for the others.
"""

from __future__ import annotations

import dataclasses

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


# Integer types whose values float32 (24-bit significand) cannot all represent.
_WIDE_INTEGERS = (tf.int32, tf.uint32, tf.int64, tf.uint64)


def batch_compute_dtype(dtype: tf.DType) -> tf.DType:
    """The dtype `to_batch` computes in: `compute_dtype`, but float64 for integer types
    wider than float32's 24-bit significand."""
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
    n: int | tf.Tensor  # the list length: a Python int when static, else a scalar tensor
    static_n: int | None = None  # the list length when known at trace time, else None

    @property
    def output_dtype(self) -> tf.DType:
        """The dtype of results: the input's if floating, else float64 for 64-bit
        integers and float32 for the others."""
        if self.input_dtype.is_floating:
            return self.input_dtype
        return tf.float64 if self.input_dtype.size == 8 else tf.float32


def to_batch(x, axis: int = -1, name: str = "x"):
    """Moves `axis` last, flattens the rest into a batch axis, casts to the compute dtype.

    Args:
      x: a tensor of rank >= 1 (not a `tf.RaggedTensor`: a `ValueError` says to pad it
        and pass a mask, `_checks.check_dense`).
      axis: the axis to operate along.
      name: the argument name used in error messages.

    Returns:
      `(x2d, view)` with `x2d` of shape `[batch, n]`.
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
    # An unknown list length (a model fed several lengths, `tf.function` with a `None`
    # dimension) is carried as a scalar tensor; operators that need it as a number read
    # `view.static_n` (None then).
    n = int(static) if static is not None else moved_shape[-1]
    view = BatchView(
        axis=axis,
        rank=rank,
        perm=perm,
        moved_shape=moved_shape,
        static_moved_shape=moved.shape,
        input_dtype=x.dtype,
        n=n,
        static_n=None if static is None else int(static),
    )
    x2d = tf.reshape(moved, [-1, n])
    x2d = tf.cast(x2d, batch_compute_dtype(x.dtype))
    return x2d, view


def from_batch(y2d, view: BatchView, keep_axis: bool = True, cast: bool = True):
    """Inverse of `to_batch` for a result of shape `[batch, m]` (or `[batch]`).

    Args:
      y2d: `[batch, m]` result, or `[batch]` when `keep_axis=False`.
      view: the `BatchView` returned by `to_batch`.
      keep_axis: when False the operated axis is removed from the output.
      cast: cast back to the input dtype (when the input was floating point; results
        of integer inputs are always cast to `view.output_dtype`).
    """
    lead = view.moved_shape[:-1]
    static_lead = view.static_moved_shape[:-1]
    if keep_axis:
        m = y2d.shape[-1]
        out = tf.reshape(y2d, tf.concat([lead, [tf.shape(y2d)[-1]]], axis=0))
        out.set_shape(static_lead.concatenate([m]))
        if view.axis != view.rank - 1:
            inv = [0] * view.rank
            for i, p in enumerate(view.perm):
                inv[p] = i
            out = tf.transpose(out, inv)
    else:
        out = tf.reshape(y2d, lead)
        out.set_shape(static_lead)
    if view.input_dtype.is_integer or (cast and view.input_dtype.is_floating):
        out = tf.cast(out, view.output_dtype)
    return out


def weights_to_batch(weights, view: BatchView, dtype, name: str = "weights"):
    """Broadcasts per-element weights to `[batch, n]` and normalises them to sum to 1.

    `weights` may have shape `[n]` or the full shape of `x`. Weights must be finite and
    non-negative with a positive sum (checked when their values are known at trace time).
    """
    n = view.n
    if weights is None:
        return None
    w = tf.convert_to_tensor(weights)
    _checks.check_weight_values(name, w, allow_zero=True)
    if w.shape.rank == 1:
        if w.shape[0] is not None and view.static_n is not None and w.shape[0] != n:
            raise ValueError(f"`{name}` of rank 1 must have length n = {n}, got {w.shape[0]}.")
        w = tf.cast(w, dtype)
        batch = tf.reduce_prod(view.moved_shape[:-1])
        w = tf.broadcast_to(w[tf.newaxis, :], tf.stack([batch, n]))
    else:
        if w.shape.rank != view.rank:
            raise ValueError(f"`{name}` must have shape [n] or the shape of `x`; got rank "
                             f"{w.shape.rank} for an input of rank {view.rank}.")
        if view.axis != view.rank - 1:
            w = tf.transpose(w, view.perm)
        if not w.shape.is_compatible_with(view.static_moved_shape):
            raise ValueError(f"`{name}` must have shape [n] or the shape of `x`; got a "
                             f"tensor of rank {view.rank} that does not match `x` (with "
                             f"the sorted axis last: {w.shape} vs {view.static_moved_shape}).")
        w = tf.reshape(tf.cast(w, dtype), [-1, n])
    return w / tf.reduce_sum(w, axis=-1, keepdims=True)

"""Argument validation shared by every operator, layer and loss: each check raises a
`ValueError` naming the argument and the allowed values."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

DIRECTIONS = ("ASCENDING", "DESCENDING")


def check_direction(direction: str) -> str:
    """Returns `direction` upper-cased; raises if it is not a sort direction."""
    if not isinstance(direction, str) or direction.upper() not in DIRECTIONS:
        raise ValueError(
            f"`direction` must be 'ASCENDING' or 'DESCENDING' (as in tf.sort), got {direction!r}."
        )
    return direction.upper()


def check_choice(name: str, value, choices: tuple):
    """Returns `value` if it is one of `choices`."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}, got {value!r}.")
    return value


def check_positive(name: str, value, *, allow_none: bool = False) -> float | None:
    """Checks that `value` is a finite real number > 0 (not a bool, a string or a tensor,
    which would be read as a constant and get no gradient)."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_, str, bytes)):
        raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}.")
    if type(value).__module__.split(".")[0] in ("tensorflow", "keras"):
        raise ValueError(f"`{name}` must be a Python number here, got a {type(value).__name__}:"
                         f" a tensor would be read as a constant and get no gradient (a "
                         f"learnable temperature goes to a family that takes one, see "
                         f"`softsort_tf.FAMILIES[...].tensor_temperature`).")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}.") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}.")
    return v


def check_in_open_interval(name: str, value, low: float, high: float) -> float:
    """Checks that `low < value < high`."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` must be a number in ({low}, {high}), got {value!r}.") from None
    if not (low < v < high):
        raise ValueError(f"`{name}` must be in the open interval ({low}, {high}), got {value!r}.")
    return v


def check_bool(name: str, value) -> bool:
    """Checks that `value` is True or False."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False, got {value!r}.")
    return bool(value)


def check_int(name: str, value) -> int:
    """Checks that `value` is an integer (an axis, for example)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"`{name}` must be an integer, got {value!r}.")
    return int(value)


def check_positive_int(name: str, value, *, minimum: int = 1) -> int:
    """Checks that `value` is an integer >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")
    return int(value)


def check_quantiles(quantiles) -> tuple[np.ndarray, bool]:
    """Validated quantile levels: a float64 array `[q]`, and whether they were a scalar."""
    items = np.asarray(quantiles, dtype=object).ravel()
    if any(isinstance(q, (str, bytes, bool, np.bool_)) for q in items):
        raise ValueError(f"`quantiles` must be numbers in (0, 1), got {quantiles!r}.")
    arr = np.asarray(quantiles, dtype=np.float64)
    scalar = arr.ndim == 0
    arr = np.atleast_1d(arr)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            f"`quantiles` must be a scalar or a non-empty 1-D sequence, got shape {arr.shape}."
        )
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0.0) or np.any(arr >= 1.0):
        raise ValueError(f"`quantiles` must lie in the open interval (0, 1), got {arr.tolist()}.")
    if np.any(np.diff(arr) <= 0.0):
        raise ValueError(f"`quantiles` must be strictly increasing, got {arr.tolist()}.")
    return arr, scalar


def check_axis(axis: int, rank: int) -> int:
    """Returns the non-negative axis; raises for rank-0 inputs or out-of-range axes."""
    if rank is None:
        raise ValueError("The input must have a known rank (>= 1).")
    if rank == 0:
        raise ValueError("The input `x` must have rank >= 1; got a scalar (rank 0).")
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise ValueError(f"`axis` must be an integer, got {axis!r}.")
    if not -rank <= axis < rank:
        raise ValueError(f"`axis` must be in [{-rank}, {rank - 1}] for an input of rank {rank}, "
                         f"got {axis}.")
    return int(axis) % rank


def check_k(k, n: int, name: str = "k") -> int:
    """Checks 1 <= k < n."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k < n:
        raise ValueError(f"`{name}` must be an integer in [1, n) = [1, {n}), got {k!r}.")
    return int(k)


def check_weight_values(name: str, weights, *, allow_zero: bool) -> None:
    """Checks weights whose values are known when tracing: finite, > 0 (>= 0 with
    `allow_zero`), a positive sum along the last axis."""
    value = tf.get_static_value(weights)
    if value is None:
        return
    value = np.asarray(value, dtype=np.float64)
    bound = ">= 0" if allow_zero else "> 0"
    bad = ~np.isfinite(value) | ((value < 0) if allow_zero else (value <= 0))
    if np.any(bad):
        raise ValueError(f"`{name}` must be finite and {bound}, got "
                         f"{value[bad].ravel()[:3].tolist()} among them.")
    if value.ndim and np.any(value.sum(axis=-1) <= 0):
        raise ValueError(f"`{name}` must have a positive sum along the sorted axis.")


def check_real_dtype(name: str, dtype) -> None:
    """Checks that `dtype` is real (floating point or integer): a cast of bool, complex
    or string tensors would turn them into numbers silently."""
    dtype = tf.as_dtype(dtype)
    if not (dtype.is_floating or dtype.is_integer):
        raise ValueError(f"`{name}` must be a real tensor (floating point or integer), got "
                         f"dtype {dtype.name}; cast it first if its values are numbers.")


def check_dense(name: str, x, *, mask: str | None = "mask") -> None:
    """Raises a `ValueError` naming `name` if `x` is a `tf.RaggedTensor`, saying to pad
    it and, for an operator with a mask argument (`mask`, or None), to pass the mask.

    Example:
    >>> check_dense("x", tf.ragged.constant([[1.0, 2.0], [3.0]]))
    Traceback (most recent call last):
    ...
    ValueError: `x` must be a dense tensor, got a tf.RaggedTensor: pad its lists ...
    """
    if not isinstance(x, tf.RaggedTensor):
        return
    instead = f"pad its lists (`{name}.to_tensor()`)"
    if mask is not None:
        instead += (f" and pass `{mask}=tf.ones_like({name}, tf.bool).to_tensor(False)` to "
                    f"mark their valid entries")
    raise ValueError(f"`{name}` must be a dense tensor, got a tf.RaggedTensor: {instead}.")


def check_mask(name: str, mask) -> None:
    """Checks a mask tensor (or `tf.RaggedTensor`): boolean, or real numbers 0 and 1
    (values checked where known when tracing)."""
    dtype = tf.as_dtype(mask.dtype)
    if dtype == tf.bool:
        return
    if not (dtype.is_floating or dtype.is_integer):
        raise ValueError(f"`{name}` must be a boolean tensor (True = valid entry) or of "
                         f"0/1 numbers, got dtype {dtype.name}.")
    value = None if isinstance(mask, tf.RaggedTensor) else tf.get_static_value(mask)
    if value is not None and not np.all((value == 0) | (value == 1)):
        raise ValueError(f"`{name}` must be a boolean tensor (True = valid entry) or of "
                         f"0/1 numbers, got values {np.unique(value)[:5].tolist()}.")


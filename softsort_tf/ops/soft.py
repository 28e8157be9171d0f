"""The front door: soft ranks, sorts, top-k masks and quantiles by any method.

`soft_rank`, `soft_sort`, `soft_topk` and `soft_quantile` take `method=`, a key of
`FAMILIES` (`softsort_tf.ops.family`), and check every argument before any computation:
the family's own keywords (an unknown one is refused with the family's names), the
temperature (`Family.check_temperature`), k (an integer in [1, n), a real in (0, n) for
LapSum) and the mask's shape. Naming and direction conventions: docs/api.md; the
families' temperatures: docs/options.md. The families with a relaxed permutation matrix
P̂ read their operations off it (ranks P̂ᵀ(1..n), sorted values P̂x, top-k membership
the column sums of its first k rows).
"""

from __future__ import annotations

import tensorflow as tf

from softsort_tf import _checks, _docs, _masking
from softsort_tf.ops.family import Family, get_family, get_matrix_family


def temperature_kwargs(method: str, temperature) -> dict:
    """`{name: temperature}` for the temperature argument of `method`, validated; `{}`
    for None (the family's default)."""
    family = get_family(method)
    temperature = family.check_temperature(temperature)
    return {} if temperature is None else {family.temperature: temperature}


def _check_arguments(family: Family, operation: str, dtype: tf.DType, temperature,
                     kwargs: dict) -> dict:
    """`kwargs` checked against the family's `operation`, with the temperature (checked
    for inputs of `dtype`) under the family's own name."""
    family.check_keywords(kwargs, operation)
    if temperature is not None and family.temperature in kwargs:
        raise ValueError(f"`temperature` and `{family.temperature}` set the same argument of "
                         f"method={family.name!r}: pass one of them.")
    dtype = _masking.compute_dtype(dtype)
    if temperature is not None:
        kwargs = {**kwargs, family.temperature: family.check_temperature(temperature, dtype)}
    elif kwargs.get(family.temperature) is not None:
        family.check_temperature(kwargs[family.temperature], dtype, name=family.temperature)
    return kwargs


def _check_mask_shape(mask, x, axis: int) -> None:
    """A `ValueError` naming `mask` and both shapes when a dense mask (or one `[n]`)
    cannot broadcast to `x` (static shapes)."""
    shape = mask.shape
    target = x.shape[axis:axis + 1] if shape.rank == 1 else x.shape
    try:
        fits = tf.broadcast_static_shape(shape, target).is_compatible_with(target)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"`mask` of shape {shape} does not broadcast to the shape {x.shape} "
                         f"of `x`: give one flag per entry of `x` (or per list entry, "
                         f"shape [n]).")


def _call(operation: str, x, args, method, direction, axis, mask, temperature, kwargs):
    """The family's `operation` on `x`, its arguments checked first."""
    family = get_family(method)
    fn = family.operation(operation)
    if isinstance(x, tf.RaggedTensor):
        if axis not in (-1, x.shape.rank - 1):
            raise ValueError(f"A ragged `x` is operated along its last axis: `axis` must be "
                             f"-1, got {axis!r}.")
        if not family.masks:
            raise ValueError(f"method={method!r} takes no padding, and a ragged `x` is "
                             f"lists padded to a common length: pass one list (or lists of "
                             f"one length) at a time, or use a method that takes masks, "
                             f"e.g. 'lapsum'.")
        n = None
    else:
        x = tf.convert_to_tensor(x)
        _checks.check_real_dtype("x", x.dtype)
        if not x.dtype.is_floating:
            x = tf.cast(x, tf.float32)
        axis = _checks.check_axis(axis, x.shape.rank)
        n = x.shape[axis]
        if mask is not None:
            mask = tf.convert_to_tensor(mask)
            _check_mask_shape(mask, x, axis)
    kwargs = _check_arguments(family, operation, x.dtype, temperature, kwargs)
    if operation == "topk":
        args = (family.check_k(args[0], n),)
    return fn(x, *args, direction=direction, axis=axis, mask=mask, **kwargs)


@_docs.fill
def permutation_matrix(scores, method: str = "softsort", direction: str = "DESCENDING",
                       hard: bool = False, *, mask=None, temperature=None, **kwargs):
    """The relaxed permutation matrix P̂ of any family that has one, chosen by name.

    Args:
      scores: `[..., n]` real tensor, or a `tf.RaggedTensor` `[batch, (n)]` (then the
        output is ragged `[batch, (n), (n)]`).
      method: a key of `FAMILIES` whose family has a relaxed matrix ('softsort',
        'neuralsort', 'sinkhorn', 'lapsum', 'sorting_network'; `Family.has_matrix`).
      direction: 'DESCENDING' (default) or 'ASCENDING'.
      hard: straight-through: the exact permutation forward, the relaxation's gradient.
      {mask}
        The valid block of P̂ is the unpadded list's; other rows and columns are 0.
      {temperature}
      log: (keyword, for the families with `log_domain`) return log P̂ computed in the
        log domain, for `permutation_cross_entropy(..., from_log=True)`.
      **kwargs: the family's own arguments (e.g. `distance_power` for 'softsort',
        `options` or `SinkhornOptions` fields for 'sinkhorn', `network` for
        'sorting_network').

    Returns:
      P̂ `[..., n, n]` in the dtype of `scores`.

    Example:
    >>> P = permutation_matrix([[1.0, 3.0, 2.0]], "sinkhorn", hard=True)
    >>> P.numpy()[0]
    array([[0., 1., 0.],
           [0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    """
    family = get_matrix_family(method)
    if not isinstance(scores, tf.RaggedTensor):
        scores = tf.convert_to_tensor(scores)
    log = kwargs.pop("log", None)
    family_kwargs = {k: v for k, v in kwargs.items() if k not in ("axis", "return_info")}
    family_kwargs = _check_arguments(family, "rank", scores.dtype, temperature,
                                     family_kwargs)
    extra = {k: kwargs[k] for k in ("axis", "return_info") if k in kwargs}
    if log is not None:
        extra["log"] = log
    return family.matrix(scores, direction=direction, hard=hard, mask=mask,
                         **family_kwargs, **extra)


_FRONT_DOOR_ARGS = """      {method}
      {direction}
      {axis}
      {mask}
        Not taken by 'permutahedron' (a `ValueError`).
      {temperature}
      **kwargs: further arguments of the family's operator (e.g. `options`, `squash`
        or `SinkhornOptions` fields for 'sinkhorn', `regularization` for
        'permutahedron', `distance_power` for 'softsort').
"""


def _front_door_doc(fn):
    fn.__doc__ = fn.__doc__.replace("      {front_door}\n", _FRONT_DOOR_ARGS)
    return _docs.fill(fn)


@_front_door_doc
def soft_rank(x, method: str = "sinkhorn", direction: str = "ASCENDING", *, axis: int = -1,
              mask=None, temperature: float | None = None, **kwargs):
    """Differentiable 1-based ranks.

    Args:
      x: `[..., n, ...]` real scores, or a `tf.RaggedTensor` ragged along its last axis.
      {front_door}

    Returns:
      Ranks with the shape of x (0 at padded entries), in its floating dtype.

    Example:
    >>> r = soft_rank([[0.5, 3.0, 1.0, 0.0]], "softsort", "DESCENDING",
    ...               mask=[[True, True, True, False]], temperature=0.01)
    >>> np.round(r.numpy()[0], 3)
    array([3., 1., 2., 0.], dtype=float32)
    """
    return _call("rank", x, (), method, direction, axis, mask, temperature, kwargs)


@_front_door_doc
def soft_sort(x, method: str = "sinkhorn", direction: str = "ASCENDING", *, axis: int = -1,
              mask=None, temperature: float | None = None, **kwargs):
    """Differentiable sorted values.

    Args:
      x: `[..., n, ...]` real values, or a `tf.RaggedTensor` ragged along its last axis.
      {front_door}

    Returns:
      Sorted values with the shape of x (with a mask: the n_valid sorted values first,
      then 0).

    Example:
    >>> s = soft_sort([[0.5, 3.0, 1.0]], "lapsum", temperature=0.01)
    >>> np.round(s.numpy(), 3)
    array([[0.5, 1. , 3. ]], dtype=float32)
    """
    return _call("sort", x, (), method, direction, axis, mask, temperature, kwargs)


@_front_door_doc
def soft_topk(x, k, method: str = "sinkhorn", direction: str = "DESCENDING", *,
              axis: int = -1, mask=None, temperature: float | None = None, **kwargs):
    """Differentiable membership in the first k entries in `direction` order.

    Values in [0, 1] summing to k per list (min(k, n_valid) with a mask) for
    'sinkhorn' and 'lapsum' (LapSum also takes a real or tensor k); for 'softsort' and
    'neuralsort', the column sums of the first k rows of their P̂.

    Args:
      x: `[..., n, ...]` real scores, or a `tf.RaggedTensor` ragged along its last axis.
      k: the number of entries selected, in [1, n).
      {front_door}

    Returns:
      The membership, with the shape of x.

    Example:
    >>> m = soft_topk([[0.1, 3.0, -1.0, 2.0]], 2, "lapsum", temperature=0.01)
    >>> np.round(m.numpy())
    array([[0., 1., 0., 1.]], dtype=float32)
    """
    return _call("topk", x, (k,), method, direction, axis, mask, temperature, kwargs)


@_front_door_doc
def soft_quantile(x, quantiles, method: str = "sinkhorn", direction: str = "ASCENDING", *,
                  axis: int = -1, mask=None, temperature: float | None = None, **kwargs):
    """Differentiable quantiles.

    In the hard limit, `np.quantile(x, q, method='averaged_inverted_cdf')` for both
    methods that define it; 'DESCENDING' gives the quantile from the top.

    Args:
      x: `[..., n, ...]` real values, or a `tf.RaggedTensor` ragged along its last axis.
      quantiles: a level or an increasing sequence of levels in (0, 1).
      {front_door}

    Returns:
      The axis of x replaced by the q levels; removed for a scalar level.

    Example:
    >>> q = soft_quantile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5, "lapsum", temperature=0.01)
    >>> round(float(q), 2)
    3.0
    """
    return _call("quantile", x, (quantiles,), method, direction, axis, mask, temperature,
                 kwargs)

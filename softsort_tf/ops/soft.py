"""The front door: soft ranks, sorts, top-k masks and quantiles by any method.

`soft_rank`, `soft_sort`, `soft_topk` and `soft_quantile` take `method=`, a key of
`METHODS`, the one table of the package's families: each entry says what its
temperature is called, its default and what it means, and which operations it
defines. Adding a family is an entry here and its maths.

| method | temperature (default) | operations | cost per list |
|---|---|---|---|
| 'sinkhorn' | `epsilon` (1e-2) | rank, sort, topk, quantile | O(n²) (O(n·k) for top-k) |
| 'lapsum' | `alpha` (1.0) | rank, sort, topk, quantile | O(n log n) |
| 'permutahedron' | `regularization_strength` (1.0) | rank, sort | O(n log n) |
| 'softsort' | `tau` (1.0) | rank, sort, topk | O(n²) |
| 'neuralsort' | `tau` (1.0) | rank, sort, topk | O(n²) |
| 'diffsort' | `steepness` (10.0; sharper as it grows) | rank, sort, topk | O(L·n²), L layers |

'softsort', 'neuralsort' and 'diffsort' (differentiable sorting networks, L = n
odd-even layers or ~½log₂²n bitonic ones) read their operations off their relaxed
permutation matrix P̂ (ranks P̂ᵀ(1..n), sorted values P̂x, top-k membership the column
sums of the first k rows of P̂).

Naming rules shared by the operators, layers, losses and metrics:

- `direction`: ranks, sorts, CDFs and quantiles default to 'ASCENDING', as `tf.sort`
  and `scipy.stats.rankdata` (rank 1 = smallest). Relaxed permutation matrices, top-k
  selections and the ranking losses default to 'DESCENDING', because they select the
  best (largest) items first, as in the NeuralSort, SoftSort and learning-to-rank
  papers (rank 1 = largest).
- Temperatures: each family names its own (`METHODS[method].temperature`): `tau` for
  SoftSort and NeuralSort and `alpha` for LapSum (in the units of the scores),
  `epsilon` for Sinkhorn (in the units of the cost on [0, 1]),
  `regularization_strength` for the permutahedron projections (in the units of the
  scores). An argument called `temperature` means "the temperature of the chosen
  `method`". A quantile level is called `quantile` (or `quantiles`), never a
  temperature.
- `k` is the number of items a top-k loss, mask or metric selects (`SoftTopKLoss(k)`,
  `soft_topk(x, k)`, NDCG@k); `topk` is the argument of a sort that returns only its
  first k values (`sinkhorn_sort(x, topk=k)`, `SinkhornSort(topk=k)`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tensorflow as tf

from softsort_tf import _checks
from softsort_tf.ops import lapsum, permutahedron
from softsort_tf.ops import sinkhorn as sinkhorn_ops
from softsort_tf.ops.permutation_readout import permute_values, ranks_from_permutation
from softsort_tf.ops.registry import PERMUTATION_OPERATORS
from softsort_tf.options import DEFAULT_EPSILON

OPERATIONS = ("rank", "sort", "topk", "quantile")


@dataclasses.dataclass(frozen=True)
class Method:
    """One family of differentiable sorting operators.

    Attributes:
      name: its key in `METHODS` (the `method` argument).
      temperature: the name of its temperature argument.
      default_temperature: the default of that argument.
      meaning: what the temperature means for a user.
      operations: `{operation: fn}` for the operations of `OPERATIONS` it defines, each
        `fn(x, *, direction, mask, **kwargs)` (`topk`: `fn(x, k, ...)`, `quantile`:
        `fn(x, quantiles, ...)`), along the last axis.
      reference: where it comes from.
      masks: whether its operators take a `mask` (and ragged lists).
    """

    name: str
    temperature: str
    default_temperature: float
    meaning: str
    operations: dict[str, Callable]
    reference: str
    masks: bool = True

    def operation(self, operation: str) -> Callable:
        if operation not in self.operations:
            able = [m.name for m in METHODS.values() if operation in m.operations]
            raise ValueError(f"method={self.name!r} does not define a soft {operation}; "
                             f"the methods that do are {able}.")
        return self.operations[operation]


def _matrix_operations(name: str) -> dict[str, Callable]:
    """Rank, sort and top-k read off the relaxed permutation matrix of `name`."""
    operator = PERMUTATION_OPERATORS[name]

    def rank(x, *, direction, mask, **kwargs):
        perm = operator.matrix(x, direction=direction, mask=mask, **kwargs)
        return ranks_from_permutation(perm)

    def sort(x, *, direction, mask, **kwargs):
        perm = operator.matrix(x, direction=direction, mask=mask, **kwargs)
        return permute_values(perm, x, mask=mask)

    def topk(x, k, *, direction, mask, **kwargs):
        k = _checks.check_positive_int("k", k)
        perm = operator.matrix(x, direction=direction, mask=mask, **kwargs)
        if isinstance(perm, tf.RaggedTensor):
            perm = perm.to_tensor()
        membership = tf.reduce_sum(perm[..., :k, :], axis=-2)
        if isinstance(x, tf.RaggedTensor):
            return tf.RaggedTensor.from_tensor(membership, lengths=x.row_lengths())
        return membership

    return dict(rank=rank, sort=sort, topk=topk)


def _sinkhorn_topk(x, k, *, direction, mask, **kwargs):
    return sinkhorn_ops.sinkhorn_topk_mask(x, k, direction=direction, mask=mask, **kwargs)


def _sinkhorn_quantile(x, quantiles, *, direction, mask, **kwargs):
    return sinkhorn_ops.sinkhorn_quantile(x, quantiles, direction=direction, mask=mask, **kwargs)


def _lapsum_quantile(x, quantiles, *, direction, mask, **kwargs):
    if _checks.check_direction(direction) == "DESCENDING":  # the quantile from the top
        return -lapsum.lapsum_quantile(-x, quantiles, mask=mask, **kwargs)
    return lapsum.lapsum_quantile(x, quantiles, mask=mask, **kwargs)


def _keywords(fn):
    """`fn(x, *args, direction, mask, **kwargs)` for an operator with those keywords."""
    return lambda x, *args, direction, mask, **kwargs: fn(x, *args, direction=direction,
                                                          mask=mask, **kwargs)


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("sinkhorn", "epsilon", DEFAULT_EPSILON,
           "entropic regularisation ε, in units of the cost on [0, 1] after squashing "
           "(how far a soft rank blurs: `SinkhornOptions.epsilon`)",
           dict(rank=_keywords(sinkhorn_ops.sinkhorn_rank),
                sort=_keywords(sinkhorn_ops.sinkhorn_sort),
                topk=_sinkhorn_topk, quantile=_sinkhorn_quantile),
           "Cuturi, Teboul & Vert (2019)"),
    Method("lapsum", "alpha", lapsum.DEFAULT_ALPHA,
           "scale α of the Laplace kernel, in the units of the scores: values closer than "
           "α are blurred together",
           dict(rank=_keywords(lapsum.lapsum_rank), sort=_keywords(lapsum.lapsum_sort),
                topk=_keywords(lapsum.lapsum_topk_mask), quantile=_lapsum_quantile),
           "Struski, Bednarczyk, Podolak & Tabor (2025)"),
    Method("permutahedron", "regularization_strength", 1.0,
           "strength of the quadratic ('l2') or entropic ('kl') regularisation of the "
           "projection, in the units of the scores",
           dict(rank=_keywords(permutahedron.permutahedron_rank),
                sort=_keywords(permutahedron.permutahedron_sort)),
           "Blondel, Teboul, Berthet & Djolonga (2020)", masks=False),
    Method("softsort", "tau", PERMUTATION_OPERATORS["softsort"].default_temperature,
           "temperature τ of the row softmaxes, in the units of the scores",
           _matrix_operations("softsort"), PERMUTATION_OPERATORS["softsort"].reference),
    Method("neuralsort", "tau", PERMUTATION_OPERATORS["neuralsort"].default_temperature,
           "temperature τ of the row softmaxes, in the units of the scores",
           _matrix_operations("neuralsort"), PERMUTATION_OPERATORS["neuralsort"].reference),
    Method("diffsort", "steepness", PERMUTATION_OPERATORS["diffsort"].default_temperature,
           "steepness β of the relaxed swaps' sigmoid, in inverse units of the scores: "
           "values closer than about 1/β are blurred together (β → ∞: exact)",
           _matrix_operations("diffsort"), PERMUTATION_OPERATORS["diffsort"].reference),
)}


def get_method(method: str) -> Method:
    """The family called `method`; a `ValueError` lists the names otherwise."""
    try:
        return METHODS[method]
    except (KeyError, TypeError):
        raise ValueError(f"`method` must be one of {tuple(METHODS)}, got {method!r}.") from None


def temperature_kwargs(method: str, temperature: float | None) -> dict:
    """`{name: temperature}` for the temperature argument of `method`, validated; `{}`
    for None (the family's default)."""
    family = get_method(method)
    if temperature is None:
        return {}
    return {family.temperature: _checks.check_positive("temperature", temperature)}


def _call(operation: str, x, args, method, direction, axis, mask, temperature, kwargs):
    family = get_method(method)
    fn = family.operation(operation)
    overrides = temperature_kwargs(method, temperature)
    clash = sorted(set(overrides) & set(kwargs))
    if clash:
        raise ValueError(f"`temperature` and `{clash[0]}` set the same argument of "
                         f"method={method!r}: pass one of them.")
    kwargs = {**kwargs, **overrides}
    if isinstance(x, tf.RaggedTensor):
        if axis not in (-1, x.shape.rank - 1):
            raise ValueError(f"A ragged `x` is operated along its last axis: `axis` must be "
                             f"-1, got {axis!r}.")
        if not family.masks:
            raise ValueError(f"method={method!r} takes no padding, and a ragged `x` is "
                             f"lists padded to a common length: pass one list (or lists of "
                             f"one length) at a time, or use a method that takes masks, "
                             f"e.g. 'lapsum'.")
        return fn(x, *args, direction=direction, mask=mask, **kwargs)
    x = tf.convert_to_tensor(x)
    _checks.check_real_dtype("x", x.dtype)
    if not x.dtype.is_floating:
        x = tf.cast(x, tf.float32)
    axis = _checks.check_axis(axis, x.shape.rank)
    last = x.shape.rank - 1
    if axis == last:
        return fn(x, *args, direction=direction, mask=mask, **kwargs)
    perm = [i for i in range(x.shape.rank) if i != axis] + [axis]
    moved_mask = None
    if mask is not None:
        mask = tf.convert_to_tensor(mask)
        moved_mask = mask if mask.shape.rank == 1 else tf.transpose(mask, perm)
    out = fn(tf.transpose(x, perm), *args, direction=direction, mask=moved_mask, **kwargs)
    if operation == "quantile" and out.shape.rank == x.shape.rank - 1:
        return out  # a scalar level: the axis is gone
    inverse = [perm.index(i) for i in range(x.shape.rank)]
    return tf.transpose(out, inverse)


_COMMON = """
      method: a key of `METHODS` (see the table in `softsort_tf.ops.soft`).
      direction: 'ASCENDING' or 'DESCENDING', as in `tf.sort`.
      axis: the axis to operate along (the last one for a ragged x).
      mask: optional boolean `[..., n]` (or `[n]`), True = valid entry (the package's
        padding convention, `softsort_tf._masking`); not supported by 'permutahedron'.
      temperature: the method's temperature (`METHODS[method].temperature`: ε, α, τ or
        the regularisation strength); default `METHODS[method].default_temperature`.
      **kwargs: further arguments of the method's operator (e.g. `options`, `squash`
        or `SinkhornOptions` fields for 'sinkhorn', `regularization` for
        'permutahedron', `distance_power` for 'softsort')."""


def _documented(fn):
    fn.__doc__ = fn.__doc__.replace("{common}", _COMMON.strip("\n"))
    return fn


@_documented
def soft_rank(x, method: str = "sinkhorn", direction: str = "ASCENDING", *, axis: int = -1,
              mask=None, temperature: float | None = None, **kwargs):
    """Differentiable 1-based ranks.

    Args:
      x: `[..., n, ...]` real scores, or a `tf.RaggedTensor` ragged along its last axis.
{common}

    Returns:
      Ranks with the shape of x (0 at padded entries), in its floating dtype.

    Example:
    >>> r = soft_rank([[0.5, 3.0, 1.0, 0.0]], "softsort", "DESCENDING",
    ...               mask=[[True, True, True, False]], temperature=0.01)
    >>> np.round(r.numpy()[0], 3)
    array([3., 1., 2., 0.], dtype=float32)
    """
    return _call("rank", x, (), method, direction, axis, mask, temperature, kwargs)


@_documented
def soft_sort(x, method: str = "sinkhorn", direction: str = "ASCENDING", *, axis: int = -1,
              mask=None, temperature: float | None = None, **kwargs):
    """Differentiable sorted values.

    Args:
      x: `[..., n, ...]` real values, or a `tf.RaggedTensor` ragged along its last axis.
{common}

    Returns:
      Sorted values with the shape of x (with a mask: the n_valid sorted values first,
      then 0).

    Example:
    >>> s = soft_sort([[0.5, 3.0, 1.0]], "lapsum", temperature=0.01)
    >>> np.round(s.numpy(), 3)
    array([[0.5, 1. , 3. ]], dtype=float32)
    """
    return _call("sort", x, (), method, direction, axis, mask, temperature, kwargs)


@_documented
def soft_topk(x, k, method: str = "sinkhorn", direction: str = "DESCENDING", *,
              axis: int = -1, mask=None, temperature: float | None = None, **kwargs):
    """Differentiable membership in the first k entries in `direction` order.

    Values in [0, 1] summing to k per list (min(k, n_valid) with a mask) for
    'sinkhorn' and 'lapsum' (LapSum also takes a real or tensor k); for 'softsort' and
    'neuralsort', the column sums of the first k rows of their P̂.

    Args:
      x: `[..., n, ...]` real scores, or a `tf.RaggedTensor` ragged along its last axis.
      k: the number of entries selected, in [1, n).
{common}

    Returns:
      The membership, with the shape of x.

    Example:
    >>> m = soft_topk([[0.1, 3.0, -1.0, 2.0]], 2, "lapsum", temperature=0.01)
    >>> np.round(m.numpy())
    array([[0., 1., 0., 1.]], dtype=float32)
    """
    return _call("topk", x, (k,), method, direction, axis, mask, temperature, kwargs)


@_documented
def soft_quantile(x, quantiles, method: str = "sinkhorn", direction: str = "ASCENDING", *,
                  axis: int = -1, mask=None, temperature: float | None = None, **kwargs):
    """Differentiable quantiles.

    In the hard limit, `np.quantile(x, q, method='averaged_inverted_cdf')` for both
    methods that define it; 'DESCENDING' gives the quantile from the top.

    Args:
      x: `[..., n, ...]` real values, or a `tf.RaggedTensor` ragged along its last axis.
      quantiles: a level or an increasing sequence of levels in (0, 1).
{common}

    Returns:
      The axis of x replaced by the q levels; removed for a scalar level.

    Example:
    >>> q = soft_quantile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5, "lapsum", temperature=0.01)
    >>> round(float(q), 2)
    3.0
    """
    return _call("quantile", x, (quantiles,), method, direction, axis, mask, temperature,
                 kwargs)

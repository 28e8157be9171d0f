"""Soft ranks by any method of the operator table, and the package's naming rules.

`soft_rank(x, method=...)` is the one entry point for differentiable ranks: `method`
is a key of `softsort_tf.ops.registry.PERMUTATION_OPERATORS`. A method with a rank
operator of its own (`RANK_OPERATORS`: Sinkhorn's `sinkhorn_rank`) uses it; the others
read the ranks off their relaxed permutation matrix (`ranks_from_permutation`).

Naming rules shared by the operators, layers, losses and metrics:

- `direction`: ranks, sorts, CDFs and quantiles default to 'ASCENDING', as `tf.sort`
  and `scipy.stats.rankdata` (rank 1 = smallest). Relaxed permutation matrices, top-k
  selections and the ranking losses default to 'DESCENDING', because they select the
  best (largest) items first, as in the NeuralSort, SoftSort and learning-to-rank
  papers (rank 1 = largest).
- Temperatures: `tau` is the temperature of SoftSort and NeuralSort (in the units of
  the scores), `epsilon` the entropic regularisation of Sinkhorn (in the units of the
  cost on [0, 1]). An argument called `temperature` means "the temperature of the
  chosen `method`": `tau` or `epsilon` (`PermutationOperator.temperature`). A quantile
  level is called `quantile` (or `quantiles`), never a temperature.
- `k` is the number of items a top-k loss, mask or metric selects (`SoftTopKLoss(k)`,
  `sinkhorn_topk_mask(x, k)`, NDCG@k); `topk` is the argument of a sort that returns
  only its first k values (`sinkhorn_sort(x, topk=k)`, `SinkhornSort(topk=k)`).
"""

from __future__ import annotations

import tensorflow as tf

from softsort_tf import _checks
from softsort_tf.ops.permutation_readout import ranks_from_permutation
from softsort_tf.ops.registry import get_permutation_operator
from softsort_tf.ops.sinkhorn import sinkhorn_rank

# Methods whose ranks come from a rank operator of their own rather than from P̂.
RANK_OPERATORS = {"sinkhorn": sinkhorn_rank}


def temperature_kwargs(method: str, temperature: float | None) -> dict:
    """`{name: temperature}` for the temperature argument of `method` ('tau' or
    'epsilon'), validated; `{}` for None (the operator's default)."""
    op = get_permutation_operator(method)
    if temperature is None:
        return {}
    return {op.temperature: _checks.check_positive("temperature", temperature)}


def soft_rank(x, method: str = "sinkhorn", direction: str = "ASCENDING", *, mask=None,
              temperature: float | None = None, **kwargs):
    """Differentiable 1-based ranks along the last axis.

    Args:
      x: `[..., n]` real scores (n may be unknown when the graph is built).
      method: a key of `PERMUTATION_OPERATORS`: 'sinkhorn' (default; `sinkhorn_rank`),
        'softsort' or 'neuralsort' (`ranks_from_permutation` of the operator's P̂).
      direction: 'ASCENDING' (default: rank 1 = smallest) or 'DESCENDING' (rank 1 =
        largest).
      mask: optional boolean `[..., n]`, True = valid entry: the valid entries are
        ranked among themselves (ranks in [1, n_valid]; exactly for SoftSort and
        NeuralSort, up to the solver's `threshold` for Sinkhorn) and padded entries get
        rank 0 and zero gradient. See softsort_tf._masking.
      temperature: the method's temperature (τ for SoftSort/NeuralSort, ε for
        Sinkhorn); default that of `PERMUTATION_OPERATORS[method]`.
      **kwargs: further arguments of the operator: `distance_power` (SoftSort);
        `options`, `squash`, `targets` or fields of `SinkhornOptions` (Sinkhorn).

    Returns:
      `[..., n]` ranks in the dtype of x (float32 for integer x).

    Example:
    >>> r = soft_rank([[0.5, 3.0, 1.0, 0.0]], "softsort", "DESCENDING",
    ...               mask=[[True, True, True, False]], temperature=0.01)
    >>> np.round(r.numpy()[0], 3)
    array([3., 1., 2., 0.], dtype=float32)
    """
    overrides = temperature_kwargs(method, temperature)
    clash = sorted(set(overrides) & set(kwargs))
    if clash:
        raise ValueError(f"`temperature` and `{clash[0]}` set the same argument of "
                         f"method={method!r}: pass one of them.")
    kwargs.update(overrides)
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        x = tf.cast(x, tf.float32)
    if method in RANK_OPERATORS:
        return RANK_OPERATORS[method](x, direction=direction, mask=mask, **kwargs)
    perm = get_permutation_operator(method).matrix(x, direction=direction, mask=mask,
                                                   **kwargs)
    return ranks_from_permutation(perm)

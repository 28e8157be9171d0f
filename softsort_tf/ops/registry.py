"""The table of relaxed-permutation operators, keyed by name.

SoftSort, NeuralSort and the Sinkhorn plan all map scores `[..., n]` to a relaxed
permutation matrix P̂ `[..., n, n]` with the same orientation (row i = the entry at
position i of the `direction` order). This table is the one place that says which
operators exist, how their temperature argument is called ("Sinkhorn takes ε, the
others take τ") and what its default is; `permutation_matrix`, the stochastic
variants, the layers, the experiments, the tuner and the benchmarks all read it, so
adding an operator is one entry here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import tensorflow as tf

from softsort_tf.ops.lapsum import DEFAULT_ALPHA, lapsum_permutation_matrix
from softsort_tf.ops.permutation import (
    DEFAULT_TAU,
    check_hard,
    hard_permutation_matrix,
    neural_sort_matrix,
    soft_sort_matrix,
    straight_through,
)
from softsort_tf.ops.sinkhorn import sinkhorn_permutation_matrix
from softsort_tf.ops.sorting_networks import DEFAULT_STEEPNESS, sorting_network_matrix
from softsort_tf.options import DEFAULT_EPSILON


@dataclasses.dataclass(frozen=True)
class PermutationOperator:
    """One relaxed-permutation operator.

    Attributes:
      name: its key in `PERMUTATION_OPERATORS` (the `method` argument elsewhere).
      matrix_fn: `matrix_fn(scores, *, direction, hard, mask, **kwargs)` → P̂ `[..., n, n]`
        (`mask`: see softsort_tf._masking; a ragged input gives a ragged output).
      temperature: the name of its temperature argument ('tau', 'epsilon' or 'alpha').
      default_temperature: the default of that argument.
      doubly_stochastic: whether the columns of P̂ sum to 1 too.
      reference: where it comes from.
      log_domain: whether `matrix(..., log=True)` returns log P̂ computed in the log
        domain (for `permutation_cross_entropy(..., from_log=True)`).
    """

    name: str
    matrix_fn: Callable[..., tf.Tensor]
    temperature: str
    default_temperature: float
    doubly_stochastic: bool
    reference: str
    log_domain: bool = False

    def matrix(self, scores, *, direction: str = "DESCENDING", hard: bool = False,
               mask=None, **kwargs) -> tf.Tensor:
        if kwargs.get("log") and not self.log_domain:
            raise ValueError(f"method={self.name!r} has no log-domain matrix (`log=True`); "
                             f"the methods that have one are "
                             f"{[m for m, op in PERMUTATION_OPERATORS.items() if op.log_domain]}.")
        if mask is not None:
            kwargs["mask"] = mask
        return self.matrix_fn(scores, direction=direction, hard=hard, **kwargs)


def _with_straight_through(matrix_fn):
    """A matrix function of the table with the `hard` (straight-through) option added
    around an operator that has none (ragged inputs included)."""

    def matrix(scores, *, direction: str = "DESCENDING", hard: bool = False, mask=None,
               **kwargs):
        hard = check_hard(hard)
        if "axis" in kwargs or "return_info" in kwargs:
            raise ValueError("`axis` and `return_info` are not supported here: scores are "
                             "sorted along their last axis; call the operator directly.")
        if hard and kwargs.get("log"):
            raise ValueError("`log=True` cannot be combined with `hard=True`.")
        perm = matrix_fn(scores, direction=direction, mask=mask, **kwargs)
        if not hard:
            return perm
        exact = hard_permutation_matrix(scores, direction, mask=mask)
        if isinstance(perm, tf.RaggedTensor):
            return perm.with_flat_values(straight_through(exact.flat_values, perm.flat_values))
        return straight_through(exact, perm)

    return matrix


PERMUTATION_OPERATORS: dict[str, PermutationOperator] = {
    op.name: op for op in (
        PermutationOperator("softsort", soft_sort_matrix, "tau", DEFAULT_TAU, False,
                            "Prillo & Eisenschlos (2020), eq. 4", log_domain=True),
        PermutationOperator("neuralsort", neural_sort_matrix, "tau", DEFAULT_TAU, False,
                            "Grover et al. (2019)", log_domain=True),
        PermutationOperator("sinkhorn", _with_straight_through(sinkhorn_permutation_matrix),
                            "epsilon", DEFAULT_EPSILON, True, "Cuturi, Teboul & Vert (2019)",
                            log_domain=True),
        PermutationOperator("lapsum", _with_straight_through(lapsum_permutation_matrix),
                            "alpha", DEFAULT_ALPHA, True,
                            "Struski, Bednarczyk, Podolak & Tabor (2025)"),
        # Odd-even (default) or bitonic networks (`network=`); products of
        # doubly-stochastic relaxed swaps. The steepness β sharpens as it grows.
        PermutationOperator("diffsort", sorting_network_matrix, "steepness", DEFAULT_STEEPNESS,
                            True, "Petersen, Borgelt, Kuehne & Deussen (ICML 2021, ICLR 2022)"),
    )
}


def get_permutation_operator(method: str) -> PermutationOperator:
    """The operator called `method`; a `ValueError` lists the names otherwise."""
    try:
        return PERMUTATION_OPERATORS[method]
    except (KeyError, TypeError):
        raise ValueError(f"`method` must be one of {tuple(PERMUTATION_OPERATORS)}, "
                         f"got {method!r}.") from None


@tf.autograph.experimental.do_not_convert
def permutation_matrix(scores, method: str = "softsort", direction: str = "DESCENDING",
                       hard: bool = False, *, mask=None, **kwargs):
    """Any relaxed permutation matrix of `PERMUTATION_OPERATORS`, chosen by name.

    Args:
      scores: `[..., n]` real tensor, or a `tf.RaggedTensor` `[batch, (n)]` (then the
        output is ragged `[batch, (n), (n)]`).
      method: 'softsort' (`soft_sort_matrix`), 'neuralsort' (`neural_sort_matrix`),
        'sinkhorn' (`sinkhorn_permutation_matrix`), 'lapsum'
        (`lapsum_permutation_matrix`) or 'diffsort' (`sorting_network_matrix`).
      direction: 'DESCENDING' (default) or 'ASCENDING'.
      hard: straight-through (see `soft_sort_matrix`): the exact permutation in the
        forward pass, the gradient of the relaxation in the backward pass.
      log: (keyword, for the operators with `log_domain`) return log P̂ computed in the
        log domain, for `permutation_cross_entropy(..., from_log=True)`.
      **kwargs: the operator's own arguments: `tau`, `distance_power` (SoftSort);
        `tau` (NeuralSort); `options`, `squash`, `targets` or fields of
        `SinkhornOptions` such as `epsilon` (Sinkhorn); `alpha` (LapSum).
      mask: optional boolean `[..., n]` (or `[n]`), True = valid entry: the valid block
        of P̂ is the matrix of the unpadded list (exactly for SoftSort/NeuralSort, up
        to the solver's threshold for Sinkhorn), rows of sorted positions >= n_valid
        and columns of padded entries are 0. See softsort_tf._masking.

    Returns:
      P̂ `[..., n, n]` in the dtype of `scores`.

    Example:
    >>> P = permutation_matrix([[1.0, 3.0, 2.0]], "sinkhorn", hard=True)
    >>> P.numpy()[0]
    array([[0., 1., 0.],
           [0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    """
    return get_permutation_operator(method).matrix(scores, direction=direction, hard=hard,
                                                   mask=mask, **kwargs)

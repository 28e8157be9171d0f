"""Sinkhorn ranks, sorts, CDFs, quantiles, quantile normalisation and top-k masks.

Every operator here is the same transport problem (`sinkhorn_solver.solve`) with a
different target measure (y, b), read out through the plan P as in Definition 2 of
Cuturi, Teboul & Vert (2019):

    S-CDF        F̃ = a⁻¹ ∘ (P b̄)            (b̄ the cumulative sum of b)
    S-rank       R̃ = n F̃                     (talk, Algorithm 2)
    S-sort       S̃ = b⁻¹ ∘ (Pᵀ x)
    S-quantile   eq. (4): S̃ for a target with "filler" bins around each level τ
    S-quantile normalisation   T̃_f = a⁻¹ ∘ (P f)

Conventions shared by all operators:

- Inputs are squashed into [0, 1] (`squash`, see `softsort_tf.squash`) and the
  targets are the centres of the target bins, y_j = b̄_j − b_j / 2 (for uniform b,
  y_j = (j − 1/2) / m). An input that is already uniform on [0, 1] therefore sits on
  its target and the regularisation acts only where inputs are close to each other.
- `direction='DESCENDING'` operates on −x (and maps values back), so rank 1 goes to
  the largest entry and sorted values decrease.
- ε (`epsilon`, default 1e-2) is in units of the cost on [0, 1]. With p = 2 and n
  inputs spread over [0, 1], neighbours differ in cost by about 2/n²; the result is
  close to the hard one when ε ≪ 2/n², and each soft rank blurs over roughly
  n·√(ε/2) neighbours otherwise (≈ 21 neighbours for n = 300, ε = 1e-2; 0.35 for
  n = 5). Smaller ε is sharper but needs more iterations and gives smaller
  gradients.
- `threshold` (default 1e-3) is the L1 marginal error at which a row stops;
  `max_iterations` (default 1000) bounds the loop whatever happens.
- NaN or Inf in x propagate NaN to the affected rows (other rows of the batch are
  unaffected) and never hang the loop: a row whose error is not finite stops. Pass
  `check_numerics=True` to raise `InvalidArgumentError` instead.
- float16/bfloat16 are computed in float32 and returned in the input dtype.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _shapes
from softsort_tf import sinkhorn_solver as solver_lib
from softsort_tf.squash import check_squash, squash_values

SinkhornInfo = collections.namedtuple("SinkhornInfo", ["num_iterations", "error"])
SinkhornInfo.__doc__ = """Convergence report of a Sinkhorn operator.

Attributes:
  num_iterations: int32 tensor of the input's shape without `axis`: Sinkhorn
    iterations used by each row.
  error: final L1 marginal error of each row (compare with `threshold`).
"""

DEFAULT_EPSILON = 1e-2
DEFAULT_THRESHOLD = 1e-3
DEFAULT_MAX_ITERATIONS = 1000
DEFAULT_POWER = 2.0


def bin_centres(b):
    """Centres y_j = b̄_j − b_j / 2 of the target bins on [0, 1] for weights b `[..., m]`."""
    return tf.cumsum(b, axis=-1) - 0.5 * b


def _target_measure(m: int | None, target_weights, dtype):
    """Returns (y, b) for a target of m uniform bins or the given (positive) weights."""
    if target_weights is None:
        b = tf.fill([m], tf.constant(1.0 / m, dtype))
    else:
        b = tf.cast(tf.convert_to_tensor(target_weights), dtype)
        if b.shape.rank not in (1, 2):
            raise ValueError("`target_weights` must have shape [m] or [batch, m].")
        if m is not None and b.shape[-1] is not None and b.shape[-1] != m:
            raise ValueError(f"`target_weights` must have length m = {m}, got {b.shape[-1]}.")
        b = b / tf.reduce_sum(b, axis=-1, keepdims=True)
    return bin_centres(b), b


class _Transport:
    """The solved transport problem of one operator call, in `[batch, ·]` layout."""

    def __init__(self, x, *, axis, direction, squash, weights, targets, epsilon, power,
                 threshold, max_iterations, implicit, check_numerics, solver_options):
        direction = _checks.check_direction(direction)
        squash = check_squash(squash)
        x2d, self.view = _shapes.to_batch(x, axis)
        if check_numerics:
            x2d = tf.debugging.check_numerics(x2d, "softsort_tf: `x` has NaN or Inf")
        self.sign = -1.0 if direction == "DESCENDING" else 1.0
        self.values = self.sign * x2d  # sorted ascending == x sorted in `direction`
        self.dtype = x2d.dtype
        self.n = self.view.n
        a = _shapes.weights_to_batch(weights, self.view, self.dtype)
        self.uniform_a = a is None
        if a is None:
            a = tf.fill(tf.shape(x2d), tf.constant(1.0 / self.n, self.dtype))
        self.a = a
        m, target_weights = targets
        self.y, self.b = _target_measure(m, target_weights, self.dtype)
        squashed = squash_values(self.values, squash,
                                 weights=None if self.uniform_a else a)
        self.result = solver_lib.solve(
            squashed, self.y, a, self.b, epsilon=epsilon, power=power, threshold=threshold,
            max_iterations=max_iterations, implicit=implicit, **solver_options)
        self._plan = None
        self._row_plan = None

    @property
    def plan(self):
        """`[batch, n, m]` transport plan P: column sums b exactly, row sums a up to
        `threshold` (the solver ends on a column update)."""
        if self._plan is None:
            self._plan = self.result.plan()
        return self._plan

    @property
    def row_plan(self):
        """`[batch, n, m]` row-conditional plan a⁻¹ ∘ P, with rows summing to 1 exactly.

        Computed from the target potential alone, Q_ij = exp((g_j − C_ij)/ε) / Σ_k
        exp((g_k − C_ik)/ε) (the row update of eq. 3 divided by a_i), so readouts such
        as the CDF stay in [0, 1] whatever the residual marginal error, and inputs of
        zero weight still get a well-defined row.
        """
        if self._row_plan is None:
            r = self.result
            logits = (r.g[:, None, :] - r.cost) / tf.cast(r.epsilon, r.cost.dtype)
            self._row_plan = tf.nn.softmax(logits, axis=-1)
        return self._row_plan

    def bcast_b(self):
        b = self.b
        return b if b.shape.rank == 2 else b[None, :]

    def cdf(self):
        """a⁻¹ ∘ (P b̄): `[batch, n]`."""
        cum_b = tf.cumsum(self.bcast_b(), axis=-1)
        return tf.reduce_sum(self.row_plan * cum_b[:, None, :], axis=-1)

    def sorted_values(self):
        """b⁻¹ ∘ (Pᵀ x) in the units of x, in `direction` order: `[batch, m]`."""
        s = tf.linalg.matvec(self.plan, self.values, transpose_a=True) / self.bcast_b()
        return self.sign * s

    def push(self, f):
        """a⁻¹ ∘ (P f) for f `[m]` or `[batch, m]`: `[batch, n]`."""
        f = tf.cast(f, self.dtype)
        f = f[None, :] if f.shape.rank == 1 else f
        return tf.reduce_sum(self.row_plan * f[:, None, :], axis=-1)

    def output(self, y2d, keep_axis=True):
        return _shapes.from_batch(y2d, self.view, keep_axis=keep_axis)

    def info(self):
        view = self.view
        lead = view.moved_shape[:-1]
        return SinkhornInfo(tf.reshape(self.result.num_iterations, lead),
                            tf.reshape(self.result.error, lead))


def check_sinkhorn_args(epsilon, power, threshold, max_iterations, implicit, squash) -> dict:
    """Validates the shared Sinkhorn arguments (as the layers and losses store them)."""
    return dict(epsilon=_checks.check_positive("epsilon", epsilon),
                power=_checks.check_positive("power", power),
                threshold=_checks.check_positive("threshold", threshold),
                max_iterations=_checks.check_positive_int("max_iterations", max_iterations),
                implicit=bool(implicit), squash=check_squash(squash))


def _finish(out, transport: _Transport, return_info: bool):
    return (out, transport.info()) if return_info else out


_COMMON_ARGS_DOC = """
      axis: the axis to operate along (any axis of an input of any rank >= 1).
      direction: 'ASCENDING' or 'DESCENDING', as in `tf.sort`.
      epsilon: entropic regularisation ε > 0 (default 1e-2); see the module docstring
        for how it interacts with n.
      power: the cost is |x̃ − y|^power (default 2, any power > 0).
      threshold: a row stops when its L1 marginal error is below it (default 1e-3).
      max_iterations: hard bound on Sinkhorn iterations (default 1000).
      implicit: implicit differentiation (default, memory independent of the number
        of iterations) or backpropagation through the unrolled loop.
      squash: 'logistic' (default), 'atan' or None (x already in [0, 1]); the
        standardisation before squashing is weighted by `weights`.
      weights: non-negative input weights a, shape `[n]` or the shape of x (default
        uniform); they are the input measure and weight the squashing's mean and
        standard deviation (a zero-weight outlier does not compress the others).
      check_numerics: raise `InvalidArgumentError` on NaN/Inf in x instead of
        propagating NaN.
      return_info: also return a `SinkhornInfo(num_iterations, error)`.
      **solver_options: advanced options of `sinkhorn_solver.solve` (`warm_start`,
        `epsilon_start`, `epsilon_decay`, `check_every`, `implicit_solver`,
        `implicit_max_iterations`)."""


def _doc(f):
    f.__doc__ = f.__doc__.replace("{common}", _COMMON_ARGS_DOC.strip("\n"))
    return f


def _kw(epsilon, power, threshold, max_iterations, implicit, squash, weights, check_numerics,
        solver_options, axis, direction):
    return dict(axis=axis, direction=direction, squash=squash, weights=weights, epsilon=epsilon,
                power=power, threshold=threshold, max_iterations=max_iterations,
                implicit=implicit, check_numerics=check_numerics, solver_options=solver_options)


@_doc
def sinkhorn_rank(x, axis: int = -1, direction: str = "ASCENDING", *,
                  epsilon: float = DEFAULT_EPSILON, power: float = DEFAULT_POWER,
                  threshold: float = DEFAULT_THRESHOLD,
                  max_iterations: int = DEFAULT_MAX_ITERATIONS, implicit: bool = True,
                  squash="logistic", weights=None, num_targets: int | None = None,
                  target_weights=None, zero_based: bool = False, check_numerics: bool = False,
                  return_info: bool = False, **solver_options):
    """Soft ranks R̃ = n a⁻¹ ∘ (P b̄) (talk, Algorithm 2; paper Def. 2).

    1-based like `scipy.stats.rankdata`: values in [1, n] (the smallest entry gets
    ≈ 1 for 'ASCENDING'); ties get equal ranks.

    Args:
      x: `[..., n, ...]` real tensor.
{common}
      num_targets: m, the size of the target grid (default n).
      target_weights: positive target weights b `[m]` (default uniform).
      zero_based: return ranks in [0, n − 1] instead.

    Returns:
      Soft ranks with the shape and dtype of x.

    Example:
    >>> r = sinkhorn_rank([[3.0, 1.0, 2.0]], epsilon=1e-3)
    >>> np.round(r.numpy())
    array([[3., 1., 2.]], dtype=float32)
    """
    m = num_targets if num_targets is not None else (
        None if target_weights is not None else _static_n(x, axis))
    t = _Transport(x, targets=(m, target_weights),
                   **_kw(epsilon, power, threshold, max_iterations, implicit, squash, weights,
                         check_numerics, solver_options, axis, direction))
    ranks = t.n * t.cdf()
    if zero_based:
        ranks = ranks - 1.0
    return _finish(t.output(ranks), t, return_info)


def _static_n(x, axis):
    shape = tf.convert_to_tensor(x).shape
    _checks.check_axis(axis, shape.rank)
    n = shape[axis]
    if n == 0:
        raise ValueError("`x` must have at least one element along `axis` (n >= 1), got n = 0.")
    return n


@_doc
def sinkhorn_cdf(x, axis: int = -1, direction: str = "ASCENDING", *,
                 epsilon: float = DEFAULT_EPSILON, power: float = DEFAULT_POWER,
                 threshold: float = DEFAULT_THRESHOLD,
                 max_iterations: int = DEFAULT_MAX_ITERATIONS, implicit: bool = True,
                 squash="logistic", weights=None, num_targets: int | None = None,
                 target_weights=None, check_numerics: bool = False, return_info: bool = False,
                 **solver_options):
    """The S-CDF F̃ = a⁻¹ ∘ (P b̄) (paper Def. 2), in [0, 1].

    In the hard limit, F̃_i is the empirical CDF at x_i: the total weight of the
    entries ≤ x_i (rank / n for uniform weights).

    Args:
      x: `[..., n, ...]` real tensor.
{common}
      num_targets: m, the size of the target grid (default n).
      target_weights: positive target weights b `[m]` (default uniform).

    Returns:
      CDF values with the shape and dtype of x.

    Example:
    >>> F = sinkhorn_cdf([0.5, -1.0, 2.0, 0.0], epsilon=1e-3)
    >>> np.round(F.numpy(), 2)
    array([0.75, 0.25, 1.  , 0.5 ], dtype=float32)
    """
    m = num_targets if num_targets is not None else (
        None if target_weights is not None else _static_n(x, axis))
    t = _Transport(x, targets=(m, target_weights),
                   **_kw(epsilon, power, threshold, max_iterations, implicit, squash, weights,
                         check_numerics, solver_options, axis, direction))
    return _finish(t.output(t.cdf()), t, return_info)


@_doc
def sinkhorn_sort(x, axis: int = -1, direction: str = "ASCENDING", *, topk: int | None = None,
                  epsilon: float = DEFAULT_EPSILON, power: float = DEFAULT_POWER,
                  threshold: float = DEFAULT_THRESHOLD,
                  max_iterations: int = DEFAULT_MAX_ITERATIONS, implicit: bool = True,
                  squash="logistic", weights=None, num_targets: int | None = None,
                  target_weights=None, check_numerics: bool = False, return_info: bool = False,
                  **solver_options):
    """Soft-sorted values S̃ = b⁻¹ ∘ (Pᵀ x) (paper Def. 2), in the units of x.

    Each output is a weighted average of entries of x, and the outputs are monotone
    in `direction` order. With `topk=k`, returns only the first k values of the sort
    (the k largest for 'DESCENDING', the k smallest for 'ASCENDING'): the target then
    has k bins of mass 1/n and one bin of mass 1 − k/n that absorbs the rest, so the
    cost is O(n·k) instead of O(n²).

    Args:
      x: `[..., n, ...]` real tensor.
{common}
      topk: if set, an integer in [1, n): return only the first k sorted values.
      num_targets: m, the number of output values (default n): with m < n each
        output averages about n/m inputs.
      target_weights: positive target weights b `[m]` (default uniform).

    Returns:
      Sorted values: the shape of x with the axis of length n replaced by m (or k).

    Example:
    >>> s = sinkhorn_sort([[3.0, 1.0, 2.0]], direction="DESCENDING", epsilon=1e-3)
    >>> np.round(s.numpy(), 3)
    array([[3., 2., 1.]], dtype=float32)
    """
    n = _static_n(x, axis)
    if topk is not None:
        k = _checks.check_k(topk, n, "topk")
        if weights is not None or num_targets is not None or target_weights is not None:
            raise ValueError("`topk` cannot be combined with `weights`, `num_targets` or "
                             "`target_weights`.")
        tw = np.concatenate([np.full([k], 1.0 / n), [1.0 - k / n]])
        t = _Transport(x, targets=(k + 1, tw),
                       **_kw(epsilon, power, threshold, max_iterations, implicit, squash,
                             weights, check_numerics, solver_options, axis, direction))
        return _finish(t.output(t.sorted_values()[:, :k]), t, return_info)
    m = num_targets if num_targets is not None else (None if target_weights is not None else n)
    t = _Transport(x, targets=(m, target_weights),
                   **_kw(epsilon, power, threshold, max_iterations, implicit, squash, weights,
                         check_numerics, solver_options, axis, direction))
    return _finish(t.output(t.sorted_values()), t, return_info)


def default_quantile_width(taus: np.ndarray, n: int | None = None) -> float:
    """The default width t of the bin around each quantile level.

    Without n: min(0.1, half the smallest gap), counting 2τ_1 and 2(1 − τ_q) as gaps.
    With n (uniform input weights), t is also capped so that, for every level, the
    window [τ − t/2, τ + t/2] stays inside the cell [(i − 1)/n, i/n] of the input that
    holds τ, or straddles the boundary symmetrically when τ·n is an integer. The hard
    limit (ε → 0) then is exactly numpy's `np.quantile(x, τ,
    method='averaged_inverted_cdf')`: the order statistic holding level τ, or the mean
    of the two neighbours when τ falls on a boundary.
    """
    gaps = np.concatenate([[2 * taus[0]], np.diff(taus), [2 * (1 - taus[-1])]])
    width = min(0.1, 0.5 * float(gaps.min()))
    if n is not None:
        pos = taus * n
        nearest = np.round(pos)
        on_boundary = np.abs(pos - nearest) < 1e-9
        # Distance from τ to its cell's nearer edge, in units of mass.
        to_edge = np.abs(pos - nearest) / n
        cell = np.where(on_boundary, 1.0 / n, 2.0 * to_edge)
        width = min(width, float(cell.min()))
    return width


def quantile_target_weights(quantiles, width: float | None = None,
                            n: int | None = None) -> tuple[np.ndarray, float]:
    """Target weights b of the S-quantile operator for levels τ_1 < … < τ_q.

    Eq. (4) of the paper transports onto three bins, b = [τ(1 − t), t, (1 − τ)(1 − t)],
    and reads the quantile off the middle one. We generalise it to q levels with one
    bin of mass t *centred* on each τ_k and filler bins between them:

        b = [τ_1 − t/2, t, τ_2 − τ_1 − t, t, …, t, 1 − τ_q − t/2]   (2q + 1 bins).

    Centring makes the hard limit exact: the output is the mean of the values whose
    cumulative mass lies in [τ_k − t/2, τ_k + t/2]; with the default width for n inputs
    (see `default_quantile_width`) that is numpy's `method='averaged_inverted_cdf'`.

    Args:
      quantiles: levels in (0, 1), strictly increasing.
      width: t; default `default_quantile_width(quantiles, n)`. Must satisfy t < 2τ_1,
        t < 2(1 − τ_q) and t < τ_{k+1} − τ_k.
      n: the number of (uniformly weighted) inputs, used only for the default width.

    Returns:
      `(b, t)` with b of shape `[2q + 1]`.
    """
    taus, _ = _checks.check_quantiles(quantiles)
    gaps = np.concatenate([[2 * taus[0]], np.diff(taus), [2 * (1 - taus[-1])]])
    if width is None:
        width = default_quantile_width(taus, n)
    width = _checks.check_positive("width", width)
    if width >= gaps.min():
        raise ValueError(
            f"`width` = {width} is too large for quantiles {taus.tolist()}: it must be smaller "
            f"than 2·min(q), 2·(1 − max(q)) and every gap between consecutive quantiles "
            f"(here < {gaps.min():.6g}).")
    fillers = np.empty(taus.size + 1)
    fillers[0] = taus[0] - width / 2
    fillers[-1] = 1 - taus[-1] - width / 2
    fillers[1:-1] = np.diff(taus) - width
    b = np.empty(2 * taus.size + 1)
    b[0::2] = fillers
    b[1::2] = width
    return b, width


@_doc
def sinkhorn_quantile(x, quantiles, width: float | None = None, axis: int = -1,
                      direction: str = "ASCENDING", *, epsilon: float = DEFAULT_EPSILON,
                      power: float = DEFAULT_POWER, threshold: float = DEFAULT_THRESHOLD,
                      max_iterations: int = DEFAULT_MAX_ITERATIONS, implicit: bool = True,
                      squash="logistic", weights=None, check_numerics: bool = False,
                      return_info: bool = False, **solver_options):
    """τ-S-quantiles (paper eq. 4, generalised to several levels).

    See `quantile_target_weights` for the target measure. 'DESCENDING' returns the
    quantiles of −x, negated (the τ-quantile from the top).

    Args:
      x: `[..., n, ...]` real tensor.
      quantiles: a level or a strictly increasing sequence of q levels in (0, 1).
      width: mass t of the bin around each level. The default (see
        `default_quantile_width`) is min(0.1, half the smallest gap between levels),
        further capped so that the hard limit is numpy's
        `np.quantile(x, τ, method='averaged_inverted_cdf')` for uniform weights.
        Larger widths average more values (a smoother, trimmed-mean-like estimate).
{common}

    Returns:
      The axis of x replaced by q quantile values; removed for a scalar `quantiles`.

    Example:
    >>> q = sinkhorn_quantile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5, epsilon=1e-3)
    >>> round(float(q), 2)
    3.0
    """
    _, scalar = _checks.check_quantiles(quantiles)
    n = _static_n(x, axis)
    b, _ = quantile_target_weights(quantiles, width, n=None if weights is not None else n)
    t = _Transport(x, targets=(b.size, b),
                   **_kw(epsilon, power, threshold, max_iterations, implicit, squash, weights,
                         check_numerics, solver_options, axis, direction))
    q = t.sorted_values()[:, 1::2]
    if scalar:
        return _finish(t.output(q[:, 0], keep_axis=False), t, return_info)
    return _finish(t.output(q), t, return_info)


@_doc
def sinkhorn_quantile_normalization(x, target_values, axis: int = -1,
                                    direction: str = "ASCENDING", *,
                                    epsilon: float = DEFAULT_EPSILON,
                                    power: float = DEFAULT_POWER,
                                    threshold: float = DEFAULT_THRESHOLD,
                                    max_iterations: int = DEFAULT_MAX_ITERATIONS,
                                    implicit: bool = True, squash="logistic", weights=None,
                                    target_weights=None, check_numerics: bool = False,
                                    return_info: bool = False, **solver_options):
    """Soft quantile normalisation T̃_f = a⁻¹ ∘ (P f) (paper Def. 2).

    Keeps the order of x and replaces its values by those of the sorted
    `target_values` f (of any length m): in the hard limit with m = n, the i-th
    smallest entry of x becomes the i-th smallest target value.

    Args:
      x: `[..., n, ...]` real tensor.
      target_values: `[m]` values (sorted internally), or `[batch..., m]` with the
        leading shape of x without `axis`.
{common}
      target_weights: positive weights of the target values `[m]` (default uniform).

    Returns:
      A tensor with the shape and dtype of x.

    Example:
    >>> t = sinkhorn_quantile_normalization([0.3, -2.0, 1.0], [10.0, 20.0, 30.0],
    ...                                     epsilon=1e-3)
    >>> np.round(t.numpy())
    array([20., 10., 30.], dtype=float32)
    """
    target_values = tf.sort(tf.convert_to_tensor(target_values), axis=-1)
    m = target_values.shape[-1]
    if m is None or m == 0:
        raise ValueError("`target_values` must have a known, non-zero last dimension.")
    t = _Transport(x, targets=(m, target_weights),
                   **_kw(epsilon, power, threshold, max_iterations, implicit, squash, weights,
                         check_numerics, solver_options, axis, direction))
    f = target_values
    if f.shape.rank > 1:
        f = tf.reshape(f, [-1, m])
    out = t.push(f)
    return _finish(t.output(out), t, return_info)


@_doc
def sinkhorn_topk_mask(x, k: int, axis: int = -1, direction: str = "DESCENDING", *,
                       epsilon: float = DEFAULT_EPSILON, power: float = DEFAULT_POWER,
                       threshold: float = DEFAULT_THRESHOLD,
                       max_iterations: int = DEFAULT_MAX_ITERATIONS, implicit: bool = True,
                       squash="logistic", weights=None, check_numerics: bool = False,
                       return_info: bool = False, **solver_options):
    """Soft indicator of membership in the first k entries in `direction` order.

    The target has two bins, of mass k/n (the top-k) and 1 − k/n; the mask is the
    fraction of each input's mass sent to the top-k bin, a⁻¹ ∘ (P e_1). Values are in
    [0, 1] and sum to k (for uniform weights). The default 'DESCENDING' selects the
    k largest entries.

    Args:
      x: `[..., n, ...]` real tensor.
      k: an integer in [1, n).
{common}

    Returns:
      A tensor with the shape and dtype of x.

    Example:
    >>> mask = sinkhorn_topk_mask([0.1, 3.0, -1.0, 2.0], k=2, epsilon=1e-3)
    >>> np.round(mask.numpy())
    array([0., 1., 0., 1.], dtype=float32)
    """
    n = _static_n(x, axis)
    k = _checks.check_k(k, n)
    tw = np.array([k / n, 1.0 - k / n])
    t = _Transport(x, targets=(2, tw),
                   **_kw(epsilon, power, threshold, max_iterations, implicit, squash, weights,
                         check_numerics, solver_options, axis, direction))
    mask = t.row_plan[:, :, 0]
    return _finish(t.output(mask), t, return_info)


@_doc
def sinkhorn_permutation_matrix(scores, axis: int = -1, direction: str = "DESCENDING", *,
                                epsilon: float = DEFAULT_EPSILON, power: float = DEFAULT_POWER,
                                threshold: float = DEFAULT_THRESHOLD,
                                max_iterations: int = DEFAULT_MAX_ITERATIONS,
                                implicit: bool = True, squash="logistic",
                                check_numerics: bool = False, return_info: bool = False,
                                **solver_options):
    """Doubly-stochastic relaxed permutation matrix P̂ = n Pᵀ (n × n transport plan).

    Row i of P̂ says which inputs land in position i of the `direction` order, with
    the orientation of SoftSort and NeuralSort (`P̂ @ scores` is the soft sort), so
    the three relaxations feed the same losses. Rows and columns sum to 1 (rows up to
    `threshold`).

    Args:
      scores: `[..., n]` real tensor.
{common}

    Returns:
      `[..., n, n]` tensor (the sort axis is moved last and followed by a new one).

    Example:
    >>> P = sinkhorn_permutation_matrix([[1.0, 3.0, 2.0]], epsilon=1e-3)
    >>> np.round(P.numpy()[0])
    array([[0., 1., 0.],
           [0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    """
    n = _static_n(scores, axis)
    t = _Transport(scores, targets=(n, None),
                   **_kw(epsilon, power, threshold, max_iterations, implicit, squash, None,
                         check_numerics, solver_options, axis, direction))
    perm = n * tf.linalg.matrix_transpose(t.plan)  # [batch, n, n]
    view = t.view
    lead = view.moved_shape[:-1]
    out = tf.reshape(perm, tf.concat([lead, [n, n]], axis=0))
    out.set_shape(view.static_moved_shape[:-1].concatenate([n, n]))
    if view.input_dtype.is_floating:
        out = tf.cast(out, view.input_dtype)
    return _finish(out, t, return_info)

"""Sinkhorn ranks, sorts, CDFs, quantiles, quantile normalisation and top-k masks.

Every operator here is the same transport problem (`solvers.sinkhorn.solve`, set up
by `ops.transport.Transport`) with a
different target measure (y, b), read out through the plan P as in Definition 2 of
Cuturi, Teboul & Vert (2019):

    S-CDF        F̃ = a⁻¹ ∘ (P c) + a/2       (c = b̄ − b/2, b̄ the cumulative sum of b)
    S-rank       R̃ = n F̃                     (talk, Algorithm 2)
    S-sort       S̃ = b⁻¹ ∘ (Pᵀ x)
    S-quantile   eq. (4): S̃ for a target with "filler" bins around each level τ
    S-quantile normalisation   T̃_f = a⁻¹ ∘ (P f)

(For uniform weights and m = n the S-CDF is Definition 2's a⁻¹ ∘ (P b̄); the centred
form keeps its hard limit exact with weights and with any m, see below.)

Hard limits (ε → 0). Sort the inputs in `direction` order: input i holds the mass
interval I_i = [W_i − a_i, W_i] (W_i the weight of the entries ≤ x_i) and target bin
j the interval J_j = [b̄_j − b_j, b̄_j]. The unregularised plan is their overlap,
P_ij = |I_i ∩ J_j| (north-west corner rule, Prop. 1), so that

- S-CDF: F̃_i → a_i/2 + a_i⁻¹ Σ_j P_ij c_j, the centre of I_i as resolved by the target
  bins plus a_i/2. It equals W_i, the weighted empirical CDF, whenever every W_i is a
  bin boundary: uniform weights with m a multiple of n (the default m = n included), or
  target weights that refine the cumulative input weights. Otherwise it is within
  max_j b_j / 2 of W_i, and inputs whose intervals fall in the same bin tie: use a
  larger `num_targets` (or matching `target_weights`) to resolve weighted inputs.
  Always F̃_i ∈ [a_i, 1] (up to `threshold`), so ranks of uniformly weighted inputs
  lie in [1, n] for any m.
- S-rank: n F̃ (n × the weighted CDF for weighted inputs).
- S-sort: S̃_j → b_j⁻¹ Σ_i P_ij x_i, the weighted mean of x over the cumulative mass
  J_j (`hard_stats.interval_mean`).
- S-quantile: the same mean over [τ − t/2, τ + t/2].
- quantile normalisation: T̃_i → a_i⁻¹ Σ_j P_ij f_j.
- top-k mask: the fraction of I_i inside the first k/n of the mass.
Tied inputs share their joint interval (equal outputs).
`tests/ops/sinkhorn/test_hard_limits.py` checks each of these in float64 with weights and
with m ≠ n.

Conventions shared by all operators:

- Inputs are squashed into [0, 1] (`squash`, see `softsort_tf.ops.squash`) and the
  targets sit on the paper's regular grid y_j = (j − 1)/(m − 1) (`targets='regular'`,
  the default, as ott-jax), whatever the bin masses. `targets='centres'` puts them at
  the centres of the target bins instead, y_j = b̄_j − b_j / 2 (for uniform b,
  y_j = (j − 1/2) / m): same hard limits and read-outs, nearly the same values for
  bins of equal mass, and blurrier quantiles and top-k at the same ε
  (docs/options.md).
- `direction='DESCENDING'` operates on −x (and maps values back), so rank 1 goes to
  the largest entry and sorted values decrease.
- The solver configuration is one `SinkhornOptions` (`options=`, or its fields as
  keyword arguments), documented in `softsort_tf.options`; `squash` and `targets` are
  arguments of the operators.
- Axis, masks, ragged inputs, dynamic shapes, dtypes and `return_info` are handled
  once for every operator by `softsort_tf.ops.wrapper.list_operator`: an operator here
  is its target measure and its read-out.
- ε (`epsilon`, default 1e-2) is in units of the cost on [0, 1]; how far it blurs a
  soft rank is stated with `SinkhornOptions.epsilon` (docs/options.md). ε must be at
  least 32 machine epsilons of the compute dtype (3.8e-6 in float32, 7.1e-15 in
  float64; `transport.min_epsilon`): below, the potentials
  (≈ cost / ε) are rounded too coarsely to converge, and a `ValueError` says so.
- `threshold` (default 1e-3) is the L1 marginal error at which a row stops;
  `max_iterations` (default 1000, rounded up to a multiple of `check_every`) bounds
  the iterations of a row; `return_info=True` reports rows that reached it.
- NaN or Inf in x propagate NaN to the affected rows (other rows of the batch are
  unaffected) and never hang the loop: a row whose error is not finite stops. Pass
  `check_numerics=True` to raise `InvalidArgumentError` instead.
- float16/bfloat16 are computed in float32 and returned in the input dtype.
- Padding: `mask=` (and `tf.RaggedTensor` inputs) follow the convention of
  `softsort_tf._masking`. Padded entries and the surplus target bins of a padded list
  carry a negligible mass (`transport.NEGLIGIBLE_MASS`, 1e-20 of a valid entry) and sit
  at `transport.PADDING_POSITION` (2, outside [0, 1]), decoupled from the valid ones:
  the iterations of a padded list follow those of the unpadded one, so its valid
  results match those of the unpadded list to rounding, converged or not.
- Unknown list length n (`tf.function` with `None` dimensions, Keras `Input((None,))`):
  every operator works, also under XLA (`jit_compile=True`, which compiles once per
  concrete shape). Arguments that must be below n (`topk`, `k`) are checked at run time
  by `tf.debugging` assertions; XLA drops assertions, so there a `k` >= n gives NaN
  results instead of an error. When the number of targets is unknown at trace time
  (the default m = n with unknown n), `ImplicitDiff(solver='auto')` still picks the
  backward solve by m (dense float64 for m <= 64, conjugate gradients above) when the
  backward runs (a `tf.cond` in the implicit backward; it compiles under XLA).
  Ragged inputs are padded by ops that XLA does not compile (`RaggedTensorToTensor`):
  call the operators on `(dense, mask)` inside `jit_compile=True` functions.
- Reproducibility between identical calls: forward values and implicit gradients are
  bit-identical (eager and `tf.function`). Unrolled gradients (`implicit_diff=None`)
  are bit-identical between eager calls; under `tf.function` the backpropagation
  through the loop may vary in the last bits from call to call, also with
  `tf.config.experimental.enable_op_determinism()`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _masking
from softsort_tf.ops import family
from softsort_tf.ops.permutation import check_log, with_straight_through
from softsort_tf.ops.squash import check_squash
from softsort_tf.ops.transport import (
    NEGLIGIBLE_MASS,
    TargetMeasure,
    Transport,
    check_targets,
    min_epsilon,
    sinkhorn_operator,
)
from softsort_tf.ops.wrapper import ListResult
from softsort_tf.options import DEFAULT_EPSILON, SinkhornOptions


def _solve(lists, target, direction, squash, targets, options, option_kwargs) -> Transport:
    """The transport of one operator call, with the options resolved once."""
    return Transport(lists, target, direction=direction, squash=squash, targets=targets,
                     options=SinkhornOptions.resolve(options, **option_kwargs))


def _checked_list_length(k: int, count, name: str):
    """`(count, poison)` for lists of length n = count (no mask, n unknown at trace
    time): a run-time assertion k < n (naming the argument) guards `count`. XLA drops
    assertions, so `poison` (`[batch]`, 0 where k < n, NaN elsewhere) is added to the
    target weights: under XLA a k >= n gives NaN results instead of wrong ones."""
    check = tf.debugging.assert_less(tf.cast(k, count.dtype), tf.reduce_min(count), message=(
        f"softsort_tf: `{name}` = {k} must be smaller than the list length n"))
    with tf.control_dependencies([check]):
        count = tf.identity(count)
    nan = tf.fill(tf.shape(count), tf.constant(np.nan, count.dtype))
    return count, tf.where(count > k, tf.zeros_like(count), nan)


@sinkhorn_operator
def sinkhorn_rank(x, axis: int = -1, direction: str = "ASCENDING", *,
                  mask=None, weights=None, num_targets: int | None = None,
                  target_weights=None, zero_based: bool = False, squash="logistic",
                  targets: str = "regular", check_numerics: bool = False,
                  return_info: bool = False,
                  options: SinkhornOptions | dict | None = None, **option_kwargs):
    """Soft ranks R̃ = n F̃ (talk, Algorithm 2; paper Def. 2), F̃ the S-CDF.

    1-based like `scipy.stats.rankdata`: values in [1, n] (the smallest entry gets
    ≈ 1 for 'ASCENDING') for any `num_targets`; ties get equal ranks. With weights,
    n × the weighted CDF (see "Hard limits" in the module docstring for how the
    target grid resolves it).

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
    t = _solve(x, TargetMeasure.bins(num_targets, target_weights), direction, squash,
               targets, options, option_kwargs)
    ranks = t.count[:, None] * t.cdf()
    if zero_based:
        ranks = ranks - 1.0
    return ListResult(ranks, "elementwise", info=t.info())


@sinkhorn_operator
def sinkhorn_cdf(x, axis: int = -1, direction: str = "ASCENDING", *,
                 mask=None, weights=None, num_targets: int | None = None,
                 target_weights=None, squash="logistic", targets: str = "regular",
                 check_numerics: bool = False, return_info: bool = False,
                 options: SinkhornOptions | dict | None = None, **option_kwargs):
    """The S-CDF F̃ = a⁻¹ ∘ (P c) + a/2, c = b̄ − b/2 (paper Def. 2, centred), in [0, 1].

    In the hard limit, F̃_i is the empirical CDF at x_i, the total weight of the
    entries ≤ x_i (rank / n for uniform weights), whenever the target grid resolves
    the cumulative weights (uniform weights with m a multiple of n, e.g. the default
    m = n); otherwise it is that CDF resolved to the target bins, within half a bin
    (see "Hard limits" in the module docstring).

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
    t = _solve(x, TargetMeasure.bins(num_targets, target_weights), direction, squash,
               targets, options, option_kwargs)
    return ListResult(t.cdf(), "elementwise", info=t.info())


@sinkhorn_operator
def sinkhorn_sort(x, axis: int = -1, direction: str = "ASCENDING", *, topk: int | None = None,
                  mask=None, weights=None, num_targets: int | None = None,
                  target_weights=None, squash="logistic", targets: str = "regular",
                  check_numerics: bool = False, return_info: bool = False,
                  options: SinkhornOptions | dict | None = None, **option_kwargs):
    """Soft-sorted values S̃ = b⁻¹ ∘ (Pᵀ x) (paper Def. 2), in the units of x.

    Each output is a weighted average of entries of x, and the outputs are monotone
    in `direction` order. With `topk=k`, returns only the first k values of the sort
    (the k largest for 'DESCENDING', the k smallest for 'ASCENDING'): the target then
    has k bins of mass 1/n and one bin of mass 1 − k/n that absorbs the rest, so the
    cost is O(n·k) instead of O(n²).

    Args:
      x: `[..., n, ...]` real tensor.
{common}
      topk: if set, an integer in [1, n): return only the first k sorted values (with
        `mask`, any k >= 1: a list of n_valid <= k gives its n_valid sorted values,
        then 0).
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
    n, masked = x.static_n, x.mask is not None
    if topk is None:
        target = TargetMeasure.bins(num_targets, target_weights)
    elif x.weights is not None or num_targets is not None or target_weights is not None:
        raise ValueError("`topk` cannot be combined with `weights`, `num_targets` or "
                         "`target_weights`.")
    elif n is not None and not masked:
        k = _checks.check_k(topk, n, "topk")
        target = TargetMeasure.bins(k + 1, np.concatenate([np.full([k], 1.0 / n), [1.0 - k / n]]))
    else:
        k = _checks.check_positive_int("topk", topk)
        target = TargetMeasure.per_list(_topk_sort_targets(k, masked=masked, name="topk"))
    t = _solve(x, target, direction, squash, targets, options, option_kwargs)
    values = t.sorted_values()
    lengths = t.real_bins
    if lengths is None and masked:
        lengths = tf.where(t.count > 0, tf.shape(values)[-1], 0)
    if topk is not None:
        values = values[:, :k]
        lengths = None if lengths is None else tf.minimum(tf.cast(lengths, tf.int32), k)
    return ListResult(values, "sorted", lengths=lengths, info=t.info())


def _topk_sort_targets(k: int, masked: bool, name: str):
    """Target of the top-k sort for lists of `count` valid entries (a callable for
    `Transport`): k bins of mass 1/count and one of mass 1 − k/count. A list with
    count <= k keeps count bins of mass 1/count (its full sort); the others are surplus
    bins of negligible mass. Without a mask every row has count = n and k < n is
    checked at run time."""

    def targets(count):
        poison = tf.zeros_like(count)
        if not masked:
            count, poison = _checked_list_length(k, count, name)
        count = count[:, None]
        j = tf.cast(tf.range(k + 1), count.dtype)[None, :]
        tiny = tf.constant(NEGLIGIBLE_MASS, count.dtype)
        head = tf.where(j < tf.minimum(count, float(k)), tf.ones_like(j * count), tiny)
        rest = tf.where(count > k, count - k, tiny)
        b = tf.where(j < k, head, rest) + poison[:, None]
        real = None
        if masked:
            real = tf.where(count[:, 0] > k, tf.ones_like(count[:, 0]) * (k + 1), count[:, 0])
        return b, real

    return targets


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


@sinkhorn_operator
def sinkhorn_quantile(x, quantiles, width: float | None = None, axis: int = -1,
                      direction: str = "ASCENDING", *, mask=None, weights=None,
                      squash="logistic", targets: str = "regular",
                      check_numerics: bool = False,
                      return_info: bool = False,
                      options: SinkhornOptions | dict | None = None, **option_kwargs):
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
    taus, scalar = _checks.check_quantiles(quantiles)
    n = x.static_n
    if width is not None or x.weights is not None or (n is not None and x.mask is None):
        b, _ = quantile_target_weights(quantiles, width, n=None if x.weights is not None else n)
        target = TargetMeasure.bins(b.size, b)
    else:  # the default width depends on the (valid) list length: per row
        quantile_target_weights(quantiles, None)  # validates the levels
        target = TargetMeasure.per_list(
            lambda count: (_quantile_target_weights_per_row(taus, count), None))
    t = _solve(x, target, direction, squash, targets, options, option_kwargs)
    q = t.sorted_values()[:, 1::2]
    return ListResult(q[:, 0] if scalar else q, "per_list", info=t.info())


def _quantile_target_weights_per_row(taus: np.ndarray, count):
    """`quantile_target_weights(taus, None, n)` for a `[batch]` tensor of list lengths
    (the number of valid entries of each row, possibly unknown at trace time):
    `[batch, 2q + 1]` target weights with the default width of each row's n (see
    `default_quantile_width`). Computed in float64."""
    n = tf.maximum(tf.cast(count, tf.float64), 1.0)[:, None]
    width = default_quantile_width(taus)  # the n-free cap
    pos = taus[None, :] * n
    nearest = tf.round(pos)
    on_boundary = tf.abs(pos - nearest) < 1e-9
    cell = tf.where(on_boundary, 1.0 / n, 2.0 * tf.abs(pos - nearest) / n)
    t = tf.minimum(tf.constant(width, tf.float64), tf.reduce_min(cell, axis=-1))
    columns = [taus[0] - t / 2]
    for k in range(taus.size):
        columns.append(t)
        gap = (taus[k + 1] - taus[k] - t) if k + 1 < taus.size else (1.0 - taus[-1] - t / 2)
        columns.append(gap)
    return tf.cast(tf.stack(columns, axis=-1), count.dtype)


@sinkhorn_operator
def sinkhorn_quantile_normalization(x, target_values, axis: int = -1,
                                    direction: str = "ASCENDING", *,
                                    mask=None, weights=None,
                                    target_weights=None, squash="logistic",
                                    targets: str = "regular",
                                    check_numerics: bool = False,
                                    return_info: bool = False,
                                    options: SinkhornOptions | dict | None = None, **option_kwargs):
    """Soft quantile normalisation T̃_f = a⁻¹ ∘ (P f) (paper Def. 2).

    Keeps the order of x and replaces its values by those of the sorted
    `target_values` f (of any length m): in the hard limit with m = n, the i-th
    smallest entry of x becomes the i-th smallest target value. `direction` does not
    change the result: the order of x is kept in both directions (matching the i-th
    largest entry with the i-th largest target value is the same transport problem,
    mirrored); the argument is accepted, and validated, like that of the other
    operators.

    Args:
      x: `[..., n, ...]` real tensor.
      target_values: `[m]` values (sorted internally), or `[batch..., m]` with the
        leading shape of x without `axis`.
{common}
      target_weights: positive weights `[m]` of the target values in increasing order
        (default uniform).

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
    _checks.check_direction(direction)  # validated; the result keeps the order of x either way
    t = _solve(x, TargetMeasure.bins(m, target_weights), "ASCENDING", squash, targets,
               options, option_kwargs)
    f = target_values
    if f.shape.rank > 1:
        lead = x.view.static_moved_shape[:-1]
        if not f.shape[:-1].is_compatible_with(lead):
            raise ValueError(f"`target_values` must have shape [m] or [..., m] with the "
                             f"shape of `x` without `axis` in front ({lead.as_list()} + [m]), "
                             f"got {f.shape.as_list()}.")
        f = tf.reshape(f, [-1, m])
    return ListResult(t.push(f), "elementwise", info=t.info())


@sinkhorn_operator
def sinkhorn_topk(x, k: int, axis: int = -1, direction: str = "DESCENDING", *,
                       mask=None, weights=None, squash="logistic", targets: str = "regular",
                       check_numerics: bool = False,
                       return_info: bool = False,
                       options: SinkhornOptions | dict | None = None, **option_kwargs):
    """Soft indicator of membership in the first k entries in `direction` order.

    The target has two bins, of mass k/n (the top-k) and 1 − k/n; the mask is the
    fraction of each input's mass sent to the top-k bin, a⁻¹ ∘ (P e_1). Values are in
    [0, 1] and sum to k (for uniform weights). The default 'DESCENDING' selects the
    k largest entries.

    Args:
      x: `[..., n, ...]` real tensor.
      k: an integer in [1, n) (with `mask`, any k >= 1: every valid entry of a list of
        n_valid <= k gets 1).
{common}

    Returns:
      A tensor with the shape and dtype of x.

    Example:
    >>> mask = sinkhorn_topk([0.1, 3.0, -1.0, 2.0], k=2, epsilon=1e-3)
    >>> np.round(mask.numpy())
    array([0., 1., 0., 1.], dtype=float32)
    """
    n, masked = x.static_n, x.mask is not None
    if n is not None and not masked:
        k = _checks.check_k(k, n)
        target = TargetMeasure.bins(2, np.array([k / n, 1.0 - k / n]))
    else:
        k = _checks.check_positive_int("k", k)

        def masses(count):
            poison = tf.zeros_like(count)
            if not masked:
                count, poison = _checked_list_length(k, count, "k")
            tiny = tf.constant(NEGLIGIBLE_MASS, count.dtype)
            b = tf.stack([tf.maximum(tf.minimum(count, float(k)), tiny),
                          tf.where(count > k, count - k, tiny)], axis=-1) + poison[:, None]
            return b, (1.0 + tf.cast(count > k, count.dtype) if masked else None)

        target = TargetMeasure.per_list(masses)
    t = _solve(x, target, direction, squash, targets, options, option_kwargs)
    selected = t.row_plan[:, :, 0]
    if masked:  # lists of at most k valid entries: all of them are selected
        selected = tf.where((t.count <= k)[:, None], tf.ones_like(selected), selected)
    return ListResult(selected, "elementwise", info=t.info())


@sinkhorn_operator
def sinkhorn_permutation_matrix(scores, axis: int = -1, direction: str = "DESCENDING", *,
                                mask=None, log: bool = False, squash="logistic",
                                targets: str = "regular", check_numerics: bool = False,
                                return_info: bool = False,
                                options: SinkhornOptions | dict | None = None, **option_kwargs):
    """Doubly-stochastic relaxed permutation matrix P̂ = n Pᵀ (n × n transport plan).

    Row i of P̂ says which inputs land in position i of the `direction` order, with
    the orientation of SoftSort and NeuralSort (`P̂ @ scores` is the soft sort), so
    the three relaxations feed the same losses. Rows sum to 1 (up to rounding: the
    solver ends on the update that makes them exact) and columns sum to 1 up to the
    solver's marginal error: Σ_j |Σ_i P̂_ij − 1| = n · `error` ≤ n · `threshold` for a
    converged row (`return_info=True` reports `error`).

    Args:
      scores: `[..., n]` real tensor.
      log: return log P̂ = log n + (f ⊕ g − C)ᵀ/ε, read off the solver's potentials
        (entries far below the smallest float stay finite; −inf where P̂ is 0 by
        padding), for `permutation_cross_entropy(..., from_log=True)`.
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
    check_log(log)
    t = _solve(scores, TargetMeasure.one_per_entry(), direction, squash, targets, options,
               option_kwargs)
    if log:  # log P̂ = log n + (f + g − C)ᵀ/ε, from the potentials
        count = tf.maximum(t.count, 1.0)
        perm = tf.math.log(count)[:, None, None] + tf.linalg.matrix_transpose(
            t.result.log_plan())
    else:
        perm = t.count[:, None, None] * tf.linalg.matrix_transpose(t.plan)  # [batch, n, n]
    if t.mask is not None:
        # Rows: sorted positions >= n_valid are 0; columns: padded entries are 0.
        rows = _masking.valid_prefix(tf.cast(t.count, tf.int32), tf.shape(perm)[-1])
        keep = tf.logical_and(rows[:, :, None], t.mask[:, None, :])
        perm = _masking.fill_padded(perm, keep, -np.inf if log else 0.0)
    return ListResult(perm, "square", info=t.info())


# ---------------------------------------------------------------------------------
# The Sinkhorn family (`softsort_tf.ops.family`).
# ---------------------------------------------------------------------------------
SINKHORN_DEFAULTS = dict(options=None, squash="logistic", targets="regular")
# ε = EPSILON_PER_RANK_SCALE / n² keeps the rank blur n·√(ε/2) at ≈ 0.39 of a rank.
EPSILON_PER_RANK_SCALE = 0.3
MIN_LENGTH_EPSILON = 1e-6


def epsilon_for_length(n: int) -> float:
    """ε = max(0.3 / n², 1e-6): the logistic squash maps the scores into (0, 1), where
    the n targets are 1/n apart; swapping two neighbouring ranks changes the cost by
    about 2/n², and a Sinkhorn rank blurs over about n·√(ε/2) neighbours, so this ε keeps
    the blur at ≈ 0.4 of a rank whatever n is (the floor keeps ε above the float32
    resolution of the costs for n ≳ 500)."""
    return max(EPSILON_PER_RANK_SCALE / n**2, MIN_LENGTH_EPSILON)



class SinkhornSettings(family.Settings):
    """Sinkhorn's settings wherever a layer or loss takes `method='sinkhorn'`: one
    `SinkhornOptions` (from `options` and its fields given as keywords, `epsilon`, ...;
    `temperature` is its ε), `squash` and `targets`, validated once. The config holds one
    key per field of the options, `squash` and `targets`.

    Attributes:
      options, squash, targets: the validated settings.
      temperature_name: the argument that set ε (`temperature` or `epsilon`), named by
        the range check.
    """

    keywords = frozenset({*SINKHORN_DEFAULTS, *SinkhornOptions.field_names()})
    keyword_defaults = SINKHORN_DEFAULTS
    holds_temperature = True

    def __init__(self, family_: family.Family, options: SinkhornOptions,
                 squash=SINKHORN_DEFAULTS["squash"], targets=SINKHORN_DEFAULTS["targets"],
                 temperature_name: str = "epsilon"):
        super().__init__(family_)
        self.options, self.squash, self.targets = options, squash, targets
        self.temperature_name = temperature_name

    @classmethod
    def create(cls, family_, temperature, method_kwargs, kwargs, operation="rank"):
        family_.check_method_kwargs(method_kwargs, operation)
        rest = family.refuse_foreign_keywords(family_, kwargs)
        settings = {name: rest.pop(name, default) for name, default in SINKHORN_DEFAULTS.items()}
        fields = {name: rest.pop(name) for name in list(rest)
                  if name in SinkhornOptions.field_names()}
        if temperature is not None:
            if fields.get("epsilon") is not None:
                raise ValueError("`temperature` and `epsilon` both set Sinkhorn's ε: pass one "
                                 "of them.")
            if family._is_tensor(temperature):
                raise ValueError("method='sinkhorn' takes ε as a Python number: a tensor or "
                                 "variable `temperature` (a learnable temperature) is taken "
                                 f"by {learnable_families()}.")
            fields["epsilon"] = temperature
        options = SinkhornOptions.resolve(settings["options"], **fields)
        return cls(family_, options, check_squash(settings["squash"]),
                   check_targets(settings["targets"]),
                   "temperature" if temperature is not None else "epsilon"), None, rest

    @classmethod
    def leave_temperature(cls, kwargs: dict) -> dict:
        if kwargs.get("options") is None and "epsilon" not in kwargs:
            return {**kwargs, "epsilon": None}  # `epsilon_for_length` at the call
        return kwargs

    def for_length(self, n: int | None) -> SinkhornSettings:
        if self.options.epsilon is not None:
            return self
        if n is None:
            raise ValueError("The default `epsilon` of a list of n items, "
                             f"{EPSILON_PER_RANK_SCALE}/n², needs n (the last axis) to be "
                             "known when the model is built; pass `epsilon` explicitly "
                             "for lists of unknown length.")
        return SinkhornSettings(self.family, self.options.replace(
            epsilon=epsilon_for_length(n)), self.squash, self.targets, self.temperature_name)

    def attributes(self) -> dict:
        return dict(options=self.options, squash=self.squash, targets=self.targets)

    def operator_kwargs(self) -> dict:
        return self.attributes()

    def get_config(self) -> dict:
        return dict(squash=self.squash, targets=self.targets, **self.options.get_config())

    def check_temperature(self, temperature, dtype, name: str = "temperature"):
        if temperature is None:
            self.family.check_temperature(self.options.solver_epsilon, dtype,
                                          name=self.temperature_name)
            return None
        return self.family.check_temperature(temperature, dtype, name=name)


def learnable_families() -> list[str]:
    """The families whose temperature may be a tensor or variable."""
    return [f.name for f in family.FAMILIES.values() if f.tensor_temperature]


def temperature_range(dtype) -> tuple[float, float]:
    """The ε a Sinkhorn computation in `dtype` resolves: from `min_epsilon(dtype)` (32
    machine epsilons) to the largest float."""
    return min_epsilon(dtype), family.normal_range(dtype)[1]


def _option_operation(fn):
    return family.family_operation(fn, keywords=SinkhornOptions.field_names())


SINKHORN = family.Family(
    "sinkhorn", "epsilon", DEFAULT_EPSILON,
    "entropic regularisation ε, in units of the cost on [0, 1] after squashing (how far "
    "a soft rank blurs: `SinkhornOptions.epsilon`)",
    "Cuturi, Teboul & Vert (2019)",
    operations=dict(rank=_option_operation(sinkhorn_rank),
                    sort=_option_operation(sinkhorn_sort),
                    topk=_option_operation(sinkhorn_topk),
                    quantile=_option_operation(sinkhorn_quantile)),
    matrix_fn=with_straight_through(sinkhorn_permutation_matrix), doubly_stochastic=True,
    log_domain=True, settings=SinkhornSettings, temperature_range=temperature_range,
    temperature_units="normalized",
    # Scale-free: ε = 3 on the squashed costs; the default threshold (1e-3) would stop
    # it after one iteration (marginal error 1.2e-4), 1e-6 after two.
    scale_free_temperature=3.0, scale_free_settings={"threshold": 1e-6})

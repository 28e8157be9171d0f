"""Sinkhorn ranks, sorts, CDFs, quantiles, quantile normalisation and top-k masks.

Every operator is one transport problem (`ops.transport.Transport`, solved by
`solvers.sinkhorn.solve`) with its own target measure (y, b), read out through the plan
P as in Definition 2 of Cuturi, Teboul & Vert (2019):

    S-CDF        F̃ = a⁻¹ ∘ (P c) + a/2       (c = b̄ − b/2, b̄ the cumulative sum of b)
    S-rank       R̃ = n F̃                     (talk, Algorithm 2)
    S-sort       S̃ = b⁻¹ ∘ (Pᵀ x)
    S-quantile   eq. (4): S̃ for a target with "filler" bins around each level τ
    S-quantile normalisation   T̃_f = a⁻¹ ∘ (P f)

Hard limits (ε → 0; `tests/ops/sinkhorn/test_hard_limits.py`). Sorted in `direction`
order, input i holds the mass interval I_i = [W_i − a_i, W_i] (W_i the weight of the
entries ≤ x_i), target bin j the interval J_j = [b̄_j − b_j, b̄_j], and the plan is
their overlap P_ij = |I_i ∩ J_j| (Prop. 1). So the S-CDF is the centre of I_i as
resolved by the bins plus a_i/2: W_i, the weighted empirical CDF, whenever every W_i is
a bin boundary (uniform weights with m a multiple of n, the default m = n included),
else within max_j b_j / 2 of it, in [a_i, 1] always (ranks of uniform inputs in
[1, n]). The S-sort is the weighted mean of x over J_j (`hard_stats.interval_mean`),
the S-quantile the same over [τ − t/2, τ + t/2], the top-k mask the fraction of I_i in
the first k/n of the mass. Tied inputs share their joint interval.

Settings: docs/options.md; padding: docs/api.md; axis, masks, dtypes and `return_info`:
`softsort_tf.ops.wrapper.list_operator`. With n unknown at trace time, `topk`/`k` < n is
a run-time assertion, which XLA drops (a `k` >= n gives NaN there). Forward values and
implicit gradients are bit-identical between identical calls; unrolled gradients under
`tf.function` may vary in the last bits.
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
    """`(count, poison)` for lists of length n = count unknown at trace time: `count`
    guarded by an assertion k < n naming the argument, and `poison` (`[batch]`, 0 where
    k < n, else NaN) for the target weights, since XLA drops assertions."""
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
                  return_info: bool = False, options: SinkhornOptions | dict | None = None,
                  **option_kwargs):
    """Soft ranks R̃ = n F̃ (talk, Algorithm 2), F̃ the S-CDF.

    1-based like `scipy.stats.rankdata`, in [1, n] for any `num_targets`; ties get equal
    ranks; with weights, n × the weighted CDF (see "Hard limits" in the module docstring).

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

    Its hard limit is the weighted empirical CDF at x_i when the target bins resolve the
    cumulative weights (e.g. the default m = n), else within half a bin ("Hard limits").

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

    Each output is a weighted average of entries of x, monotone in `direction` order.
    With `topk=k`, only the first k values, at a cost of O(n·k): the target has k bins
    of mass 1/n and one of mass 1 − k/n.

    Args:
      x: `[..., n, ...]` real tensor.
{common}
      topk: if set, k in [1, n): only the first k sorted values (with `mask`, any
        k >= 1: a list of n_valid <= k gives its n_valid sorted values, then 0).
      num_targets: m, the number of output values (default n).
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
        target = TargetMeasure.per_list(_topk_target(k, masked, "topk", one_head=False))
    t = _solve(x, target, direction, squash, targets, options, option_kwargs)
    values = t.sorted_values()
    lengths = t.real_bins
    if lengths is None and masked:
        lengths = tf.where(t.count > 0, tf.shape(values)[-1], 0)
    if topk is not None:
        values = values[:, :k]
        lengths = None if lengths is None else tf.minimum(tf.cast(lengths, tf.int32), k)
    return ListResult(values, "sorted", lengths=lengths, info=t.info())


def _topk_target(k: int, masked: bool, name: str, one_head: bool):
    """Target masses (for `TargetMeasure.per_list`) of lists of `count` valid entries:
    the first min(count, k) of mass in one bin (`one_head`, top-k masks) or in k bins of
    1 (top-k sorts: a list with count <= k keeps count bins, its full sort), then one bin
    of count − k; bins without mass are surplus bins."""

    def masses(count):
        poison = tf.zeros_like(count)
        if not masked:
            count, poison = _checked_list_length(k, count, name)
        c, tiny = count[:, None], tf.constant(NEGLIGIBLE_MASS, count.dtype)
        if one_head:
            head = tf.maximum(tf.minimum(c, float(k)), tiny)
            real = 1.0 + tf.cast(count > k, count.dtype)
        else:
            j = tf.cast(tf.range(k), count.dtype)[None, :]
            head = tf.where(j < tf.minimum(c, float(k)), tf.ones_like(j * c), tiny)
            real = tf.where(count > k, tf.ones_like(count) * (k + 1), count)
        b = tf.concat([head, tf.where(c > k, c - k, tiny)], axis=-1) + poison[:, None]
        return b, (real if masked else None)

    return masses


def default_quantile_width(taus: np.ndarray, n: int | None = None) -> float:
    """The default width t of the bin around each quantile level: min(0.1, half the
    smallest gap), counting 2τ_1 and 2(1 − τ_q) as gaps; with n (uniform weights) also
    capped so that [τ − t/2, τ + t/2] stays in the cell of the input holding τ (or
    straddles a boundary symmetrically): the hard limit is then
    `np.quantile(x, τ, method='averaged_inverted_cdf')`."""
    gaps = np.concatenate([[2 * taus[0]], np.diff(taus), [2 * (1 - taus[-1])]])
    width = min(0.1, 0.5 * float(gaps.min()))
    if n is not None:
        width = min(width, float(_cell_width(taus, n, np).min()))
    return width


def _cell_width(taus, n, xp):
    """Per level, twice the distance from τ to the nearer edge of its input's cell (one
    cell where τ·n is an integer), in mass; `xp` is numpy or tensorflow."""
    to_edge = abs(taus * n - xp.round(taus * n))
    return xp.where(to_edge < 1e-9, 1.0 / n, 2.0 * to_edge / n)


def _quantile_bins(taus, t) -> list:
    """The masses [τ_1 − t/2, t, τ_2 − τ_1 − t, t, …, t, 1 − τ_q − t/2]."""
    bins = [taus[0] - t / 2]
    for k in range(taus.size):
        bins += [t, (taus[k + 1] - taus[k] - t) if k + 1 < taus.size else (1.0 - taus[-1] - t / 2)]
    return bins


def quantile_target_weights(quantiles, width: float | None = None,
                            n: int | None = None) -> tuple[np.ndarray, float]:
    """Target weights b of the S-quantile operator for levels τ_1 < … < τ_q.

    Eq. (4) of the paper for q levels, one bin of mass t centred on each τ_k (so the
    hard limit is the mean of the values whose cumulative mass is in [τ_k ± t/2]):

        b = [τ_1 − t/2, t, τ_2 − τ_1 − t, t, …, t, 1 − τ_q − t/2]   (2q + 1 bins).

    Args:
      quantiles: levels in (0, 1), strictly increasing.
      width: t < 2τ_1, 2(1 − τ_q), τ_{k+1} − τ_k; default `default_quantile_width`.
      n: the number of (uniformly weighted) inputs, used only for the default width.

    Returns:
      `(b, t)` with b of shape `[2q + 1]`.

    Example:
    >>> b, t = quantile_target_weights([0.5], width=0.2)
    >>> b.round(6).tolist(), t
    ([0.4, 0.2, 0.4], 0.2)
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
    return np.array(_quantile_bins(taus, width), np.float64), width


@sinkhorn_operator
def sinkhorn_quantile(x, quantiles, width: float | None = None, axis: int = -1,
                      direction: str = "ASCENDING", *, mask=None, weights=None,
                      squash="logistic", targets: str = "regular", check_numerics: bool = False,
                      return_info: bool = False,
                      options: SinkhornOptions | dict | None = None, **option_kwargs):
    """τ-S-quantiles (paper eq. 4 for several levels, `quantile_target_weights`);
    'DESCENDING' returns the quantiles of −x, negated.

    Args:
      x: `[..., n, ...]` real tensor.
      quantiles: a level or a strictly increasing sequence of q levels in (0, 1).
      width: mass t of the bin around each level (default `default_quantile_width`:
        the hard limit is `np.quantile(x, τ, method='averaged_inverted_cdf')` for
        uniform weights); larger widths average more values.
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
    """`quantile_target_weights(taus, None, n)` `[batch, 2q + 1]` for a `[batch]` tensor
    of list lengths (possibly unknown at trace time), computed in float64."""
    n = tf.maximum(tf.cast(count, tf.float64), 1.0)[:, None]
    cell = tf.reduce_min(_cell_width(taus[None, :], n, tf), axis=-1)
    t = tf.minimum(tf.constant(default_quantile_width(taus), tf.float64), cell)
    return tf.cast(tf.stack(_quantile_bins(taus, t), axis=-1), count.dtype)


@sinkhorn_operator
def sinkhorn_quantile_normalization(x, target_values, axis: int = -1,
                                    direction: str = "ASCENDING", *, mask=None, weights=None,
                                    target_weights=None, squash="logistic",
                                    targets: str = "regular", check_numerics: bool = False,
                                    return_info: bool = False,
                                    options: SinkhornOptions | dict | None = None,
                                    **option_kwargs):
    """Soft quantile normalisation T̃_f = a⁻¹ ∘ (P f) (paper Def. 2).

    Keeps the order of x and replaces its values by those of the sorted `target_values`
    f (any length m): in the hard limit with m = n, the i-th smallest entry of x becomes
    the i-th smallest target value. `direction` is validated and does not change the
    result (the mirrored problem is the same).

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
                  check_numerics: bool = False, return_info: bool = False,
                  options: SinkhornOptions | dict | None = None, **option_kwargs):
    """Soft indicator of membership in the first k entries in `direction` order.

    The fraction a⁻¹ ∘ (P e_1) of each input's mass sent to the first of two target bins,
    of mass k/n and 1 − k/n: in [0, 1], summing to k. 'DESCENDING' selects the largest.

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
        target = TargetMeasure.per_list(_topk_target(k, masked, "k", one_head=True))
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

    Row i says which inputs land in position i of the `direction` order (`P̂ @ scores`
    is the soft sort, as for SoftSort and NeuralSort). Rows sum to 1, columns up to the
    solver's marginal error: Σ_j |Σ_i P̂_ij − 1| = n · `error` (`return_info=True`).

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


# The Sinkhorn family (`softsort_tf.ops.family`).
SINKHORN_DEFAULTS = dict(options=None, squash="logistic", targets="regular")
# ε = EPSILON_PER_RANK_SCALE / n² keeps the rank blur n·√(ε/2) at ≈ 0.39 of a rank.
EPSILON_PER_RANK_SCALE = 0.3
MIN_LENGTH_EPSILON = 1e-6


def epsilon_for_length(n: int) -> float:
    """ε = max(0.3 / n², 1e-6): a Sinkhorn rank blurs over about n·√(ε/2) neighbours
    (docs/options.md), so this keeps the blur at ≈ 0.4 of a rank whatever n is; the
    floor keeps ε above the float32 resolution of the costs."""
    return max(EPSILON_PER_RANK_SCALE / n**2, MIN_LENGTH_EPSILON)


class SinkhornSettings(family.Settings):
    """Sinkhorn's settings wherever a layer or loss takes `method='sinkhorn'`: one
    `SinkhornOptions` (`temperature` is its ε), `squash` and `targets`, validated once;
    the config holds one key per field of the options, `squash` and `targets`.
    `temperature_name` is the argument that set ε, named by the range check.
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

    operator_kwargs = attributes

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
    scale_free_temperature=3.0, scale_free_settings={"threshold": 1e-6},
    raw_scores_settings={"squash": None})

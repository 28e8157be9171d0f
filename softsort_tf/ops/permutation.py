"""Relaxed permutation matrices: SoftSort (Prillo & Eisenschlos 2020, eq. 4) and
NeuralSort (Grover et al. 2019, in O(n²)), the exact matrix, and the straight-through
plumbing the families share.

Row i of P̂ `[..., n, n]` is a distribution over the items that may occupy position i
in `direction` order ('DESCENDING' by default); P̂ tends to the exact matrix as τ → 0
(τ in the units of the scores). With a `mask` (or ragged input) the valid block of P̂
is P̂ of the unpadded list, the other rows and columns 0 (docs/api.md, "Padding").
"""

from __future__ import annotations

import inspect

import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _masking
from softsort_tf.ops.family import Family
from softsort_tf.ops.wrapper import ListResult, Lists, list_operator
from softsort_tf.solvers.cost import pair_cost

DEFAULT_TAU = 1.0
DEFAULT_DISTANCE_POWER = 1.0


def check_log(log, hard: bool = False) -> bool:
    """Validates `log` (log P̂ instead of P̂), which excludes `hard`."""
    if not isinstance(log, (bool, np.bool_)):
        raise ValueError(f"`log` must be a bool, got {log!r}.")
    if log and hard:
        raise ValueError("`log=True` returns log P̂ of the relaxation; it cannot be combined "
                         "with `hard=True` (straight-through).")
    return bool(log)


def check_hard(hard) -> bool:
    if not isinstance(hard, (bool, np.bool_)):
        raise ValueError(f"`hard` must be a bool, got {hard!r}.")
    return bool(hard)


def _descending_order(d, valid=None):
    """Stable DESCENDING argsort of `[batch, n]` scores `d`, the `valid` entries first."""
    order = tf.argsort(d, axis=-1, direction="DESCENDING", stable=True)
    if valid is None:
        return order
    padded_sorted = tf.cast(tf.logical_not(tf.gather(valid, order, batch_dims=1)), tf.int32)
    return tf.gather(order, tf.argsort(padded_sorted, axis=-1, stable=True), batch_dims=1)


def _exact_permutation_2d(d, valid=None):
    """`[batch, n, n]` one-hot rows of `_descending_order(d, valid)`, 0 from n_valid on."""
    order = _descending_order(d, valid)
    perm = tf.one_hot(order, tf.shape(d)[-1], dtype=d.dtype)
    if valid is None:
        return perm
    return tf.where(_sorted_positions_valid(valid)[:, :, None], perm, tf.zeros([], d.dtype))


def _sorted_positions_valid(valid):
    """`[batch, n]` boolean: position i of the sort holds a valid entry (i < n_valid)."""
    return _masking.valid_prefix(_masking.n_valid(valid), tf.shape(valid)[-1])


def _masked_log_softmax(logits, valid):
    """Row-wise log-softmax of `[batch, n, n]` logits over the valid columns; −inf at
    padded columns and in the rows of sorted positions >= n_valid."""
    if valid is None:
        return tf.nn.log_softmax(logits, axis=-1)
    minus_inf = tf.constant(-np.inf, logits.dtype)
    log_perm = tf.nn.log_softmax(tf.where(valid[:, None, :], logits, minus_inf), axis=-1)
    return tf.where(_sorted_positions_valid(valid)[:, :, None], log_perm, minus_inf)


def _masked_normalise(weights, valid):
    """Row-normalised `weights` `[batch, n, n]` over the valid columns; rows of sorted
    positions >= n_valid and columns of padded entries are 0 (no division by 0)."""
    # `weights` are finite (padded scores were replaced): a padded column's 0 is exact.
    weights = weights * tf.cast(valid, weights.dtype)[:, None, :]
    sums = tf.reduce_sum(weights, axis=-1, keepdims=True)
    keep = tf.logical_and(_sorted_positions_valid(valid)[:, :, None], sums > 0)
    factor = tf.where(keep, 1.0 / tf.where(keep, sums, tf.ones_like(sums)),
                      tf.zeros_like(sums))
    return weights * factor


def straight_through(hard, soft):
    """Straight-through estimator `hard + (soft − stop_gradient(soft))`: the value of
    `hard` bit for bit, the gradient of `soft`.

    Args:
      hard: the forward value, e.g. `hard_permutation_matrix(scores)` (or ragged).
      soft: a differentiable tensor of the same shape (ragged like `hard`), e.g. P̂.

    Returns:
      `hard`'s values in the dtype of `soft`, with the gradient of `soft`.

    Example:
    >>> s = tf.constant([[0.3, 2.0, 1.0]])
    >>> P = straight_through(hard_permutation_matrix(s), softsort_permutation_matrix(s))
    >>> P.numpy()[0]
    array([[0., 1., 0.],
           [0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    """
    if isinstance(hard, tf.RaggedTensor) and isinstance(soft, tf.RaggedTensor):
        return tf.ragged.map_flat_values(straight_through, hard, soft)
    _checks.check_dense("hard", hard, mask=None)  # ragged with a dense `soft`
    _checks.check_dense("soft", soft, mask=None)
    soft = tf.convert_to_tensor(soft)
    hard = tf.cast(hard, soft.dtype)
    return hard + (soft - tf.stop_gradient(soft))


def with_straight_through(matrix_fn):
    """`matrix_fn(scores, *, direction, mask, **kwargs)` with the straight-through option
    `hard=` added (ragged inputs included), for a family whose operator has none."""

    def matrix(scores, *, direction: str = "DESCENDING", hard: bool = False, mask=None,
               **kwargs):
        hard = check_hard(hard)
        if hard and kwargs.get("log"):
            raise ValueError("`log=True` cannot be combined with `hard=True`.")
        perm = matrix_fn(scores, direction=direction, mask=mask, **kwargs)
        if not hard:
            return perm
        exact = hard_permutation_matrix(scores, direction, mask=mask)
        if isinstance(perm, tf.RaggedTensor):
            return perm.with_flat_values(straight_through(exact.flat_values, perm.flat_values))
        return straight_through(exact, perm)

    matrix.__signature__ = _with_hard_signature(matrix_fn)
    return matrix


def _with_hard_signature(fn):
    """The signature of `fn` with a keyword `hard` added (read by `Family.keywords`)."""
    signature = inspect.signature(fn)
    parameters = list(signature.parameters.values())
    if "hard" in signature.parameters:
        return signature
    hard = inspect.Parameter("hard", inspect.Parameter.KEYWORD_ONLY, default=False)
    position = next((i for i, p in enumerate(parameters) if p.kind == p.VAR_KEYWORD),
                    len(parameters))
    return signature.replace(parameters=parameters[:position] + [hard] + parameters[position:])


@list_operator
def hard_permutation_matrix(scores, direction: str = "DESCENDING", *, mask=None):
    """The exact sorting permutation matrix of `scores` (no gradient).

    Row i is the one-hot vector of the i-th item in `direction` order (a stable sort),
    so `P @ scores` is `tf.sort(scores, direction=direction)`.

    Args:
      scores: `[..., n]` real tensor, or a `tf.RaggedTensor` `[batch, (n)]`.
      direction: 'DESCENDING' (default) or 'ASCENDING'.
      mask: optional boolean `[..., n]` (or `[n]`), True = valid entry (see the module
        docstring).

    Returns:
      `[..., n, n]` 0/1 in the dtype of `scores` (float32 for integers, float64 for
      64-bit integers); ragged `[batch, (n), (n)]` for a ragged input.

    Example:
    >>> hard_permutation_matrix([[0.3, 2.0, 1.0]]).numpy()[0]
    array([[0., 1., 0.],
           [0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    """
    direction = _checks.check_direction(direction)
    return _matrix(scores, lambda d, valid: _exact_permutation_2d(tf.stop_gradient(d), valid),
                   direction)


def _matrix(lists: Lists, core, direction: str) -> ListResult:
    """The `[batch, n, n]` matrices `core(d, valid)` of the scores `d` whose DESCENDING
    order is the `direction` order of the lists (padded entries already replaced)."""
    d = -lists.values if direction == "ASCENDING" else lists.values
    return ListResult(core(d, lists.mask), "square")


def centred_finite_rows(values):
    """`(values − c, bad)` for `[batch, n]` rows, c the per-row midrange (no gradient),
    so that a relaxation of differences works at their size, not the offset's; `bad`
    `[batch]` marks the rows with a non-finite entry, set to 0 (then `poison_rows`)."""
    finite = tf.math.is_finite(values)
    bad = tf.reduce_any(tf.logical_not(finite), axis=-1)
    safe = tf.where(bad[:, None], tf.zeros_like(values), values)
    centre = tf.stop_gradient(0.5 * tf.reduce_max(safe, axis=-1, keepdims=True)
                              + 0.5 * tf.reduce_min(safe, axis=-1, keepdims=True))
    return safe - centre, bad


def poison_rows(values, bad):
    """`values` `[batch, ...]` with the rows marked by `bad` `[batch]` set to NaN."""
    shape = tf.concat([tf.shape(bad), tf.ones(tf.rank(values) - 1, tf.int32)], axis=0)
    return tf.where(tf.reshape(bad, shape), tf.constant(np.nan, values.dtype), values)


def finite_midrange(values, finite):
    """`(centre, half_spread)` `[batch, 1]` of the `finite` entries (bool `[batch, n]`)
    of each row of `values`: their midrange (no gradient) and half their spread; 0 and
    0 for a row without one. Relaxations of differences are computed on `values − centre`,
    at the size of the differences, not of the offset."""
    dtype = values.dtype
    inf = tf.constant(np.inf, dtype)
    high = tf.reduce_max(tf.where(finite, values, -inf), axis=-1, keepdims=True)
    low = tf.reduce_min(tf.where(finite, values, inf), axis=-1, keepdims=True)
    has_finite = high >= low
    zero = tf.zeros([], dtype)
    centre = tf.stop_gradient(tf.where(has_finite, 0.5 * high + 0.5 * low, zero))
    return centre, tf.stop_gradient(tf.where(has_finite, high - centre, zero))


def centred_with_stand_ins(values, reach):
    """`(keys, nan, finite)` for `[batch, n]` rows: the finite values centred on their
    midrange c (no gradient), each ±inf replaced by the finite stand-in ±(h + reach)
    (h the finite values' half-spread, capped at a quarter of the largest float; zero
    gradient), `nan` `[batch]` marking the rows with a NaN (their keys finite, for
    `poison_rows`) and `finite` the finite entries. `reach`: a number, or a function of
    h (`[batch, 1]`) giving one per row. For a relaxation whose weights across a
    distance of `reach` are exactly 0, the stand-ins give the limit of scores growing
    without bound."""
    dtype = values.dtype
    finite = tf.math.is_finite(values)
    centre, half_spread = finite_midrange(values, finite)
    reach = reach(half_spread) if callable(reach) else tf.constant(reach, dtype)
    far = tf.stop_gradient(tf.minimum(half_spread + reach,
                                      tf.constant(0.25 * dtype.max, dtype)))
    # NaN: neither finite nor > 0, so −far (finite); its row is poisoned by the caller.
    keys = tf.where(finite, values - centre, tf.where(values > 0, far, -far))
    return keys, tf.reduce_any(tf.math.is_nan(values), axis=-1), finite


def _relaxed(lists: Lists, core, direction: str, hard: bool, log: bool, reach) -> ListResult:
    """`_matrix` of a relaxation `core(d, valid, finite)` with the straight-through
    option, on centred scores with ±inf replaced by stand-ins beyond `reach` (a distance
    across which the relaxation's weights are exactly 0: their limits,
    `centred_with_stand_ins`), the core told the `finite` entries; a list with a NaN is
    NaN."""
    direction = _checks.check_direction(direction)
    hard = check_hard(hard)
    check_log(log, hard)

    def relaxed_core(d, valid):
        d, bad, finite = centred_with_stand_ins(d, reach)
        perm = core(d, valid, finite)
        if hard:
            perm = straight_through(_exact_permutation_2d(tf.stop_gradient(d), valid), perm)
        return poison_rows(perm, bad)

    return _matrix(lists, relaxed_core, direction)


def _vanishing_exponent(dtype) -> float:
    """L such that exp(−L) is exactly 0 in `dtype`: 1 beyond −log of its smallest
    subnormal."""
    info = np.finfo(tf.as_dtype(dtype).as_numpy_dtype)
    return float(1.0 - np.log(np.float64(info.smallest_subnormal)))


def _soft_sort_reach(tau: float, power: float, dtype) -> float:
    """The distance d at which SoftSort's weight exp(−d^p / τ) is exactly 0 in `dtype`
    (the compute dtype)."""
    with np.errstate(over="ignore"):
        reach = float((np.float64(_vanishing_exponent(dtype)) * tau) ** (1.0 / power))
    return min(reach, float(np.finfo(tf.as_dtype(dtype).as_numpy_dtype).max))


def _neural_sort_reach(tau: float, n, dtype):
    """The distance at which NeuralSort's weights across it are exactly 0, per row of
    half-spread h (`[batch, 1]`): 8·n·h + 2·L·τ (L: `_vanishing_exponent`). In the
    units u = s / M of `_neural_sort_core` (M in [h, 2h]; 1 for h = 0) a stand-in is
    then beyond 4n·h/M + L·τ/M, and the logits of a row's finite entries lie within
    4n·h/M of each other (|u| <= h/M), so the stand-ins' logits trail by at least L·τ/M
    before the factor M/τ."""
    vanish = 2.0 * _vanishing_exponent(dtype) * tau

    def reach(half_spread):
        dtype_ = half_spread.dtype
        count = tf.cast(n, dtype_)
        quarter = 0.25 * float(dtype_.max)  # as `centred_with_stand_ins` caps the stand-ins
        return tf.minimum(8.0 * count * half_spread + tf.constant(min(vanish, quarter), dtype_),
                          tf.constant(quarter, dtype_))

    return reach


def _in_xla_context() -> bool:
    """Whether the op is traced for XLA (`jit_compile=True`; False if TF cannot tell)."""
    try:
        from tensorflow.python.ops import control_flow_util
        return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except (ImportError, AttributeError):  # pragma: no cover - private API moved
        return False


def _soft_sort_rows(top, s, power: float, tau: float, valid=None, log: bool = False):
    """P̂[b, i, j] = softmax_j(−|top[b, i] − s[b, j]|^p / τ) for `[batch, n]` `top`, `s`
    (with `valid`: over the valid columns, rows i >= n_valid 0). Differences are taken
    before any scaling; the hand-written gradient reads the sign of d from an exact
    comparison, so the zero diagonal differences cancel."""
    xla = _in_xla_context()
    info = np.finfo(s.dtype.as_numpy_dtype)
    scale = tau ** (-1.0 / power)
    by_scale = bool(float(info.tiny) <= scale <= float(info.max))
    # Factors ∂cost/∂d gain: scale (differences scaled) or 1/τ (cost scaled).
    diff_factor = tf.constant(scale if by_scale else 1.0, s.dtype)
    cost_factor = tf.constant(1.0 if by_scale else 1.0 / tau, s.dtype)

    @tf.custom_gradient
    def rows(top, s):
        t, u = top[:, :, None], s[:, None, :]
        d = (t - u) * diff_factor if by_scale and scale != 1.0 else t - u
        if power == 2.0:
            cost = tf.square(d)
        elif power == 1.0:
            cost = tf.abs(d)
        else:
            cost = pair_cost(d, tf.zeros([], d.dtype), power)
        if not by_scale:
            cost = cost * cost_factor
        if log:
            log_perm = _masked_log_softmax(-cost, valid)
            perm = tf.exp(log_perm)
        elif valid is not None:
            # Valid row i contains s_[i] among the valid columns: its largest logit is 0.
            perm = _masked_normalise(tf.exp(-cost), valid)
        elif xla:
            # Row i contains s_[i] itself (`top` holds copies of the entries of `s`), so
            # its largest logit is 0: exp needs no max-shift (no overflow, and the row
            # sum is >= 1). XLA fuses this into fewer passes than a softmax.
            weights = tf.exp(-cost)
            perm = weights / tf.reduce_sum(weights, axis=-1, keepdims=True)
        else:
            perm = tf.nn.softmax(-cost, axis=-1)

        def grad(upstream):
            if log:
                # ∂L/∂logits of a row-wise log-softmax (upstream 0 where log P̂ = −inf).
                upstream = tf.where(perm > 0, upstream, tf.zeros_like(upstream))
                h = upstream - perm * tf.reduce_sum(upstream, axis=-1, keepdims=True)
            else:
                # ∂L/∂logits of a row-wise softmax; its rows sum to 0.
                h = perm * (upstream - tf.reduce_sum(upstream * perm, axis=-1, keepdims=True))
            factor = diff_factor * cost_factor
            if power == 1.0:
                # logits = −|d|, d = t_i − s_j: ∂L/∂d = −σ h with σ = sign(d) read as
                # 1 − 2·[t_i < s_j] (+1 on ties), so Σ_j σ h = −2 Σ_j [t_i < s_j] h.
                h = h * factor
                below = tf.where(t < u, h, tf.zeros([], h.dtype))
                return (2.0 * tf.reduce_sum(below, axis=-1),
                        tf.reduce_sum(h, axis=-2) - 2.0 * tf.reduce_sum(below, axis=-2))
            if power == 2.0:
                slope = 2.0 * d * factor
            else:
                a = tf.abs(d)
                valid = tf.logical_and(a > 0, tf.not_equal(t, u))
                safe = tf.where(valid, a, tf.ones_like(a))
                slope = tf.where(valid, power * tf.pow(safe, power - 1.0) * tf.sign(d),
                                 tf.zeros_like(a)) * factor
            # ∂L/∂d = ∂L/∂logits · (−∂cost/∂d); a weight of exactly 0 (an overflowed
            # logit, whose slope may be inf) contributes 0, not NaN.
            d_grad = -tf.math.multiply_no_nan(slope, h)
            return tf.reduce_sum(d_grad, axis=-1), -tf.reduce_sum(d_grad, axis=-2)

        return (log_perm if log else perm), grad

    return rows(top, s)


def _soft_sort_core(s, tau: float, power: float, valid=None, log: bool = False):
    """SoftSort on `[batch, n]` scores, DESCENDING: softmax_j(−|s_[i] − s_j|^p / τ);
    with `valid`, over the valid entries alone (see `_soft_sort_rows`)."""
    top = (tf.sort(s, axis=-1, direction="DESCENDING") if valid is None
           else tf.gather(s, _descending_order(tf.stop_gradient(s), valid), batch_dims=1))
    return _soft_sort_rows(top, s, power, tau, valid, log=log)


@list_operator
def softsort_permutation_matrix(scores, tau: float = DEFAULT_TAU,
                     distance_power: float = DEFAULT_DISTANCE_POWER,
                     direction: str = "DESCENDING", hard: bool = False, *, mask=None,
                     log: bool = False):
    """SoftSort relaxed permutation matrix (Prillo & Eisenschlos, 2020, eq. 4).

    P̂[i, :] = softmax(−|s_[i] − s|^p / τ), s_[i] the i-th score in `direction` order.
    O(n log n) for the sort plus O(n²) time and memory.

    Args:
      scores: `[..., n]` real tensor (or ragged `[batch, (n)]`: ragged output).
      tau: temperature τ > 0 (default 1.0), in the units of the scores: rows are
        nearly one-hot when neighbouring sorted scores differ by much more than τ^{1/p}.
      distance_power: exponent p > 0 of the distance |s_[i] − s_j|^p (default 1; 2 is
        the squared distance).
      direction: 'DESCENDING' (default, the papers' convention) or 'ASCENDING'.
      hard: straight-through: the exact permutation matrix forward, the gradient of
        the relaxation backward.
      mask: optional boolean `[..., n]` (or `[n]`), True = valid entry (see the module
        docstring).
      log: return log P̂, computed as a log-softmax (−inf where P̂ is 0 by padding), for
        `permutation_cross_entropy(..., from_log=True)`. Excludes `hard`.

    Returns:
      P̂ `[..., n, n]` in the dtype of `scores`: rows sum to 1 (rows of padding: 0).
      A ±inf score is the limit of a score growing without bound: the infinities of
      one sign share their end rows evenly, the finite entries' rows are P̂ of the
      finite entries alone (`centred_with_stand_ins`); a NaN makes its list NaN.

    Example:
    >>> P = softsort_permutation_matrix([[1.0, 3.0, 2.0]], tau=0.1)
    >>> np.round(P.numpy()[0], 3)
    array([[0., 1., 0.],
           [0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    """
    tau = _checks.check_positive("tau", tau)
    power = _checks.check_positive("distance_power", distance_power)
    return _relaxed(scores, lambda s, valid, _: _soft_sort_core(s, tau, power, valid, log),
                    direction, hard, log, reach=_soft_sort_reach(tau, power, scores.dtype))


def _abs_row_sums(s, weights):
    """(A_s·w)_j = Σ_k w_k |s_j − s_k| for `[batch, n]` scores and 0/1 `weights` (the
    entries summed over), in O(n²) time and memory. The gradient, g_m Σ_k w_k σ_mk +
    w_m Σ_j σ_mj g_j with σ_jk = sign(s_j − s_k), takes σ from exact comparisons (as
    `_soft_sort_rows`); `weights` get no gradient."""

    @tf.custom_gradient
    def row_sums(s):
        a_sum = tf.linalg.matvec(tf.abs(s[:, :, None] - s[:, None, :]), weights)

        def grad(upstream):
            greater = tf.cast(s[:, :, None] > s[:, None, :], s.dtype)  # σ = greater − greaterᵀ
            spread = (tf.linalg.matvec(greater, upstream)
                      - tf.linalg.matvec(greater, upstream, transpose_a=True))
            sign_sums = (tf.linalg.matvec(greater, weights)
                         - tf.linalg.matvec(greater, weights, transpose_a=True))
            return upstream * sign_sums + weights * spread

        return a_sum, grad

    return row_sums(s)


def _neural_sort_core(s, tau: float, valid, log: bool, finite):
    """NeuralSort on `[batch, n]` scores, DESCENDING, in O(n²) time and memory: the logits
    of s / M (M the power of two at or above max |s| of the `finite` entries), shifted
    to a maximum of 0, times M / τ capped at the largest float (huge scores or a tiny τ
    give a one-hot row, not NaN). With `valid` (or None): over the valid entries, rows
    i >= n_valid 0. `finite` (bool `[batch, n]`; the others are stand-ins of ±inf far
    beyond, `centred_with_stand_ins`): A_s·1 sums over the finite entries and the coefficient of
    row i is that of row i − n₊ of the finite list alone (n₊ the +inf stand-ins), so the
    finite entries' rows are those of the finite list, the stand-ins' weights 0 (their
    logits trail by far more than the finite entries' spread)."""
    n = tf.shape(s)[-1]
    dtype = s.dtype
    info = np.finfo(dtype.as_numpy_dtype)
    magnitude = tf.where(finite, tf.abs(s), tf.zeros([], dtype))
    largest = tf.stop_gradient(tf.reduce_max(magnitude, axis=-1, keepdims=True))
    positive = tf.logical_and(largest > 0, tf.math.is_finite(largest))
    top_exponent = float(info.maxexp - 1)  # 2^top_exponent is the largest power of two
    exponent = tf.math.ceil(tf.math.log(tf.where(positive, largest, tf.ones_like(largest)))
                            / np.log(2.0))
    exponent = tf.minimum(exponent, top_exponent)
    scale = tf.where(positive, tf.pow(tf.constant(2.0, dtype), exponent), tf.ones_like(largest))
    # The logarithm may round below an exact power of two.
    scale = tf.where(tf.logical_and(scale < largest, exponent < top_exponent), 2.0 * scale,
                     scale)
    u = s / scale
    positions = tf.cast(tf.range(1, n + 1), dtype)[None, :]  # i = 1..n
    counted = finite if valid is None else tf.logical_and(valid, finite)
    # Stand-ins stay below the largest float / (16 n): logits and sums stay finite.
    cap = tf.constant(info.max / 16.0, dtype) / tf.cast(n, dtype)
    u = tf.clip_by_value(u, -cap, cap)
    weights = tf.cast(counted, dtype)
    a_sum = _abs_row_sums(u, weights)  # A_s·1 over the finite valid entries, [batch, n]
    # n_fin, plus 2 n₊: the +inf stand-ins come first, n₊ rows earlier.
    ahead = tf.logical_and(tf.logical_not(finite), s > 0)
    if valid is not None:
        ahead = tf.logical_and(ahead, valid)
    length = tf.reduce_sum(weights + 2.0 * tf.cast(ahead, dtype), axis=-1, keepdims=True)
    coeff = length + 1.0 - 2.0 * positions  # n + 1 − 2i
    logits = coeff[:, :, None] * u[:, None, :] - a_sum[:, None, :]
    largest_float = float(info.max)
    inv_tau = tf.constant(min(1.0 / tau, largest_float), dtype)
    factor = tf.minimum(scale * inv_tau, largest_float)  # inf (overflow) → largest float
    if log:
        return _masked_log_softmax(logits * factor[:, :, None], valid)
    if valid is None:
        logits = logits - tf.stop_gradient(tf.reduce_max(logits, axis=-1, keepdims=True))
        return tf.nn.softmax(logits * factor[:, :, None], axis=-1)
    columns = valid[:, None, :]
    lowest = tf.constant(info.min, dtype)
    top = tf.stop_gradient(tf.reduce_max(tf.where(columns, logits, lowest), axis=-1,
                                         keepdims=True))
    # Padded columns get logit 0 (then weight 0), so no overflow reaches a gradient.
    logits = tf.where(columns, logits - top, tf.zeros([], dtype))
    return _masked_normalise(tf.exp(logits * factor[:, :, None]), valid)


@list_operator
def neuralsort_permutation_matrix(scores, tau: float = DEFAULT_TAU, direction: str = "DESCENDING",
                       hard: bool = False, *, mask=None, log: bool = False):
    """NeuralSort relaxed permutation matrix (Grover et al., 2019).

    P̂[i, :] = softmax(((n + 1 − 2i)·s − A_s·1) / τ), i = 1..n, A_s[j, k] = |s_j − s_k|
    (eq. 3 of the SoftSort paper), in O(n²) time and memory ('ASCENDING': on −s).

    Args:
      scores, direction, hard, mask, log: as in `softsort_permutation_matrix`.
      tau: temperature τ > 0 (default 1.0), in the units of the scores: rows are sharp
        when sorted neighbours differ by much more than τ / 2.

    Returns:
      P̂ `[..., n, n]` in the dtype of `scores` (rows of padding: 0). ±inf scores are
      their limits and NaN poisons its list, as in `softsort_permutation_matrix`.

    Example:
    >>> P = neuralsort_permutation_matrix([[1.0, 3.0, 2.0]], tau=0.1)
    >>> np.round(P.numpy()[0], 3)
    array([[0., 1., 0.],
           [0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    """
    tau = _checks.check_positive("tau", tau)
    return _relaxed(scores, lambda s, valid, finite: _neural_sort_core(s, tau, valid, log, finite),
                    direction, hard, log,
                    reach=_neural_sort_reach(tau, scores.n, scores.dtype))


# The families whose operations are read off these matrices (`softsort_tf.ops.family`).
SOFTSORT = Family(
    "softsort", "tau", DEFAULT_TAU,
    "temperature τ of the row softmaxes, in the units of the scores",
    "Prillo & Eisenschlos (2020), eq. 4", matrix_fn=softsort_permutation_matrix, log_domain=True,
    scale_free_temperature=0.1)
NEURALSORT = Family(
    "neuralsort", "tau", DEFAULT_TAU,
    "temperature τ of the row softmaxes, in the units of the scores",
    "Grover et al. (2019)", matrix_fn=neuralsort_permutation_matrix, log_domain=True,
    scale_free_temperature=0.1)

"""Relaxed permutation matrices: SoftSort, NeuralSort and the Sinkhorn plan.

All three operators map scores s ∈ Rⁿ to an n × n matrix P̂ whose row i is a
distribution over the inputs that may occupy position i of the sort, in
`direction` order ('DESCENDING' by default, as in both papers). So

    P̂ @ x          soft-sorts any values x by the scores  (`permute_values`),
    P̂ᵀ @ (1..n)    gives soft ranks of the scores           (`ranks_from_permutation`),

and the row-wise argmax of P̂ is the sorting permutation. The operators:

- SoftSort (Prillo & Eisenschlos, 2020, eq. 4): row i of P̂ is
  softmax_j(−|s_[i] − s_j|^p / τ), where s_[i] is the i-th score in `direction` order.
- NeuralSort (Grover et al., 2019, eq. 3 of the SoftSort paper): row i of P̂ is
  softmax(((n + 1 − 2i)·s − A_s·1) / τ) with A_s[i, j] = |s_i − s_j|. A_s·1 is
  computed as a vector, so time and memory are O(n²) (never the O(n³) product
  A_s·(1·1ᵀ) of the original code, SoftSort paper App. A.4.5).
- Sinkhorn (Cuturi et al., 2019): `softsort_tf.sinkhorn_permutation_matrix`, the
  n × n transport plan scaled to a doubly-stochastic matrix with the same
  orientation. `permutation_matrix(method='sinkhorn', ...)` adds `hard=` and the
  stochastic variant to it.

SoftSort and NeuralSort are unimodal row-stochastic (URS): non-negative, rows sum
to 1, and the row-wise argmax is the argsort; columns do not sum to 1. Both tend to
the exact permutation matrix as τ → 0.

The temperature τ (default 1.0) is in the units of the scores: SoftSort rows are
sharp when neighbouring sorted scores differ by much more than τ (for p = 1),
NeuralSort rows when they differ by much more than τ / 2 — so rescale τ with the
scale of your scores (the SoftSort paper uses τ ∈ [128, 4096] on raw CNN scores,
and τ ≈ 0.03 for scores in [0, 1] with n up to 4000).

Straight-through (`hard=True`): the forward value is the exact permutation matrix
(one-hot rows of `tf.argsort(scores, direction)`, stable), the backward pass uses
the gradient of the relaxed matrix.

Stochastic variants (reparameterised Plackett–Luce, Grover et al. §4.1): the scores
are read as log-scores, perturbed with i.i.d. standard Gumbel noise,
s̃ = s + g, g = −log(−log u), u ~ U(0, 1), and the operator is applied to s̃. Sorting
s̃ exactly draws a permutation from the Plackett–Luce distribution with weights
exp(s); the relaxation makes it differentiable. `num_samples` samples are drawn
along a new axis inserted before the last one, with a stateless counter-based
generator (`stateless_uniform`) seeded by `seed`: an int or an int32/int64 tensor of
shape [2]. The same seed gives bit-identical samples in eager mode and under
`tf.function`; with XLA, float32 samples are bit-identical too except about one in
10⁷ (one ulp off), float64 samples agree to ~2e-15 (XLA's logarithm differs from the
CPU kernel's in the last bits, see `sampling.gumbel_noise`). Pass a different seed per
step (e.g. from a `keras.random.SeedGenerator`, as the layers do) to draw fresh noise.

Shapes: scores `[..., n]` (any number of leading batch dims, sorted along the last
axis); P̂ `[..., n, n]`; stochastic P̂ `[..., num_samples, n, n]`. float16/bfloat16
scores are computed in float32 and the result is returned in the input dtype. n and
the batch may be unknown when tracing (`tf.function` with `None` dimensions, Keras
`Input((None,))`); every operator here compiles with XLA (`jit_compile=True`) for an
unknown n, except on `tf.RaggedTensor` inputs (XLA has no kernel for the ragged ↔ dense
conversion: under XLA pass the padded tensor and its `mask`).

Padding (`mask=`, ragged inputs; see softsort_tf._masking): the valid entries are
sorted alone. Padded scores (any value, NaN and ±inf included) are replaced before any
arithmetic; SoftSort's row i < n_valid is a softmax over the valid columns only and
NeuralSort's uses n_valid + 1 − 2i and A_s·1 summed over the valid entries, so the
valid block (rows 0..n_valid − 1, valid columns) is exactly P̂ of the unpadded list;
rows of sorted positions >= n_valid and columns of padded entries are 0, and padded
scores get exactly zero gradient. A list without valid entries gives P̂ = 0.
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



# ---------------------------------------------------------------------------------
# Shared plumbing.
# ---------------------------------------------------------------------------------
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


def _descending_scores(s2d, direction: str):
    """Scores whose DESCENDING order is the `direction` order of `s2d`."""
    return -s2d if direction == "ASCENDING" else s2d


def _descending_order(d, valid=None):
    """Stable DESCENDING argsort of `[batch, n]` scores `d`; with a `[batch, n]` boolean
    `valid`, the valid entries come first (in their order) and the padded ones last.

    A second stable sort on validity (not a fill value such as −inf) places the
    padding, so a valid entry equal to any fill value still sorts among the valid ones.
    """
    order = tf.argsort(d, axis=-1, direction="DESCENDING", stable=True)
    if valid is None:
        return order
    padded_sorted = tf.cast(tf.logical_not(tf.gather(valid, order, batch_dims=1)), tf.int32)
    return tf.gather(order, tf.argsort(padded_sorted, axis=-1, stable=True), batch_dims=1)


def _exact_permutation_2d(d, valid=None):
    """`[batch, n, n]` one-hot rows of `_descending_order(d, valid)`; with `valid`, the
    rows of sorted positions >= n_valid are 0 (so the columns of padded entries are 0)."""
    order = _descending_order(d, valid)
    perm = tf.one_hot(order, tf.shape(d)[-1], dtype=d.dtype)
    if valid is None:
        return perm
    return tf.where(_sorted_positions_valid(valid)[:, :, None], perm, tf.zeros([], d.dtype))


def _sorted_positions_valid(valid):
    """`[batch, n]` boolean: position i of the sort holds a valid entry (i < n_valid)."""
    return _masking.valid_prefix(_masking.n_valid(valid), tf.shape(valid)[-1])


def _masked_normalise(weights, valid):
    """Row-normalised `weights` `[batch, n, n]` over the valid columns; rows of sorted
    positions >= n_valid and columns of padded entries are 0 (no division by 0)."""
    # Three passes over [batch, n, n] (column factor, row sums, row factor): the row
    # masking and the normalisation share one [batch, n, 1] factor. `weights` are
    # finite (padded scores were replaced), so the factor 0 of a padded column is exact.
    weights = weights * tf.cast(valid, weights.dtype)[:, None, :]
    sums = tf.reduce_sum(weights, axis=-1, keepdims=True)
    keep = tf.logical_and(_sorted_positions_valid(valid)[:, :, None], sums > 0)
    factor = tf.where(keep, 1.0 / tf.where(keep, sums, tf.ones_like(sums)),
                      tf.zeros_like(sums))
    return weights * factor


def straight_through(hard, soft):
    """Straight-through estimator: the value of `hard`, the gradient of `soft`.

    Computed as `hard + (soft − stop_gradient(soft))`: the bracket is exactly zero,
    so the forward value is bit-for-bit `hard` (an exact permutation matrix stays
    exact), and the gradient w.r.t. `soft` is the identity.

    Args:
      hard: the forward value, e.g. `hard_permutation_matrix(scores)` `[..., n, n]`
        (ragged `[lists, (n), (n)]` for ragged scores).
      soft: a differentiable tensor of the same shape, e.g. a relaxed P̂ (ragged with
        the row lengths of `hard` when `hard` is ragged).

    Returns:
      A tensor equal to `hard` whose gradient flows into `soft` (ragged for ragged
      inputs).

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
    """A relaxed-matrix function `matrix_fn(scores, *, direction, mask, **kwargs)` with
    the straight-through option `hard=` added (ragged inputs included): the matrix
    function of a family whose own operator has none."""

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

    Row i is the one-hot vector of the index of the i-th score in `direction` order
    (a stable sort: ties keep their input order), so `P @ scores` is
    `tf.sort(scores, direction=direction)`.

    Args:
      scores: `[..., n]` real tensor, or a `tf.RaggedTensor` `[batch, (n)]`.
      direction: 'DESCENDING' (default) or 'ASCENDING'.
      mask: optional boolean `[..., n]` (or `[n]`), True = valid entry: the valid
        entries are sorted alone, rows of sorted positions >= n_valid and columns of
        padded entries are 0. See softsort_tf._masking.

    Returns:
      `[..., n, n]` 0/1 matrix in the dtype of `scores` (float32 for integers, float64
      for 64-bit integers); ragged `[batch, (n), (n)]` for a ragged input.

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
    """Applies `core(d, valid)` to the scores `d` whose DESCENDING order is the
    `direction` order of the lists (padded entries already replaced) and returns the
    `[batch, n, n]` matrices."""
    d = _descending_scores(lists.values, direction)
    return ListResult(core(d, lists.mask), "square")


def centred_finite_rows(values):
    """`(values − c, bad)` for `[batch, n]` rows: c a per-row reference (the midrange,
    no gradient), so that a relaxation whose result depends on differences only is
    computed on numbers of the size of the differences (not of the scores' offset);
    `bad` `[batch]` marks the rows with a non-finite entry, whose values are set to 0
    (their results are NaN, `poison_rows`: the package's rule for non-finite scores)."""
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


def _relaxed(lists: Lists, core, direction: str, hard: bool, log: bool = False) -> ListResult:
    """`_matrix` of a relaxation `core(d, valid)` (DESCENDING `[batch, n]` → `[batch, n,
    n]`), with the straight-through option; computed on the scores minus a per-list
    reference, NaN for a list with a non-finite score (`centred_finite_rows`)."""
    direction = _checks.check_direction(direction)
    hard = check_hard(hard)
    check_log(log, hard)

    def relaxed_core(d, valid):
        d, bad = centred_finite_rows(d)
        perm = core(d, valid)
        if hard:
            perm = straight_through(_exact_permutation_2d(tf.stop_gradient(d), valid), perm)
        return poison_rows(perm, bad)

    return _matrix(lists, relaxed_core, direction)


# ---------------------------------------------------------------------------------
# The deterministic operators.
# ---------------------------------------------------------------------------------
def _in_xla_context() -> bool:
    """Whether the op is being traced for XLA (`jit_compile=True`), to pick the faster
    of two equivalent formulations; False if TensorFlow cannot tell."""
    try:
        from tensorflow.python.ops import control_flow_util
        return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except (ImportError, AttributeError):  # pragma: no cover - private API moved
        return False


def _soft_sort_rows(top, s, power: float, tau: float, valid=None, log: bool = False):
    """P̂[b, i, j] = softmax_j(−|top[b, i] − s[b, j]|^p / τ) for `[batch, n]` `top`, `s`.

    The differences are taken before any scaling, so scores near the float range or
    a tiny τ give logits of −inf (weight 0) instead of inf − inf = NaN; the diagonal
    pair (difference 0) keeps logit 0. The 1/τ factor is applied as a scale of the
    differences, τ^(−1/p), when that is a normal number of the dtype (so |d|^p / τ
    stays finite where |d|^p alone would overflow), and to the cost otherwise (e.g.
    p = 0.1, τ = 1e-4: τ^(−10) overflows float32).

    The gradient is written by hand. Autodiff would take the sign of
    top_i − s_j from a recomputed difference; under XLA the diagonal entry
    (top_i and s_j the same score, difference exactly 0 in the forward pass) can be
    recomputed with a fused multiply-add upstream as ±1 ulp, with opposite signs in
    the two reductions, which corrupts the gradient. Here the sign comes from an exact
    comparison, and the diagonal pairs, whose difference is identically zero, get
    the same sign (or slope 0) on both paths so that they cancel.

    With a `[batch, n]` boolean `valid` (padded entries of `s` already finite), the
    softmax runs over the valid columns only and the rows i >= n_valid are 0
    (`_masked_normalise`); `top` must then hold the valid sorted scores first.
    """
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
            # log P̂ = −cost − logsumexp(−cost) over the valid columns; −inf elsewhere.
            logits = -cost
            if valid is not None:
                logits = tf.where(valid[:, None, :], logits, tf.constant(-np.inf, s.dtype))
            log_perm = tf.nn.log_softmax(logits, axis=-1)
            if valid is not None:
                rows_valid = _sorted_positions_valid(valid)[:, :, None]
                log_perm = tf.where(rows_valid, log_perm, tf.constant(-np.inf, s.dtype))
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
    if valid is None:
        return _soft_sort_rows(tf.sort(s, axis=-1, direction="DESCENDING"), s, power, tau,
                               log=log)
    top = tf.gather(s, _descending_order(tf.stop_gradient(s), valid), batch_dims=1)
    return _soft_sort_rows(top, s, power, tau, valid, log=log)


@list_operator
def softsort_permutation_matrix(scores, tau: float = DEFAULT_TAU,
                     distance_power: float = DEFAULT_DISTANCE_POWER,
                     direction: str = "DESCENDING", hard: bool = False, *, mask=None,
                     log: bool = False):
    """SoftSort relaxed permutation matrix (Prillo & Eisenschlos, 2020, eq. 4).

    P̂[i, :] = softmax(−|s_[i] − s|^p / τ), with s_[i] the i-th score in `direction`
    order: row i is a softmax over the inputs of their distance to the i-th sorted
    score. Cost O(n log n) for the sort plus O(n²) time and memory for P̂.

    Args:
      scores: `[..., n]` real tensor; sorted along the last axis.
      tau: temperature τ > 0 (default 1.0), in the units of the scores: rows are
        nearly one-hot when neighbouring sorted scores differ by much more than
        τ^{1/p}. As τ → 0, P̂ tends to the exact permutation matrix.
      distance_power: exponent p > 0 of the distance |s_[i] − s_j|^p (default 1, the
        absolute value preferred in the paper; p = 2 is the squared distance). Named
        apart from the Sinkhorn cost exponent `power` of `SinkhornOptions`.
      direction: 'DESCENDING' (default, the papers' convention) or 'ASCENDING'.
      hard: straight-through: return the exact permutation matrix in the forward
        pass and use the gradient of the relaxation in the backward pass.
      mask: optional boolean `[..., n]` (or `[n]`), True = valid entry: row i < n_valid
        is the softmax over the valid entries alone, rows i >= n_valid and the columns
        of padded entries are 0, so the valid block is P̂ of the unpadded list; padded
        scores (NaN and ±inf included) get zero gradient. A `tf.RaggedTensor`
        `[batch, (n)]` input gives a ragged `[batch, (n), (n)]` output. See
        softsort_tf._masking.
      log: return log P̂, computed in the log domain (a log-softmax: entries far below
        the smallest float stay finite; −inf where P̂ is 0 by padding), for
        `permutation_cross_entropy(..., from_log=True)`. Excludes `hard`.

    Returns:
      P̂ `[..., n, n]` in the dtype of `scores`: non-negative, rows sum to 1 (rows of
      padding: 0), and `P̂ @ x` soft-sorts x. Works with an unknown n (under
      `tf.function` and XLA).

    Example:
    >>> P = softsort_permutation_matrix([[1.0, 3.0, 2.0]], tau=0.1)
    >>> np.round(P.numpy()[0], 3)
    array([[0., 1., 0.],
           [0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    """
    tau = _checks.check_positive("tau", tau)
    power = _checks.check_positive("distance_power", distance_power)
    return _relaxed(scores, lambda s, valid: _soft_sort_core(s, tau, power, valid, log),
                    direction, hard, log)


def _abs_row_sums(s, weights=None):
    """(A_s·w)_j = Σ_k w_k |s_j − s_k| for `[batch, n]` scores (w = 1 by default; 0/1
    weights sum over the valid entries), in O(n²) time and memory.

    The gradient, ∂/∂s_m = g_m Σ_k w_k σ_mk + w_m Σ_j σ_mj g_j with
    σ_jk = sign(s_j − s_k), takes σ from exact comparisons (see `_soft_sort_rows` for
    why not autodiff), and needs two matrix-vector products, O(n²). `weights` get no
    gradient.
    """

    @tf.custom_gradient
    def row_sums(s):
        dist = tf.abs(s[:, :, None] - s[:, None, :])
        if weights is not None:
            dist = dist * weights[:, None, :]
        a_sum = tf.reduce_sum(dist, axis=-1)

        def grad(upstream):
            greater = tf.cast(s[:, :, None] > s[:, None, :], s.dtype)  # σ = greater − greaterᵀ
            spread = (tf.linalg.matvec(greater, upstream)
                      - tf.linalg.matvec(greater, upstream, transpose_a=True))
            if weights is None:
                sign_sums = tf.reduce_sum(greater, axis=-1) - tf.reduce_sum(greater, axis=-2)
                return upstream * sign_sums + spread
            sign_sums = (tf.linalg.matvec(greater, weights)
                         - tf.linalg.matvec(greater, weights, transpose_a=True))
            return upstream * sign_sums + weights * spread

        return a_sum, grad

    return row_sums(s)


def _neural_sort_core(s, tau: float, valid=None, log: bool = False):
    """NeuralSort on `[batch, n]` scores, DESCENDING, in O(n²) time and memory.

    The logits are linear in s: they are computed for s / M, with M the power of two
    at or above max |s| of the row (an exact scaling), so they are bounded by 2n, and
    then shifted to a maximum of 0 and multiplied by M / τ, capped at the largest float.
    Scores near the float range or a tiny τ thus give a one-hot row instead of
    inf − inf = NaN.

    With a `[batch, n]` boolean `valid` (padded entries of `s` already replaced by a
    valid score), row i = 1..n_valid is the softmax over the valid entries of
    (n_valid + 1 − 2i)·s − A_s·w, with A_s·w summed over the valid entries (w = 0/1):
    exactly the matrix of the valid list alone; rows i > n_valid are 0.
    """
    n = tf.shape(s)[-1]
    dtype = s.dtype
    info = np.finfo(dtype.as_numpy_dtype)
    largest = tf.stop_gradient(tf.reduce_max(tf.abs(s), axis=-1, keepdims=True))
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
    if valid is None:
        a_sum = _abs_row_sums(u)  # A_s·1 as a [batch, n] vector
        length = tf.cast(n, dtype)
    else:
        weights = tf.cast(valid, dtype)
        a_sum = _abs_row_sums(u, weights)
        length = tf.reduce_sum(weights, axis=-1, keepdims=True)  # n_valid per row
    coeff = length + 1.0 - 2.0 * positions  # n + 1 − 2i
    logits = coeff[:, :, None] * u[:, None, :] - a_sum[:, None, :]
    largest_float = float(info.max)
    inv_tau = tf.constant(min(1.0 / tau, largest_float), dtype)
    factor = tf.minimum(scale * inv_tau, largest_float)  # inf (overflow) → largest float
    if log:
        scaled = logits * factor[:, :, None]
        if valid is None:
            return tf.nn.log_softmax(scaled, axis=-1)
        minus_inf = tf.constant(-np.inf, dtype)
        log_perm = tf.nn.log_softmax(tf.where(valid[:, None, :], scaled, minus_inf), axis=-1)
        return tf.where(_sorted_positions_valid(valid)[:, :, None], log_perm, minus_inf)
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

    P̂[i, :] = softmax(((n + 1 − 2i)·s − A_s·1) / τ), i = 1..n, with
    A_s[j, k] = |s_j − s_k| (eq. 3 of the SoftSort paper). A_s·1 is a vector, so the
    cost is O(n²) time and memory; no n × n × n tensor is ever built. 'ASCENDING'
    applies the formula to −s.

    Args:
      scores: `[..., n]` real tensor; sorted along the last axis.
      tau: temperature τ > 0 (default 1.0), in the units of the scores: entry
        (i, j) of the logits changes by 2(s_[i] − s_j)/τ between neighbouring rows,
        so rows are sharp when sorted neighbours differ by much more than τ / 2.
        As τ → 0, P̂ tends to the exact permutation matrix.
      direction: 'DESCENDING' (default, the papers' convention) or 'ASCENDING'.
      hard: straight-through (see `softsort_permutation_matrix`).
      log: return log P̂, computed in the log domain (see `softsort_permutation_matrix`).
      mask: optional boolean `[..., n]` (or `[n]`), True = valid entry: row
        i = 1..n_valid is softmax(((n_valid + 1 − 2i)·s − A_s·w) / τ) over the valid
        entries, A_s·w summing over the valid entries only, so the valid block is P̂
        of the unpadded list; rows i > n_valid and the columns of padded entries are
        0. Ragged input: ragged output. See softsort_tf._masking.

    Returns:
      P̂ `[..., n, n]` in the dtype of `scores`, unimodal row-stochastic (rows of
      padding: 0). Works with an unknown n (under `tf.function` and XLA).

    Example:
    >>> P = neuralsort_permutation_matrix([[1.0, 3.0, 2.0]], tau=0.1)
    >>> np.round(P.numpy()[0], 3)
    array([[0., 1., 0.],
           [0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    """
    tau = _checks.check_positive("tau", tau)
    return _relaxed(scores, lambda s, valid: _neural_sort_core(s, tau, valid, log), direction,
                    hard, log)


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

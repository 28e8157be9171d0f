"""The batched, log-domain Sinkhorn solver behind every Sinkhorn operator.

One transport problem serves all operators (Cuturi, Teboul & Vert, 2019): the inputs
x ∈ R^{B×n} with weights a are transported onto sorted targets y ∈ R^m with weights
b, for the cost C_ij = |x_i − y_j|^p and entropic regularisation ε:

    P* = argmin_{P 1 = a, Pᵀ 1 = b} <P, C> − ε H(P).

The solution has the form P_ij = exp((f_i + g_j − C_ij) / ε) for dual potentials
f, g, found by the stabilised log-domain updates of the paper's eq. (3):

    f_i ← ε log a_i − ε logsumexp_j((g_j − C_ij) / ε)
    g_j ← ε log b_j − ε logsumexp_i((f_i − C_ij) / ε)

Speed-ups, each switchable and measured in `scripts/bench_sinkhorn.py`:

- warm start: g is initialised with the dual potential of the *exact* (ε = 0) 1-D
  problem, computed from a sort in O(n log n + nm) (complementary slackness along the
  north-west-corner staircase of Proposition 1 gives g_{j+1} − g_j = c(x*, y_{j+1}) −
  c(x*, y_j), where x* is the input straddling the boundary between target bins j
  and j + 1);
- ε annealing (`epsilon_start`, `epsilon_decay`): ε_t = max(ε, ε_start · decay^t);
- the marginal error is read every `check_every` iterations, for free, from the
  potential update that the next iteration needs anyway.

Rows of the batch stop independently: once a row's L1 marginal error is below
`threshold` its potentials are frozen, so its result does not depend on the rest of
the batch and does not drift. A row whose error is NaN/Inf also stops (it can never
converge), so NaN inputs propagate NaN instead of running to `max_iterations`.

Gradients (w.r.t. the cost, hence x, and the weights a and b):

- `implicit=True` (default): implicit differentiation of the optimality conditions
  H(f, g) = (P1 − a, Pᵀ1 − b) = 0. The Jacobian ∂H/∂(f, g) = (1/ε)[[diag r, P],
  [Pᵀ, diag c]] is singular along the gauge direction (1, −1) (f + t, g − t gives the
  same plan). We eliminate f (Schur complement) and solve the m×m system
  (I − MᵀM + qqᵀ) ŵ = r̂ with M = D_r^{-1/2} P D_c^{-1/2} and q = √c: the rank-one
  term qqᵀ removes the null space (the right-hand side is orthogonal to q), so the
  system is symmetric positive definite with eigenvalues in (0, 1]. It is solved
  matrix-free by conjugate gradients, each step O(n·m), or densely by Cholesky for
  small m. Memory is O(B·n·m) whatever the number of forward iterations.
- `implicit=False`: automatic differentiation through the unrolled loop; memory grows
  with the number of iterations.
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from softsort_tf import _checks

IMPLICIT_SOLVERS = ("auto", "cg", "dense")
# Below this number of targets the dense Cholesky solve is faster than CG.
DENSE_SOLVE_MAX_TARGETS = 64


@dataclasses.dataclass
class SinkhornResult:
    """Solution of a batch of transport problems.

    Attributes:
      f: `[batch, n]` dual potential of the inputs.
      g: `[batch, m]` dual potential of the targets.
      cost: `[batch, n, m]` cost matrix.
      epsilon: the regularisation ε.
      num_iterations: `[batch]` int32, Sinkhorn iterations each row used.
      error: `[batch]` L1 error of the row marginal, Σ_i |(P1)_i − a_i|; the column
        marginal is exact.
    """

    f: tf.Tensor
    g: tf.Tensor
    cost: tf.Tensor
    epsilon: float
    num_iterations: tf.Tensor
    error: tf.Tensor

    def log_plan(self):
        """`[batch, n, m]` log of the transport plan."""
        return (self.f[:, :, None] + self.g[:, None, :] - self.cost) / self.epsilon

    def plan(self):
        """`[batch, n, m]` transport plan P, with P1 ≈ a and Pᵀ1 = b."""
        return tf.exp(self.log_plan())


def cost_matrix(x, y, power: float = 2.0):
    """C_ij = |x_i − y_j|^power for x `[batch, n]`, y `[batch, m]`."""
    return pair_cost(x[:, :, None], y[:, None, :], power)


def pair_cost(u, v, power: float = 2.0):
    """|u − v|^power elementwise (broadcasting), with finite gradients at u = v."""
    d = tf.abs(u - v)
    if power == 2.0:
        return tf.square(d)
    if power == 1.0:
        return d
    positive = d > 0
    safe = tf.where(positive, d, tf.ones_like(d))
    return tf.where(positive, tf.pow(safe, power), tf.zeros_like(d))


def exact_target_potential(x, a, y, b, power: float):
    """Dual potential g `[batch, m]` of the unregularised 1-D problem (warm start).

    Sorting x gives the optimal plan (north-west corner rule, Prop. 1 of the paper);
    along its staircase, complementary slackness f_i + g_j = C_ij on the support
    makes g_{j+1} − g_j = c(x*_j, y_{j+1}) − c(x*_j, y_j) with x*_j the input that
    straddles the cumulative-mass boundary B_j = b_1 + … + b_j. When the boundary
    falls exactly between two inputs any value between theirs is optimal; we take
    their midpoint.
    """
    m = y.shape[-1]
    if m == 1:
        return tf.zeros_like(y)
    order = tf.argsort(x, axis=-1, stable=True)
    xs = tf.gather(x, order, batch_dims=1)
    cum_a = tf.cumsum(tf.gather(a, order, batch_dims=1), axis=-1)  # [B, n]
    bounds = tf.cumsum(b, axis=-1)[:, :-1]  # [B, m - 1]
    tol = tf.cast(1e-6, x.dtype) if x.dtype == tf.float32 else tf.cast(1e-12, x.dtype)
    n = x.shape[-1]

    def first_reaching(level):  # index of the first i with cum_a[i] >= level
        below = tf.cast(cum_a[:, None, :] < level[:, :, None], tf.int32)
        return tf.minimum(tf.reduce_sum(below, axis=-1), n - 1)

    k_lo = first_reaching(bounds - tol)
    k_hi = first_reaching(bounds + tol)
    x_star = 0.5 * (tf.gather(xs, k_lo, batch_dims=1) + tf.gather(xs, k_hi, batch_dims=1))
    increments = pair_cost(x_star, y[:, 1:], power) - pair_cost(x_star, y[:, :-1], power)
    g = tf.concat([tf.zeros_like(increments[:, :1]), tf.cumsum(increments, axis=-1)], axis=-1)
    return g - tf.reduce_mean(g, axis=-1, keepdims=True)


def _f_update(cost, g, log_a, eps):
    return eps * log_a - eps * tf.reduce_logsumexp((g[:, None, :] - cost) / eps, axis=2)


def _g_update(cost, f, log_b, eps):
    return eps * log_b - eps * tf.reduce_logsumexp((f[:, :, None] - cost) / eps, axis=1)


def _run_loop(cost, log_a, log_b, g_init, *, epsilon, epsilon_start, epsilon_decay, threshold,
              max_iterations, check_every):
    """Runs the Sinkhorn loop. Returns (f, g, num_iterations, error)."""
    dtype = cost.dtype
    a = tf.exp(log_a)
    batch = tf.shape(cost)[0]
    eps_final = tf.constant(epsilon, dtype)
    num_blocks = -(-max_iterations // check_every)

    def eps_at(it):
        if epsilon_start is None or epsilon_start <= epsilon:
            return eps_final
        e = tf.constant(epsilon_start, dtype) * tf.pow(tf.constant(epsilon_decay, dtype),
                                                       tf.cast(it, dtype))
        return tf.maximum(eps_final, e)

    def annealed_until(it):
        if epsilon_start is None or epsilon_start <= epsilon:
            return tf.constant(True)
        return eps_at(it) <= eps_final

    f_next0 = _f_update(cost, g_init, log_a, eps_at(0))

    def cond(it, f, g, f_next, n_it, err, done):
        del f, g, f_next, n_it, err
        return tf.logical_not(tf.reduce_all(done))

    def body(it, f, g, f_next, n_it, err, done):
        f_c = f_next
        g_c = g
        for k in range(check_every):
            eps_k = eps_at(it + k)
            if k > 0:
                f_c = _f_update(cost, g_c, log_a, eps_k)
            g_c = _g_update(cost, f_c, log_b, eps_k)
        it_new = it + check_every
        eps_n = eps_at(it_new)
        f_next_c = _f_update(cost, g_c, log_a, eps_n)
        # Row sums of the plan (f_c, g_c) are a_i exp((f_c − f_next_c)/ε).
        err_c = tf.reduce_sum(a * tf.abs(tf.math.expm1((f_c - f_next_c) / eps_n)), axis=-1)
        at_target = annealed_until(it + check_every - 1)
        newly = tf.logical_and(at_target,
                               tf.logical_or(err_c < threshold,
                                             tf.logical_not(tf.math.is_finite(err_c))))
        keep = done[:, None]
        f = tf.where(keep, f, f_c)
        g = tf.where(keep, g, g_c)
        f_next = tf.where(keep, f_next, f_next_c)
        n_it = tf.where(done, n_it, tf.fill(tf.shape(n_it), it_new))
        err = tf.where(done, err, err_c)
        done = tf.logical_or(done, newly)
        return it_new, f, g, f_next, n_it, err, done

    init = (
        tf.constant(0, tf.int32),
        f_next0,
        g_init,
        f_next0,
        tf.zeros([batch], tf.int32),
        tf.fill([batch], tf.constant(math.inf, dtype)),
        tf.zeros([batch], tf.bool),
    )
    _, f, g, _, n_it, err, _ = tf.while_loop(cond, body, init, maximum_iterations=num_blocks)
    return f, g, n_it, err


def _conjugate_gradient(apply_op, rhs, max_iterations: int, tol: float):
    """Batched CG for SPD systems `apply_op(x) = rhs`, rows stop independently."""
    dtype = rhs.dtype
    rhs_norm = tf.norm(rhs, axis=-1)
    target = tol * rhs_norm
    tiny = tf.constant(1e-30 if dtype == tf.float32 else 1e-300, dtype)

    def cond(i, x, r, p, rs):
        del i, x, r, p
        return tf.reduce_any(tf.sqrt(rs) > target)

    def body(i, x, r, p, rs):
        active = tf.sqrt(rs) > target
        ap = apply_op(p)
        pap = tf.reduce_sum(p * ap, axis=-1)
        alpha = tf.where(active & (pap > tiny), rs / tf.maximum(pap, tiny), tf.zeros_like(rs))
        x = x + alpha[:, None] * p
        r = r - alpha[:, None] * ap
        rs_new = tf.reduce_sum(r * r, axis=-1)
        beta = tf.where(active & (rs > tiny), rs_new / tf.maximum(rs, tiny), tf.zeros_like(rs))
        p = tf.where(active[:, None], r + beta[:, None] * p, p)
        rs = tf.where(active, rs_new, rs)
        return i + 1, x, r, p, rs

    x0 = tf.zeros_like(rhs)
    rs0 = tf.reduce_sum(rhs * rhs, axis=-1)
    _, x, _, _, _ = tf.while_loop(cond, body, (tf.constant(0), x0, rhs, rhs, rs0),
                                  maximum_iterations=max_iterations)
    return x


def implicit_vjp(cost, f, g, epsilon, df, dg, *, solver="auto", cg_max_iterations=200,
                 cg_tolerance=None):
    """Vector-Jacobian product of the Sinkhorn fixed point (f, g) w.r.t. (C, a, b).

    Args:
      cost: `[B, n, m]`; f `[B, n]`; g `[B, m]`: a (near-)optimal solution.
      df, dg: cotangents of f and g.

    Returns:
      `(d_cost, d_a, d_b)`.
    """
    eps = tf.cast(epsilon, cost.dtype)
    plan = tf.exp((f[:, :, None] + g[:, None, :] - cost) / eps)
    r = tf.reduce_sum(plan, axis=2)
    c = tf.reduce_sum(plan, axis=1)
    tiny = tf.constant(1e-30 if cost.dtype == tf.float32 else 1e-300, cost.dtype)
    r = tf.maximum(r, tiny)
    c = tf.maximum(c, tiny)
    sqrt_r = tf.sqrt(r)
    sqrt_c = tf.sqrt(c)
    rhs = eps * (dg - tf.linalg.matvec(plan, df / r, transpose_a=True))
    rhs_hat = rhs / sqrt_c
    q = sqrt_c / tf.norm(sqrt_c, axis=-1, keepdims=True)
    rhs_hat = rhs_hat - q * tf.reduce_sum(q * rhs_hat, axis=-1, keepdims=True)
    m = cost.shape[-1]
    use_dense = solver == "dense" or (solver == "auto" and m is not None
                                      and m <= DENSE_SOLVE_MAX_TARGETS)
    if use_dense:
        # The small m×m system is assembled and factorised in float64 from the plan
        # itself: with r and c recomputed in float64, M has singular value 1 exactly
        # (along √r, √c), so I − MᵀM + qqᵀ stays positive definite even when the plan
        # is nearly a hard assignment and float32 rounding would make it indefinite.
        # A ridge of 1e-12 guards the directions where it is singular up to rounding
        # (the right-hand side vanishes along them).
        p64 = tf.cast(plan, tf.float64)
        r64 = tf.maximum(tf.reduce_sum(p64, axis=2), 1e-300)
        c64 = tf.maximum(tf.reduce_sum(p64, axis=1), 1e-300)
        m64 = p64 / tf.sqrt(r64)[:, :, None] / tf.sqrt(c64)[:, None, :]
        q64 = tf.sqrt(c64) / tf.norm(tf.sqrt(c64), axis=-1, keepdims=True)
        gram = tf.linalg.matmul(m64, m64, transpose_a=True)
        eye = tf.eye(tf.shape(gram)[-1], batch_shape=tf.shape(gram)[:1], dtype=tf.float64)
        system = (1.0 + 1e-12) * eye - gram + q64[:, :, None] * q64[:, None, :]
        system = 0.5 * (system + tf.linalg.matrix_transpose(system))
        rhs64 = tf.cast(rhs_hat, tf.float64)[:, :, None]
        w_hat = tf.cast(tf.linalg.cholesky_solve(tf.linalg.cholesky(system), rhs64)[..., 0],
                        cost.dtype)
    else:
        scaled = plan / sqrt_r[:, :, None] / sqrt_c[:, None, :]  # M

        def apply_op(v):
            mv = tf.linalg.matvec(scaled, v)
            return v - tf.linalg.matvec(scaled, mv, transpose_a=True) + q * tf.reduce_sum(
                q * v, axis=-1, keepdims=True)

        if cg_tolerance is None:
            cg_tolerance = 1e-6 if cost.dtype == tf.float32 else 1e-12
        w_hat = _conjugate_gradient(apply_op, rhs_hat, cg_max_iterations, cg_tolerance)
    w_g = w_hat / sqrt_c
    w_f = (eps * df - tf.linalg.matvec(plan, w_g)) / r
    d_cost = plan * (w_f[:, :, None] + w_g[:, None, :]) / eps
    return d_cost, w_f, w_g


def solve(
    x,
    y,
    a=None,
    b=None,
    *,
    epsilon: float = 1e-2,
    power: float = 2.0,
    threshold: float = 1e-3,
    max_iterations: int = 1000,
    implicit: bool = True,
    warm_start: bool = True,
    epsilon_start: float | None = None,
    epsilon_decay: float = 0.9,
    check_every: int = 5,
    implicit_solver: str = "auto",
    implicit_max_iterations: int = 200,
) -> SinkhornResult:
    """Solves a batch of entropic OT problems from x `[B, n]` onto sorted y.

    Args:
      x: `[batch, n]` input support (float32 or float64).
      y: `[m]` or `[batch, m]` target support, sorted increasingly.
      a: `[batch, n]` input weights, positive and summing to 1; uniform if None.
      b: `[m]` or `[batch, m]` target weights, positive, summing to 1; uniform if None.
      epsilon: regularisation ε > 0, in units of the cost (|x − y|^p on [0, 1]).
      power: exponent p > 0 of the cost.
      threshold: stop a row when Σ_i |(P1)_i − a_i| < threshold.
      max_iterations: bound on the Sinkhorn iterations (rounded up to a multiple of
        `check_every`).
      implicit: implicit differentiation (True) or backpropagation through the loop.
      warm_start: start from the exact 1-D dual potential (see module docstring).
      epsilon_start: if set above ε, anneal ε_t = max(ε, ε_start · decay^t).
      epsilon_decay: decay factor of the annealing, in (0, 1).
      check_every: iterations between two reads of the marginal error.
      implicit_solver: 'auto' (dense Cholesky for m <= 64, else CG), 'cg' or 'dense'.
      implicit_max_iterations: bound on CG iterations in the backward pass.

    Returns:
      A `SinkhornResult`.
    """
    epsilon = _checks.check_positive("epsilon", epsilon)
    power = _checks.check_positive("power", power)
    threshold = _checks.check_positive("threshold", threshold)
    max_iterations = _checks.check_positive_int("max_iterations", max_iterations)
    check_every = min(_checks.check_positive_int("check_every", check_every), max_iterations)
    implicit_max_iterations = _checks.check_positive_int("implicit_max_iterations",
                                                         implicit_max_iterations)
    if epsilon_start is not None:
        _checks.check_positive("epsilon_start", epsilon_start)
        _checks.check_in_open_interval("epsilon_decay", epsilon_decay, 0.0, 1.0)
    if implicit_solver not in IMPLICIT_SOLVERS:
        raise ValueError(f"`implicit_solver` must be one of {IMPLICIT_SOLVERS}, "
                         f"got {implicit_solver!r}.")

    x = tf.convert_to_tensor(x)
    dtype = x.dtype
    batch = tf.shape(x)[0]
    n = x.shape[-1]
    y = tf.cast(tf.convert_to_tensor(y), dtype)
    if y.shape.rank == 1:
        y = tf.broadcast_to(y[None, :], tf.stack([batch, tf.shape(y)[0]]))
    m = y.shape[-1]
    if a is None:
        a = tf.fill(tf.stack([batch, n]), tf.constant(1.0 / n, dtype))
    a = tf.cast(a, dtype)
    if b is None:
        b = tf.fill(tf.stack([batch, tf.shape(y)[-1]]), tf.cast(1.0, dtype) /
                    tf.cast(tf.shape(y)[-1], dtype))
    b = tf.cast(b, dtype)
    if b.shape.rank == 1:
        b = tf.broadcast_to(b[None, :], tf.shape(y))
    if m is not None:
        b.set_shape([None, m])

    cost = cost_matrix(x, y, power)
    loop_kwargs = dict(epsilon=epsilon, epsilon_start=epsilon_start, epsilon_decay=epsilon_decay,
                       threshold=threshold, max_iterations=max_iterations,
                       check_every=check_every)

    def init_g(x_, a_, b_):
        if warm_start:
            return tf.stop_gradient(exact_target_potential(x_, a_, y, b_, power))
        return tf.zeros_like(b_)

    if not implicit:
        f, g, n_it, err = _run_loop(cost, tf.math.log(a), tf.math.log(b), init_g(x, a, b),
                                    **loop_kwargs)
        return SinkhornResult(f, g, cost, epsilon, n_it, err)

    cost_s, a_s, b_s = tf.stop_gradient(cost), tf.stop_gradient(a), tf.stop_gradient(b)
    f0, g0, n_it, err = _run_loop(cost_s, tf.math.log(a_s), tf.math.log(b_s),
                                  init_g(tf.stop_gradient(x), a_s, b_s), **loop_kwargs)

    @tf.custom_gradient
    def attach(cost_, a_, b_):
        def grad(df, dg):
            if df is None:
                df = tf.zeros_like(f0)
            if dg is None:
                dg = tf.zeros_like(g0)
            return implicit_vjp(cost_, f0, g0, epsilon, df, dg, solver=implicit_solver,
                                cg_max_iterations=implicit_max_iterations)

        return (tf.identity(f0), tf.identity(g0)), grad

    f, g = attach(cost, a, b)
    return SinkhornResult(f, g, cost, epsilon, n_it, err)

"""Implicit differentiation of the Sinkhorn fixed point (used by `solvers.sinkhorn`).

At the optimum, H(f, g) = (P1 − a, Pᵀ1 − b) = 0 with P_ij = exp((f_i + g_j − C_ij)/ε).
The Jacobian ∂H/∂(f, g) = (1/ε)[[diag r, P], [Pᵀ, diag c]] is singular along the gauge
direction (1, −1) (f + t, g − t gives the same plan). We eliminate f (Schur complement)
and solve the m×m system (I − MᵀM + qqᵀ) ŵ = r̂ with M = D_r^{-1/2} P D_c^{-1/2} and
q = √c: the rank-one term qqᵀ removes the null space (the right-hand side is orthogonal
to q), so the system is symmetric positive definite with eigenvalues in (0, 1]. It is
solved by conjugate gradients (matrix-free, O(n·m) per step) or Cholesky, in float64 for
at most 64 targets (`backward_method`).
"""

from __future__ import annotations

import tensorflow as tf

from softsort_tf.options import CHOLESKY_MAX_TARGETS, FLOAT64_SOLVE_MAX_TARGETS


def _conjugate_gradient(apply_op, rhs, max_iterations: int, tol: float):
    """Batched CG for SPD systems `apply_op(x) = rhs`, rows stop independently."""
    target = tol * tf.norm(rhs, axis=-1)
    tiny = tf.constant(1e-30 if rhs.dtype == tf.float32 else 1e-300, rhs.dtype)

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

    init = (tf.constant(0), tf.zeros_like(rhs), rhs, rhs, tf.reduce_sum(rhs * rhs, axis=-1))
    return tf.while_loop(cond, body, init, maximum_iterations=max_iterations)[1]


def implicit_vjp(cost, f, g, epsilon, df, dg, *, solver="auto", cg_max_iterations=200,
                 cg_tolerance=None):
    """Vector-Jacobian product of the Sinkhorn fixed point (f, g) w.r.t. (C, a, b).

    Args:
      cost: `[B, n, m]`; f `[B, n]`; g `[B, m]`: a (near-)optimal solution.
      df, dg: cotangents of f and g.

    Returns:
      `(d_cost, d_a, d_b)`.
    """
    m = cost.shape[-1]
    kwargs = dict(cg_max_iterations=cg_max_iterations, cg_tolerance=cg_tolerance)
    if solver == "auto" and m is None:
        # m unknown at trace time: chosen when the backward runs, float64 Cholesky for at
        # most 64 targets (a choice around the whole solve does not compile under XLA).
        def by(method):
            return lambda: _vjp(cost, f, g, epsilon, df, dg, method=method, **kwargs)

        return tf.cond(tf.shape(cost)[-1] <= FLOAT64_SOLVE_MAX_TARGETS, by("cholesky"),
                       by("cg"))
    return _vjp(cost, f, g, epsilon, df, dg, method=backward_method(solver, m), **kwargs)


def backward_method(solver: str, m: int | None) -> str:
    """The backward solve of m targets known at trace time: 'cholesky' (float64), 'cg64'
    (conjugate gradients in float64) or 'cg' (in the input dtype; also for 'auto' with
    m unknown, chosen when the backward runs)."""
    if solver == "dense":
        return "cholesky"
    if solver == "cg" or m is None or m > FLOAT64_SOLVE_MAX_TARGETS:
        return "cg"
    return "cholesky" if m <= CHOLESKY_MAX_TARGETS else "cg64"


def float64_backward(solver: str, m: int | None) -> bool:
    """Whether the backward of m targets runs in float64, known at trace time."""
    return backward_method(solver, m) != "cg"


def _vjp(cost, f, g, epsilon, df, dg, *, method: str, cg_max_iterations: int,
         cg_tolerance):
    """`implicit_vjp` with the solve `method` (`backward_method`)."""
    out_dtype = cost.dtype
    if method != "cg" and out_dtype != tf.float64:
        # Few targets make the system nearly singular once the plan is nearly hard: a
        # float32 solve returns rounding noise.
        cost, f, g, df, dg = (tf.cast(t, tf.float64) for t in (cost, f, g, df, dg))
    eps = tf.cast(epsilon, cost.dtype)
    plan = tf.exp((f[:, :, None] + g[:, None, :] - cost) / eps)
    r = tf.reduce_sum(plan, axis=2)
    c = tf.reduce_sum(plan, axis=1)
    tiny = tf.constant(1e-30 if cost.dtype == tf.float32 else 1e-300, cost.dtype)
    r = tf.maximum(r, tiny)
    c = tf.maximum(c, tiny)
    sqrt_c = tf.sqrt(c)
    rhs = eps * (dg - tf.linalg.matvec(plan, df / r, transpose_a=True))
    rhs_hat = rhs / sqrt_c
    q = sqrt_c / tf.norm(sqrt_c, axis=-1, keepdims=True)
    rhs_hat = rhs_hat - q * tf.reduce_sum(q * rhs_hat, axis=-1, keepdims=True)
    if method == "cholesky":
        # With r and c recomputed from the plan, M has singular value 1 exactly (along
        # √r, √c), so I − MᵀM + qqᵀ stays positive definite for nearly hard plans; a
        # ridge of 1e-12 guards directions singular up to rounding.
        m_hat = plan / tf.sqrt(r)[:, :, None] / sqrt_c[:, None, :]
        gram = tf.linalg.matmul(m_hat, m_hat, transpose_a=True)
        eye = tf.eye(tf.shape(gram)[-1], batch_shape=tf.shape(gram)[:1], dtype=tf.float64)
        system = (1.0 + 1e-12) * eye - gram + q[:, :, None] * q[:, None, :]
        system = 0.5 * (system + tf.linalg.matrix_transpose(system))
        w_hat = tf.linalg.cholesky_solve(tf.linalg.cholesky(system), rhs_hat[:, :, None])[..., 0]
    else:
        inv_sqrt_c = 1.0 / sqrt_c
        inv_r = 1.0 / r

        def apply_op(v):  # (I − MᵀM + qqᵀ) v, with M = D_r^{-1/2} P D_c^{-1/2} never formed
            pv = tf.linalg.matvec(plan, v * inv_sqrt_c) * inv_r
            mtmv = tf.linalg.matvec(plan, pv, transpose_a=True) * inv_sqrt_c
            return v - mtmv + q * tf.reduce_sum(q * v, axis=-1, keepdims=True)

        if cg_tolerance is None:
            cg_tolerance = 1e-6 if cost.dtype == tf.float32 else 1e-12
        w_hat = _conjugate_gradient(apply_op, rhs_hat, cg_max_iterations, cg_tolerance)
    w_g = w_hat / sqrt_c
    w_f = (eps * df - tf.linalg.matvec(plan, w_g)) / r
    d_cost = plan * (w_f[:, :, None] + w_g[:, None, :]) / eps
    return tuple(tf.cast(t, out_dtype) for t in (d_cost, w_f, w_g))

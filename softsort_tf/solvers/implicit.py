"""Implicit differentiation of the Sinkhorn fixed point (used by `solvers.sinkhorn`).

At the optimum, H(f, g) = (P1 − a, Pᵀ1 − b) = 0 with P_ij = exp((f_i + g_j − C_ij)/ε).
The Jacobian ∂H/∂(f, g) = (1/ε)[[diag r, P], [Pᵀ, diag c]] is singular along the gauge
direction (1, −1) (f + t, g − t gives the same plan). We eliminate f (Schur complement)
and solve the m×m system (I − MᵀM + qqᵀ) ŵ = r̂ with M = D_r^{-1/2} P D_c^{-1/2} and
q = √c: the rank-one term qqᵀ removes the null space (the right-hand side is orthogonal
to q), so the system is symmetric positive definite with eigenvalues in (0, 1]. It is
solved matrix-free by conjugate gradients, each step O(n·m), or densely by Cholesky for
small m. Memory is O(B·n·m) whatever the number of forward iterations.
"""

from __future__ import annotations

import tensorflow as tf

from softsort_tf.options import DENSE_SOLVE_MAX_TARGETS


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
    m = cost.shape[-1]
    kwargs = dict(cg_max_iterations=cg_max_iterations, cg_tolerance=cg_tolerance)
    if solver == "auto" and m is None:
        # m unknown at trace time (the default m = n of lists of unknown length): the
        # same choice by m as for a static m, made when the backward runs. (A choice
        # made on the whole solve instead, forward loop included, does not compile
        # under XLA once differentiated.)
        return tf.cond(tf.shape(cost)[-1] <= DENSE_SOLVE_MAX_TARGETS,
                       lambda: _vjp(cost, f, g, epsilon, df, dg, use_dense=True, **kwargs),
                       lambda: _vjp(cost, f, g, epsilon, df, dg, use_dense=False, **kwargs))
    return _vjp(cost, f, g, epsilon, df, dg, use_dense=dense_backward(solver, m), **kwargs)


def dense_backward(solver: str, m: int | None) -> bool:
    """Whether the backward of m targets is the dense float64 solve, known at trace time
    (False for 'auto' with m unknown: the choice is then made when the backward runs)."""
    return solver == "dense" or (solver == "auto" and m is not None
                                 and m <= DENSE_SOLVE_MAX_TARGETS)


def _vjp(cost, f, g, epsilon, df, dg, *, use_dense: bool, cg_max_iterations: int,
         cg_tolerance):
    """`implicit_vjp` with the dense (Cholesky, float64) or the CG solve."""
    out_dtype = cost.dtype
    if use_dense and out_dtype != tf.float64:
        # Few targets (ranks of short rows, top-k masks, quantiles) make the system
        # nearly singular once the plan is nearly hard, and a float32 solve returns
        # rounding noise: the dense backward is computed in float64 (O(n·m + m³) with
        # m ≤ 64, a small cost); the CG path for many targets stays in float32.
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
    if use_dense:
        # The small m×m system is assembled and factorised in float64 from the plan
        # itself: with r and c recomputed from it, M has singular value 1 exactly
        # (along √r, √c), so I − MᵀM + qqᵀ stays positive definite even when the plan
        # is nearly a hard assignment. A ridge of 1e-12 guards the directions where it
        # is singular up to rounding (the right-hand side vanishes along them).
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

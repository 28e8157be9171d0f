"""The batched, log-domain Sinkhorn solver behind every Sinkhorn operator.

Inputs x `[B, n]` with weights a are transported onto sorted targets y `[m]` with
weights b, for the cost C_ij = |x_i − y_j|^p and entropic regularisation ε (Cuturi,
Teboul & Vert, 2019): P_ij = exp((f_i + g_j − C_ij)/ε) for dual potentials f, g found by
the log-domain updates of the paper's eq. (3), from the sorted initializer
(`warm_start`), with ε annealing and single-pass half-steps (`_half_step`). Rows stop
independently, at an L1 marginal error below `threshold` or a non-finite one. Gradients
by implicit differentiation (`implicit`), or through the unrolled loop.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import tensorflow as tf

from softsort_tf.options import SinkhornOptions
from softsort_tf.solvers.cost import cost_matrix
from softsort_tf.solvers.implicit import float64_backward, implicit_vjp
from softsort_tf.solvers.warm_start import exact_target_potential

EXACT_MARGINALS = ("target", "input")


@dataclasses.dataclass
class SinkhornResult:
    """Solution of a batch of transport problems, in the dtype of x.

    Attributes:
      f: `[batch, n]` dual potential of the inputs.
      g: `[batch, m]` dual potential of the targets.
      cost: `[batch, n, m]` cost matrix, `cost.cost_matrix` (for p = 2 less a term per
        input: f is the potential of that cost, the plan that of |x − y|²).
      epsilon: scalar tensor, the ε the potentials solve (the plan and the gradient use
        it): the requested one, or the larger ε_t annealing had reached.
      num_iterations: `[batch]` int32, Sinkhorn iterations each row used.
      error: `[batch]` L1 error Σ_i |(P1)_i − a_i| of the column-exact plan (which bounds
        the column error of the row-exact plan of `exact_marginal='input'`).
      readout: None, or what the read-outs evaluate their `fn(f, g, cost, ε)` with
        (`_implicit_readout`: differentiated in float64 for float32 inputs).
    """

    f: tf.Tensor
    g: tf.Tensor
    cost: tf.Tensor
    epsilon: tf.Tensor
    num_iterations: tf.Tensor
    error: tf.Tensor
    readout: Callable | None = None

    def _read(self, fn):
        if self.readout is not None:
            return self.readout(fn)
        return fn(self.f, self.g, self.cost, self.epsilon)

    def log_plan(self):
        """`[batch, n, m]` log of the transport plan, (f_i + g_j − C_ij)/ε."""
        return self._read(_log_plan)

    def plan(self):
        """`[batch, n, m]` transport plan P, with P1 ≈ a and Pᵀ1 = b."""
        return tf.exp(self.log_plan())

    def row_plan(self):
        """`[batch, n, m]` row-conditional plan a⁻¹ ∘ P from g alone, Q_ij = softmax_j
        ((g_j − C_ij)/ε) (eq. 3's row update over a_i): rows sum to 1 exactly."""
        return self._read(_row_plan)


def _log_plan(f, g, cost, epsilon):
    """(f_i + g_j − C_ij)/ε `[batch, n, m]`, rounded about once: f_i + g_j = s + e exactly
    (TwoSum), e added after s − C_ij (exact where s ≈ C_ij); rounded in place, f_i + g_j
    would move log P by ulp(f + g)/ε. e, 0 in exact arithmetic, is a constant for autodiff."""
    f, g = f[:, :, None], g[:, None, :]
    # e of the finite potentials (a −∞ one counts as 0, and e as 0): no NaN is formed.
    finite_f = tf.where(tf.math.is_finite(f), f, tf.zeros_like(f))
    finite_g = tf.where(tf.math.is_finite(g), g, tf.zeros_like(g))
    s = finite_f + finite_g
    g_part = s - finite_f
    error = (finite_f - (s - g_part)) + (finite_g - g_part)
    error = tf.where(tf.abs(error) <= error.dtype.max, error, tf.zeros_like(error))  # ±inf
    return (f + g - cost + tf.stop_gradient(error)) / tf.cast(epsilon, cost.dtype)


def _row_plan(f, g, cost, epsilon):
    # softmax_j is invariant to the row's f_i: f shifts the logits to the accurate log-plan
    # and is a constant for autodiff. A non-finite f_i (−∞ for a zero weight a_i) is
    # replaced by min_j C_ij − g_j (its ε → 0 limit for any a_i > 0): a row of −∞ logits
    # has no softmax, and logits far from 0 (C_ij/ε for a large x_i) leave the row's
    # largest one at exp(l − max l) = 0 when XLA rounds l twice differently.
    f = tf.stop_gradient(f)
    c_transform = tf.stop_gradient(tf.reduce_min(cost - g[:, None, :], axis=-1))
    fill = tf.where(tf.math.is_finite(c_transform), c_transform, tf.zeros_like(f))
    f = tf.where(tf.math.is_finite(f), f, fill)
    return tf.nn.softmax(_log_plan(f, g, cost, epsilon), axis=-1)


# Sums over more entries than this are accumulated in float64 for float32 inputs: a
# float32 sum of n positive terms drifts by up to ~n/16 ulps on CPU (1e-3 at n = 10⁶),
# which stalls the marginal error above the default threshold.
LONG_SUM = 4096


def is_long(length: int | None) -> bool:
    """Whether sums over `length` entries (None: unknown) are accumulated in float64."""
    return length is None or length > LONG_SUM


def accurate_sum(t, axis: int, long: bool | None = None):
    """`tf.reduce_sum` along `axis`, accumulated in float64 for long float32 axes
    (`long`; None: decided from the static length of `axis`)."""
    if long is None:
        long = is_long(t.shape[axis])
    if t.dtype == tf.float32 and long:
        return tf.cast(tf.reduce_sum(tf.cast(t, tf.float64), axis=axis), t.dtype)
    return tf.reduce_sum(t, axis=axis)


def _half_step(log_kernel, u, v, log_w, axis: int, active, long: bool):
    """One Sinkhorn half-step in scaled potentials (u = f/ε, v = g/ε), in one pass.

    `axis=2` replaces u by log a − logsumexp_j(v_j + K_ij), `axis=1` v by log b −
    logsumexp_i(u_i + K_ij), K = −C/ε, shifted by the potential replaced: the summands are
    the current plan's entries (at most 1: its other marginal is exact), so one pass of exp
    suffices. Where a sum underflows or is NaN in an `active` row, the stabilised
    log-sum-exp is recomputed (a `tf.cond`). Returns (new potential, the plan's marginal
    sums along `axis`).
    """
    old = u if axis == 2 else v
    # New axes by expand_dims: TFLite has no builtin for a strided slice with a new axis
    # on the unknown shapes of a generalised trace.
    sums = accurate_sum(tf.exp(tf.expand_dims(u, 2) + tf.expand_dims(v, 1) + log_kernel), axis=axis,
                        long=long)
    # Smallest trusted sum, far above denormals; False for NaN too.
    trusted = sums > tf.constant(1e-30 if sums.dtype == tf.float32 else 1e-290, sums.dtype)
    fast = log_w - tf.math.log(tf.where(trusted, sums, tf.ones_like(sums))) + old
    redo = tf.logical_and(tf.logical_not(trusted), tf.expand_dims(active, 1))

    def stabilised():
        other = tf.expand_dims(v, 1) if axis == 2 else tf.expand_dims(u, 2)
        full = log_w - tf.reduce_logsumexp(other + log_kernel, axis=axis)
        return tf.where(redo, full, fast)

    new = tf.cond(tf.reduce_any(redo), stabilised, lambda: fast)
    return new, sums


def _run_loop(cost, log_a, log_b, g_init, *, epsilon, epsilon_start, epsilon_decay, threshold,
              num_blocks, check_every, annealing, long_sums, exact_marginal="target"):
    """Runs the Sinkhorn loop. Returns (f, g, num_iterations, error, ε reached).

    The numbers (ε's, `threshold`, `num_blocks`: the bound on blocks of `check_every`
    iterations) may be tensors; the other arguments are Python values (`long_sums`: float64
    sums over the n inputs, the m targets). One iteration updates g, then f, whose sums
    give the error. The loop works with u = f/ε_t, v = g/ε_t on the reduced cost
    C̃_ij = C_ij − f⁰_i − g⁰_j of the start (g⁰ = `g_init`, f⁰ its c-transform), K = −C̃/ε
    (K·ε/ε_t under annealing): the iterates on C, with additions of the size of the plan's
    log-entries instead of C/ε, whose rounding would floor the marginal error.
    """
    dtype = cost.dtype
    a = tf.exp(log_a)
    batch = tf.shape(cost)[0]
    eps_final = tf.cast(epsilon, dtype)
    threshold = tf.cast(threshold, dtype)
    # Reduced cost (see above); f⁰ is a constant for autodiff, which is exact: the
    # loop's f depends on C − f⁰ only up to the shift f⁰ that is added back.
    f_init = tf.stop_gradient(tf.reduce_min(cost - tf.expand_dims(g_init, 1), axis=2))
    f_init = tf.where(tf.math.is_finite(f_init), f_init, tf.zeros_like(f_init))
    log_kernel = -(cost - tf.expand_dims(f_init, 2) - tf.expand_dims(g_init, 1)) / eps_final

    def eps_at(it):
        if not annealing:
            return eps_final
        e = tf.cast(epsilon_start, dtype) * tf.pow(tf.cast(epsilon_decay, dtype),
                                                   tf.cast(it, dtype))
        return tf.maximum(eps_final, e)

    def kernel_at(it):  # K · ε/ε_t
        return log_kernel * (eps_final / eps_at(it)) if annealing else log_kernel

    v0 = tf.zeros_like(g_init)
    u0 = log_a - tf.reduce_logsumexp(tf.expand_dims(v0, 1) + kernel_at(0), axis=2)

    def cond(it, u_prev, u, v, n_it, err, done):
        del it, u_prev, u, v, n_it, err
        return tf.logical_not(tf.reduce_all(done))

    def body(it, u_prev, u, v, n_it, err, done):
        active = tf.logical_not(done)
        u_c, v_c, sums = u, v, None
        for k in range(check_every):
            if annealing:  # rescale from ε_{t−1} to ε_t (no-op once annealed)
                ratio = eps_at(tf.maximum(it + k - 1, 0)) / eps_at(it + k)
                u_c, v_c = u_c * ratio, v_c * ratio
            kernel = kernel_at(it + k)
            v_c, _ = _half_step(kernel, u_c, v_c, log_b, 1, active, long_sums[0])
            u_prev_c = u_c
            u_c, sums = _half_step(kernel, u_c, v_c, log_a, 2, active, long_sums[1])
        it_new = it + check_every
        err_c = accurate_sum(tf.abs(sums - a), axis=-1, long=long_sums[0])
        newly = tf.logical_or(err_c < threshold, tf.logical_not(tf.math.is_finite(err_c)))
        if annealing:
            newly = tf.logical_and(eps_at(it_new - 1) <= eps_final, newly)
        keep = tf.expand_dims(done, 1)
        u_prev, u, v = (tf.where(keep, old, new) for old, new in
                        ((u_prev, u_prev_c), (u, u_c), (v, v_c)))
        n_it = tf.where(done, n_it, tf.fill(tf.shape(n_it), it_new))
        err = tf.where(done, err, err_c)
        done = tf.logical_or(done, newly)
        return it_new, u_prev, u, v, n_it, err, done

    init = (tf.constant(0, tf.int32), u0, u0, v0, tf.zeros([batch], tf.int32),
            tf.fill([batch], tf.constant(math.inf, dtype)), tf.zeros([batch], tf.bool))
    it, u_prev, u, v, n_it, err, _ = tf.while_loop(cond, body, init,
                                                   maximum_iterations=num_blocks)
    # The ε the potentials solve: ε_t if annealing had not reached ε (no row is done).
    eps_last = eps_at(tf.maximum(it - 1, 0))
    f = (u if exact_marginal == "input" else u_prev) * eps_last + f_init
    # A zero weight's potential is −∞, whatever XLA's rounding of its row of C/ε ~ 1e14.
    f = tf.where(tf.math.is_inf(log_a), log_a, f)
    return f, v * eps_last + g_init, n_it, err, eps_last


# The loop runs as one traced graph function in eager mode, and, with implicit
# differentiation, inside `tf.function` and XLA too (traced once per process and Python
# arguments, not once per caller); unrolled gradients and graph backwards inline the
# plain functions. Both traces generalise to unknown shapes after a second shape.
_run_loop_graph = tf.function(_run_loop, autograph=False, reduce_retracing=True)
_implicit_vjp_graph = tf.function(implicit_vjp, autograph=False, reduce_retracing=True)


def _loop(cost, log_a, log_b, g_init, **kwargs):
    """`_run_loop` as a call of its graph function, with the static shapes of its inputs
    on its outputs (a generalised trace returns unknown ones)."""
    out = _run_loop_graph(cost, log_a, log_b, g_init, **kwargs)
    shapes = (log_a.shape, log_b.shape, log_a.shape[:1], log_a.shape[:1])
    for t, shape in zip(out[:4], shapes, strict=True):
        t.set_shape(shape)
    return out


def _eager_or_graph(fn, graph_fn):
    return graph_fn if tf.executing_eagerly() else fn


def solve(x, y, a=None, b=None, options: SinkhornOptions | dict | None = None, *,
          exact_marginal: str = "target", **option_kwargs) -> SinkhornResult:
    """Solves a batch of entropic OT problems from x `[B, n]` onto sorted y.

    Args:
      x: `[batch, n]` input support (float32 or float64).
      y: `[m]` or `[batch, m]` target support, sorted increasingly.
      a: `[batch, n]` input weights, positive and summing to 1; uniform if None.
      b: `[m]` or `[batch, m]` target weights, positive, summing to 1; uniform if None.
      options: the solver configuration (`softsort_tf.SinkhornOptions`, validated when
        it was built; default `SinkhornOptions()`).
      **option_kwargs: fields of `SinkhornOptions` overriding those of `options`.
      exact_marginal: which marginal of the plan is exact: 'target' (default), Pᵀ1 = b
        and `error` is the L1 error of P1 (for read-outs through Pᵀ: sorts); 'input',
        P1 = a and the L1 error of Pᵀ1 is at most `error` (for read-outs through a⁻¹ P).

    Returns:
      A `SinkhornResult`.
    """
    if option_kwargs or not isinstance(options, SinkhornOptions):
        options = SinkhornOptions.resolve(options, **option_kwargs)
    if exact_marginal not in EXACT_MARGINALS:
        raise ValueError(f"`exact_marginal` must be one of {EXACT_MARGINALS}, "
                         f"got {exact_marginal!r}.")
    epsilon, epsilon_start = options.solver_epsilon, options.epsilon_start
    max_iterations, power = options.max_iterations, options.power
    check_every = min(options.check_every, max_iterations)
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
    annealing = epsilon_start is not None and epsilon_start > epsilon
    # Numbers go in as tensors: new values do not retrace the loop's graph function.
    as_tensor = lambda v: tf.constant(v, dtype)
    loop_kwargs = dict(epsilon=as_tensor(epsilon),
                       epsilon_start=as_tensor(epsilon_start if annealing else epsilon),
                       epsilon_decay=as_tensor(options.epsilon_decay),
                       threshold=as_tensor(options.threshold),
                       num_blocks=tf.constant(-(-max_iterations // check_every), tf.int32),
                       check_every=check_every, annealing=annealing,
                       exact_marginal=exact_marginal, long_sums=(is_long(n), is_long(m)))

    def init_g(x_, a_, b_):
        if options.initializer_for_loop() == "sorted":
            return tf.stop_gradient(exact_target_potential(x_, a_, y, b_, power))
        return tf.zeros_like(b_)

    if options.implicit_diff is None:
        # Inlined in graphs: the gradient of a called loop does not compile under XLA.
        run_loop = _eager_or_graph(_run_loop, _run_loop_graph)
        f, g, n_it, err, eps_reached = run_loop(cost, tf.math.log(a), tf.math.log(b),
                                                init_g(x, a, b), **loop_kwargs)
        return SinkhornResult(f, g, cost, tf.stop_gradient(eps_reached), n_it, err)

    cost_s, a_s, b_s = tf.stop_gradient(cost), tf.stop_gradient(a), tf.stop_gradient(b)
    f0, g0, n_it, err, eps_reached = _loop(cost_s, tf.math.log(a_s), tf.math.log(b_s),
                                              init_g(tf.stop_gradient(x), a_s, b_s),
                                              **loop_kwargs)

    # With the float64 backward (at most 64 targets), float32 read-outs go through
    # `_implicit_readout` to be differentiated in float64 with the potentials.
    backward_dtype = (tf.float64 if float64_backward(options.implicit_diff.solver, m)
                      else dtype)
    readout = functools.partial(_implicit_readout, f=f0, g=g0, cost=cost, a=a, b=b,
                                epsilon=eps_reached, implicit_diff=options.implicit_diff,
                                backward_dtype=backward_dtype)
    f, g = readout(lambda f_, g_, cost_, eps: (tf.identity(f_), tf.identity(g_)))
    return SinkhornResult(f, g, cost, eps_reached, n_it, err,
                          readout=readout if backward_dtype != dtype else None)


def _implicit_readout(fn, *, f, g, cost, a, b, epsilon, implicit_diff, backward_dtype):
    """`fn(f, g, cost, ε)` (tensors) of the solution (f, g) of the problem (cost, a, b),
    computed in the inputs' dtype; its gradient w.r.t. (cost, a, b) is `fn`'s VJP plus
    the implicit VJP through (f, g), both in `backward_dtype` and summed before rounding.
    (The two are of size |w|/ε and cancel where the plan is hard: summed in float32 they
    leave noise of ~1e-7·|w|/ε where the exact gradient is 0.) f and g are constants (the
    loop ran on stopped inputs); `implicit_diff` is the `ImplicitDiff`."""

    @tf.custom_gradient
    def read(cost_, a_, b_):
        del a_, b_
        out = fn(f, g, cost_, epsilon)

        def grad(*upstream):
            held = [tf.cast(t, backward_dtype) for t in (f, g, cost_)]
            with tf.GradientTape() as tape:
                tape.watch(held)
                outs = tf.nest.flatten(fn(*held, epsilon))
            upstream = [tf.zeros_like(o) if u is None else tf.cast(u, backward_dtype)
                        for o, u in zip(outs, upstream, strict=True)]
            df, dg, d_read = tape.gradient(outs, held, output_gradients=upstream,
                                           unconnected_gradients=tf.UnconnectedGradients.ZERO)
            vjp = _eager_or_graph(implicit_vjp, _implicit_vjp_graph)
            d_cost, d_a, d_b = vjp(held[2], held[0], held[1], epsilon, df, dg,
                                   solver=implicit_diff.solver,
                                   cg_max_iterations=implicit_diff.max_iterations)
            return tuple(tf.cast(t, cost_.dtype) for t in (d_cost + d_read, d_a, d_b))

        return out, grad

    return read(cost, a, b)

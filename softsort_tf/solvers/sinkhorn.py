"""The batched, log-domain Sinkhorn solver behind every Sinkhorn operator.

One transport problem serves all operators (Cuturi, Teboul & Vert, 2019): the inputs
x ∈ R^{B×n} with weights a are transported onto sorted targets y ∈ R^m with weights
b, for the cost C_ij = |x_i − y_j|^p and entropic regularisation ε:

    P* = argmin_{P 1 = a, Pᵀ 1 = b} <P, C> − ε H(P).

The solution has the form P_ij = exp((f_i + g_j − C_ij) / ε) for dual potentials
f, g, found by the stabilised log-domain updates of the paper's eq. (3):

    f_i ← ε log a_i − ε logsumexp_j((g_j − C_ij) / ε)
    g_j ← ε log b_j − ε logsumexp_i((f_i − C_ij) / ε)

Speed-ups, each switchable (`scripts/bench_sinkhorn.py` measures them):

- the sorted initializer (`initializer='sorted'`): g is initialised with the dual
  potential of the *exact* (ε = 0) 1-D problem, computed from a sort and a binary
  search in O((n + m) log n) (complementary slackness along the north-west-corner
  staircase of Proposition 1 gives g_{j+1} − g_j = c(x*, y_{j+1}) − c(x*, y_j),
  where x* is the input straddling the boundary between target bins j and j + 1);
- ε annealing (`epsilon_start`, `epsilon_decay`): ε_t = max(ε, ε_start · decay^t);
- single-pass updates: each half-step is one pass of exp over the n×m kernel (the
  log-sum-exp is shifted by the potential it replaces, see `_half_step`), with
  −C/ε computed once, instead of the two passes (max, then exp) of a stabilised
  log-sum-exp; the sums of the f update are the row marginal, so the error check is
  free and `check_every` (iterations between two checks, default 1) only decides how
  many iterations run between stopping decisions.


Rows of the batch stop independently: once a row's L1 marginal error is below
`threshold` its potentials are frozen, so its result does not depend on the rest of
the batch and does not drift. A row whose error is NaN/Inf also stops (it can never
converge), so NaN inputs propagate NaN instead of running to `max_iterations`.

Gradients (w.r.t. the cost, hence x, and the weights a and b):

- `implicit_diff=ImplicitDiff()` (default): implicit differentiation of the optimality conditions
  H(f, g) = (P1 − a, Pᵀ1 − b) = 0. The Jacobian ∂H/∂(f, g) = (1/ε)[[diag r, P],
  [Pᵀ, diag c]] is singular along the gauge direction (1, −1) (f + t, g − t gives the
  same plan). We eliminate f (Schur complement) and solve the m×m system
  (I − MᵀM + qqᵀ) ŵ = r̂ with M = D_r^{-1/2} P D_c^{-1/2} and q = √c: the rank-one
  term qqᵀ removes the null space (the right-hand side is orthogonal to q), so the
  system is symmetric positive definite with eigenvalues in (0, 1]. It is solved
  matrix-free by conjugate gradients, each step O(n·m), or densely by Cholesky for
  small m. Memory is O(B·n·m) whatever the number of forward iterations.
- `implicit_diff=None`: automatic differentiation through the unrolled loop; memory grows
  with the number of iterations.
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
      cost: `[batch, n, m]` cost matrix.
      epsilon: the regularisation the potentials were computed at, a scalar tensor:
        the requested ε, or, when ε annealing (`epsilon_start`) had not reached ε
        within `max_iterations`, the larger ε_t it had reached. The plan and the
        implicit gradient use this value, so they always describe the problem the
        potentials solve.
      num_iterations: `[batch]` int32, Sinkhorn iterations each row used.
      error: `[batch]` L1 error of the row marginal, Σ_i |(P1)_i − a_i|, of the
        column-exact plan; with `exact_marginal='input'` the returned plan is row-exact
        and its column error Σ_j |(Pᵀ1)_j − b_j| is at most this value.
      readout: None, or what `log_plan`, `plan` and `row_plan` evaluate their
        `fn(f, g, cost, ε)` with: for float32 inputs with the float64 implicit
        backward, computed in float32 and differentiated in float64 (see `solve`).
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
        """`[batch, n, m]` row-conditional plan a⁻¹ ∘ P from the target potential alone,
        Q_ij = exp((g_j − C_ij)/ε) / Σ_k exp((g_k − C_ik)/ε) (the row update of eq. 3
        divided by a_i): rows sum to 1 exactly, whatever the residual marginal error."""
        return self._read(_row_plan)


def _log_plan(f, g, cost, epsilon):
    """(f_i + g_j − C_ij)/ε `[batch, n, m]`, rounded about once in any dtype.

    f_i + g_j is summed exactly, as s + e (TwoSum: s the rounded sum, e its rounding
    error), and e is added after s − C_ij, which is exact where the plan is not
    negligible (s ≈ C_ij); rounded in place, f_i + g_j would carry an error of
    ulp(f + g)/ε into the log of the plan (a relative 6e-3 on P at ε = 1e-5 in float32).
    e is a constant for autodiff (it is 0 in exact arithmetic)."""
    f, g = f[:, :, None], g[:, None, :]
    s = f + g
    g_part = s - f
    error = (f - (s - g_part)) + (g - g_part)
    error = tf.where(tf.abs(error) <= error.dtype.max, error, tf.zeros_like(error))  # ±inf
    return (s - cost + tf.stop_gradient(error)) / tf.cast(epsilon, cost.dtype)


def _row_plan(f, g, cost, epsilon):
    # softmax_j is invariant to the row's f_i: f shifts the logits to the accurate log-plan
    # and is a constant for autodiff.
    return tf.nn.softmax(_log_plan(tf.stop_gradient(f), g, cost, epsilon), axis=-1)


def _tiny(dtype):
    """Smallest marginal sum trusted by the single-pass log-sum-exp (far above denormals)."""
    return tf.constant(1e-30 if dtype == tf.float32 else 1e-290, dtype)


# Sums over more entries than this are accumulated in float64 for float32 inputs. A
# float32 sum of n positive terms drifts by up to ~n/16 ulps on CPU (lanes accumulate
# sequentially), 1e-3 relative at n = 10⁶: the marginal error then stalls above the
# default threshold and eager runs went to `max_iterations` where XLA (another
# summation order) converged in 12 iterations.
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

    `axis=2` replaces u by log a − logsumexp_j(v_j + K_ij), `axis=1` replaces v by
    log b − logsumexp_i(u_i + K_ij), with K = −C/ε. The log-sum-exp is shifted by the
    potential being replaced, so its summands are the entries of the current plan
    P_ij = exp(u_i + v_j + K_ij). That plan has the *other* marginal exact (it was
    just updated), so every entry is at most 1 and the sum cannot overflow: one pass
    of exp instead of the max pass and the exp pass of a stabilised log-sum-exp. The
    sums are the current plan's marginal along `axis`, which gives the marginal error
    for free. Only where a sum underflows (< 1e-30, e.g. an outlier far from every
    target at a cold start) or is NaN, and only for `active` rows, the stabilised
    log-sum-exp is recomputed (a `tf.cond`, so it costs nothing when not needed).

    Returns:
      (new potential, marginal sums of the current plan along `axis`).
    """
    old = u if axis == 2 else v
    # New axes by expand_dims, not slicing: TFLite has no builtin for a strided slice
    # with a new axis on the unknown shapes of a generalised trace (`reduce_retracing`).
    sums = accurate_sum(tf.exp(tf.expand_dims(u, 2) + tf.expand_dims(v, 1) + log_kernel), axis=axis,
                        long=long)
    tiny = _tiny(sums.dtype)
    trusted = sums > tiny  # False for NaN too
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

    `epsilon`, `epsilon_start`, `epsilon_decay`, `threshold` and `num_blocks` (the bound
    on blocks of `check_every` iterations) may be tensors, so that new values do not
    retrace the graph version of the loop; `check_every`, `annealing` (whether ε is
    annealed from `epsilon_start`), `exact_marginal` and `long_sums` (whether sums over
    the n inputs and over the m targets are accumulated in float64, see `accurate_sum`)
    are Python values. Nothing else depends on the static shape, so the graph version
    may generalise it (`reduce_retracing`).

    One iteration updates g (columns exact), then f (rows exact). The loop works with
    scaled potentials u = f/ε_t, v = g/ε_t and the log-kernel K = −C̃/ε computed once;
    under annealing the kernel is used as K·ε/ε_t and u, v are rescaled by ε_{t−1}/ε_t
    when ε changes (this keeps the single-pass log-sum-exp overflow-free, see
    `_half_step`). The error of iteration t is Σ_i |(P1)_i − a_i| for the plan after its
    g update, read off the sums of its f update, so checking it costs no extra pass.

    C̃_ij = C_ij − f⁰_i − g⁰_j is the reduced cost of the start (g⁰ = `g_init`, f⁰ its
    exact c-transform min_j (C_ij − g⁰_j)); the loop starts from v = 0 and its
    potentials are added to (f⁰, g⁰) at the end. The iterates are exactly those on C
    from g⁰ (updates commute with row/column constants), but the loop adds numbers of
    the size of the plan's log-entries, not of C/ε, whose rounding (machine-ε·|C|/ε per
    update) floored the marginal error: near the smallest ε of a dtype, two-bin masks
    on the regular grid ran 1000 iterations at error 2e-3 (float32 and float64).
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

    def annealed_until(it):
        if not annealing:
            return tf.constant(True)
        return eps_at(it) <= eps_final

    all_rows = tf.ones([batch], tf.bool)
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
        at_target = annealed_until(it_new - 1)
        newly = tf.logical_and(at_target,
                               tf.logical_or(err_c < threshold,
                                             tf.logical_not(tf.math.is_finite(err_c))))
        keep = tf.expand_dims(done, 1)
        u_prev = tf.where(keep, u_prev, u_prev_c)
        u = tf.where(keep, u, u_c)
        v = tf.where(keep, v, v_c)
        n_it = tf.where(done, n_it, tf.fill(tf.shape(n_it), it_new))
        err = tf.where(done, err, err_c)
        done = tf.logical_or(done, newly)
        return it_new, u_prev, u, v, n_it, err, done

    init = (
        tf.constant(0, tf.int32),
        u0,
        u0,
        v0,
        tf.zeros([batch], tf.int32),
        tf.fill([batch], tf.constant(math.inf, dtype)),
        tf.logical_not(all_rows),
    )
    it, u_prev, u, v, n_it, err, _ = tf.while_loop(cond, body, init,
                                                   maximum_iterations=num_blocks)
    # The ε the potentials were computed at: the target ε, unless annealing had not
    # reached it within the iteration bound (then no row is done, all rows are at ε_t).
    eps_last = eps_at(tf.maximum(it - 1, 0))
    f = (u if exact_marginal == "input" else u_prev) * eps_last + f_init
    return f, v * eps_last + g_init, n_it, err, eps_last


# In eager mode the loop would run op by op from Python (milliseconds per iteration):
# it runs as one traced graph function. With implicit differentiation (the loop itself
# is not differentiated) it is that function's call inside `tf.function` and XLA as
# well, traced once per process and Python arguments instead of once per caller's trace
# (the loop is about half of an operator's graph; XLA inlines the call). Otherwise, and
# for the backward, graphs inline the plain functions (the backward's solve is chosen by
# the static number of targets). Python arguments are part of the trace key. Both
# traces generalise to unknown shapes after a second shape, so calls at many list
# lengths do not each trace a new graph: the loop's numerics depend on the shape only
# through `long_sums` (an argument), and a generalised backward chooses its solve by m
# when it runs (`implicit_vjp`).
_run_loop_graph = tf.function(_run_loop, autograph=False, reduce_retracing=True)
_implicit_vjp_graph = tf.function(implicit_vjp, autograph=False, reduce_retracing=True)


def _loop(cost, log_a, log_b, g_init, **kwargs):
    """`_run_loop` as a call of its graph function, with the static shapes of its inputs
    on its outputs (a generalised trace returns unknown ones)."""
    f, g, n_it, err, eps_reached = _run_loop_graph(cost, log_a, log_b, g_init, **kwargs)
    f.set_shape(log_a.shape)
    g.set_shape(log_b.shape)
    n_it.set_shape(log_a.shape[:1])
    err.set_shape(log_a.shape[:1])
    return f, g, n_it, err, eps_reached


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
      exact_marginal: which marginal of the returned plan is exact. 'target' (default):
        Pᵀ1 = b, and `error` is the L1 error of P1; the right choice for read-outs
        through Pᵀ (sorts, quantiles). 'input': P1 = a (the plan after one more f
        update, at no extra cost), and the L1 error of Pᵀ1 is at most `error`; the
        right choice for read-outs through a⁻¹ P (ranks, CDFs), which are then exact
        convex combinations of the targets.

    Returns:
      A `SinkhornResult`.
    """
    if option_kwargs or not isinstance(options, SinkhornOptions):
        options = SinkhornOptions.resolve(options, **option_kwargs)
    if exact_marginal not in EXACT_MARGINALS:
        raise ValueError(f"`exact_marginal` must be one of {EXACT_MARGINALS}, "
                         f"got {exact_marginal!r}.")
    epsilon = options.solver_epsilon
    power = options.power
    max_iterations = options.max_iterations
    check_every = min(options.check_every, max_iterations)
    epsilon_start = options.epsilon_start
    implicit = options.implicit_diff is not None

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
    # Numbers go in as tensors: new values of ε or of the threshold do not retrace the
    # graph version of the loop in eager mode (inside tf.function/XLA they are constants).
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

    if not implicit:
        # Differentiated through: inlined in graphs (the gradient of a while loop with a
        # `tf.cond` inside a function call does not compile under XLA).
        run_loop = _eager_or_graph(_run_loop, _run_loop_graph)
        f, g, n_it, err, eps_reached = run_loop(cost, tf.math.log(a), tf.math.log(b),
                                                init_g(x, a, b), **loop_kwargs)
        return SinkhornResult(f, g, cost, tf.stop_gradient(eps_reached), n_it, err)

    cost_s, a_s, b_s = tf.stop_gradient(cost), tf.stop_gradient(a), tf.stop_gradient(b)
    f0, g0, n_it, err, eps_reached = _loop(cost_s, tf.math.log(a_s), tf.math.log(b_s),
                                              init_g(tf.stop_gradient(x), a_s, b_s),
                                              **loop_kwargs)

    # For float32 inputs with the float64 backward (at most 64 targets), the read-outs are
    # differentiated in float64 together with the potentials (`_implicit_readout`).
    backward_dtype = (tf.float64 if float64_backward(options.implicit_diff.solver, m)
                      else dtype)
    readout = functools.partial(_implicit_readout, f=f0, g=g0, cost=cost, a=a, b=b,
                                epsilon=eps_reached, implicit_diff=options.implicit_diff,
                                backward_dtype=backward_dtype)
    f, g = readout(lambda f_, g_, cost_, eps: (tf.identity(f_), tf.identity(g_)))
    return SinkhornResult(f, g, cost, eps_reached, n_it, err,
                          readout=readout if backward_dtype != dtype else None)


def _implicit_readout(fn, *, f, g, cost, a, b, epsilon, implicit_diff, backward_dtype):
    """`fn(f, g, cost, ε)` of the solution (f, g) of the problem (cost, a, b), computed
    in the dtype of the inputs, and differentiated w.r.t. (cost, a, b) in
    `backward_dtype`: by `fn`'s own VJP (w.r.t. f, g and cost) and the implicit VJP
    (`implicit_vjp`) through f and g, summed before rounding to the inputs' dtype.

    The read-outs' gradients w.r.t. f, g and the cost are of size |w|/ε and cancel
    against the implicit ones where the plan is hard; summed in float32 they would leave
    rounding noise of ~1e-7·|w|/ε (0.01 at ε = 1e-5) where the exact gradient is 0. So
    the forward holds no float64, and the backward recomputes `fn` in float64.

    Args:
      fn: a function of (f `[batch, n]`, g `[batch, m]`, cost `[batch, n, m]`, ε) to
        tensors, differentiable by `tf.GradientTape`.
      f, g: the potentials, not differentiated (the loop ran on stopped inputs).
      cost, a, b: the differentiated inputs of the problem.
      epsilon: the ε the potentials solve.
      implicit_diff: the `ImplicitDiff` options.
      backward_dtype: the dtype the gradient is computed in.

    Returns:
      `fn(f, g, cost, ε)`.
    """

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

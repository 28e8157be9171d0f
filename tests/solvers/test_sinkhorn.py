"""Tests of `softsort_tf.solvers.sinkhorn`, the batched log-domain Sinkhorn solver:
marginals of the plan, warm start and annealing, the ε an unfinished annealed run
reached, rows that converge independently of the batch, no retracing for new numbers,
accurate long float32 sums, and no rounding floor of the marginal error at small ε."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from operator_cases import implicit_or_unrolled

import softsort_tf as ss
from softsort_tf.ops import transport as transport_lib
from softsort_tf.solvers import sinkhorn as solver

SETTINGS = settings(max_examples=15, deadline=None, derandomize=True)


seeds = st.integers(0, 10_000)


def random_problem(seed, n, m):
    """A batch of 3 random transport problems: x `[3, n]`, sorted y `[m]`, weights a, b."""
    rng = np.random.RandomState(seed)
    x = rng.rand(3, n)
    a = rng.uniform(0.2, 1.0, (3, n))
    a /= a.sum(-1, keepdims=True)
    b = rng.uniform(0.2, 1.0, m)
    b /= b.sum()
    return x, np.sort(rng.rand(m)), a, b


@SETTINGS
@given(st.integers(2, 20), st.integers(1, 12), st.floats(1e-3, 1.0), seeds,
       st.sampled_from([1.5, 2.0, 3.0]))
def test_plan_marginals(n, m, eps, seed, power):
    x, y, a, b = random_problem(seed, n, m)
    threshold = 1e-4
    res = solver.solve(x, y, a, b, epsilon=eps, power=power, threshold=threshold,
                       max_iterations=20000)
    plan = res.plan().numpy()
    row_err = np.abs(plan.sum(2) - a).sum(-1)
    np.testing.assert_array_less(row_err, threshold)
    np.testing.assert_allclose(plan.sum(1), np.broadcast_to(b, (3, m)), atol=1e-9)
    np.testing.assert_allclose(res.error.numpy(), row_err, rtol=1e-6, atol=1e-12)
    assert np.all(res.num_iterations.numpy() <= 20000)


@SETTINGS
@given(st.integers(2, 20), st.integers(1, 12), st.floats(1e-3, 1.0), seeds,
       st.booleans())
def test_input_exact_plan_marginals(n, m, eps, seed, implicit):
    """exact_marginal='input': rows equal a, columns are within the reported error."""
    x, y, a, b = random_problem(seed, n, m)
    res = solver.solve(x, y, a, b, epsilon=eps, threshold=1e-4,
                       max_iterations=20000, implicit_diff=implicit_or_unrolled(implicit),
                       exact_marginal="input")
    plan = res.plan().numpy()
    np.testing.assert_allclose(plan.sum(2), a, atol=1e-9)
    col_err = np.abs(plan.sum(1) - b).sum(-1)
    np.testing.assert_array_less(col_err, res.error.numpy() + 1e-12)
    np.testing.assert_array_less(res.error.numpy(), 1e-4)
    # Same potentials g as the default plan: both are read from the same iterate.
    target = solver.solve(x, y, a, b, epsilon=eps, threshold=1e-4,
                          max_iterations=20000,
                          implicit_diff=implicit_or_unrolled(implicit))
    np.testing.assert_allclose(res.g.numpy(), target.g.numpy(), atol=1e-9)


def test_speedups_do_not_change_the_answer_and_warm_start_saves_iterations():
    # Three lists (they were the first three of six): each row converges on its own
    # (test_converged_rows_do_not_drift), so the per-row comparisons need no more.
    x = np.random.RandomState(7).rand(6, 100)[:3]
    kw = dict(epsilon=1e-3, squash=None, threshold=1e-6, max_iterations=20000,
              return_info=True)
    ref, info_cold = ss.sinkhorn_rank(x, initializer="zeros", check_every=1, **kw)
    warm, info_warm = ss.sinkhorn_rank(x, **kw)
    anneal, _ = ss.sinkhorn_rank(x, initializer="zeros", epsilon_start=1.0, epsilon_decay=0.8,
                                 **kw)
    np.testing.assert_allclose(warm.numpy(), ref.numpy(), atol=1e-3)
    np.testing.assert_allclose(anneal.numpy(), ref.numpy(), atol=1e-3)
    assert info_warm.num_iterations.numpy().max() < info_cold.num_iterations.numpy().min()


def test_converged_rows_do_not_drift():
    """A row's result and iteration count do not depend on the rest of the batch."""
    rng = np.random.RandomState(8)
    quick = np.tanh(rng.randn(1, 30)) * 0.5 + 0.5
    slow = np.sort(rng.rand(1, 30)) ** 4  # crowded near 0: many iterations at small ε
    kw = dict(epsilon=1e-3, threshold=1e-4, max_iterations=3000, squash=None,
              initializer="zeros", return_info=True)
    rows = [ss.sinkhorn_sort(r, **kw) for r in (quick, slow)]
    both, info_both = ss.sinkhorn_sort(np.concatenate([quick, slow]), **kw)
    n_both = info_both.num_iterations.numpy()
    assert n_both[0] != n_both[1]
    for i, (alone, info_alone) in enumerate(rows):
        assert n_both[i] == info_alone.num_iterations.numpy()[0]
        # Sorted values are read out around the row's median (`Transport.sorted_values`):
        # agreement to float64 rounding of that centre (~1e-16 · 0.1), not of each value.
        np.testing.assert_allclose(both.numpy()[i], alone.numpy()[0], rtol=1e-12, atol=1e-14)


# ε_t = max(1e-3, 0.3 · 0.99^t): after 60 iterations ε_t ≈ 0.166, far from 1e-3.
ANNEALED = dict(epsilon=1e-3, epsilon_start=0.3, epsilon_decay=0.99, max_iterations=60,
                threshold=1e-12)


REACHED = 0.3 * 0.99 ** 59


def _problem(seed=0, batch=3, n=6, m=4):
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.uniform(size=(batch, n)), tf.float64)
    y = tf.constant((np.arange(m) + 0.5) / m, tf.float64)
    return x, y


@pytest.mark.parametrize("implicit", [True, False])
def test_unfinished_annealing_carries_the_epsilon_reached(implicit):
    x, y = _problem()
    result = solver.solve(x, y, implicit_diff=implicit_or_unrolled(implicit), **ANNEALED)
    reached = REACHED
    np.testing.assert_allclose(float(result.epsilon), reached, rtol=1e-12)
    # The plan is the plan of the potentials: its columns are exact (the last update
    # was a g update at ε_t), which fails when the plan is rebuilt at the target ε.
    plan = result.plan().numpy()
    np.testing.assert_allclose(plan.sum(axis=1), np.full((3, 4), 0.25), atol=1e-10)
    # ε_t moves by 1 % an iteration and the problem at ε_t ≈ 0.16 contracts fast: the
    # unfinished annealed run is close to the converged solution at the ε it reached
    # (with the target ε, 1e-3, the rebuilt plan is nowhere near: errors of order 1).
    reference = solver.solve(x, y, epsilon=reached, threshold=1e-13, max_iterations=5000)
    np.testing.assert_allclose(plan, reference.plan().numpy(), atol=2e-3)


def test_unfinished_annealing_gradient_is_that_of_the_epsilon_reached():
    x, y = _problem(seed=1)
    weights = tf.constant(np.random.default_rng(2).normal(size=(3, 6, 4)), tf.float64)

    def objective(x_, **kwargs):
        return tf.reduce_sum(solver.solve(x_, y, **kwargs).plan() * weights)

    def gradient(**kwargs):
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = objective(x, **kwargs)
        return tape.gradient(value, x).numpy()

    annealed = gradient(**ANNEALED)
    reference = gradient(epsilon=REACHED, threshold=1e-13, max_iterations=5000)
    np.testing.assert_allclose(annealed, reference, rtol=0.05, atol=2e-3)


def test_new_epsilon_or_threshold_does_not_retrace_the_eager_solver():
    x = tf.constant(np.random.default_rng(3).normal(size=(2, 7)), tf.float32)
    ss.sinkhorn_rank(x, epsilon=0.1, threshold=1e-3)  # traces once for this shape
    loop_before = solver._run_loop_graph.experimental_get_tracing_count()
    vjp_before = solver._implicit_vjp_graph.experimental_get_tracing_count()
    for eps, threshold in [(0.05, 1e-3), (0.02, 1e-4), (0.01, 1e-5), (0.005, 1e-6)]:
        with tf.GradientTape() as tape:
            tape.watch(x)
            ranks = ss.sinkhorn_rank(x, epsilon=eps, threshold=threshold, max_iterations=300)
        tape.gradient(ranks, x)
    assert solver._run_loop_graph.experimental_get_tracing_count() == loop_before
    # The backward pass traces once (first gradient), not once per ε.
    assert solver._implicit_vjp_graph.experimental_get_tracing_count() <= vjp_before + 1


def test_new_list_lengths_do_not_retrace_the_eager_solver_and_keep_its_values():
    """Eager calls at many list lengths share one generalised trace of the loop and of
    the backward (they traced one graph per length); the values and gradients of each
    of those traces are those of a graph with the static shape. The backward of at most
    64 targets takes float64 potentials, of more targets float32 ones: one trace for the
    first length of each dtype and one generalised trace for the rest, whatever ran
    before (the test also passes alone)."""
    rng = np.random.default_rng(4)
    lengths = (5, 9, 13, 17, 21, 70, 75)  # 70 and 75 targets: the float32 CG backward
    # Each eager trace against a static-shape graph (a trace of its own, ~0.6 s each):
    # the first trace of each backward dtype (5, 70), the first generalised one (9, 75)
    # and a later call reusing the generalised float64-backward trace (21). Lengths 13
    # and 17 run the very same generalised traces as 9 and 21 (the loop's and the
    # backward's numerics depend on n only through `long_sums` and the backward's
    # dtype, the same for 5 ≤ n ≤ 64); they keep the eager checks and the trace counts.
    graph_checked = (5, 9, 21, 70, 75)
    loop_before = solver._run_loop_graph.experimental_get_tracing_count()
    vjp_before = solver._implicit_vjp_graph.experimental_get_tracing_count()

    def ranks_and_gradient(v, w):
        with tf.GradientTape() as tape:
            tape.watch(v)
            r = ss.sinkhorn_rank(v, epsilon=1e-2, threshold=1e-6)
            loss = tf.reduce_sum(r * w)
        return r, tape.gradient(loss, v)

    for n in lengths:
        x = tf.constant(rng.normal(size=(2, n)), tf.float32)
        w = tf.constant(rng.normal(size=(2, n)), tf.float32)
        eager_r, eager_g = ranks_and_gradient(x, w)
        # Soft ranks of one list are a permutation's ranks averaged: they sum to n(n + 1)/2
        # (an off-by-one or a transposed plan breaks it).
        np.testing.assert_allclose(eager_r.numpy().sum(axis=-1), n * (n + 1) / 2, rtol=1e-4)
        assert np.all(np.isfinite(eager_g.numpy())), n
        if n not in graph_checked:
            continue
        graph_r, graph_g = tf.function(ranks_and_gradient)(x, w)
        for got, want in ((eager_r, graph_r), (eager_g, graph_g)):
            assert np.all(np.isfinite(got.numpy()))
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    assert solver._run_loop_graph.experimental_get_tracing_count() <= loop_before + 2
    # Two input dtypes, at most two traces each: fewer than one per length (7).
    assert solver._implicit_vjp_graph.experimental_get_tracing_count() <= vjp_before + 4


@pytest.mark.parametrize("implicit", [True, False], ids=["implicit", "unrolled"])
def test_graphs_of_new_callers_agree_with_eager_and_reuse_the_implicit_loop(implicit):
    """Inside `tf.function` and XLA, values and gradients equal the eager ones and the
    outputs keep the callers' static shapes. With implicit differentiation the loop is a
    call of its graph function: new callers' traces reuse its trace (generalised after a
    second shape). Unrolled gradients go through the inlined loop (they compile under XLA)."""
    rng = np.random.default_rng(5)
    x = tf.constant(rng.normal(size=(3, 6)), tf.float64)
    diff = implicit_or_unrolled(implicit)

    def sort_and_gradient(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            s = ss.sinkhorn_sort(v, epsilon=0.1, threshold=1e-9, implicit_diff=diff)
            loss = tf.reduce_sum(s * tf.cast(tf.range(tf.shape(v)[-1]), v.dtype) ** 2)
        return s, tape.gradient(loss, v)

    want = sort_and_gradient(x)
    sort_and_gradient(tf.constant(rng.normal(size=(2, 9))))  # a second shape: generalised
    before = solver._run_loop_graph.experimental_get_tracing_count()
    # Two new callers as graphs (each traced anew), the second under XLA.
    for jit in (False, True):
        fn = tf.function(sort_and_gradient, jit_compile=jit)
        concrete = fn.get_concrete_function(tf.TensorSpec([3, 6], tf.float64))
        assert concrete.structured_outputs[0].shape == (3, 6)
        calls = [op.get_attr("f").name for op in concrete.graph.get_operations()
                 if op.type in ("PartitionedCall", "StatefulPartitionedCall")]
        assert any("_run_loop" in name for name in calls) == implicit, calls
        for got, ref in zip(fn(x), want, strict=True):
            assert np.all(np.isfinite(got.numpy())) and np.abs(got.numpy()).max() > 0.1
            np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-9, atol=1e-12)
    if implicit:
        assert solver._run_loop_graph.experimental_get_tracing_count() == before


def test_long_float32_sums_are_accurate():
    values = np.random.default_rng(0).uniform(0.5, 1.5, size=(2, 1_000_000)).astype(np.float32)
    exact = values.astype(np.float64).sum(axis=1)
    got = solver.accurate_sum(tf.constant(values), axis=1).numpy()
    np.testing.assert_allclose(got, exact, rtol=1e-7)
    # Short axes keep the plain float32 sum (no cast on the hot path of small problems).
    short = tf.constant(values[:, :100])
    np.testing.assert_array_equal(solver.accurate_sum(short, axis=1).numpy(),
                                  tf.reduce_sum(short, axis=1).numpy())


@pytest.mark.slow
def test_quantiles_of_a_million_values_converge_alike_eagerly_and_under_xla():
    x = tf.constant(np.random.default_rng(1).normal(size=(1, 1_000_000)), tf.float32)

    def quantiles(v):
        return ss.sinkhorn_quantile(v, [0.1, 0.5, 0.9], return_info=True)

    eager, eager_info = quantiles(x)
    xla, xla_info = tf.function(quantiles, jit_compile=True)(x)
    # Before float64 accumulation, the eager float32 column sums drifted by ~1e-3 and
    # the eager run stalled at error 1.02e-3 > threshold for 1000 iterations (130 s).
    for info in (eager_info, xla_info):
        assert info.num_iterations.numpy()[0] < 50
        assert info.error.numpy()[0] < 1e-3
    np.testing.assert_array_equal(eager_info.num_iterations.numpy(),
                                  xla_info.num_iterations.numpy())
    np.testing.assert_allclose(eager.numpy(), xla.numpy(), atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("targets", ["centres", "regular"])
def test_two_bin_masks_converge_at_the_smallest_epsilon(dtype, targets):
    """At ε = `min_epsilon(dtype)` the top-k mask converges at once to the hard mask on
    both grids. The loop used to add potentials of size |C|/ε, rounded to about
    machine-ε·|C|/ε each update, so the marginal error stalled at 1e-3–2e-3 on the
    regular grid (1000 iterations, unconverged, in float32 and float64 alike)."""
    x = np.random.default_rng(14).normal(size=(6, 8)).astype(dtype)
    eps = transport_lib.min_epsilon(dtype)
    for k in (1, 2, 5):
        hard = np.zeros(x.shape)
        np.put_along_axis(hard, np.argsort(-x, axis=1)[:, :k], 1.0, axis=1)
        mask, info = ss.sinkhorn_topk(x, k, epsilon=eps, targets=targets,
                                           return_info=True)
        assert np.all(info.num_iterations.numpy() <= 3)
        assert np.all(info.error.numpy() < 1e-3)
        np.testing.assert_allclose(mask.numpy(), hard, atol=1e-3)


@pytest.mark.parametrize("dtype, epsilon", [(np.float32, 1e-4), (np.float64, 1e-12)])
def test_marginal_error_has_no_rounding_floor_of_size_cost_over_epsilon(dtype, epsilon):
    """The solver reaches a tight threshold at a small ε: its error is not floored at
    about machine-ε·|C|/ε. Before the loop worked on the reduced cost every row here
    ran 2000 iterations and stalled at 3e-5–5e-5 (float32, 2 targets), 1e-5–1.6e-5
    (float64, 2 targets), and above 1e-6 on 3 and 12 targets."""
    rng = np.random.default_rng(5)
    x = rng.uniform(0.1, 0.9, size=(4, 12)).astype(dtype)
    for y, b in (([0.0, 1.0], [0.25, 0.75]), ([0.0, 0.5, 1.0], [0.1, 0.8, 0.1]),
                 (np.linspace(0.0, 1.0, 12), np.full(12, 1 / 12))):
        result = solver.solve(x, np.asarray(y, dtype), b=np.asarray(b, dtype),
                              epsilon=epsilon, threshold=1e-6, max_iterations=2000)
        assert np.all(result.error.numpy() < 1e-6), result.error.numpy()


def test_float32_read_outs_are_the_float64_ones_of_the_same_potentials_rounded():
    """The read-outs of float32 potentials are computed in float32 (f_i + g_j summed
    exactly) and equal those computed in float64 from the same potentials to float32
    rounding, eagerly and under XLA. Rounded in place, f_i + g_j moved log P by
    ulp(f + g)/ε (2e-3 at ε = 1e-5)."""
    rng = np.random.RandomState(9)
    x = tf.constant(rng.rand(3, 16), tf.float32)
    y = tf.linspace(0.0, 1.0, 16)

    def read_outs(f, g, cost, eps):
        res = solver.SinkhornResult(f, g, cost, eps, None, None)
        return res.log_plan(), res.plan(), res.row_plan()

    xla = tf.function(read_outs, jit_compile=True)
    for eps in (1e-2, 1e-5):
        res = solver.solve(x, y, epsilon=eps)
        f, g, cost = (tf.cast(t, tf.float64) for t in (res.f, res.g, res.cost))
        log_plan = ((f[:, :, None] + g[:, None, :] - cost)
                    / tf.cast(res.epsilon, tf.float64)).numpy()
        row_logits = log_plan - log_plan.max(-1, keepdims=True)
        want = (log_plan, np.exp(log_plan),
                np.exp(row_logits) / np.exp(row_logits).sum(-1, keepdims=True))
        for mode, got in (("eager", read_outs(res.f, res.g, res.cost, res.epsilon)),
                          ("xla", xla(res.f, res.g, res.cost, res.epsilon))):
            got = [t.numpy() for t in got]
            assert all(t.dtype == np.float32 and np.isfinite(t).all() for t in got), mode
            np.testing.assert_allclose(got[0], log_plan, rtol=3e-7, atol=1e-6,
                                       err_msg=f"log_plan, ε = {eps}, {mode}")
            # exp and the softmax relative to |log P| ulps: P within 1e-5 where P > 1e-3.
            for name, value, ref in (("plan", got[1], want[1]), ("row_plan", got[2], want[2])):
                np.testing.assert_allclose(value, ref, rtol=1e-5, atol=1e-8,
                                           err_msg=f"{name}, ε = {eps}, {mode}")


@pytest.mark.parametrize("dtype, large", [(np.float32, 40.0), (np.float64, 1e6)])
def test_zero_weight_rows_read_out_the_limits_of_their_potentials(dtype, large):
    """Inputs of weight a_i = 0 (f_i = −∞): their rows of log P are −∞ and of P 0, and
    their row-conditional plan is softmax_j((g_j − C_ij)/ε) of the same potentials
    (float64 reference), finite eagerly and under XLA, also for a large x_i (C_ij/ε up
    to 2e13); the gradients are finite, the float64 one equals central differences and
    the float32 one the float64 one."""
    x = np.array([[0.3, 0.1, 0.7, 0.9, large], [0.2, 0.15, 0.6, 0.4, 0.5]])
    a = np.array([[1.0, 1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 2.0, 1.0]])
    a /= a.sum(-1, keepdims=True)
    y = np.linspace(0.1, 0.9, 5)
    zero = a == 0
    probe = np.random.RandomState(3).rand(2, 5, 5)

    def run(x_):
        res = solver.solve(x_, tf.constant(y, x_.dtype), tf.constant(a, x_.dtype),
                           epsilon=0.05, threshold=1e-12, max_iterations=5000)
        reads = res.log_plan(), res.plan(), res.row_plan()
        loss = tf.reduce_sum(tf.cast(probe, x_.dtype) * (reads[1] + reads[2]))
        return reads, res.f, res.g, res.cost, res.epsilon, loss

    def with_gradient(x_):
        with tf.GradientTape() as tape:
            tape.watch(x_)
            *out, loss = run(x_)
        return out, loss, tape.gradient(loss, x_)

    xla = tf.function(with_gradient, jit_compile=True)
    grads = {}
    for mode, fn in (("eager", with_gradient), ("xla", xla)):
        ((log_plan, plan, row_plan), f, g, cost, eps), _, grad = fn(tf.constant(x, dtype))
        logits = ((g.numpy()[:, None, :].astype(np.float64) - cost.numpy())
                  / float(eps.numpy()))
        logits -= logits.max(-1, keepdims=True)
        want = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        assert np.all(np.isneginf(f.numpy()[zero])), mode
        assert np.all(np.isneginf(log_plan.numpy()[zero])), mode
        assert np.all(plan.numpy()[zero] == 0), mode
        for t in (plan, row_plan, grad):
            assert np.isfinite(t.numpy()).all(), mode
        np.testing.assert_allclose(row_plan.numpy()[zero], want[zero], rtol=1e-5, atol=1e-7,
                                   err_msg=mode)
        grads[mode] = grad.numpy()
    np.testing.assert_allclose(grads["xla"], grads["eager"], rtol=1e-4, atol=1e-6)
    if dtype == np.float64:
        step, fd = 1e-6, np.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            if x[idx] > 10:  # its plan is hard: no gradient
                continue
            dx = np.zeros_like(x)
            dx[idx] = step
            fd[idx] = (run(tf.constant(x + dx))[-1] - run(tf.constant(x - dx))[-1]) / (2 * step)
        np.testing.assert_allclose(grads["eager"], fd, rtol=1e-5, atol=1e-6)
    else:
        reference = with_gradient(tf.constant(x))[2].numpy()
        np.testing.assert_allclose(grads["eager"], reference, rtol=1e-3, atol=1e-4)

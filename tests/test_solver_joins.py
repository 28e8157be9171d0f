"""The solver's joins: the ε an annealed run reached, and no retracing for new numbers."""

import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss
from softsort_tf.solvers import sinkhorn as solver


def _diff(implicit: bool, solver: str = "auto"):
    """`implicit_diff` of an implicit (True) or unrolled (False) solve."""
    return ss.ImplicitDiff(solver=solver) if implicit else None

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
    result = solver.solve(x, y, implicit_diff=_diff(implicit), **ANNEALED)
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


@pytest.mark.parametrize("direction", ["ASCENDING", "DESCENDING", "descending"])
def test_quantile_normalization_keeps_the_order_of_x_in_both_directions(direction):
    x = tf.constant([[0.3, -2.0, 1.0, 0.5], [4.0, 3.0, 2.0, 1.0]], tf.float64)
    targets = [10.0, 20.0, 30.0, 40.0]
    out = ss.sinkhorn_quantile_normalization(x, targets, direction=direction, epsilon=1e-4,
                                             threshold=1e-9).numpy()
    hard = np.sort(targets)[np.argsort(np.argsort(x.numpy(), axis=-1), axis=-1)]
    np.testing.assert_allclose(out, hard, atol=1e-3)
    layer = ss.SinkhornQuantileNormalization(num_targets=4, direction=direction, epsilon=1e-4)
    y = layer(x).numpy()
    assert np.all(np.argsort(y, axis=-1) == np.argsort(x.numpy(), axis=-1))


def test_quantile_normalization_rejects_a_bad_direction():
    with pytest.raises(ValueError, match="`direction`"):
        ss.sinkhorn_quantile_normalization([1.0, 2.0], [0.0, 1.0], direction="UP")


def test_per_row_target_weights_of_the_wrong_batch_size_are_rejected():
    x = np.random.default_rng(4).normal(size=(3, 5))
    with pytest.raises(ValueError, match="`target_weights`"):
        ss.sinkhorn_sort(x, target_weights=np.full((2, 4), 0.25))
    ok = ss.sinkhorn_sort(x, target_weights=np.full((3, 4), 0.25))
    assert ok.shape == (3, 4)

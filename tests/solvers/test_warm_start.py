"""Tests of `softsort_tf.solvers.warm_start`: the exact 1-D dual potential against numpy,
in float32 and float64, eagerly and under XLA."""

import numpy as np
import pytest
import tensorflow as tf

from softsort_tf.solvers import sinkhorn as sinkhorn_solver


def np_exact_target_potential(x, y):
    """Exact 1-D dual potential for uniform weights and n = m (squared cost), numpy.

    With n = m every boundary B_j = j/n is a tie between the j-th and (j+1)-th smallest
    inputs, so x*_j is their midpoint and g_{j+1} − g_j = c(x*_j, y_{j+1}) − c(x*_j, y_j).
    """
    xs = np.sort(x, axis=-1)
    x_star = 0.5 * (xs[:, :-1] + xs[:, 1:])
    inc = (x_star - y[1:]) ** 2 - (x_star - y[:-1]) ** 2
    g = np.concatenate([np.zeros_like(inc[:, :1]), np.cumsum(inc, axis=-1)], axis=-1)
    return g - g[:, (g.shape[-1] - 1) // 2][:, None]  # anchored at the middle target


@pytest.mark.parametrize("jit_compile", [False, True])
def test_warm_start_is_the_exact_potential_in_float32_and_under_xla(jit_compile):
    """Ties of the cumulative masses are found despite float32 running-sum drift.

    Regression: under XLA a constant-folded cumulative sum of 1/n and a run-time one
    differed by ~1e-5 at n = 1000, which split exact ties at random: the warm start was
    off by 4e-4 (0.04 ε) and XLA needed twice the iterations of eager mode.
    """
    n = 1000
    x = np.random.RandomState(11).rand(2, n)
    y = np.linspace(0.0, 1.0, n)

    def potential(x_):
        batch = tf.shape(x_)[0]
        yb = tf.broadcast_to(tf.constant(y, x_.dtype)[None], tf.stack([batch, n]))
        a = tf.fill(tf.stack([batch, n]), tf.constant(1.0 / n, x_.dtype))
        b = tf.fill(tf.stack([batch, n]), tf.cast(1.0, x_.dtype) / tf.cast(n, x_.dtype))
        return sinkhorn_solver.exact_target_potential(x_, a, yb, b, 2.0)

    def both(x32, x64):  # under XLA: the two dtypes in one program (one compile)
        return potential(x32), potential(x64)

    fn = tf.function(both, jit_compile=True) if jit_compile else both
    g, g64 = fn(tf.constant(x, tf.float32), tf.constant(x, tf.float64))
    np.testing.assert_allclose(g.numpy(), np_exact_target_potential(x, y), atol=1e-6,
                               err_msg="float32")
    np.testing.assert_allclose(g64.numpy(), np_exact_target_potential(x, y), atol=1e-12,
                               err_msg="float64")


def test_count_below_is_searchsorted_left():
    """The warm start finds the boundaries by one merged sort (a TFLite kernel exists
    for it; LowerBound has none, not even a flex one): the same indices as
    `tf.searchsorted(side='left')`, ties with the values included."""
    from softsort_tf.solvers.warm_start import _count_below

    rng = np.random.default_rng(3)
    for _ in range(50):
        n, k = rng.integers(1, 30), rng.integers(1, 10)
        values = np.sort(np.round(rng.uniform(size=(3, n)) * 8) / 8, -1)
        levels = np.sort(np.round(rng.uniform(-0.2, 1.2, size=(3, k)) * 8) / 8, -1)
        want = tf.searchsorted(tf.constant(values), tf.constant(levels), side="left")
        np.testing.assert_array_equal(_count_below(tf.constant(values), tf.constant(levels)),
                                      want)

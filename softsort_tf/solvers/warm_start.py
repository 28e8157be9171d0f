"""Warm start of the Sinkhorn loop: the dual potential of the exact 1-D problem.

In one dimension the unregularised transport between x (weights a) and sorted targets
y (weights b) is solved by sorting (north-west corner rule, Proposition 1 of Cuturi,
Teboul & Vert, 2019), so its dual potential g is available in O((n + m) log n). The
Sinkhorn loop starts from it (`initializer='sorted'`).
"""

from __future__ import annotations

import tensorflow as tf

from softsort_tf.solvers.cost import pair_cost


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
    # Cumulative masses, exactly: a float32 running sum drifts by up to n ulps (1e-5 at
    # n = 1000), more than the tie tolerance, so two sums of equal masses computed
    # differently (e.g. a fill of 1/n constant-folded by XLA and one computed at run
    # time) would split exact ties at random and spoil the warm start. float64 inputs
    # sum in float64; float32 ones in fixed point (int64 multiples of 2⁻⁴⁰: each mass
    # rounded by at most 2⁻⁴¹, the sums exact, no float64 in the graph).
    if x.dtype == tf.float64:
        cum_a = tf.cumsum(tf.gather(a, order, batch_dims=1), axis=-1)
        bounds = tf.cumsum(b, axis=-1)[:, :-1]  # [B, m - 1]
        tol = tf.constant(1e-12, tf.float64)
    else:
        cum_a = tf.cumsum(_fixed_point(tf.gather(a, order, batch_dims=1)), axis=-1)
        bounds = tf.cumsum(_fixed_point(b), axis=-1)[:, :-1]
        # Ties: boundaries within 1e-6 of a cumulative input mass (float32 weights are
        # rounded to ~6e-8 relative, far below).
        tol = _fixed_point(tf.constant(1e-6, tf.float32))
    last = tf.shape(x)[-1] - 1

    def first_reaching(level):  # index of the first i with cum_a[i] >= level
        return tf.minimum(_count_below(cum_a, level), last)

    k_lo = first_reaching(bounds - tol)
    k_hi = first_reaching(bounds + tol)
    x_star = 0.5 * (tf.gather(xs, k_lo, batch_dims=1) + tf.gather(xs, k_hi, batch_dims=1))
    increments = pair_cost(x_star, y[:, 1:], power) - pair_cost(x_star, y[:, :-1], power)
    # The first potential is 0 (read off y, not the increments: m may be 1 at run time).
    g = tf.concat([tf.zeros_like(y[:, :1]), tf.cumsum(increments, axis=-1)], axis=-1)
    return g - tf.reduce_mean(g, axis=-1, keepdims=True)


_FIXED_POINT = 2.0 ** 40


def _fixed_point(t):
    """float32 masses in [0, 1] as int64 multiples of 2⁻⁴⁰ (rounded to nearest)."""
    return tf.cast(tf.round(tf.cast(t, tf.float32) * _FIXED_POINT), tf.int64)


def _count_below(values, levels):
    """#{i : values[b, i] < levels[b, j]} `[batch, k]` for rows of `values` `[batch, n]`
    and of `levels` `[batch, k]`, both sorted increasingly and of one real or integer
    dtype (`tf.searchsorted(values, levels, side='left')`). By one stable sort of the
    levels followed by the values: a level's position in the merged order counts the
    values strictly below it (equal values come after it) plus the j levels before it.
    O((n + k) log(n + k)); unlike searchsorted (LowerBound), it has TFLite kernels."""
    k = tf.shape(levels)[-1]
    merged = tf.concat([levels, values], axis=-1)
    order = tf.argsort(merged, axis=-1, stable=True)
    position = tf.argsort(order, axis=-1, stable=True)  # the inverse permutation
    return position[:, :k] - tf.range(k)[None, :]

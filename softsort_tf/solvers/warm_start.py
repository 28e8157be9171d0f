"""Warm start of the Sinkhorn loop (`initializer='sorted'`): the dual potential of the
unregularised 1-D problem, solved by sorting in O((n + m) log n)."""

from __future__ import annotations

import tensorflow as tf

from softsort_tf.solvers.cost import cost_increment


def exact_target_potential(x, a, y, b, power: float):
    """Dual potential g `[batch, m]` of the unregularised 1-D problem (warm start).

    Sorting x gives the optimal plan (north-west corner rule, Prop. 1 of Cuturi, Teboul &
    Vert, 2019); complementary slackness on its staircase gives g_{j+1} − g_j =
    c(x*_j, y_{j+1}) − c(x*_j, y_j), x*_j the input straddling the cumulative mass
    b_1 + … + b_j (the midpoint of two inputs when it falls between them).
    """
    m = y.shape[-1]
    if m == 1:
        return tf.zeros_like(y)
    order = tf.argsort(x, axis=-1, stable=True)
    xs = tf.gather(x, order, batch_dims=1)
    # Cumulative masses, exactly (a float32 running sum drifts past the tie tolerance and
    # splits exact ties at random): float32 ones in fixed point, int64 multiples of 2⁻⁴⁰.
    if x.dtype == tf.float64:
        cum_a = tf.cumsum(tf.gather(a, order, batch_dims=1), axis=-1)
        bounds = tf.cumsum(b, axis=-1)[:, :-1]  # [B, m - 1]
        tol = tf.constant(1e-12, tf.float64)
    else:
        cum_a = tf.cumsum(_fixed_point(tf.gather(a, order, batch_dims=1)), axis=-1)
        bounds = tf.cumsum(_fixed_point(b), axis=-1)[:, :-1]
        # Ties: boundaries within 1e-6 of a cumulative input mass.
        tol = _fixed_point(tf.constant(1e-6, tf.float32))
    last = tf.shape(x)[-1] - 1

    def first_reaching(level):  # index of the first i with cum_a[i] >= level
        return tf.minimum(_count_below(cum_a, level), last)

    k_lo = first_reaching(bounds - tol)
    k_hi = first_reaching(bounds + tol)
    x_star = 0.5 * (tf.gather(xs, k_lo, batch_dims=1) + tf.gather(xs, k_hi, batch_dims=1))
    increments = cost_increment(x_star, y[:, :-1], y[:, 1:], power)
    # The first potential is 0 (read off y, not the increments: m may be 1 at run time).
    g = tf.concat([tf.zeros_like(y[:, :1]), tf.cumsum(increments, axis=-1)], axis=-1)
    # Anchored at the middle target, not the mean: a far input moves the potentials at
    # its end of the grid by its own distance, and a mean would carry that into every
    # entry (float32 then rounds the bulk's differences away).
    middle = (tf.shape(g)[-1] - 1) // 2
    return g - g[:, middle:middle + 1]


_FIXED_POINT = 2.0 ** 40


def _fixed_point(t):
    """float32 masses in [0, 1] as int64 multiples of 2⁻⁴⁰ (rounded to nearest)."""
    return tf.cast(tf.round(tf.cast(t, tf.float32) * _FIXED_POINT), tf.int64)


def _count_below(values, levels):
    """`tf.searchsorted(values, levels, side='left')` `[batch, k]` for sorted rows of one
    dtype, by a stable sort of the levels followed by the values (a level's position
    counts the values strictly below it plus the levels before it): unlike LowerBound,
    it has TFLite kernels."""
    k = tf.shape(levels)[-1]
    merged = tf.concat([levels, values], axis=-1)
    order = tf.argsort(merged, axis=-1, stable=True)
    position = tf.argsort(order, axis=-1, stable=True)  # the inverse permutation
    return position[:, :k] - tf.range(k)[None, :]

"""The transport cost |x − y|^p of the Sinkhorn operators."""

from __future__ import annotations

import tensorflow as tf


def cost_matrix(x, y, power: float = 2.0):
    """C_ij = |x_i − y_j|^power for x `[batch, n]`, y `[batch, m]`, less a term r_i per
    input for power 2: r_i = (x_i − y_k)², y_k the target nearest x_i, so that
    C_ij = (y_j − y_k)(y_j + y_k − 2x_i).

    A term per input is absorbed by the input potential f: the plan, its marginals,
    every read-out and their gradients are those of |x_i − y_j|². The entries are then
    products of two differences, of the size |x − y_k|·|y_j − y_k| instead of |x − y_j|²:
    float32 rounds them by ≈ 1e-7 of that, which neither grows with the square of the
    values' spread nor leaves the entries near the plan's support (y_j ≈ y_k ≈ x_i)
    rounded by more than their own size.
    """
    if power != 2.0:
        return pair_cost(x[:, :, None], y[:, None, :], power)
    x, y = x[:, :, None], y[:, None, :]
    nearest = tf.argmin(tf.abs(x - y), axis=-1, output_type=tf.int32)  # [batch, n]
    y_k = tf.stop_gradient(tf.gather(y[:, 0, :], nearest, batch_dims=1))[:, :, None]
    return cost_increment(x, y_k, y, power)


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


def cost_increment(x, y_from, y_to, power: float = 2.0):
    """c(x, y_to) − c(x, y_from) elementwise; for power 2 as (y_to − y_from)(y_to + y_from
    − 2x), without the cancellation of two squares."""
    if power == 2.0:
        return (y_to - y_from) * (y_to + y_from - 2.0 * x)
    return pair_cost(x, y_to, power) - pair_cost(x, y_from, power)

"""The transport cost |x − y|^p of the Sinkhorn operators."""

from __future__ import annotations

import tensorflow as tf


def cost_matrix(x, y, power: float = 2.0):
    """C_ij = |x_i − y_j|^power for x `[batch, n]`, y `[batch, m]`."""
    return pair_cost(x[:, :, None], y[:, None, :], power)


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

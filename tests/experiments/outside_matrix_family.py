"""A family with a relaxed permutation matrix, registered from outside the package when
this file is imported: the binaries' `--family_modules` imports it, and `--method`
then takes its name (tests/experiments/test_large_mnist.py). Only the public API.

P̂ row i (the i-th position of the `direction` order) is a softmax over the valid items
of −(r_j − i)²/κ, r the Gaussian-smoothed ranks r_j = ½ + Σ_l Φ((x_j − x_l)/σ).
"""

import math

import numpy as np
import tensorflow as tf

import softsort_tf as ss

NAME = "gaussian_matrix_test"


def gaussian_matrix(scores, *, direction="DESCENDING", hard=False, mask=None, sigma=1.0,
                    log=False):
    x = tf.convert_to_tensor(scores)
    keys = -x if direction == "DESCENDING" else x
    valid = tf.ones_like(keys, tf.bool) if mask is None else tf.broadcast_to(
        tf.cast(mask, tf.bool), tf.shape(keys))
    weights = tf.cast(valid, keys.dtype)
    z = (keys[..., :, None] - keys[..., None, :]) / (sigma * math.sqrt(2.0))
    ranks = 0.5 + tf.reduce_sum(0.5 * tf.math.erfc(-z) * weights[..., None, :], axis=-1)
    positions = tf.range(1, tf.shape(keys)[-1] + 1, dtype=keys.dtype)
    logits = -((ranks[..., None, :] - positions[:, None]) ** 2) / 0.1
    logits = tf.where(valid[..., None, :], logits, tf.constant(-np.inf, keys.dtype))
    count = tf.reduce_sum(weights, axis=-1)[..., None, None]
    rows = positions[:, None] <= count
    log_perm = tf.where(rows, tf.nn.log_softmax(logits, axis=-1),
                        tf.constant(-np.inf, keys.dtype))
    if log:
        return log_perm
    perm = tf.exp(log_perm)
    if hard:
        perm = ss.straight_through(ss.hard_permutation_matrix(x, direction, mask=mask), perm)
    return perm


ss.register_family(ss.Family(
    NAME, "sigma", 1.0, "scale σ of the Gaussian smoothing, in the units of the scores",
    "softsort_tf's tests", matrix_fn=gaussian_matrix, log_domain=True), replace=True)

"""Squashing functions that map raw scores into [0, 1] before transport.

The Sinkhorn operators compare inputs to a target grid on [0, 1] (Cuturi et al.,
2019, §3 "Cost function"); in the ε → 0 limit the result does not change under any
increasing transform of the inputs, so inputs are first standardised along the sort
axis and then passed through an increasing map g̃ into [0, 1] (the talk's
Algorithm 2, g̃(x) = g((x − mean) / std)).

- `'logistic'`: g(z) = sigmoid(π z / √3), the CDF of a logistic law with unit
  variance, as in the papers and the reference implementation.
- `'atan'`: g(z) = 1/2 + arctan(z) / π, heavier-tailed: outliers are squashed less
  hard against 0 and 1.
- `None`: inputs are used as given (use for values already in [0, 1]).

The standardisation is scale-free and safe: it divides by the largest absolute
deviation before squaring, so inputs from 1e-30 to 1e30 give finite outputs, and a
constant row maps to 0.5 everywhere with finite gradients. With input weights (the
operators' `weights`) the mean and standard deviation are weighted by them.
"""

from __future__ import annotations

import math

import tensorflow as tf

SQUASHES = ("logistic", "atan", None)


def check_squash(squash):
    if isinstance(squash, str):
        squash = squash.lower()
        if squash == "none":
            squash = None
    if squash not in SQUASHES:
        raise ValueError(f"`squash` must be 'logistic', 'atan' or None, got {squash!r}.")
    return squash


def _safe_positive(v):
    return tf.where(v > 0, v, tf.ones_like(v))


def standardize(x, axis: int = -1, weights=None):
    """(x − mean) / std along `axis`, computed without overflow; 0 for constant rows.

    Args:
      x: input of any rank.
      axis: the axis to standardise along.
      weights: optional non-negative weights of the entries, broadcastable to x (for
        example the input measure a of the transport): the mean and standard deviation
        are then weighted, so entries of zero or tiny weight (outliers given no mass)
        do not compress the others towards one value. None: uniform weights.

    Returns:
      A tensor like x.
    """
    if weights is None:
        centred = x - tf.reduce_mean(x, axis=axis, keepdims=True)
        scale = tf.reduce_max(tf.abs(centred), axis=axis, keepdims=True)
        z = centred / _safe_positive(scale)
        std = tf.sqrt(tf.reduce_mean(tf.square(z), axis=axis, keepdims=True))
        return z / _safe_positive(std)
    w = tf.broadcast_to(tf.cast(weights, x.dtype), tf.shape(x))
    w = w / _safe_positive(tf.reduce_sum(w, axis=axis, keepdims=True))
    # Scale-free like the unweighted case, but only entries with mass set the scale, so
    # a zero-weight outlier cannot underflow the others; such an outlier gets a large
    # |z| (the squash maps it to ~0 or ~1) instead.
    has_mass = w > 0
    zeros = tf.zeros_like(x)
    mean = tf.reduce_sum(tf.where(has_mass, w * x, zeros), axis=axis, keepdims=True)
    centred = x - mean
    scale = tf.reduce_max(tf.where(has_mass, tf.abs(centred), zeros), axis=axis,
                          keepdims=True)
    z = centred / _safe_positive(scale)
    var = tf.reduce_sum(tf.where(has_mass, w * tf.square(z), zeros), axis=axis, keepdims=True)
    return z / _safe_positive(tf.sqrt(var))


def squash_values(x, squash="logistic", axis: int = -1, weights=None):
    """Applies the squashing `squash` ('logistic', 'atan' or None) along `axis`.

    Args:
      x: input of any rank.
      squash: 'logistic', 'atan' or None (returns x unchanged).
      axis: the axis the values are compared along.
      weights: optional non-negative weights for a weighted standardisation (see
        `standardize`); the Sinkhorn operators pass their input weights a.

    Returns:
      A tensor like x, in [0, 1] unless `squash` is None.
    """
    squash = check_squash(squash)
    if squash is None:
        return x
    z = standardize(x, axis=axis, weights=weights)
    if squash == "logistic":
        return tf.sigmoid(z * (math.pi / math.sqrt(3.0)))
    return 0.5 + tf.atan(z) / math.pi

"""Squashing functions that map raw scores into [0, 1] before transport.

The Sinkhorn operators compare inputs to a target grid on [0, 1] (Cuturi et al., 2019,
§3), so inputs are standardised along the list and mapped into [0, 1] (the talk's
Algorithm 2): `'logistic'` (default, sigmoid(π z / √3)), `'atan'` (1/2 + arctan(z)/π),
`'robust'` (the asinh-compressed median/MAD z-score, then the arctan map) or `None`
(the values as they are, ε then in their units: raw scores whose scale the model
learns); docs/options.md. Statistics are weighted by the input
weights and computed without overflow, float32 subnormals included; a constant row maps
to 0.5 with finite gradients.
"""

from __future__ import annotations

import math

import tensorflow as tf

from softsort_tf import _checks, _masking

SQUASHES = ("logistic", "atan", "robust", None)
MAD_TO_STD = 1.4826  # MAD of a normal law times this is its standard deviation


def check_squash(squash):
    if isinstance(squash, str):
        squash = squash.lower()
        if squash == "none":
            squash = None
    return _checks.check_choice("squash", squash, SQUASHES)


def _safe_positive(v):
    return tf.where(v > 0, v, tf.ones_like(v))


def exact_float64(x):
    """x as float64, float32 subnormals rebuilt from their bits (CPU kernels flush them
    to zero); the gradient of a plain cast."""
    x = tf.convert_to_tensor(x)
    if x.dtype == tf.float64:
        return x
    x32 = tf.cast(x, tf.float32)
    cast = tf.cast(x32, tf.float64)
    bits = tf.bitcast(x32, tf.int32)
    mantissa = tf.bitwise.bitwise_and(bits, 0x7FFFFF)
    subnormal = tf.logical_and(tf.bitwise.bitwise_and(bits, 0x7F800000) == 0, mantissa != 0)
    magnitude = tf.cast(mantissa, tf.float64) * (2.0 ** -149)
    rebuilt = tf.where(bits < 0, -magnitude, magnitude)
    return cast + tf.stop_gradient(tf.where(subnormal, rebuilt, cast) - cast)


def _scale_invariant_float32(x, axis):
    """float32 x whose rows (along `axis`) of magnitude below 2⁻¹⁰⁰ are multiplied by
    2¹⁰⁰ exactly, subnormals rebuilt from their bits (magnitude bits m = x·2¹⁴⁹, m·2⁻⁴⁹
    is normal; one constant factor each, as 2¹⁴⁹ overflows float32): scale-invariant
    functions (`standardize`) keep such rows' order in float32, TFLite builtins only."""
    bits = tf.cast(tf.bitcast(x, tf.int32), tf.int64)
    negative = bits < 0
    magnitude = tf.where(negative, bits + 2 ** 31, bits)   # order-preserving in |x|
    subnormal = tf.logical_and(magnitude > 0, magnitude < 2 ** 23)
    rebuilt = tf.cast(magnitude, tf.float32) * 2.0 ** -49
    rebuilt = tf.where(negative, -rebuilt, rebuilt)
    plain = x * 2.0 ** 100   # the gradient of the scaling, for every entry
    scaled = plain + tf.stop_gradient(tf.where(subnormal, rebuilt, plain) - plain)
    tiny = tf.reduce_max(magnitude, axis=axis, keepdims=True) < 0x0D800000  # |x| < 2⁻¹⁰⁰
    return tf.where(tiny, scaled, x)


def _weighted(x, weights, axis):
    """Normalised weights broadcast to x (uniform for None) and the mask of entries with
    mass."""
    if weights is None:
        w = tf.ones_like(x)
    else:
        w = tf.broadcast_to(tf.cast(weights, x.dtype), tf.shape(x))
    w = w / _safe_positive(tf.reduce_sum(w, axis=axis, keepdims=True))
    return w, w > 0


def _scale_free_centre(x, has_mass, axis):
    """(x − c) / s with c the mid-range and s the largest absolute deviation of the
    entries with mass: in [−1, 1] for them, and computed without overflow even for
    values near the largest float (|x − c| ≤ (max − min)/2)."""
    big = tf.constant(x.dtype.max, x.dtype)
    hi = tf.reduce_max(tf.where(has_mass, x, -big), axis=axis, keepdims=True)
    lo = tf.reduce_min(tf.where(has_mass, x, big), axis=axis, keepdims=True)
    centred = x - (0.5 * hi + 0.5 * lo)
    zeros = tf.zeros_like(x)
    scale = tf.reduce_max(tf.where(has_mass, tf.abs(centred), zeros), axis=axis, keepdims=True)
    return centred / _safe_positive(scale)


def standardize(x, axis: int = -1, weights=None):
    """(x − mean) / std along `axis`, computed without overflow; 0 for constant rows.

    Computed after scaling into [−1, 1], in float64 for float64 x, else in float32
    (`_scale_invariant_float32` first); returned like x. `weights`: optional
    non-negative weights broadcastable to x (e.g. the transport's input measure a)
    weighting the mean and standard deviation (None: uniform)."""
    x = tf.convert_to_tensor(x)
    if x.dtype == tf.float64:
        xc = x
    else:
        xc = _scale_invariant_float32(tf.cast(x, tf.float32), axis)
    w, has_mass = _weighted(xc, weights, axis)
    # Only entries with mass set the scale, so a zero-weight outlier cannot compress the
    # others; such an outlier gets a large |z| (the squash maps it to ~0 or ~1) instead.
    z = _scale_free_centre(xc, has_mass, axis)
    zeros = tf.zeros_like(z)
    z = z - tf.reduce_sum(tf.where(has_mass, w * z, zeros), axis=axis, keepdims=True)
    var = tf.reduce_sum(tf.where(has_mass, w * tf.square(z), zeros), axis=axis, keepdims=True)
    return tf.cast(z / _safe_positive(tf.sqrt(var)), x.dtype)


def weighted_median(x, w, axis):
    """The lower weighted median of x along `axis`, kept as a length-1 axis.

    w: non-negative weights like x, not necessarily normalised (0/1 weights give the
    lower median of the entries with weight 1). The first value in sorted order whose
    cumulative weight reaches half the total; weights are summed in float32 (float64 for
    float64 weights), so 0/1 weights count exactly up to 2^24 entries. A zero-weight
    entry never becomes the median, whatever its value (±inf included; NaN is not
    ordered, so it must be replaced first).
    """
    x_t = tf.experimental.numpy.moveaxis(x, axis, -1)
    w_t = tf.experimental.numpy.moveaxis(w, axis, -1)
    w_t = tf.cast(w_t, tf.float64 if w_t.dtype == tf.float64 else tf.float32)
    order = tf.argsort(x_t, axis=-1, stable=True)
    xs = tf.gather(x_t, order, batch_dims=x_t.shape.rank - 1)
    cum = tf.cumsum(tf.gather(w_t, order, batch_dims=x_t.shape.rank - 1), axis=-1)
    half = 0.5 * cum[..., -1:] * (1.0 - 1e-12)
    index = tf.minimum(tf.reduce_sum(tf.cast(cum < half, tf.int32), axis=-1, keepdims=True),
                       tf.shape(x_t)[-1] - 1)
    median = tf.gather(xs, index, batch_dims=x_t.shape.rank - 1)
    return tf.experimental.numpy.moveaxis(median, -1, axis)


def robust_zscore(x, axis: int = -1, weights=None):
    """asinh((x − median) / (1.4826 · MAD)) along `axis`, in float64 internally.

    Median and MAD weighted by the optional `weights` (broadcastable to x); where the
    MAD is 0 (more than half of the entries equal) the largest absolute deviation is the
    scale; a constant row gives 0. Returned like x.
    """
    x = tf.convert_to_tensor(x)
    x64 = exact_float64(x)
    w, has_mass = _weighted(x64, weights, axis)
    # Not rescaled by the range (that would merge the bulk next to a 1e30 outlier);
    # float32 values are far from float64's limits, and float64 values beyond 2^1000
    # are halved 2^24 times (exactly) so that differences cannot overflow.
    huge = tf.reduce_max(tf.abs(x64), axis=axis, keepdims=True) > 2.0 ** 1000
    u = tf.where(huge, x64 * 2.0 ** -24, x64)
    u = u - weighted_median(u, w, axis)
    deviation = tf.abs(u)
    mad = weighted_median(deviation, w, axis) * MAD_TO_STD
    widest = tf.reduce_max(tf.where(has_mass, deviation, tf.zeros_like(u)), axis=axis,
                           keepdims=True)
    scale = tf.where(mad > 0, mad, widest)
    return tf.cast(tf.math.asinh(u / _safe_positive(scale)), x.dtype)


def _arctan(z):
    """arctan(z) as atan2(z, 1): the values of `tf.atan` (bit for bit on CPU), and a
    TFLite builtin where Atan is not."""
    return tf.math.atan2(z, tf.ones_like(z))


def squash_values(x, squash="logistic", axis: int = -1, weights=None):
    """Applies the squashing `squash` ('logistic', 'atan', 'robust' or None) along `axis`.

    Args:
      x: input of any rank, or a `tf.RaggedTensor` ragged along its last axis (each
        list squashed on its own statistics).
      squash: 'logistic', 'atan', 'robust' or None (x unchanged); see the module
        docstring.
      axis: the axis the values are compared along (-1 for a ragged x).
      weights: optional non-negative weights (see `standardize`); not with a ragged x.

    Returns:
      A tensor like x (ragged with the row lengths of a ragged x), in [0, 1] unless
      `squash` is None.

    Example:
    >>> x = np.array([[1e-3, 1e30, 0.5, 1.0, 2.0, 4.0, 8.0]])
    >>> np.round(squash_values(x, "robust").numpy(), 2)
    array([[0.32, 1.  , 0.36, 0.4 , 0.5 , 0.68, 0.81]])
    >>> np.round(squash_values(x, "logistic").numpy(), 2)
    array([[0.32, 0.99, 0.32, 0.32, 0.32, 0.32, 0.32]])
    """
    squash = check_squash(squash)
    if isinstance(x, tf.RaggedTensor):
        return _squash_lists(x, squash, axis, weights)
    if squash is None:
        return x
    if squash == "robust":
        return 0.5 + _arctan(robust_zscore(x, axis=axis, weights=weights)) / math.pi
    z = standardize(x, axis=axis, weights=weights)
    if squash == "logistic":
        return tf.sigmoid(z * (math.pi / math.sqrt(3.0)))
    return 0.5 + _arctan(z) / math.pi


def _squash_lists(x: tf.RaggedTensor, squash, axis, weights):
    """`squash_values` of the lists of a ragged `x`: padded to a dense tensor whose
    padding has weight 0, so that it moves no list's statistics (`_weighted`)."""
    _masking.check_ragged_call(x, axis, weights)
    if squash is None:
        return x
    lists = _masking.RaggedLists.from_ragged(x)
    out = squash_values(lists.dense, squash, weights=tf.cast(lists.mask, lists.dense.dtype))
    return lists.to_elementwise(out)

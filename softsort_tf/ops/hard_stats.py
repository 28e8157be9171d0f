"""Exact (hard) ranks, quantiles, trimmed means and correlations: the references the
soft operators approach as ε → 0 and the statistics the metrics report (graph mode and
XLA included).
"""

from __future__ import annotations

import tensorflow as tf

from softsort_tf import _checks, _masking

# Cumulative masses within this distance of a quantile level count as equal to it,
# so that e.g. τ = 0.5 with 4 equal weights averages the 2nd and 3rd values.
_MASS_TOLERANCE = 1e-9


def rankdata(x, axis: int = -1, *, mask=None):
    """1-based ranks along `axis` with ties averaged (`scipy.stats.rankdata`).

    One stable sort, then each run of equal sorted values gets the mean of its
    positions: O(n log n) time, O(n) memory.

    Args:
      x: `[..., n, ...]` real tensor (no NaN at valid entries), or a `tf.RaggedTensor`
        `[batch, (n)]` (ranked along its last axis; ragged output).
      axis: the axis to rank along.
      mask: optional boolean of the shape of x (or `[n]`), True = valid entry: valid
        entries are ranked among themselves, padded ones (NaN included) get rank 0.

    Returns:
      Float ranks in [1, n] with the shape of x (float32 for reduced precision and
      up to 32-bit integers, float64 for 64-bit integers, else the dtype of x).

    Example:
    >>> rankdata([[10.0, 30.0, 20.0, 20.0]]).numpy()
    array([[1. , 4. , 2.5, 2.5]], dtype=float32)
    """
    if _masking.is_ragged(x):
        if axis not in (-1, x.shape.rank - 1):
            raise ValueError(f"A ragged `x` is ranked along its last axis, got axis={axis}.")
        return _masking.map_lists(
            lambda lists, aligned, group: lists.to_elementwise(
                rankdata(lists.dense, mask=lists.mask)), x, mask)
    x2d, view = _masking.to_batch(x, axis)
    valid = _masking.mask_to_batch(mask, view)
    batch, n = tf.shape(x2d)[0], tf.shape(x2d)[1]
    if valid is not None:  # any padded value (NaN included) is replaced before the sort
        x2d = tf.where(valid, x2d, tf.zeros_like(x2d))
    order = tf.argsort(x2d, axis=-1, stable=True)
    if valid is not None:  # valid entries first (in their order), padded ones last
        padded_sorted = tf.cast(tf.logical_not(tf.gather(valid, order, batch_dims=1)),
                                tf.int32)
        order = tf.gather(order, tf.argsort(padded_sorted, axis=-1, stable=True), batch_dims=1)
    xs = tf.gather(x2d, order, batch_dims=1)
    # A run of ties starts where the sorted value (or the validity) changes.
    starts = tf.not_equal(xs[:, 1:], xs[:, :-1])
    if valid is not None:
        vs = tf.gather(valid, order, batch_dims=1)
        starts = tf.logical_or(starts, tf.not_equal(vs[:, 1:], vs[:, :-1]))
    starts = tf.concat([tf.ones_like(xs[:, :1], tf.bool), starts], axis=-1)  # n may be 1
    runs = tf.cumsum(tf.cast(starts, tf.int32), axis=-1) - 1 + tf.range(batch)[:, None] * n
    positions = tf.cast(tf.broadcast_to(tf.range(1, n + 1), tf.shape(runs)), x2d.dtype)
    flat_runs = tf.reshape(runs, [-1])
    totals = tf.math.unsorted_segment_sum(tf.reshape(positions, [-1]), flat_runs, batch * n)
    counts = tf.math.unsorted_segment_sum(tf.ones_like(tf.reshape(positions, [-1])),
                                          flat_runs, batch * n)
    mean_position = tf.reshape(tf.gather(totals / tf.maximum(counts, 1.0), flat_runs),
                               tf.shape(xs))
    ranks = tf.gather(mean_position, tf.argsort(order, axis=-1, stable=True), batch_dims=1)
    ranks = _masking.fill_padded(ranks, valid)
    return _masking.from_batch(ranks, view, cast=False)


def _sorted_masses(x, axis, weights, mask):
    """`(xs, before, upto, view, valid)`: the rows of x sorted (padded entries replaced
    by the largest valid value of their row, without mass) and the normalised
    cumulative masses (float64) before and up to each sorted value."""
    x2d, view = _masking.to_batch(x, axis)
    valid = _masking.mask_to_batch(mask, view)
    x2d = _masking.replace_padded(x2d, valid)
    if weights is None:
        w = tf.ones_like(x2d, tf.float64) if valid is None else tf.cast(valid, tf.float64)
    else:
        w = _masking.weights_to_batch(weights, view, tf.float64)
        w = w if valid is None else tf.where(valid, w, tf.zeros_like(w))
    order = tf.argsort(x2d, axis=-1, stable=True)
    w = tf.gather(w, order, batch_dims=1)
    total = tf.reduce_sum(w, axis=-1, keepdims=True)
    w = w / tf.where(total > 0, total, tf.ones_like(total))  # a row of zero mass stays 0
    upto = tf.cumsum(w, axis=-1)
    return tf.gather(x2d, order, batch_dims=1), upto - w, upto, view, valid


def _per_list(value, view, valid):
    """A `[batch]` result in the shape of x without its axis, 0 for a list of no valid entry."""
    if valid is not None:
        value = tf.where(tf.reduce_any(valid, axis=-1), value, tf.zeros_like(value))
    return _masking.from_batch(value, view, keep_axis=False)


def weighted_quantile(x, quantile: float, axis: int = -1, weights=None, *, mask=None):
    """The τ-quantile of the (weighted) sample along `axis`.

    s_j for the first j with W_j ≥ τ (W the cumulative masses of the sorted values s),
    averaged with s_{j+1} when W_j = τ: numpy's `method='averaged_inverted_cdf'` for
    uniform weights.

    Args:
      x: `[..., n, ...]` real tensor.
      quantile: τ in (0, 1).
      axis: the sample axis.
      weights: non-negative weights `[n]` or of the shape of x (default uniform),
        with a positive sum along `axis`.
      mask: optional boolean of the shape of x (or `[n]`), True = valid entry: padded
        entries get no mass; a list without valid entries gives 0.

    Returns:
      The shape of x without `axis`.

    Example:
    >>> float(weighted_quantile([4.0, 1.0, 3.0, 2.0], 0.5))
    2.5
    """
    tau = float(_checks.check_in_open_interval("quantile", quantile, 0.0, 1.0))
    xs, _, upto, view, valid = _sorted_masses(x, axis, weights, mask)
    lower = tf.reduce_sum(tf.cast(upto < tau - _MASS_TOLERANCE, tf.int32), axis=-1)
    upper = tf.reduce_sum(tf.cast(upto <= tau + _MASS_TOLERANCE, tf.int32), axis=-1)
    q = 0.5 * (tf.gather(xs, tf.minimum(lower, view.n - 1), batch_dims=1)
               + tf.gather(xs, tf.minimum(upper, view.n - 1), batch_dims=1))
    return _per_list(q, view, valid)


def interval_mean(x, low: float, high: float, axis: int = -1, weights=None, *, mask=None):
    """Weighted mean of the values whose cumulative mass lies in [low, high].

    Each sorted value s_j enters with the overlap of its mass interval [W_{j−1}, W_j]
    with [low, high]: the α-trimmed mean for [α, 1 − α], and the limit of a Sinkhorn
    transport onto a target bin of mass high − low placed after mass `low`.

    Args:
      x, axis, weights, mask: as in `weighted_quantile`.
      low, high: cumulative-mass bounds with 0 ≤ low < high ≤ 1.

    Returns:
      The shape of x without `axis`.

    Example:
    >>> float(interval_mean([4.0, 1.0, 3.0, 2.0, 100.0], 0.2, 0.8))
    3.0
    """
    low, high = check_mass_interval(low, high, "low", "high")
    xs, before, upto, view, valid = _sorted_masses(x, axis, weights, mask)
    overlap = tf.nn.relu(tf.minimum(upto, high) - tf.maximum(before, low))
    inside = tf.reduce_sum(overlap, axis=-1)
    mean = tf.reduce_sum(overlap * tf.cast(xs, tf.float64), axis=-1) / tf.where(
        inside > 0, inside, tf.ones_like(inside))
    return _per_list(tf.cast(mean, xs.dtype), view, valid)


def check_mass_interval(low, high, low_name: str, high_name: str) -> tuple[float, float]:
    """Checks 0 ≤ low < high ≤ 1 and returns them as floats."""
    try:
        lo, hi = float(low), float(high)
    except (TypeError, ValueError):
        lo = hi = float("nan")
    if not (0.0 <= lo < hi <= 1.0):
        raise ValueError(f"`{low_name}` and `{high_name}` must satisfy 0 <= {low_name} < "
                         f"{high_name} <= 1, got {low!r} and {high!r}.")
    return lo, hi


def pearson_correlation(u, v, axis: int = -1):
    """Pearson correlation of u and v along `axis`, reducing it.

    The inner product of the centred, unit-normalised vectors; a constant input gives
    0 (not NaN) with zero gradients.

    Args:
      u, v: tensors of the same shape and floating dtype.
      axis: the axis to correlate along.

    Returns:
      Correlations in [−1, 1] with the shape of u without `axis`.
    """
    u = tf.convert_to_tensor(u)
    v = tf.cast(tf.convert_to_tensor(v), u.dtype)

    def unit(t):
        centred = t - tf.reduce_mean(t, axis=axis, keepdims=True)
        sq = tf.reduce_sum(tf.square(centred), axis=axis, keepdims=True)
        tiny = tf.constant(1e-30 if t.dtype == tf.float64 else 1e-20, t.dtype)
        # Where sq ≤ tiny the row is constant: its direction is 0, and so is the gradient.
        return tf.where(sq > tiny, centred * tf.math.rsqrt(tf.maximum(sq, tiny)),
                        tf.zeros_like(centred))

    corr = tf.reduce_sum(unit(u) * unit(v), axis=axis)
    return tf.clip_by_value(corr, -1.0, 1.0)

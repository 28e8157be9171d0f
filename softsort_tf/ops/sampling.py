"""Stochastic relaxed permutations (reparameterised Plackett–Luce, Grover et al. 2019,
§4.1): a relaxed permutation matrix of log-scores perturbed by Gumbel noise, drawn by a
stateless counter-based generator keyed by `seed` (an int or an integer tensor `[2]`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _masking
from softsort_tf.ops.permutation import DEFAULT_DISTANCE_POWER, DEFAULT_TAU
from softsort_tf.ops.soft import permutation_matrix


def _as_seed(seed):
    """An int or a shape-[2] integer tensor → an int64 seed of shape [2]."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return tf.constant([int(seed), 0], tf.int64)
    if isinstance(seed, bool) or seed is None:
        raise ValueError(f"`seed` must be an int or an integer tensor of shape [2], got {seed!r}.")
    seed = tf.convert_to_tensor(seed)
    if not seed.dtype.is_integer or (seed.shape.rank is not None
                                     and seed.shape.as_list() not in ([2], [None])):
        raise ValueError("`seed` must be an int or an integer tensor of shape [2], got "
                         f"dtype {seed.dtype.name} and shape {seed.shape}.")
    if seed.dtype not in (tf.int32, tf.int64):
        seed = tf.cast(seed, tf.int64)
    return seed


_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_MIX_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_SEED_SALT = 0x632BE59BD9B4E019


def _mix64(z):
    """The splitmix64 finaliser on uint64 (multiplications wrap modulo 2⁶⁴)."""
    for shift, multiplier in zip((30, 27), _MIX_MULTIPLIERS, strict=True):
        z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(shift, tf.uint64)))
        z = z * tf.constant(multiplier, tf.uint64)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, tf.constant(31, tf.uint64)))


def stateless_uniform(shape, seed, dtype=tf.float32):
    """Counter-based uniform noise in the open interval (0, 1), keyed by `seed`.

    Element k (row-major) is splitmix64(k·γ + key), key = seed[0] ⊕ splitmix64(seed[1] +
    salt), its top b bits m mapped to (m + 1/2)·2⁻ᵇ: integer arithmetic only, so
    bit-identical eagerly, under `tf.function` and XLA, on any device.

    Args:
      shape: 1-D int tensor or list, the output shape.
      seed: an int or an int32/int64 tensor of shape [2].
      dtype: float32 (default) or float64 (float16/bfloat16 are drawn in float32).

    Returns:
      A tensor of `shape` with values in [2⁻ᵇ⁻¹, 1 − 2⁻ᵇ⁻¹] ⊂ (0, 1) (b = 23 or 52).
    """
    seed = tf.bitcast(tf.cast(_as_seed(seed), tf.int64), tf.uint64)
    dtype = _masking.compute_dtype(dtype)
    bits = 52 if dtype == tf.float64 else 23
    key = tf.bitwise.bitwise_xor(seed[0], _mix64(seed[1] + tf.constant(_SEED_SALT, tf.uint64)))
    shape = tf.cast(shape, tf.int64)
    counter = tf.cast(tf.range(tf.reduce_prod(shape)), tf.uint64)
    hashed = _mix64(counter * tf.constant(_GOLDEN_GAMMA, tf.uint64) + key)
    top = tf.bitwise.right_shift(hashed, tf.constant(64 - bits, tf.uint64))
    uniform = (tf.cast(top, dtype) + 0.5) * tf.constant(2.0 ** -bits, dtype)
    return tf.reshape(uniform, shape)


def gumbel_noise(shape, seed, dtype=tf.float32):
    """Standard Gumbel noise g = −log(−log u), u from `stateless_uniform` (bit-identical
    everywhere; XLA's logarithm may change the last bits of g).

    Args:
      shape, seed, dtype: as in `stateless_uniform`.

    Returns:
      A tensor of `shape` and `dtype` (float32 for reduced precision).
    """
    dtype = _masking.compute_dtype(dtype)
    u = tf.cast(stateless_uniform(shape, seed, dtype), tf.float64)  # exact cast
    return tf.cast(-tf.math.log(-tf.math.log(u)), dtype)


def gumbel_perturb(scores, num_samples: int, seed, *, mask=None):
    """Plackett–Luce samples of log-scores: s̃ = s + g, g i.i.d. standard Gumbel.

    Sorting each row of s̃ draws a permutation from the Plackett–Luce distribution
    with item weights exp(s); a relaxation of the sort makes it differentiable in s.

    Args:
      scores: `[..., n]` real tensor of log-scores.
      num_samples: number of samples S >= 1.
      seed: an int, or an int32/int64 tensor of shape [2] (e.g. from
        `keras.random.SeedGenerator.next()`).
      mask: optional boolean `[..., n]` (or `[n]`), True = valid entry: padded entries
        are returned as 0 (zero gradient). The noise depends on the padded shape, so a
        padded list gets another sample than its unpadded version.

    Returns:
      `[..., S, n]` perturbed scores, in the dtype of `scores`.

    Example:
    >>> s = gumbel_perturb([[0.0, 1.0, 2.0]], num_samples=4, seed=0)
    >>> s.shape
    TensorShape([1, 4, 3])
    """
    num_samples = _checks.check_positive_int("num_samples", num_samples)
    seed = _as_seed(seed)
    _checks.check_dense("scores", scores)
    scores = tf.convert_to_tensor(scores)
    if scores.shape.rank is None or scores.shape.rank == 0:
        raise ValueError("`scores` must have rank >= 1 (shape [..., n]).")
    dtype = _masking.compute_dtype(scores.dtype)
    s = tf.cast(scores, dtype)[..., None, :]
    shape = tf.concat([tf.shape(s)[:-2], [num_samples], tf.shape(s)[-1:]], axis=0)
    noise = gumbel_noise(shape, seed, dtype)
    if mask is not None:  # padded entries are not read, and returned as 0
        valid, zero = _scores_mask(mask, scores)[..., None, :], tf.zeros([], dtype)
        s, noise = tf.where(valid, s, zero), tf.where(valid, noise, zero)
    out = s + noise
    return tf.cast(out, scores.dtype) if scores.dtype.is_floating else out


def _scores_mask(mask, scores):
    """A mask `[..., n]` (or `[n]`) of `scores` `[..., n]`, checked, as bool of their shape."""
    _, view = _masking.to_batch(scores, -1, "scores")
    return tf.reshape(_masking.mask_to_batch(mask, view), tf.shape(scores))


def group_seed(seed, group: int):
    """The seed of group `group` of a ragged input's lists (`_masking.map_lists`): `seed`
    itself for group 0, else `stateless_fold_in(seed, group)`, so lists computed in
    different groups get independent noise."""
    if group == 0:
        return seed
    return tf.random.experimental.stateless_fold_in(_as_seed(seed), group)


def ragged_samples(lists, dense_out, num_samples: int):
    """Stochastic matrices `[lists, S, longest, longest]` of the padded lists of
    `lists` (a `_masking.RaggedLists`) → ragged `[lists, S, (n), (n)]`."""
    longest = tf.shape(dense_out)[-1]
    lengths = tf.repeat(lists.lengths, num_samples)  # one list per (list, sample)
    samples = _masking.RaggedLists(source=tf.ragged.range(lengths), dense=None, mask=None,
                                   lengths=lengths)
    square = samples.to_square(tf.reshape(dense_out, tf.stack([-1, longest, longest])))
    return lists.to_per_list(tf.RaggedTensor.from_uniform_row_length(square, num_samples))


def stochastic_permutation_matrix(scores, num_samples: int, seed, method: str = "softsort",
                                  direction: str = "DESCENDING", hard: bool = False, *,
                                  mask=None, **kwargs):
    """A relaxed permutation matrix of Gumbel-perturbed scores (stochastic variant).

    `permutation_matrix(gumbel_perturb(scores, num_samples, seed), method, ...)`: each
    of the S matrices relaxes a Plackett–Luce sample with log-scores `scores` (with
    `hard=True`, the exact matrix of each sample forward).

    Args:
      scores, num_samples, seed, mask: as in `gumbel_perturb`; each sample's P̂ is
        masked as in `permutation_matrix`. A ragged `[batch, (n)]` input gives a ragged
        `[batch, S, (n), (n)]` output.
      method: a family with a permutation matrix ('softsort', 'neuralsort', ...).
      direction, hard, **kwargs: as in `permutation_matrix`.

    Returns:
      `[..., S, n, n]` in the dtype of `scores`.

    Example:
    >>> P = stochastic_permutation_matrix([[0.0, 1.0, 2.0]], 5, seed=[1, 2])
    >>> P.shape
    TensorShape([1, 5, 3, 3])
    """
    if _masking.is_ragged(scores):
        num_samples = _checks.check_positive_int("num_samples", num_samples)
        return _masking.map_lists(
            lambda lists, aligned, group: ragged_samples(lists, stochastic_permutation_matrix(
                lists.dense, num_samples, group_seed(seed, group), method, direction, hard,
                mask=lists.mask, **kwargs), num_samples), scores, mask, name="scores")
    scores = tf.convert_to_tensor(scores)
    dtype = _masking.compute_dtype(scores.dtype)
    perturbed = gumbel_perturb(tf.cast(scores, dtype), num_samples, seed, mask=mask)
    if mask is not None:
        mask = _scores_mask(mask, scores)[..., None, :]
    perm = permutation_matrix(perturbed, method, direction=direction, hard=hard, mask=mask,
                              **kwargs)
    return tf.cast(perm, scores.dtype) if scores.dtype.is_floating else perm


def stochastic_softsort_permutation_matrix(scores, num_samples: int, seed,
                                           tau: float = DEFAULT_TAU,
                                           distance_power: float = DEFAULT_DISTANCE_POWER,
                                           direction: str = "DESCENDING", hard: bool = False,
                                           *, mask=None):
    """Stochastic SoftSort: `softsort_permutation_matrix` of Gumbel-perturbed
    log-scores.

    Args:
      scores, num_samples, seed, direction, hard, mask: as in
        `stochastic_permutation_matrix`.
      tau, distance_power: as in `softsort_permutation_matrix`.

    Returns:
      `[..., S, n, n]` in the dtype of `scores`.

    Example:
    >>> P = stochastic_softsort_permutation_matrix([[0.0, 1.0, 2.0]], num_samples=2, seed=7)
    >>> P.shape
    TensorShape([1, 2, 3, 3])
    """
    return stochastic_permutation_matrix(scores, num_samples, seed, "softsort",
                                         direction=direction, hard=hard, mask=mask, tau=tau,
                                         distance_power=distance_power)


def stochastic_neuralsort_permutation_matrix(scores, num_samples: int, seed,
                                             tau: float = DEFAULT_TAU,
                                             direction: str = "DESCENDING",
                                             hard: bool = False, *, mask=None):
    """Stochastic NeuralSort (Grover et al., 2019, §4.1): `neuralsort_permutation_matrix`
    of Gumbel-perturbed log-scores.

    Args:
      scores, num_samples, seed, direction, hard, mask: as in
        `stochastic_permutation_matrix`.
      tau: as in `neuralsort_permutation_matrix`.

    Returns:
      `[..., S, n, n]` in the dtype of `scores`.

    Example:
    >>> P = stochastic_neuralsort_permutation_matrix([[0.0, 1.0, 2.0]], 4, seed=[3, 4],
    ...                                              hard=True)
    >>> P.shape, bool(tf.reduce_all(tf.reduce_sum(P, -1) == 1.0))
    (TensorShape([1, 4, 3, 3]), True)
    """
    return stochastic_permutation_matrix(scores, num_samples, seed, "neuralsort",
                                         direction=direction, hard=hard, mask=mask, tau=tau)


def stochastic_sinkhorn_permutation_matrix(scores, num_samples: int, seed,
                                           direction: str = "DESCENDING", hard: bool = False,
                                           **sinkhorn_kwargs):
    """Stochastic Sinkhorn: `sinkhorn_permutation_matrix` of Gumbel-perturbed
    log-scores.

    Args:
      scores, num_samples, seed, direction, hard: as in `stochastic_permutation_matrix`.
      **sinkhorn_kwargs: `mask` and the arguments of `sinkhorn_permutation_matrix`
        (`epsilon`, `options`, ...).

    Returns:
      `[..., S, n, n]` in the dtype of `scores`, doubly stochastic.

    Example:
    >>> P = stochastic_sinkhorn_permutation_matrix([[0.0, 1.0, 2.0]], 2, seed=[5, 6],
    ...                                            epsilon=0.05)
    >>> P.shape, np.allclose(tf.reduce_sum(P, -2), 1.0, atol=1e-2)
    (TensorShape([1, 2, 3, 3]), True)
    """
    return stochastic_permutation_matrix(scores, num_samples, seed, "sinkhorn",
                                         direction=direction, hard=hard, **sinkhorn_kwargs)

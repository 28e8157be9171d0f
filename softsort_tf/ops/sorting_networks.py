"""Differentiable sorting networks: odd-even and bitonic networks of relaxed swaps.

A sorting network (Knuth, TAOCP vol. 3, §5.3.4) sorts n values on n wires by a fixed
sequence of layers of conditional swaps: a comparator (lo, hi) puts min(a, b) on
wire lo and max(a, b) on wire hi. Petersen, Borgelt, Kuehne & Deussen (ICML 2021)
relax each comparator with a sigmoid f of the difference of its inputs,

    σ = f(β·(b − a)),   lo ← σ·a + (1 − σ)·b,   hi ← (1 − σ)·a + σ·b,

(β: the steepness), which makes the network differentiable, and read off the relaxed
permutation matrix by applying the same mixing to the rows of a matrix that starts
as the identity. Each layer mixes pairs of rows with a symmetric doubly-stochastic
2 × 2 block, so P̂ (their product) is doubly stochastic; as β → ∞ every σ tends to
0 or 1 and P̂ to the exact permutation matrix (for distinct scores).

Networks (`network=`):

- 'odd_even': odd-even transposition sort, n layers; layer l compares the wire
  pairs (i, i + 1) with i ≡ l (mod 2). n(n − 1)/2 comparators.
- 'bitonic': Batcher's bitonic sorter on W = 2^⌈log₂ n⌉ wires, ⌈log₂ n⌉(⌈log₂ n⌉ + 1)/2
  layers of W/2 comparators. For n < W the list sits on the last n wires and the first
  W − n wires hold values below every score, routed by exact (hard) comparators, so
  the network sorts every n. The diffsort package (its `bitonic_network`) instead
  drops the comparators that touch those wires; for most n the two coincide (every
  power of two, and e.g. n = 3, 5, 6, 7, 9, 10, 12–18, 20, 24–26, 28–33), for
  others they are different networks (n = 11, 19, 21, 23, 27 among n ≤ 33), and for
  n = 22 the dropped-comparator network does not sort.

Sigmoids f (`sigmoid=`; u = β·v, v = b − a), with diffsort's parameterisation:

- 'logistic': 1 / (1 + e^(−u)) (ICML 2021).
- 'logistic_phi': the logistic sigmoid after the activation replacement trick (ART,
  ICML 2021): f(β·v / (|v| + 10⁻¹⁰)^λ), λ = `art_lambda` (default 0.25), which pushes
  small differences away from 0 and so keeps the mixing of a deep network low.
- 'gaussian': Φ(u), the standard normal CDF.
- 'reciprocal': ½·u / (2 + |u|) + ½,
- 'cauchy': arctan(u)/π + ½ (the default),
- 'optimal': u + ½ for |u| ≤ ¼, 1 − 1/(16u) above, −1/(16u) below:
  the monotonic sigmoids of Petersen et al. (ICLR 2022), whose derivative decays as
  1/u², which makes the relaxed network monotonic (its outputs are non-decreasing in
  every input, so gradients have the right sign) with a bounded error.

Orientation: as for every relaxed permutation matrix of the package, row i of P̂ is
the distribution over the inputs of the entry at position i of the `direction` order
('DESCENDING' by default), so `P̂ @ x` soft-sorts x. The network sorts ascending keys:
the scores for 'ASCENDING' (then P̂ is the transpose of diffsort's matrix) and the
negated scores for 'DESCENDING'.

Shapes and dtypes: scores `[..., n]`; P̂ `[..., n, n]`. The layers are a static list
when n is known at trace time; for an unknown n (`tf.function` with `None`
dimensions) the network is built from n in a `tf.while_loop` (bitonic: on 2^⌈log₂ n⌉
wires), and both compile with XLA (`jit_compile=True`). float16/bfloat16 are computed
in float32.

Padding (`mask=`, ragged inputs; see softsort_tf._masking): the valid entries are
placed, in their input order, on the wires the unpadded list would occupy; the other
wires hold values that sort after them (before them, for the first wires of a bitonic
network) and are routed by exact comparators, and the layers the unpadded list would
not have (odd-even: l ≥ n_valid; bitonic: blocks of the longer network) leave the row
unchanged. So the valid block of P̂ is the unpadded list's matrix, rows of positions
≥ n_valid and columns of padded entries are 0, and padded entries get zero gradient.

Cost: O(L·n²) time per list for P̂ (L = n layers for odd-even, ~½log₂²n for bitonic),
and, for the gradient, the L intermediate matrices: prefer 'bitonic' for long lists.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _masking, _special
from softsort_tf.ops.family import Family
from softsort_tf.ops.permutation import (
    _exact_permutation_2d,
    centred_finite_rows,
    check_hard,
    poison_rows,
    straight_through,
)
from softsort_tf.ops.wrapper import ListResult, Lists, list_operator

NETWORKS = ("odd_even", "bitonic")
SIGMOIDS = ("logistic", "logistic_phi", "gaussian", "reciprocal", "cauchy", "optimal")
DEFAULT_STEEPNESS = 10.0
DEFAULT_NETWORK = "odd_even"
DEFAULT_SIGMOID = "cauchy"
DEFAULT_ART_LAMBDA = 0.25
# The ART denominator (|v| + ε)^λ, as in the reference implementation.
_ART_EPSILON = 1e-10

# Wire kinds: a list entry, or a padding wire whose value sorts before (−1) or after
# (+1) every entry.
_BELOW, _ENTRY, _ABOVE = -1, 0, 1


# ---------------------------------------------------------------------------------
# Arguments.
# ---------------------------------------------------------------------------------
def check_network(network) -> str:
    if network not in NETWORKS:
        raise ValueError(f"`network` must be one of {NETWORKS}, got {network!r}.")
    return network


def check_sigmoid(sigmoid) -> str:
    if sigmoid not in SIGMOIDS:
        raise ValueError(f"`sigmoid` must be one of {SIGMOIDS}, got {sigmoid!r}.")
    return sigmoid


def check_art_lambda(art_lambda) -> float:
    """λ of the activation replacement trick, in [0, 1) (λ = 1 would make φ a sign)."""
    try:
        value = float(art_lambda)
    except (TypeError, ValueError):
        value = math.nan
    if not 0.0 <= value < 1.0:
        raise ValueError(f"`art_lambda` must be a number in [0, 1), got {art_lambda!r}.")
    return value


# ---------------------------------------------------------------------------------
# Sigmoids.
# ---------------------------------------------------------------------------------
def relaxed_step(v, steepness: float, sigmoid: str = DEFAULT_SIGMOID,
                 art_lambda: float = DEFAULT_ART_LAMBDA):
    """σ = f(β·v): the weight a relaxed comparator gives to "already in order" when
    the value on its max wire exceeds the value on its min wire by v.

    Every f is a CDF of a symmetric distribution (f(−u) = 1 − f(u), f(0) = ½) that
    tends to the step function as β → ∞. `v` must be finite; β·v may overflow to ±inf,
    which gives exactly 0 or 1 (and zero gradient).

    Args:
      v: differences b − a, a float tensor.
      steepness: β > 0.
      sigmoid: one of `SIGMOIDS` (see the module docstring).
      art_lambda: λ of 'logistic_phi'.

    Returns:
      σ in [0, 1], the shape and dtype of `v`.

    Example:
    >>> relaxed_step(tf.constant([-1.0, 0.0, 1.0]), 1.0, "cauchy").numpy()
    array([0.25, 0.5 , 0.75], dtype=float32)
    """
    dtype = v.dtype
    beta = tf.constant(steepness, dtype)
    half = tf.constant(0.5, dtype)
    if sigmoid == "logistic":
        return tf.sigmoid(beta * v)
    if sigmoid == "logistic_phi":
        scaled = v / tf.pow(tf.abs(v) + tf.constant(_ART_EPSILON, dtype), art_lambda)
        return tf.sigmoid(beta * scaled)
    u = beta * v
    if sigmoid == "gaussian":
        return half + half * _special.erf(u * tf.constant(1.0 / math.sqrt(2.0), dtype))
    if sigmoid == "cauchy":
        # arctan as atan2(u, 1): the same values (bit for bit on CPU, float32 and
        # float64), and a TFLite builtin where Atan is not.
        return tf.math.atan2(u, tf.ones_like(u)) * tf.constant(1.0 / math.pi, dtype) + half
    if sigmoid == "reciprocal":
        # ½·u/(2 + |u|) + ½, written as ½·sign(u)/(1 + 2/|u|) + ½ for |u| >= 1 so that
        # u = ±inf gives 0 or 1 (not inf/inf).
        a = tf.abs(u)
        large = a >= 1.0
        inner = tf.where(large, tf.sign(u) / (1.0 + 2.0 / tf.where(large, a, tf.ones_like(a))),
                         u / (2.0 + tf.where(large, tf.ones_like(a), a)))
        return half * inner + half
    if sigmoid == "optimal":
        a = tf.abs(u)
        quarter = tf.constant(0.25, dtype)
        tail = 1.0 / (16.0 * tf.maximum(a, quarter))  # 1/(16|u|), bounded
        centre = tf.clip_by_value(u, -quarter, quarter) + half
        return tf.where(a <= quarter, centre, tf.where(u > 0, 1.0 - tail, tail))
    raise ValueError(f"`sigmoid` must be one of {SIGMOIDS}, got {sigmoid!r}.")


# ---------------------------------------------------------------------------------
# The networks' layers.
# ---------------------------------------------------------------------------------
def network_wires(network: str, n: int) -> int:
    """The number of wires of the network for n entries (bitonic: 2^⌈log₂ n⌉)."""
    if network == "odd_even" or n <= 1:
        return max(n, 1)
    return 1 << (n - 1).bit_length()


def network_layers(network: str, n: int) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """The layers of the network for a static n, each `(partner, is_lo, stage)`.

    `partner[w]` is the wire compared with wire w (w itself: no comparator), `is_lo[w]`
    whether w receives the minimum, `stage` the index that decides whether the layer
    exists for a list of n_valid <= n entries: the layer index l (odd-even, which has
    n_valid layers) or the block b (bitonic, ⌈log₂ n_valid⌉ blocks).
    """
    wires = network_wires(network, n)
    w = np.arange(wires)
    layers = []
    if network == "odd_even":
        for layer in range(n):
            partner, is_lo = _odd_even_layer(w, layer, n, np)
            layers.append((partner.astype(np.int32), is_lo, layer))
        return layers
    blocks = wires.bit_length() - 1
    for block in range(blocks):
        for step in range(block + 1):
            partner, is_lo = _bitonic_layer(w, block, step, np)
            layers.append((partner.astype(np.int32), is_lo, block))
    return layers


def layer_swaps(network: str, n: int) -> list[tuple[str, int]]:
    """How each static layer of `network_layers` pairs its wires, as a data movement:
    `('xor', m)` (bitonic: wire w ↔ w XOR m) or `('pairs', s)` (odd-even: s + 2i ↔
    s + 2i + 1 while both are wires, the others unpaired)."""
    if network == "odd_even":
        return [("pairs", layer % 2) for layer in range(n)]
    blocks = network_wires(network, n).bit_length() - 1
    return [("xor", 1 << (block - step)) for block in range(blocks) for step in range(block + 1)]


def _swap_static(t, swap, wires: int):
    """`t[:, partner]` of a static layer (`layer_swaps`) for `[batch, wires, c]` `t`, as
    reshapes and reverses: XLA compiles these to copies, where a gather with the same
    indices is an element-by-element loop."""
    kind, k = swap
    batch, c = tf.shape(t)[0], tf.shape(t)[2]
    if kind == "xor":
        blocks = tf.reshape(t, tf.stack([batch, wires // (2 * k), 2, k, c]))
        return tf.reshape(tf.reverse(blocks, axis=[2]), tf.shape(t))
    pairs = (wires - k) // 2
    if pairs == 0:
        return t
    body = tf.reshape(t[:, k:k + 2 * pairs], tf.stack([batch, pairs, 2, c]))
    body = tf.reshape(tf.reverse(body, axis=[2]), tf.stack([batch, 2 * pairs, c]))
    parts = [t[:, :k], body, t[:, k + 2 * pairs:]]
    return tf.concat([p for p, size in zip(parts, (k, 2 * pairs, wires - k - 2 * pairs),
                                           strict=True) if size], axis=1)


def _odd_even_layer(w, layer, n, xp):
    """Partners of layer `layer` of odd-even transposition sort on n wires: pairs
    (i, i + 1) with i ≡ layer (mod 2); `xp` is numpy or a TF-like namespace."""
    shifted = w - layer % 2
    first = (shifted >= 0) & (shifted % 2 == 0) & (w + 1 < n)
    second = (shifted >= 1) & (shifted % 2 == 1)
    partner = xp.where(first, w + 1, xp.where(second, w - 1, w))
    return partner, first


def _bitonic_layer(w, block, step, xp):
    """Partners of step `step` of block `block` of the bitonic sorter: wires w and
    w XOR m, m = 2^(block − step); the comparator sorts ascending in the groups of
    2^(block + 1) wires of even index, descending in the others."""
    if xp is np:
        m = 1 << (block - step)
        partner = w ^ m
        lower = (w & m) == 0
        descending = ((w >> (block + 1)) & 1) == 1
    else:
        m = tf.bitwise.left_shift(1, block - step)
        partner = tf.bitwise.bitwise_xor(w, m)
        lower = tf.equal(tf.bitwise.bitwise_and(w, m), 0)
        descending = tf.equal(tf.bitwise.bitwise_and(tf.bitwise.right_shift(w, block + 1), 1), 1)
    return partner, lower != descending


class _TfWhere:
    """The two numpy functions `_odd_even_layer` uses, for tensors."""

    where = staticmethod(tf.where)


@tf.custom_gradient
def _partner_rows(t, partner):
    """`t[:, partner]` for `[batch, wires, ...]` `t`; `partner` is an involution (a
    product of disjoint transpositions), so the gradient is the same gather."""

    def grad(upstream):
        return tf.gather(upstream, partner, axis=1), None

    return tf.gather(t, partner, axis=1), grad


def _mix(state, other, sigma):
    """Rows σ·state + (1 − σ)·other of `[batch, wires, n + 1]` states (σ `[batch, wires]`);
    σ = 1 keeps a row bit for bit."""
    sigma = sigma[:, :, None]
    return sigma * state + (1.0 - sigma) * other


def _finite_difference(other_values, values, sign):
    """b − a of each comparator, (value on its max wire) − (value on its min wire):
    the same float on both of its wires, clipped to the finite range (the difference of
    two finite floats may overflow)."""
    diff = (other_values - values) * sign
    limit = tf.constant(np.finfo(values.dtype.as_numpy_dtype).max, values.dtype)
    return tf.clip_by_value(diff, -limit, limit)


def _apply_layer(state, kind, partner, is_lo, active, step_fn, swap=None):
    """One layer of relaxed comparators, for lists whose wire kinds are tensors.

    Args:
      state: `[batch, wires, n + 1]`: the rows of the relaxed permutation matrix on the
        wires, and the values on the wires (ascending keys) as the last column.
      kind: `[batch or 1, wires]` int32 `_BELOW`/`_ENTRY`/`_ABOVE`.
      partner, is_lo: `[wires]` the layer (see `network_layers`).
      active: `[batch, 1]` bool (the layer exists for the row) or None (all rows).
      step_fn: σ of a difference.
      swap: `state[:, partner]` as a function of `state` (default a gather).

    Returns:
      `(state, kind)` after the layer. A comparator of two entries mixes them with
      σ = step_fn(b − a); one that involves a padding wire is exact (σ ∈ {0, 1}); rows
      where the layer is not active are unchanged.
    """
    wires = tf.shape(state)[1]
    other = _partner_rows(state, partner) if swap is None else swap(state)
    other_kind = tf.gather(kind, partner, axis=1)
    has_comparator = tf.not_equal(partner, tf.range(wires, dtype=partner.dtype))
    entries = tf.logical_and(tf.equal(kind, _ENTRY), tf.equal(other_kind, _ENTRY))
    relaxed = tf.logical_and(entries, has_comparator)
    in_order = tf.where(is_lo, kind <= other_kind, other_kind <= kind)
    if active is not None:
        relaxed = tf.logical_and(relaxed, active)
        in_order = tf.logical_or(in_order, tf.logical_not(active))
    dtype = state.dtype
    sign = tf.where(is_lo, tf.ones([], dtype), -tf.ones([], dtype))
    diff = _finite_difference(other[:, :, -1], state[:, :, -1], sign)
    diff = tf.where(relaxed, diff, tf.zeros_like(diff))
    hard = tf.where(in_order, tf.ones([], dtype), tf.zeros([], dtype))
    state = _mix(state, other, tf.where(relaxed, step_fn(diff), hard))
    kind = tf.where(tf.logical_or(relaxed, in_order), kind, other_kind)
    return state, kind


@functools.lru_cache(maxsize=512)
def static_plan(network: str, n: int):
    """The layers of the network for a full list of static length n, with the wire
    kinds resolved: `(wires, layers)`, each layer `(swap, sign, relaxed, hard)` with
    `swap` its pairing (`layer_swaps`),
    `sign` +1 on min wires and −1 on max wires, `relaxed` the wires of comparators of
    two entries and `hard` σ (0 or 1) of the other wires."""
    wires = network_wires(network, n)
    w = np.arange(wires)
    kind = np.where(w < wires - n, _BELOW, _ENTRY)  # odd-even: wires == n
    layers = []
    for (partner, is_lo, _), swap in zip(network_layers(network, n), layer_swaps(network, n),
                                         strict=True):
        other = kind[partner]
        relaxed = (kind == _ENTRY) & (other == _ENTRY) & (partner != w)
        in_order = np.where(is_lo, kind <= other, other <= kind)
        kind = np.where(relaxed | in_order, kind, other)
        layers.append((swap, np.where(is_lo, 1, -1), relaxed, in_order.astype(np.float64)))
    return wires, tuple(layers)


def _run_static(keys, network: str, step_fn):
    """`_run_network` for full lists of a static length: the wire kinds are known at
    trace time, so each layer is gathers and elementwise ops with constant masks."""
    dtype = keys.dtype
    n = keys.shape[-1]
    wires, layers = static_plan(network, n)
    batch = tf.shape(keys)[0]
    state = tf.concat([tf.broadcast_to(tf.eye(n, dtype=dtype), tf.stack([batch, n, n])),
                       keys[:, :, None]], axis=-1)
    if wires > n:  # bitonic: the first wires hold values below every entry
        state = tf.concat([tf.zeros(tf.stack([batch, wires - n, n + 1]), dtype), state], axis=1)
    for swap, sign, relaxed, hard in layers:
        other = _swap_static(state, swap, wires)
        if relaxed.any():
            diff = _finite_difference(other[:, :, -1], state[:, :, -1],
                                      tf.constant(sign, dtype))
            if relaxed.all():
                sigma = step_fn(diff)
            else:
                diff = tf.where(relaxed, diff, tf.zeros_like(diff))
                sigma = tf.where(relaxed, step_fn(diff), tf.constant(hard, dtype))
        else:
            sigma = tf.broadcast_to(tf.constant(hard, dtype), tf.shape(state)[:2])
        state = _mix(state, other, sigma)
    state = state[:, wires - n:]
    return state[:, :, -1], state[:, :, :-1]


def _ceil_log2(count):
    """⌈log₂ count⌉ of an int32 tensor (0 for count <= 1), exactly."""
    powers = tf.bitwise.left_shift(1, tf.range(31, dtype=tf.int32))
    return tf.reduce_sum(tf.cast(powers[None, :] < tf.reshape(count, [-1, 1]), tf.int32),
                         axis=-1)


def _run_network(keys, valid, network: str, step_fn):
    """The relaxed network on `[batch, n]` ascending `keys`.

    Args:
      keys: `[batch, n]` finite values (padded entries replaced).
      valid: `[batch, n]` bool or None.
      network: one of `NETWORKS`.
      step_fn: σ of a difference.

    Returns:
      `(sorted_keys, perm)`: `[batch, n]` relaxed ascending keys and `[batch, n, n]`
      P̂ (row i: position i of the ascending order); with `valid`, positions >= n_valid
      are 0.
    """
    static_n = keys.shape[-1]
    if valid is None and static_n is not None:
        return _run_static(keys, network, step_fn)
    dtype = keys.dtype
    batch = tf.shape(keys)[0]
    n = tf.shape(keys)[1] if static_n is None else static_n
    if static_n is not None:
        wires = network_wires(network, static_n)
    elif network == "odd_even":
        wires = n
    else:
        wires = tf.bitwise.left_shift(1, _ceil_log2(n)[0])
    order = None
    if valid is None:
        count = tf.reshape(tf.cast(n, tf.int32), [1])
    else:
        count = _masking.n_valid(valid)
        order = tf.argsort(tf.cast(tf.logical_not(valid), tf.int32), axis=-1, stable=True)
    # Wires of the unpadded list: odd-even the first n_valid; bitonic the last n_valid
    # of the first 2^⌈log₂ n_valid⌉.
    if network == "odd_even":
        stages = count
        start = tf.zeros_like(count)
    else:
        stages = _ceil_log2(count)
        start = tf.bitwise.left_shift(1, stages) - count
    w = tf.range(wires, dtype=tf.int32)[None, :]
    slot = w - start[:, None]  # [batch or 1, wires]: index among the valid entries
    holds = tf.logical_and(slot >= 0, slot < count[:, None])
    clipped = tf.clip_by_value(slot, 0, tf.maximum(n - 1, 0))
    if valid is None:
        values = tf.gather(keys, clipped[0], axis=1)
        onehot = tf.one_hot(clipped, n, dtype=dtype)
    else:
        source = tf.gather(order, clipped, axis=1, batch_dims=1)
        values = tf.gather(keys, source, axis=1, batch_dims=1)
        onehot = tf.one_hot(source, n, dtype=dtype)
    zero = tf.zeros([], dtype)
    perm = tf.broadcast_to(tf.where(holds[:, :, None], onehot, zero),
                           tf.stack([batch, wires, n]))
    state = tf.concat([perm, tf.where(holds, values, zero)[:, :, None]], axis=-1)
    kind = tf.where(slot < 0, _BELOW, tf.where(holds, _ENTRY, _ABOVE))
    active_rows = None if valid is None else stages[:, None]

    def active(stage):
        return None if active_rows is None else stage < active_rows

    if static_n is not None:
        for (partner, is_lo, stage), swap in zip(network_layers(network, static_n),
                                                 layer_swaps(network, static_n), strict=True):
            state, kind = _apply_layer(
                state, kind, tf.constant(partner), tf.constant(is_lo), active(stage), step_fn,
                swap=lambda t, swap=swap: _swap_static(t, swap, wires))
    else:
        state = _run_dynamic(state, kind, n, wires, network, active, step_fn)
    # Read out the unpadded list's wires.
    positions = tf.range(n, dtype=tf.int32)[None, :]
    wire = tf.clip_by_value(start[:, None] + positions, 0, wires - 1)
    keep = positions < count[:, None]
    if valid is None:
        state = tf.gather(state, wire[0], axis=1)
    else:
        state = tf.gather(state, wire, axis=1, batch_dims=1)
    state = tf.where(keep[:, :, None], state, zero)
    return state[:, :, -1], state[:, :, :-1]


def _run_dynamic(state, kind, n, wires, network, active, step_fn):
    """The layers for an n unknown at trace time, in a `tf.while_loop`."""
    w = tf.range(wires, dtype=tf.int32)
    if network == "odd_even":
        layers = n

        def layer_of(t):
            partner, is_lo = _odd_even_layer(w, t, n, _TfWhere)
            return partner, is_lo, t
    else:
        blocks = _ceil_log2(wires)[0]
        layers = blocks * (blocks + 1) // 2

        def layer_of(t):
            # Layer t is step t − b(b + 1)/2 of block b, the largest b with b(b+1)/2 <= t.
            b = tf.range(32, dtype=tf.int32)
            block = tf.reduce_sum(tf.cast(b * (b + 1) // 2 <= t, tf.int32)) - 1
            step = t - block * (block + 1) // 2
            partner, is_lo = _bitonic_layer(w, block, step, tf)
            return partner, is_lo, block

    def body(t, state, kind):
        partner, is_lo, stage = layer_of(t)
        state, kind = _apply_layer(state, kind, partner, is_lo, active(stage), step_fn)
        return t + 1, state, kind

    _, state, _ = tf.while_loop(
        lambda t, *_: t < layers, body, (tf.constant(0, tf.int32), state, kind),
        maximum_iterations=tf.maximum(layers, 1))  # XLA: a list of size >= 1
    return state


# ---------------------------------------------------------------------------------
# Public operators.
# ---------------------------------------------------------------------------------
def _checked(steepness, network, sigmoid, art_lambda, direction, hard):
    steepness = _checks.check_positive("steepness", steepness)
    network = check_network(network)
    sigmoid = check_sigmoid(sigmoid)
    art_lambda = check_art_lambda(art_lambda)
    direction = _checks.check_direction(direction)
    hard = check_hard(hard)

    def step_fn(v):
        return relaxed_step(v, steepness, sigmoid, art_lambda)

    return network, step_fn, direction, hard


def _network_lists(lists: Lists, network, step_fn, direction):
    """`(sorted values in direction order, P̂, keys)` of a batch of lists.

    The network runs on the values minus a per-list reference c (it mixes values by
    convex combinations, so the shift commutes; c is added back to the sorted values):
    its results do not depend on the scores' offset. A list with a non-finite value
    gives NaN (`permutation.centred_finite_rows`)."""
    centred, bad = centred_finite_rows(lists.values)
    centre = tf.stop_gradient(lists.values - centred)[:, :1]
    keys = centred if direction == "ASCENDING" else -centred
    sorted_keys, perm = _run_network(keys, lists.mask, network, step_fn)
    sorted_values = (sorted_keys if direction == "ASCENDING" else -sorted_keys) + centre
    return poison_rows(sorted_values, bad), poison_rows(perm, bad), keys


@list_operator
def sorting_network_permutation_matrix(scores, steepness: float = DEFAULT_STEEPNESS,
                           network: str = DEFAULT_NETWORK, sigmoid: str = DEFAULT_SIGMOID,
                           art_lambda: float = DEFAULT_ART_LAMBDA,
                           direction: str = "DESCENDING", hard: bool = False, *, mask=None):
    """Relaxed permutation matrix of a differentiable sorting network (Petersen et al.,
    ICML 2021; monotonic sigmoids: ICLR 2022).

    The scores run through an odd-even or bitonic network whose comparators are relaxed
    with a sigmoid of steepness β; P̂ is the product of the layers' doubly-stochastic
    mixing matrices (see the module docstring).

    Args:
      scores: `[..., n]` real tensor, sorted along the last axis; or a
        `tf.RaggedTensor` `[batch, (n)]` (ragged output `[batch, (n), (n)]`).
      steepness: β > 0 (default 10), in inverse units of the scores: a comparator is
        nearly exact when its two values differ by much more than 1/β. As β → ∞, P̂
        tends to the exact permutation matrix.
      network: 'odd_even' (default; n layers) or 'bitonic' (~½log₂²n layers).
      sigmoid: 'cauchy' (default), 'reciprocal', 'optimal' (monotonic, ICLR 2022),
        'logistic', 'logistic_phi' (logistic with the activation replacement trick)
        or 'gaussian'.
      art_lambda: λ ∈ [0, 1) of 'logistic_phi' (default 0.25).
      direction: 'DESCENDING' (default) or 'ASCENDING'.
      hard: straight-through: the exact permutation matrix in the forward pass, the
        gradient of the relaxation in the backward pass.
      mask: optional boolean `[..., n]` (or `[n]`), True = valid entry: the valid block
        is P̂ of the unpadded list, rows of positions >= n_valid and columns of padded
        entries are 0. See softsort_tf._masking.

    Returns:
      P̂ `[..., n, n]` in the dtype of `scores`: doubly stochastic (the valid block,
      with a mask), row i the soft one-hot of the input at position i of the
      `direction` order.

    Example:
    >>> P = sorting_network_permutation_matrix([[1.0, 3.0, 2.0]], steepness=1000.0)
    >>> np.round(P.numpy()[0], 2)
    array([[0., 1., 0.],
           [0., 0., 1.],
           [1., 0., 0.]], dtype=float32)
    >>> P = sorting_network_permutation_matrix([[1.0, 3.0, 2.0]], network="bitonic")
    >>> np.round(P.numpy()[0].sum(axis=0), 4), np.round(P.numpy()[0].sum(axis=1), 4)
    (array([1., 1., 1.], dtype=float32), array([1., 1., 1.], dtype=float32))
    """
    network, step_fn, direction, hard = _checked(steepness, network, sigmoid, art_lambda,
                                                 direction, hard)
    _, perm, keys = _network_lists(scores, network, step_fn, direction)
    if hard:
        perm = straight_through(_exact_permutation_2d(tf.stop_gradient(-keys), scores.mask),
                                perm)
    return ListResult(perm, "square")


@list_operator
def sorting_network_sort(x, steepness: float = DEFAULT_STEEPNESS, network: str = DEFAULT_NETWORK,
                         sigmoid: str = DEFAULT_SIGMOID, art_lambda: float = DEFAULT_ART_LAMBDA,
                         direction: str = "ASCENDING", hard: bool = False, axis: int = -1, *,
                         mask=None):
    """Soft-sorted values: the outputs of a relaxed sorting network (Petersen et al.,
    ICML 2021), equal to `sorting_network_permutation_matrix(x, ...) @ x`.

    Args:
      x: `[..., n]` real tensor, or a `tf.RaggedTensor` `[batch, (n)]`.
      steepness, network, sigmoid, art_lambda: see `sorting_network_permutation_matrix`.
      direction: 'ASCENDING' (default, as `tf.sort`) or 'DESCENDING'.
      hard: straight-through: the exact sort forward, the relaxed gradient backward.
      axis: the axis to sort along (default the last).
      mask: optional boolean of the shape of `x` (or `[n]`), True = valid: the first
        n_valid outputs are the soft-sorted valid values, the others 0.

    Returns:
      The soft-sorted values, the shape and (floating) dtype of `x`.

    Example:
    >>> v = sorting_network_sort([[2.5, -1.0, 0.3, 4.0]], steepness=1000.0)
    >>> np.round(v.numpy(), 2)
    array([[-1. ,  0.3,  2.5,  4. ]], dtype=float32)
    """
    network, step_fn, direction, hard = _checked(steepness, network, sigmoid, art_lambda,
                                                 direction, hard)
    values, _, keys = _network_lists(x, network, step_fn, direction)
    lengths = None if x.mask is None else _masking.n_valid(x.mask)
    if hard:
        exact = tf.linalg.matvec(_exact_permutation_2d(tf.stop_gradient(-keys), x.mask),
                                 tf.stop_gradient(x.values))
        values = straight_through(exact, values)
    return ListResult(values, "sorted", lengths=lengths)


# Odd-even (default) or bitonic networks (`network=`): products of doubly-stochastic
# relaxed swaps (`softsort_tf.ops.family`).
DIFFSORT = Family(
    "sorting_network", "steepness", DEFAULT_STEEPNESS,
    "steepness β of the relaxed swaps' sigmoid, in inverse units of the scores: values "
    "closer than about 1/β are blurred together (β → ∞: exact)",
    "Petersen, Borgelt, Kuehne & Deussen (ICML 2021, ICLR 2022)",
    matrix_fn=sorting_network_permutation_matrix, doubly_stochastic=True,
    temperature_units="inverse_scores", scale_free_temperature=1.0)

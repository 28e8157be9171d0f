"""Differentiable sorting networks (Petersen, Borgelt, Kuehne & Deussen, ICML 2021;
monotonic sigmoids: ICLR 2022): odd-even and bitonic networks of relaxed swaps.

Each comparator of values a (min wire) and b (max wire) is relaxed with a sigmoid f of
steepness β (`relaxed_step`): σ = f(β·(b − a)), min ← σ·a + (1 − σ)·b, max ←
(1 − σ)·a + σ·b; the same mixing of the rows of the identity gives P̂, a product of
doubly-stochastic layers (row i: the input at position i of the `direction` order).
Networks: 'odd_even' (n layers) and 'bitonic' (Batcher's, ⌈log₂ n⌉(⌈log₂ n⌉ + 1)/2
layers on 2^⌈log₂ n⌉ wires, the extra wires below every score and routed by exact
comparators, so that it sorts every n). Padded entries sit on wires of their own, so
the valid block of P̂ is that of the unpadded list. n may be unknown at trace time;
both compile with XLA. Cost O(L·n²) per list for L layers.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _docs, _masking, _special
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


# -- Arguments and sigmoids ------------------------------------------------------------
def check_art_lambda(art_lambda) -> float:
    """λ of the activation replacement trick, in [0, 1) (λ = 1 would make φ a sign)."""
    try:
        value = float(art_lambda)
    except (TypeError, ValueError):
        value = math.nan
    if not 0.0 <= value < 1.0:
        raise ValueError(f"`art_lambda` must be a number in [0, 1), got {art_lambda!r}.")
    return value


def relaxed_step(v, steepness: float, sigmoid: str = DEFAULT_SIGMOID,
                 art_lambda: float = DEFAULT_ART_LAMBDA):
    """σ = f(β·v): the weight a relaxed comparator gives to "already in order" when
    the value on its max wire exceeds the value on its min wire by v. Each f is the CDF
    of a symmetric distribution (diffsort's parameterisation), with u = β·v:

    - 'logistic': 1/(1 + e^(−u)); 'logistic_phi': the logistic of β·v/(|v| + 10⁻¹⁰)^λ
      (the activation replacement trick, ICML 2021, λ = `art_lambda`);
    - 'gaussian': Φ(u); 'reciprocal': ½·u/(2 + |u|) + ½; 'cauchy': arctan(u)/π + ½;
    - 'optimal': u + ½ for |u| ≤ ¼, 1 − 1/(16u) above, −1/(16u) below.

    'reciprocal', 'cauchy' and 'optimal' are the monotonic sigmoids of ICLR 2022. `v`
    must be finite; β·v may overflow to ±inf (exactly 0 or 1, zero gradient).

    Args:
      v: differences b − a, a float tensor.
      steepness: β > 0.
      sigmoid: one of `SIGMOIDS`.
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
    if sigmoid == "logistic_phi":
        v = v / tf.pow(tf.abs(v) + tf.constant(_ART_EPSILON, dtype), art_lambda)
    u = beta * v
    if sigmoid in ("logistic", "logistic_phi"):
        return tf.sigmoid(u)
    if sigmoid == "gaussian":
        return half + half * _special.erf(u * tf.constant(1.0 / math.sqrt(2.0), dtype))
    if sigmoid == "cauchy":
        # arctan as atan2(u, 1): the same values, and a TFLite builtin where Atan is not.
        return tf.math.atan2(u, tf.ones_like(u)) * tf.constant(1.0 / math.pi, dtype) + half
    a = tf.abs(u)
    if sigmoid == "reciprocal":
        # ½·sign(u)/(1 + 2/|u|) + ½ for |u| >= 1, so that u = ±inf gives 0 or 1.
        large = a >= 1.0
        inner = tf.where(large, tf.sign(u) / (1.0 + 2.0 / tf.where(large, a, tf.ones_like(a))),
                         u / (2.0 + tf.where(large, tf.ones_like(a), a)))
        return half * inner + half
    if sigmoid == "optimal":
        quarter = tf.constant(0.25, dtype)
        tail = 1.0 / (16.0 * tf.maximum(a, quarter))  # 1/(16|u|), bounded
        centre = tf.clip_by_value(u, -quarter, quarter) + half
        return tf.where(a <= quarter, centre, tf.where(u > 0, 1.0 - tail, tail))
    return _checks.check_choice("sigmoid", sigmoid, SIGMOIDS)  # raises: not a sigmoid


# -- The networks' layers --------------------------------------------------------------
def network_wires(network: str, n: int) -> int:
    """The number of wires of the network for n entries (bitonic: 2^⌈log₂ n⌉)."""
    if network == "odd_even" or n <= 1:
        return max(n, 1)
    return 1 << (n - 1).bit_length()


def network_layers(network: str, n: int) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """The layers of the network for a static n, each `(partner, is_lo, stage)`:
    the wire compared with each wire (itself: none), whether it receives the minimum,
    and the stage (odd-even: the layer; bitonic: the block) that decides whether the
    layer exists for a list of n_valid <= n entries."""
    w = np.arange(network_wires(network, n))
    if network == "odd_even":
        layers = [(_odd_even_layer(w, layer, n, np.where), layer) for layer in range(n)]
    else:
        layers = [(_bitonic_layer(w, block, step), block)
                  for block in range(w.size.bit_length() - 1) for step in range(block + 1)]
    return [(partner.astype(np.int32), is_lo, stage) for (partner, is_lo), stage in layers]


def layer_swaps(network: str, n: int) -> list[tuple[str, int]]:
    """How each layer of `network_layers` pairs its wires: `('xor', m)` (bitonic: w ↔ w
    XOR m) or `('pairs', s)` (odd-even: s + 2i ↔ s + 2i + 1)."""
    if network == "odd_even":
        return [("pairs", layer % 2) for layer in range(n)]
    blocks = network_wires(network, n).bit_length() - 1
    return [("xor", 1 << (block - step)) for block in range(blocks) for step in range(block + 1)]


def _swap_static(t, swap, wires: int):
    """`t[:, partner]` of a static layer (`layer_swaps`) for `[batch, wires, c]` `t`, as
    reshapes and reverses (copies under XLA, where a gather is a loop)."""
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


def _odd_even_layer(w, layer, n, where):
    """`(partner, is_lo)` of layer `layer` of odd-even transposition sort on n wires
    `w`: pairs (i, i + 1) with i ≡ layer (mod 2); `where` is `np.where` or `tf.where`."""
    shifted = w - layer % 2
    first = (shifted >= 0) & (shifted % 2 == 0) & (w + 1 < n)
    second = (shifted >= 1) & (shifted % 2 == 1)
    return where(first, w + 1, where(second, w - 1, w)), first


def _bitonic_layer(w, block, step):
    """`(partner, is_lo)` of step `step` of block `block` of the bitonic sorter on the
    wires `w` (numpy or tensors): w ↔ w XOR 2^(block − step), ascending in the groups
    of 2^(block + 1) wires of even index, descending in the others."""
    m = 2 ** (block - step)
    bit = (w // m) % 2                                 # w is the upper wire of its pair
    descending = (w // (2 * 2 ** block)) % 2
    return w + m * (1 - 2 * bit), bit == descending


@tf.custom_gradient
def _partner_rows(t, partner):
    """`t[:, partner]` for `[batch, wires, ...]` `t`; `partner` is an involution, so the
    gradient is the same gather."""

    def grad(upstream):
        return tf.gather(upstream, partner, axis=1), None

    return tf.gather(t, partner, axis=1), grad


def _mix(state, other, sign, step_fn, relaxed, hard):
    """Rows σ·state + (1 − σ)·other of `[batch, wires, n + 1]` states, σ = step_fn(b − a)
    on the `relaxed` wires (None: all) and `hard` on the others; `sign` is +1 on min
    wires, −1 on max wires; b − a is clipped finite."""
    dtype = state.dtype
    diff = (other[:, :, -1] - state[:, :, -1]) * sign
    limit = tf.constant(np.finfo(dtype.as_numpy_dtype).max, dtype)
    diff = tf.clip_by_value(diff, -limit, limit)
    if relaxed is None:
        sigma = step_fn(diff)
    else:
        sigma = tf.where(relaxed, step_fn(tf.where(relaxed, diff, tf.zeros_like(diff))), hard)
    sigma = sigma[:, :, None]
    return sigma * state + (1.0 - sigma) * other


def _apply_layer(state, kind, partner, is_lo, active, step_fn, swap=None):
    """`(state, kind)` after one layer (`network_layers`) of `state` `[batch, wires,
    n + 1]` (the rows of P̂, then the keys) with wire kinds `kind`: comparators of two
    entries relaxed, others exact; rows where `active` `[batch, 1]` is False unchanged;
    `swap`: `state[:, partner]` as a function of `state` (default a gather)."""
    dtype = state.dtype
    other = _partner_rows(state, partner) if swap is None else swap(state)
    other_kind = tf.gather(kind, partner, axis=1)
    has_comparator = tf.not_equal(partner, tf.range(tf.shape(state)[1], dtype=partner.dtype))
    entries = tf.logical_and(tf.equal(kind, _ENTRY), tf.equal(other_kind, _ENTRY))
    relaxed = tf.logical_and(entries, has_comparator)
    in_order = tf.where(is_lo, kind <= other_kind, other_kind <= kind)
    if active is not None:
        relaxed = tf.logical_and(relaxed, active)
        in_order = tf.logical_or(in_order, tf.logical_not(active))
    sign = tf.where(is_lo, tf.ones([], dtype), -tf.ones([], dtype))
    hard = tf.where(in_order, tf.ones([], dtype), tf.zeros([], dtype))
    state = _mix(state, other, sign, step_fn, relaxed, hard)
    return state, tf.where(tf.logical_or(relaxed, in_order), kind, other_kind)


@functools.lru_cache(maxsize=512)
def static_plan(network: str, n: int):
    """`(wires, layers)` for a full list of static length n, each layer `(swap, sign,
    relaxed, hard)` with the wire kinds resolved (the arguments of `_mix`)."""
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
    """`_run_network` for full lists of a static length (constant masks per layer)."""
    dtype = keys.dtype
    n = keys.shape[-1]
    wires, layers = static_plan(network, n)
    batch = tf.shape(keys)[0]
    state = tf.concat([tf.broadcast_to(tf.eye(n, dtype=dtype), tf.stack([batch, n, n])),
                       keys[:, :, None]], axis=-1)
    if wires > n:  # bitonic: the first wires hold values below every entry
        state = tf.concat([tf.zeros(tf.stack([batch, wires - n, n + 1]), dtype), state], axis=1)
    for swap, sign, relaxed, hard in layers:
        state = _mix(state, _swap_static(state, swap, wires), tf.constant(sign, dtype),
                     step_fn, None if relaxed.all() else relaxed, tf.constant(hard, dtype))
    state = state[:, wires - n:]
    return state[:, :, -1], state[:, :, :-1]


def _ceil_log2(count):
    """⌈log₂ count⌉ of an int32 tensor (0 for count <= 1), exactly."""
    powers = tf.bitwise.left_shift(1, tf.range(31, dtype=tf.int32))
    return tf.reduce_sum(tf.cast(powers[None, :] < tf.reshape(count, [-1, 1]), tf.int32),
                         axis=-1)


def _run_network(keys, valid, network: str, step_fn):
    """`(sorted_keys, perm)` `[batch, n]`, `[batch, n, n]` of the relaxed network on
    finite `keys` (`valid`: bool `[batch, n]` or None; rows >= n_valid are 0)."""
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
    slot = tf.range(wires, dtype=tf.int32)[None, :] - start[:, None]  # among the entries
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

    def active(stage):
        return None if valid is None else stage < stages[:, None]

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
    if valid is None:
        state = tf.gather(state, wire[0], axis=1)
    else:
        state = tf.gather(state, wire, axis=1, batch_dims=1)
    state = tf.where((positions < count[:, None])[:, :, None], state, zero)
    return state[:, :, -1], state[:, :, :-1]


def _run_dynamic(state, kind, n, wires, network, active, step_fn):
    """The layers for an n unknown at trace time, in a `tf.while_loop`."""
    w = tf.range(wires, dtype=tf.int32)
    if network == "odd_even":
        layers = n

        def layer_of(t):
            return (*_odd_even_layer(w, t, n, tf.where), t)
    else:
        blocks = _ceil_log2(wires)[0]
        layers = blocks * (blocks + 1) // 2

        def layer_of(t):
            # Layer t is step t − b(b + 1)/2 of block b, the largest b with b(b+1)/2 <= t.
            b = tf.range(32, dtype=tf.int32)
            block = tf.reduce_sum(tf.cast(b * (b + 1) // 2 <= t, tf.int32)) - 1
            return (*_bitonic_layer(w, block, t - block * (block + 1) // 2), block)

    def body(t, state, kind):
        partner, is_lo, stage = layer_of(t)
        state, kind = _apply_layer(state, kind, partner, is_lo, active(stage), step_fn)
        return t + 1, state, kind

    _, state, _ = tf.while_loop(
        lambda t, *_: t < layers, body, (tf.constant(0, tf.int32), state, kind),
        maximum_iterations=tf.maximum(layers, 1))  # XLA: a list of size >= 1
    return state


# -- Public operators ------------------------------------------------------------------
def _network_lists(lists: Lists, steepness, network, sigmoid, art_lambda, direction, hard):
    """`(values, perm, exact)`: the sorted values in direction order, P̂, and the exact P
    when `hard` (else None), computed on the centred values (`centred_finite_rows`); a
    list with a non-finite value gives NaN."""
    steepness = _checks.check_positive("steepness", steepness)
    network = _checks.check_choice("network", network, NETWORKS)
    sigmoid = _checks.check_choice("sigmoid", sigmoid, SIGMOIDS)
    art_lambda = check_art_lambda(art_lambda)
    ascending = _checks.check_direction(direction) == "ASCENDING"
    hard = check_hard(hard)
    centred, bad = centred_finite_rows(lists.values)
    centre = tf.stop_gradient(lists.values - centred)[:, :1]
    keys = centred if ascending else -centred
    sorted_keys, perm = _run_network(
        keys, lists.mask, network, lambda v: relaxed_step(v, steepness, sigmoid, art_lambda))
    sorted_values = (sorted_keys if ascending else -sorted_keys) + centre
    exact = _exact_permutation_2d(tf.stop_gradient(-keys), lists.mask) if hard else None
    return poison_rows(sorted_values, bad), poison_rows(perm, bad), exact


@list_operator
@_docs.fill
def sorting_network_permutation_matrix(scores, steepness: float = DEFAULT_STEEPNESS,
                           network: str = DEFAULT_NETWORK, sigmoid: str = DEFAULT_SIGMOID,
                           art_lambda: float = DEFAULT_ART_LAMBDA,
                           direction: str = "DESCENDING", hard: bool = False, *, mask=None):
    """Relaxed permutation matrix P̂ of a differentiable sorting network (module docstring).

    Args:
      scores: `[..., n]` real tensor, or a `tf.RaggedTensor` `[batch, (n)]` (ragged
        output `[batch, (n), (n)]`).
      steepness: β > 0, in inverse units of the scores: a comparator is nearly exact
        when its two values differ by much more than 1/β; P̂ is exact as β → ∞.
      network: 'odd_even' (default; n layers) or 'bitonic' (~½log₂²n layers).
      sigmoid: one of `SIGMOIDS` (`relaxed_step`), default 'cauchy'.
      art_lambda: λ ∈ [0, 1) of 'logistic_phi'.
      direction: 'DESCENDING' (default; row 0 = the largest score) or 'ASCENDING'.
      hard: straight-through: the exact permutation matrix in the forward pass, the
        gradient of the relaxation in the backward pass.
      {mask}

    Returns:
      P̂ `[..., n, n]` in the dtype of `scores`, doubly stochastic (0 outside the valid
      block).

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
    _, perm, exact = _network_lists(scores, steepness, network, sigmoid, art_lambda,
                                    direction, hard)
    return ListResult(perm if exact is None else straight_through(exact, perm), "square")


@list_operator
@_docs.fill
def sorting_network_sort(x, steepness: float = DEFAULT_STEEPNESS, network: str = DEFAULT_NETWORK,
                         sigmoid: str = DEFAULT_SIGMOID, art_lambda: float = DEFAULT_ART_LAMBDA,
                         direction: str = "ASCENDING", hard: bool = False, axis: int = -1, *,
                         mask=None):
    """Soft-sorted values: the outputs of a relaxed sorting network, equal to
    `sorting_network_permutation_matrix(x, ...) @ x`.

    Args:
      x: `[..., n]` real tensor, or a `tf.RaggedTensor` `[batch, (n)]`.
      steepness, network, sigmoid, art_lambda: see `sorting_network_permutation_matrix`.
      {direction}
      hard: straight-through: the exact sort forward, the relaxed gradient backward.
      {axis}
      {mask}

    Returns:
      The soft-sorted values, the shape and (floating) dtype of `x` (with a mask: the
      first n_valid are the valid values', then 0).

    Example:
    >>> v = sorting_network_sort([[2.5, -1.0, 0.3, 4.0]], steepness=1000.0)
    >>> np.round(v.numpy(), 2)
    array([[-1. ,  0.3,  2.5,  4. ]], dtype=float32)
    """
    values, _, exact = _network_lists(x, steepness, network, sigmoid, art_lambda, direction,
                                      hard)
    if exact is not None:
        values = straight_through(tf.linalg.matvec(exact, tf.stop_gradient(x.values)), values)
    lengths = None if x.mask is None else _masking.n_valid(x.mask)
    return ListResult(values, "sorted", lengths=lengths)


DIFFSORT = Family(
    "sorting_network", "steepness", DEFAULT_STEEPNESS,
    "steepness β of the relaxed swaps' sigmoid, in inverse units of the scores: values "
    "closer than about 1/β are blurred together (β → ∞: exact)",
    "Petersen, Borgelt, Kuehne & Deussen (ICML 2021, ICLR 2022)",
    matrix_fn=sorting_network_permutation_matrix, doubly_stochastic=True,
    temperature_units="inverse_scores", scale_free_temperature=1.0)

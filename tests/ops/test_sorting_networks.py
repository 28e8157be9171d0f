"""Differentiable sorting networks (`softsort_tf.ops.sorting_networks`): parity with the
diffsort package (golden values from scripts/reference_diffsort.py, no PyTorch needed)
and with a float64 numpy network written comparator by comparator, hard limits, double
stochasticity, gradients vs finite differences, XLA with an unknown n, masks, ragged
lists, dtypes and argument checks."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from scipy.special import erf, expit

import softsort_tf as ss
from softsort_tf.ops import sorting_networks
from softsort_tf.ops.sorting_networks import (
    NETWORKS,
    SIGMOIDS,
    network_layers,
    sorting_network_permutation_matrix,
    sorting_network_sort,
)

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "golden", "diffsort.json")


# ---------------------------------------------------------------------------------
# A float64 numpy network, one comparator at a time.
# ---------------------------------------------------------------------------------
def _step(v, sigmoid, beta, lam=0.25):
    u = beta * v
    if sigmoid == "logistic":
        return expit(u)
    if sigmoid == "logistic_phi":
        return expit(beta * v / (abs(v) + 1e-10) ** lam)
    if sigmoid == "gaussian":
        return 0.5 + 0.5 * erf(u / np.sqrt(2.0))
    if sigmoid == "reciprocal":
        return 0.5 * u / (2.0 + abs(u)) + 0.5
    if sigmoid == "cauchy":
        return np.arctan(u) / np.pi + 0.5
    if abs(u) <= 0.25:  # optimal
        return u + 0.5
    return 1.0 - 1.0 / (16.0 * u) if u > 0 else -1.0 / (16.0 * u)


def _comparators(network, n):
    """Wires and layers of (min wire, max wire) comparators, from the textbook
    definitions (odd-even transposition; Batcher's bitonic sorter on 2^⌈log₂ n⌉ wires)."""
    if network == "odd_even":
        return n, [[(i, i + 1) for i in range(layer % 2, n - 1, 2)] for layer in range(n)]
    wires = 1 << max(n - 1, 0).bit_length()
    layers = []
    for block in range(wires.bit_length() - 1):
        for step in range(block + 1):
            m = 1 << (block - step)
            layer = []
            for w in range(wires):
                if not w & m:
                    descending = (w >> (block + 1)) & 1
                    layer.append((w + m, w) if descending else (w, w + m))
            layers.append(layer)
    return wires, layers


def numpy_network(x, network, sigmoid, beta, lam=0.25):
    """Ascending (values, P) of one list; the first wires of a bitonic network hold
    −inf (exact comparators)."""
    n = len(x)
    wires, layers = _comparators(network, n)
    pad = wires - n
    values = np.concatenate([np.full(pad, -np.inf), np.asarray(x, float)])
    perm = np.zeros((wires, n))
    perm[pad:] = np.eye(n)
    for layer in layers:
        new_values, new_perm = values.copy(), perm.copy()
        for lo, hi in layer:
            if np.isinf(values[lo]) or np.isinf(values[hi]):
                s = float(values[lo] <= values[hi])
            else:
                s = _step(values[hi] - values[lo], sigmoid, beta, lam)
            if s in (0.0, 1.0):  # exact (a padding wire holds −inf)
                pair = (values[lo], values[hi]) if s else (values[hi], values[lo])
                new_values[lo], new_values[hi] = pair
            else:
                new_values[lo] = s * values[lo] + (1 - s) * values[hi]
                new_values[hi] = s * values[hi] + (1 - s) * values[lo]
            new_perm[lo] = s * perm[lo] + (1 - s) * perm[hi]
            new_perm[hi] = s * perm[hi] + (1 - s) * perm[lo]
        values, perm = new_values, new_perm
    return values[pad:], perm[pad:]


def _rows(seed, shape, scale=1.0):
    return scale * np.random.default_rng(seed).standard_normal(shape)


def _exact(x, direction="DESCENDING"):
    order = np.argsort(-x if direction == "DESCENDING" else x, axis=-1, kind="stable")
    return np.eye(x.shape[-1])[order]


# ---------------------------------------------------------------------------------
# Parity.
# ---------------------------------------------------------------------------------
def _golden():
    with open(GOLDEN) as f:
        return json.load(f)


def test_golden_values_and_gradients_equal_diffsort():
    golden = _golden()
    inputs = {n: np.array(v).reshape(golden["input_shapes"][n]) for n, v in
              golden["inputs"].items()}
    assert len(golden["cases"]) >= 90
    for case in golden["cases"]:
        x = tf.constant(inputs[str(case["n"])])
        batch, n = x.shape
        rng = np.random.default_rng(1000 + n)
        c_values, c_perm = rng.standard_normal((batch, n)), rng.standard_normal((batch, n, n))
        kw = dict(steepness=case["steepness"], network=case["network"],
                  sigmoid=case["sigmoid"], art_lambda=case["art_lambda"],
                  direction=case["direction"])
        with tf.GradientTape() as tape:
            tape.watch(x)
            perm = sorting_network_permutation_matrix(x, **kw)
            # The network's outputs are P̂ @ x as functions of x (every layer mixes the
            # values and the rows of P̂ with the same σ), so their VJP is that of P̂ @ x.
            values = tf.linalg.matvec(perm, x)
            total = tf.reduce_sum(values * c_values) + tf.reduce_sum(perm * c_perm)
        vjp = tape.gradient(total, x)
        label = {k: case[k] for k in ("network", "n", "sigmoid", "steepness", "direction")}
        checks = [(perm, "perm"), (values, "values"), (vjp, "vjp")]
        if n == 8 or case["direction"] == "DESCENDING":
            checks.append((sorting_network_sort(x, **kw), "values"))
        for got, key in checks:
            got = got.numpy()
            assert np.all(np.isfinite(got)), label
            np.testing.assert_allclose(got.ravel(), case[key], atol=1e-5, rtol=1e-5,
                                       err_msg=f"{key} {label}")


@pytest.mark.parametrize("network", NETWORKS)
def test_equals_the_comparator_by_comparator_network(network):
    # n = 11 and 22: the bitonic sizes where diffsort's network differs from Batcher's
    # padded one (at 22 it does not sort); odd-even at every size.
    for n, sigmoid in ((1, "cauchy"), (2, "logistic"), (6, "optimal"), (11, "reciprocal"),
                       (22, "logistic_phi"), (7, "gaussian")):
        x = _rows(n, (2, n))
        perm = sorting_network_permutation_matrix(x, 3.0, network, sigmoid,
                                                  direction="ASCENDING").numpy()
        values = sorting_network_sort(x, 3.0, network, sigmoid).numpy()
        for b in range(2):
            want_values, want_perm = numpy_network(x[b], network, sigmoid, 3.0)
            np.testing.assert_allclose(perm[b], want_perm, atol=1e-12)
            np.testing.assert_allclose(values[b], want_values, atol=1e-12)
        # DESCENDING: the network on the negated scores.
        down = sorting_network_permutation_matrix(x, 3.0, network, sigmoid).numpy()
        np.testing.assert_allclose(down[0], numpy_network(-x[0], network, sigmoid, 3.0)[1],
                                   atol=1e-12)


def test_static_layers_are_the_textbook_networks():
    for network in NETWORKS:
        for n in (1, 2, 5, 8, 13):
            wires, layers = _comparators(network, n)
            ours = network_layers(network, n)
            assert len(ours) == len(layers)
            for (partner, is_lo, _), layer in zip(ours, layers, strict=True):
                want = np.arange(wires)
                lows = np.zeros(wires, bool)
                for lo, hi in layer:
                    want[lo], want[hi] = hi, lo
                    lows[lo] = True
                np.testing.assert_array_equal(partner, want)
                np.testing.assert_array_equal(is_lo & (partner != np.arange(wires)), lows)
            # The data movement of the static layers is the gather by `partner`.
            wire_ids = tf.constant(np.arange(wires, dtype=np.float32)[None, :, None])
            for (partner, _, _), swap in zip(ours, sorting_networks.layer_swaps(network, n),
                                             strict=True):
                moved = sorting_networks._swap_static(wire_ids, swap, wires).numpy()
                np.testing.assert_array_equal(moved[0, :, 0], partner)


# ---------------------------------------------------------------------------------
# Properties.
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize("direction", ["ASCENDING", "DESCENDING"])
def test_hard_limit_is_the_exact_permutation(network, direction):
    for n in (1, 2, 5, 9, 22):
        x = _rows(10 + n, (3, n))
        for sigmoid in SIGMOIDS:
            beta = 1e12
            perm = sorting_network_permutation_matrix(x, beta, network, sigmoid,
                                                      direction=direction)
            np.testing.assert_allclose(perm.numpy(), _exact(x, direction), atol=1e-5)
        values = sorting_network_sort(x, 1e12, network, direction=direction).numpy()
        want = np.sort(x, axis=-1)
        np.testing.assert_allclose(values, want if direction == "ASCENDING" else want[:, ::-1],
                                   atol=1e-5)


@pytest.mark.parametrize("network", NETWORKS)
def test_doubly_stochastic_and_soft_sort_is_p_times_x(network):
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
        x = _rows(16, (2, 16), scale=2.0).astype(dtype)
        for sigmoid in SIGMOIDS if dtype == np.float64 else ("cauchy",):
            perm = sorting_network_permutation_matrix(x, 1.5, network, sigmoid).numpy()
            assert perm.dtype == dtype and np.all(np.isfinite(perm))
            assert perm.min() >= 0.0
            np.testing.assert_allclose(perm.sum(-1), 1.0, atol=tol)
            np.testing.assert_allclose(perm.sum(-2), 1.0, atol=tol)
        values = sorting_network_sort(x[:, :13], 1.5, network, direction="DESCENDING").numpy()
        perm = sorting_network_permutation_matrix(x[:, :13], 1.5, network).numpy()
        np.testing.assert_allclose(values, np.einsum("bij,bj->bi", perm, x[:, :13]),
                                   atol=10 * tol)


@pytest.mark.parametrize("network", NETWORKS)
def test_gradients_match_finite_differences(network):
    n = 6
    x0 = _rows(3, (2, n))
    rng = np.random.default_rng(4)
    c_perm, c_values = rng.standard_normal((2, n, n)), rng.standard_normal((2, n))
    mask = np.array([[True] * n, [True, False, True, True, False, True]])
    h = 1e-6
    steps = np.eye(x0.size).reshape((x0.size,) + x0.shape) * h
    # Every perturbed input as one batch: [2 * x0.size, 2, n].
    perturbed = np.concatenate([x0 + steps, x0 - steps])
    for sigmoid in ("cauchy", "logistic_phi", "optimal", "reciprocal"):
        def loss(x, sigmoid=sigmoid):
            m = np.broadcast_to(mask, x.shape)
            perm = sorting_network_permutation_matrix(x, 2.0, network, sigmoid, mask=m)
            values = sorting_network_sort(x, 2.0, network, sigmoid, mask=m)
            return (tf.reduce_sum(perm * c_perm, axis=(-1, -2, -3))
                    + tf.reduce_sum(values * c_values, axis=(-1, -2)))

        x = tf.constant(x0)
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = loss(x)
        grad = tape.gradient(value, x).numpy()
        assert np.all(np.isfinite(grad))
        np.testing.assert_array_equal(grad[~mask], 0.0)  # padded entries
        both = loss(tf.constant(perturbed)).numpy()
        numeric = ((both[:x0.size] - both[x0.size:]) / (2 * h)).reshape(x0.shape)
        np.testing.assert_allclose(grad, numeric, atol=1e-6, rtol=1e-5, err_msg=sigmoid)


@pytest.mark.parametrize("network", NETWORKS)
def test_xla_with_unknown_n_equals_eager(network):
    def run(x, mask):
        with tf.GradientTape() as tape:
            tape.watch(x)
            perm = sorting_network_permutation_matrix(x, 2.0, network, "cauchy", mask=mask)
            values = sorting_network_sort(x, 2.0, network, "logistic_phi", mask=mask)
            weights = tf.cast(tf.range(tf.size(perm[0])), x.dtype)
            total = (tf.reduce_sum(tf.reshape(perm, [tf.shape(x)[0], -1]) * weights)
                     + tf.reduce_sum(tf.square(values)))
        return perm, values, tape.gradient(total, x, unconnected_gradients="zero")

    spec = [tf.TensorSpec([None, None], tf.float64), tf.TensorSpec([None, None], tf.bool)]
    compiled = tf.function(run, input_signature=spec, jit_compile=True)
    rng = np.random.default_rng(5)
    for n in (1, 6):
        x = tf.constant(rng.standard_normal((3, n)))
        mask = tf.constant(np.arange(n)[None, :] < np.array([[n], [max(n - 2, 0)], [1]]))
        for got, want in zip(compiled(x, mask), run(x, mask), strict=True):
            assert np.all(np.isfinite(got.numpy()))
            np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-12)
    # Without a mask, XLA and the static layers agree.
    no_mask = tf.function(lambda x: sorting_network_permutation_matrix(x, 2.0, network),
                          input_signature=spec[:1], jit_compile=True)
    x = rng.standard_normal((2, 11))
    np.testing.assert_allclose(no_mask(tf.constant(x)).numpy(),
                               sorting_network_permutation_matrix(x, 2.0, network).numpy(),
                               atol=1e-12)


@pytest.mark.parametrize("network", NETWORKS)
def test_masks_give_the_unpadded_matrix(network):
    n = 7
    x = _rows(6, (4, n))
    counts = np.array([7, 5, 1, 0])
    mask = np.zeros((4, n), bool)
    for b, c in enumerate(counts):
        mask[b, np.sort(np.random.default_rng(b).permutation(n)[:c])] = True
    x[~mask] = np.nan  # padded values never matter
    x_tf = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x_tf)
        perm = sorting_network_permutation_matrix(x_tf, 2.0, network, mask=mask)
        values = sorting_network_sort(x_tf, 2.0, network, mask=mask)
        total = tf.reduce_sum(perm * np.arange(n)) + tf.reduce_sum(values)
    grad = tape.gradient(total, x_tf).numpy()
    perm, values = perm.numpy(), values.numpy()
    assert np.all(np.isfinite(perm)) and np.all(np.isfinite(values))
    np.testing.assert_array_equal(grad[~mask], 0.0)
    assert np.all(np.isfinite(grad))
    for b, c in enumerate(counts):
        valid = x[b, mask[b]]
        np.testing.assert_array_equal(perm[b][c:], 0.0)
        np.testing.assert_array_equal(perm[b][:, ~mask[b]], 0.0)
        np.testing.assert_array_equal(values[b][c:], 0.0)
        if c:
            alone = sorting_network_permutation_matrix(valid[None], 2.0, network).numpy()[0]
            np.testing.assert_allclose(perm[b][:c][:, mask[b]], alone, atol=1e-14)
            np.testing.assert_allclose(
                values[b][:c], sorting_network_sort(valid[None], 2.0, network).numpy()[0],
                atol=1e-14)
    ragged = tf.ragged.constant([[0.3, -1.0, 2.0], [1.0], [4.0, 0.5, 0.2, 0.1, 3.0]])
    out = sorting_network_permutation_matrix(ragged, 2.0, network)
    assert isinstance(out, tf.RaggedTensor)
    for row, got in zip(ragged.to_list(), out.to_list(), strict=True):
        np.testing.assert_allclose(got, sorting_network_permutation_matrix([row], 2.0, network)[0],
                                   atol=1e-6)


def test_dtypes_and_hard_straight_through():
    x = _rows(7, (2, 5)).astype(np.float32)
    reference = sorting_network_permutation_matrix(x, 4.0).numpy()
    for dtype in (tf.float16, tf.bfloat16):
        got = sorting_network_permutation_matrix(tf.cast(x, dtype), 4.0)
        assert got.dtype == dtype
        np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), reference, atol=2e-2)
    hard_x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(hard_x)
        hard = sorting_network_permutation_matrix(hard_x, 4.0, hard=True)
        total = tf.reduce_sum(hard * np.arange(5.0))
    np.testing.assert_array_equal(hard.numpy(), _exact(x))
    with tf.GradientTape() as tape2:
        tape2.watch(hard_x)
        soft_total = tf.reduce_sum(sorting_network_permutation_matrix(hard_x, 4.0) * np.arange(5.0))
    np.testing.assert_allclose(tape.gradient(total, hard_x).numpy(),
                               tape2.gradient(soft_total, hard_x).numpy(), atol=1e-6)
    sorted_hard = sorting_network_sort(x, 4.0, hard=True).numpy()
    np.testing.assert_allclose(sorted_hard, np.sort(x, -1), atol=1e-6)


def test_extreme_values_stay_finite():
    x = np.array([[3e38, -3e38, 0.0, 1e-30, -1e-30]], np.float32)
    for network in NETWORKS:
        for sigmoid in SIGMOIDS:
            x_tf = tf.constant(x)
            with tf.GradientTape() as tape:
                tape.watch(x_tf)
                perm = sorting_network_permutation_matrix(x_tf, 1e30, network, sigmoid)
                total = tf.reduce_sum(perm * np.arange(5.0, dtype=np.float32))
            grad = tape.gradient(total, x_tf).numpy()
            assert np.all(np.isfinite(perm.numpy())) and np.all(np.isfinite(grad)), sigmoid
            np.testing.assert_allclose(perm.numpy().sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("kwargs, name", [
    (dict(steepness=0.0), "steepness"), (dict(steepness=-1.0), "steepness"),
    (dict(steepness=float("nan")), "steepness"), (dict(steepness="big"), "steepness"),
    (dict(network="merge"), "network"), (dict(sigmoid="tanh"), "sigmoid"),
    (dict(art_lambda=1.0), "art_lambda"), (dict(art_lambda=-0.1), "art_lambda"),
    (dict(direction="up"), "direction"), (dict(hard="yes"), "hard"),
])
def test_bad_arguments_raise_value_errors_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        sorting_network_permutation_matrix([[1.0, 2.0]], **kwargs)
    with pytest.raises(ValueError, match=name):
        sorting_network_sort([[1.0, 2.0]], **kwargs)


def test_registered_as_a_permutation_operator_and_soft_method():
    op = ss.get_family("sorting_network")
    assert op.temperature == "steepness" and op.doubly_stochastic
    x = np.array([[0.2, 1.5, -0.3, 0.9]])
    np.testing.assert_allclose(
        ss.permutation_matrix(x, "sorting_network", steepness=3.0, network="bitonic").numpy(),
        sorting_network_permutation_matrix(x, 3.0, "bitonic").numpy(), atol=1e-12)
    np.testing.assert_array_equal(ss.permutation_matrix(x, "sorting_network", hard=True).numpy(),
                                  _exact(x))
    ranks = ss.soft_rank(x, "sorting_network", "ASCENDING", temperature=1e6).numpy()
    np.testing.assert_allclose(ranks, [[2.0, 4.0, 1.0, 3.0]], atol=1e-4)
    np.testing.assert_allclose(ss.soft_sort(x, "sorting_network", temperature=1e6).numpy(),
                               np.sort(x, -1), atol=1e-4)

"""Helpers shared by several test modules (not a test module): inputs, padded-list
strategies and small utilities. Exact numpy references live in `numpy_references`."""

import numpy as np
import tensorflow as tf
from hypothesis import strategies as st

import softsort_tf as ss


# The Sinkhorn solver (tests/ops/sinkhorn, tests/solvers).
def implicit_or_unrolled(implicit: bool, solver: str = "auto"):
    """`implicit_diff` of an implicit (True) or unrolled (False) solve."""
    return ss.ImplicitDiff(solver=solver) if implicit else None


# Relaxed permutation matrices on padded lists (tests/ops, tests/losses/test_permutation.py).
PADDED_VALUES = [np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, 7.0, -1e-300]


TAU = 0.2  # small against the spacing 0.5 of the drawn values, but rows stay soft


# name: f(scores, mask=None) → P̂ [..., n, n]; whether it has a gradient.
MATRIX_OPERATORS = {
    "softsort": (lambda s, **kw: ss.softsort_permutation_matrix(s, tau=TAU, **kw), True),
    "softsort_p2": (lambda s, **kw: ss.softsort_permutation_matrix(s, tau=TAU, distance_power=2.0,
                                                                     **kw),
                    True),
    "softsort_p05_ascending": (lambda s, **kw: ss.softsort_permutation_matrix(
        s, tau=TAU, distance_power=0.5, direction="ASCENDING", **kw), True),
    "softsort_hard": (lambda s, **kw: ss.softsort_permutation_matrix(s, tau=TAU, hard=True, **kw),
                      True),
    "neuralsort": (lambda s, **kw: ss.neuralsort_permutation_matrix(s, tau=TAU, **kw), True),
    "neuralsort_hard_ascending": (lambda s, **kw: ss.neuralsort_permutation_matrix(
        s, tau=TAU, hard=True, direction="ASCENDING", **kw), True),
    "registry_neuralsort": (lambda s, **kw: ss.permutation_matrix(s, "neuralsort", tau=TAU,
                                                                  **kw), True),
    "hard": (lambda s, **kw: ss.hard_permutation_matrix(s, **kw), False),
}


@st.composite
def padded_batches(draw, min_valid=1):
    """Two lists of `min_valid`..6 valid entries (halves in [−2, 2]: many ties), padded
    at random positions to one random longer length with arbitrary padded values, and
    a seed for the random linear functionals."""
    n_valid = [draw(st.integers(min_valid, 6)) for _ in range(2)]
    n = max(max(n_valid), 1) + draw(st.integers(0, 3))
    values = np.zeros([2, n])
    mask = np.zeros([2, n], bool)
    for r, nv in enumerate(n_valid):
        mask[r, draw(st.permutations(range(n)))[:nv]] = True
        for i in range(n):
            values[r, i] = (draw(st.integers(-4, 4)) / 2.0 if mask[r, i]
                            else draw(st.sampled_from(PADDED_VALUES)))
    return values, mask, draw(st.integers(0, 2**31 - 1))


def matrix_and_gradient(fn, x, mask, weights, has_gradient):
    """P̂ of `fn`, and the gradient w.r.t. x of Σ weights ⊙ P̂ (None without gradient)."""
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        perm = fn(x) if mask is None else fn(x, mask=mask)
        total = tf.reduce_sum(tf.constant(weights) * perm)
    grad = tape.gradient(total, x) if has_gradient else None
    return perm.numpy(), None if grad is None else grad.numpy()


def embed_block(block, mask_row):
    """An `[nv, nv]` block of the unpadded list as the `[n, n]` matrix of the padded
    one: rows = the first nv sorted positions, columns = the valid entries."""
    n = mask_row.size
    out = np.zeros([n, n])
    out[np.ix_(np.arange(block.shape[0]), np.flatnonzero(mask_row))] = block
    return out


# Permutation accuracies (tests/losses/test_permutation.py, tests/metrics/test_permutation.py).
def hand_made_batch():
    """Three examples whose row-wise argmax gives [0, 1, 2] (right), [0, 2, 1] (two
    positions wrong) and [1, 1, 2] (not a permutation; one position wrong)."""
    argmax = np.array([[0, 1, 2], [0, 2, 1], [1, 1, 2]])
    perm = 0.1 + 0.7 * np.eye(3)[argmax]  # rows 0.8 / 0.1 / 0.1
    return np.array([[0, 1, 2]] * 3), perm.astype(np.float32)


# Ranked lists (tests/ops/test_ranking.py, tests/losses, tests/metrics).
def random_padded(rng, batch, n, dtype=np.float64, ties=True):
    """Labels 0–4 (−1 on a random tail of each row), scores with ties if asked."""
    labels = rng.integers(0, 5, size=(batch, n)).astype(dtype)
    scores = (rng.integers(0, 6, size=(batch, n)) if ties else rng.normal(size=(batch, n)))
    lengths = rng.integers(1, n + 1, size=batch)
    for b, length in enumerate(lengths):
        labels[b, length:] = -1.0
    return labels, scores.astype(dtype)


def masked_label_batch(seed, batch=12, n=6):
    """`(labels, mask, scores)` in float32 / bool, as Keras-RS's `{"labels", "mask"}`:
    graded labels 0–3, a random mask, list 0 without a relevant item, list 1 with
    relevant items only where masked, list 2 empty, and tied scores of equal labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=(batch, n)).astype(np.float32)
    mask = rng.random((batch, n)) > 0.25
    labels[0] = 0.0
    labels[1] = np.where(mask[1], 0.0, 3.0)
    mask[2] = False
    scores = rng.normal(size=(batch, n)).astype(np.float32)
    for b in range(batch):
        same = np.flatnonzero(labels[b] == labels[b, 0])
        scores[b, same[:2]] = scores[b, same[0]]
    return labels, mask, scores


# Losses (tests/losses).
def separated_values(rng, shape, gap=0.3):
    """Random values whose entries along the last axis are distinct by at least 1 − 2·gap."""
    n = shape[-1]
    base = rng.rand(*shape).argsort(axis=-1).argsort(axis=-1).astype(np.float64)
    return base + rng.uniform(-gap, gap, size=shape) - n / 2


def value_and_grad(fn, x):
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return y.numpy(), tape.gradient(y, x).numpy()


GRADIENT_CASES = {
    "all_ties": np.zeros((3, 6)),
    "partial_ties": np.array([[1.0, 1.0, 1.0, -2.0, 5.0, 5.0]]),
    "large": np.array([[1e6, -1e6, 3e5, 0.0, 1e6 + 1.0, 2.0]]),
    "huge": np.array([[1e30, -1e30, 0.0, 1e-30, 3e29, -5.0]]),
    "tiny": np.array([[1e-30, -1e-30, 0.0, 2e-30, 3e-30, -5e-31]]),
    "batch_of_one": np.array([[0.3, -1.2, 2.0, 0.1, 0.0, 0.7]]),
}


# Kendall's τ (tests/ops, tests/metrics and tests/losses test_kendall.py).
def tied_rows(rng, rows, n, levels=4):
    return rng.integers(0, levels, size=(rows, n)).astype(np.float64)


def assert_finite_close(actual, expected, **kw):
    actual = np.asarray(actual)
    assert np.all(np.isfinite(actual)), actual
    np.testing.assert_allclose(actual, expected, **kw)


def _perturbed_copies(args, wrt, unperturbed, delta):
    """The batch of copies behind `batched_jacobians` and `weighted_gradient_check`: every
    arg `[B, ...]` repeated `unperturbed` times, then 2·size more times where args[wrt]
    holds args[wrt] + delta·e_i and args[wrt] − delta·e_i (i = 0..size−1, size =
    args[wrt].size); the copies are flattened into the batch axis, as tensors."""
    args = [np.asarray(a) for a in args]
    target = args[wrt]
    size = target.size
    steps = delta * np.eye(size).reshape((size,) + target.shape)
    perturbed = np.stack([target + s for step in steps for s in (step, -step)])
    copies = [np.stack([a] * (unperturbed + 2 * size)) for a in args]
    copies[wrt] = np.concatenate([np.stack([target] * unperturbed), perturbed])
    return [tf.constant(a.reshape((-1,) + a.shape[2:])) for a in copies]


def batched_jacobians(f, args, wrt=0, delta=1e-5):
    """`(theoretical, numerical)` Jacobians of `f(*args)` with respect to `args[wrt]`, as
    `tf.test.compute_gradient` gives them (`[y.size, args[wrt].size]`, central
    differences with step `delta`), from ONE forward and backward pass over a batch of
    copies: every arg `[B, ...]` is stacked C times along axis 0, and `f` must treat the
    rows of its batch independently (as the Sinkhorn operators do: each row stops on its
    own). Copies 0..S−1 (S = args[wrt].size) are unperturbed, the loss of copy j is its
    j-th output entry, so its gradient is row j of the theoretical Jacobian (cross-row
    entries included); copies S + 2i and S + 2i + 1 hold args[wrt] ± delta·e_i, their
    outputs give column i of the numerical Jacobian."""
    size = np.asarray(args[wrt]).size
    stacked = _perturbed_copies(args, wrt, size, delta)
    with tf.GradientTape() as tape:
        tape.watch(stacked[wrt])
        out = f(*stacked)
        out_copies = tf.reshape(out, [3 * size, -1])
        out_size = out_copies.shape[1]
        assert out_size <= size, "more outputs than theoretical copies"
        loss = tf.linalg.trace(out_copies[:out_size])
    grad = tape.gradient(loss, stacked[wrt]).numpy().reshape((3 * size, size))
    theoretical = grad[:out_size]
    out_copies = out_copies.numpy()[size:].reshape(size, 2, out_size)
    numerical = ((out_copies[:, 0] - out_copies[:, 1]) / (2 * delta)).T
    return theoretical, numerical


def weighted_gradient_check(f, args, wrt=0, num_weights=2, delta=1e-6, seed=0):
    """`(theoretical, numerical)` gradients `[num_weights, args[wrt].size]` of the losses
    Σ w_k ⊙ f(*args) for `num_weights` random Gaussian weightings w_k of the outputs, from
    ONE forward and backward pass over a batch of copies (every arg `[B, ...]` stacked along
    axis 0; `f` must treat the rows of its batch independently). Copies 0..K−1 are
    unperturbed, copy k carries the loss of w_k, so its gradient is the theoretical one;
    copies K + 2i and K + 2i + 1 hold args[wrt] ± delta·e_i and give the central difference
    of every weighted loss along entry i. A wrong Jacobian entry J_ij shifts gradient i of
    each loss by w_kj·ΔJ_ij: random weights catch it (almost surely) as the full Jacobian
    would, with 2·size + K evaluations in one call instead of 2·size calls."""
    size = np.asarray(args[wrt]).size
    stacked = _perturbed_copies(args, wrt, num_weights, delta)
    with tf.GradientTape() as tape:
        tape.watch(stacked[wrt])
        out = f(*stacked)
        out_copies = tf.reshape(out, [num_weights + 2 * size, -1])
        weights = np.random.default_rng(seed).normal(
            size=(num_weights, out_copies.shape[1]))
        loss = tf.reduce_sum(out_copies[:num_weights] * tf.cast(weights, out.dtype))
    grad = tape.gradient(loss, stacked[wrt]).numpy().reshape((-1, size))
    theoretical = grad[:num_weights]
    values = out_copies.numpy()[num_weights:] @ weights.T  # [2·size, K]
    numerical = ((values[0::2] - values[1::2]) / (2 * delta)).T
    return theoretical, numerical

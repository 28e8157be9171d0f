"""Tests of `softsort_tf.ops.permutation`: SoftSort, NeuralSort and the hard permutation
matrix (with the Sinkhorn plan of the same table where a property compares the
families), deterministic and straight-through, against naive float64 numpy references;
padded and ragged lists; errors and memory."""

import resource

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy_references import np_perm_matrix
from operator_cases import (
    MATRIX_OPERATORS,
    batched_jacobians,
    embed_block,
    matrix_and_gradient,
    padded_batches,
)

import softsort_tf as ss

SETTINGS = settings(max_examples=10, deadline=None)


directions = st.sampled_from(["ASCENDING", "DESCENDING"])


seeds = st.integers(0, 10_000)


leading_shapes = st.sampled_from([(), (3,), (2, 2)])


def np_softmax_rows(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def np_soft_sort(s, tau, power, direction):
    """SoftSort eq. 4: P[i, j] = softmax_j(−|s_[i] − s_j|^p / τ), s_[i] sorted."""
    s = np.asarray(s, np.float64)
    out = np.empty(s.shape + (s.shape[-1],))
    for idx in np.ndindex(s.shape[:-1]):
        row = s[idx]
        ordered = np.sort(row)[::-1] if direction == "DESCENDING" else np.sort(row)
        logits = np.array([[-abs(ordered[i] - row[j]) ** power / tau
                            for j in range(row.size)] for i in range(row.size)])
        out[idx] = np_softmax_rows(logits)
    return out


def np_neural_sort(s, tau, direction):
    """NeuralSort as in the original code: P_max = (C − A_s·(1·1ᵀ))ᵀ, softmax rows."""
    s = np.asarray(s, np.float64)
    out = np.empty(s.shape + (s.shape[-1],))
    for idx in np.ndindex(s.shape[:-1]):
        row = s[idx] if direction == "DESCENDING" else -s[idx]
        n = row.size
        col = row[:, None]
        a_s = np.abs(col - col.T)
        one = np.ones((n, 1))
        b = a_s @ (one @ one.T)  # the O(n³) product of the original implementation
        scaling = (n + 1 - 2 * (np.arange(n) + 1)).astype(np.float64)
        c = col @ scaling[None, :]
        out[idx] = np_softmax_rows((c - b).T / tau)
    return out


def separated(seed, shape, gap=1.0):
    """Scores whose entries along the last axis are at least `gap` / 2 apart."""
    rng = np.random.RandomState(seed)
    base = np.argsort(rng.rand(*shape), axis=-1).astype(np.float64) * gap
    return base + rng.uniform(-0.25 * gap, 0.25 * gap, size=shape) + rng.randn() * 3


OPS = {
    "softsort": lambda s, **kw: ss.softsort_permutation_matrix(s, **kw),
    "neuralsort": lambda s, **kw: ss.neuralsort_permutation_matrix(s, **kw),
    "sinkhorn": lambda s, **kw: ss.permutation_matrix(s, "sinkhorn", **kw),
}


@SETTINGS
@given(leading_shapes, st.integers(1, 7), directions, seeds,
       st.sampled_from([0.05, 0.3, 1.0, 4.0]), st.sampled_from([1.0, 2.0, 1.5, 0.5]))
def test_soft_sort_matches_numpy_formula(lead, n, direction, seed, tau, power):
    s = np.random.RandomState(seed).randn(*lead, n)
    out = ss.softsort_permutation_matrix(s, tau=tau, distance_power=power, direction=direction)
    assert out.shape == lead + (n, n) and out.dtype == tf.float64
    np.testing.assert_allclose(out.numpy(), np_soft_sort(s, tau, power, direction),
                               rtol=1e-10, atol=1e-12)


@SETTINGS
@given(leading_shapes, st.integers(1, 7), directions, seeds, st.sampled_from([0.1, 1.0, 5.0]))
def test_neural_sort_matches_numpy_formula(lead, n, direction, seed, tau):
    s = np.random.RandomState(seed).randn(*lead, n)
    out = ss.neuralsort_permutation_matrix(s, tau=tau, direction=direction)
    assert out.shape == lead + (n, n)
    np.testing.assert_allclose(out.numpy(), np_neural_sort(s, tau, direction),
                               rtol=1e-9, atol=1e-12)


def test_xla_formulation_of_soft_sort_matches_numpy():
    """Each distance power compiled by XLA (all three in one program) against numpy."""
    s = np.random.RandomState(3).randn(4, 9)
    powers = (1.0, 2.0, 0.7)
    outs = tf.function(lambda x: [ss.softsort_permutation_matrix(x, tau=0.2, distance_power=p)
                                  for p in powers], jit_compile=True)(tf.constant(s))
    for power, out in zip(powers, outs, strict=True):
        np.testing.assert_allclose(out.numpy(), np_soft_sort(s, 0.2, power, "DESCENDING"),
                                   rtol=1e-10, atol=1e-12, err_msg=f"power {power}")


@SETTINGS
@given(st.sampled_from(["softsort", "neuralsort"]), leading_shapes, st.integers(2, 9),
       directions, seeds, st.sampled_from([0.01, 0.5, 3.0, 50.0]))
def test_unimodal_row_stochastic(method, lead, n, direction, seed, tau):
    s = separated(seed, lead + (n,), gap=0.1)
    perm = OPS[method](tf.constant(s, tf.float32), tau=tau, direction=direction).numpy()
    assert np.all(perm >= 0)
    np.testing.assert_allclose(perm.sum(-1), 1.0, atol=1e-5)
    expected = np.argsort(-s if direction == "DESCENDING" else s, axis=-1)
    np.testing.assert_array_equal(perm.argmax(-1), expected)


@pytest.mark.parametrize("method", ["softsort", "neuralsort"])
def test_urs_matrices_are_not_column_stochastic(method):
    perm = OPS[method](tf.constant([0.0, 0.5, 0.6, 0.7]), tau=1.0).numpy()
    np.testing.assert_allclose(perm.sum(-1), 1.0, atol=1e-6)
    assert np.abs(perm.sum(-2) - 1.0).max() > 0.05


def test_sinkhorn_permutation_is_doubly_stochastic_and_sorts():
    s = separated(0, (3, 6))
    perm = ss.permutation_matrix(s, "sinkhorn", epsilon=1e-3, threshold=1e-6,
                                 max_iterations=2000).numpy()
    np.testing.assert_allclose(perm.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(perm.sum(-2), 1.0, atol=1e-5)
    np.testing.assert_array_equal(perm.argmax(-1), np.argsort(-s, axis=-1))


@pytest.mark.parametrize("method, temperatures, direction", [
    ("softsort", [("tau", t) for t in (1.0, 0.3, 0.1, 0.03, 0.01)], "ASCENDING"),
    ("softsort", [("tau", t) for t in (1.0, 0.3, 0.1, 0.03, 0.01)], "DESCENDING"),
    ("neuralsort", [("tau", t) for t in (1.0, 0.3, 0.1, 0.03, 0.01)], "ASCENDING"),
    ("neuralsort", [("tau", t) for t in (1.0, 0.3, 0.1, 0.03, 0.01)], "DESCENDING"),
    ("sinkhorn", [("epsilon", e) for e in (1e-1, 1e-2, 1e-3, 1e-4)], "DESCENDING"),
])
def test_limit_is_the_exact_permutation(method, temperatures, direction):
    s = separated(1, (2, 7))
    exact = np_perm_matrix(s, direction)
    errors = []
    for name, value in temperatures:
        kwargs = {name: value}
        if method == "sinkhorn":
            kwargs.update(threshold=1e-7, max_iterations=5000)
        perm = OPS[method](s, direction=direction, **kwargs).numpy()
        errors.append(np.abs(perm - exact).max())
    assert all(b <= a + 1e-12 for a, b in zip(errors, errors[1:], strict=False)), errors
    assert errors[0] > 1e-2 and errors[-1] < 1e-6, errors


def check_equivariance(method, n, direction, seed, hard, **kwargs):
    rng = np.random.RandomState(seed)
    s = rng.randn(2, n)
    pi = np.eye(n)[rng.permutation(n)]
    p_s = OPS[method](s, direction=direction, hard=hard, **kwargs).numpy()
    p_pis = OPS[method](s @ pi.T, direction=direction, hard=hard, **kwargs).numpy()
    np.testing.assert_allclose(p_pis, p_s @ pi.T, atol=1e-12 if method != "sinkhorn" else 1e-6)
    assert hard or np.abs(p_s - np_perm_matrix(s, direction)).max() > 1e-3


@SETTINGS
@given(st.sampled_from(["softsort", "neuralsort"]), st.integers(2, 8), directions, seeds,
       st.booleans())
def test_equivariance(method, n, direction, seed, hard):
    """Proposition 1: P̂(Π s) = P̂(s) Πᵀ for every permutation matrix Π."""
    check_equivariance(method, n, direction, seed, hard, tau=0.7)


@pytest.mark.parametrize("seed, direction, hard", [(0, "DESCENDING", False),
                                                   (1, "ASCENDING", True)])
def test_sinkhorn_equivariance(seed, direction, hard):
    check_equivariance("sinkhorn", 6, direction, seed, hard, epsilon=0.05, threshold=1e-7,
                       max_iterations=2000)


@pytest.mark.parametrize("method", ["softsort", "neuralsort", "sinkhorn"])
def test_hard_is_exact_forward_and_relaxed_backward(method):
    s = tf.constant(np.random.RandomState(2).randn(3, 6))
    kwargs = dict(epsilon=0.1) if method == "sinkhorn" else dict(tau=0.5)
    weights = tf.constant(np.random.RandomState(3).randn(3, 6, 6))
    grads = []
    for hard in (False, True):
        with tf.GradientTape() as tape:
            tape.watch(s)
            perm = OPS[method](s, hard=hard, direction="ASCENDING", **kwargs)
            loss = tf.reduce_sum(perm * weights)
        grads.append(tape.gradient(loss, s).numpy())
        if hard:
            np.testing.assert_array_equal(perm.numpy(), np_perm_matrix(s.numpy(), "ASCENDING"))
    assert np.abs(grads[0]).max() > 1e-3
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12)


@pytest.mark.parametrize("op, kwargs", [
    ("softsort", dict(tau=0.5)),
    ("softsort", dict(tau=0.5, distance_power=2.0)),
    ("softsort", dict(tau=2.0, distance_power=1.5, direction="ASCENDING")),
    ("neuralsort", dict(tau=0.5)),
    ("neuralsort", dict(tau=2.0, direction="ASCENDING")),
])
def test_gradients_match_finite_differences(op, kwargs):
    """The full Jacobian against central differences, as `tf.test.compute_gradient`
    gives them, from one batched call (the rows are independent lists)."""
    x = np.random.RandomState(4).randn(2, 5)
    weights = np.random.RandomState(5).randn(2, 5, 5)

    def f(s, w):
        perm = OPS[op](s, **kwargs)
        return tf.stack([tf.reduce_sum(perm * w, axis=[-1, -2]),
                         tf.reduce_sum(perm[..., 0, :] * s, axis=-1)], axis=-1)

    theoretical, numerical = batched_jacobians(f, [x, weights], delta=1e-6)
    assert theoretical.shape == numerical.shape == (4, 10)
    assert np.abs(theoretical).max() > 1e-2
    np.testing.assert_allclose(theoretical, numerical, atol=1e-6)


XLA_CASES = {
    "softsort": lambda s: ss.softsort_permutation_matrix(s, tau=0.3),
    "softsort_p2_ascending_hard": lambda s: ss.softsort_permutation_matrix(
        s, tau=0.3, distance_power=2.0, direction="ASCENDING", hard=True),
    "neuralsort": lambda s: ss.neuralsort_permutation_matrix(s, tau=0.3),
    "neuralsort_ascending_hard": lambda s: ss.neuralsort_permutation_matrix(
        s, tau=0.3, direction="ASCENDING", hard=True),
    "stochastic_softsort": lambda s: ss.stochastic_softsort_permutation_matrix(
        s, 4, seed=tf.constant([3, 4]), tau=0.3),
    "stochastic_neuralsort_hard": lambda s: ss.stochastic_neuralsort_permutation_matrix(
        s, 2, seed=7, tau=0.3, hard=True),
    "ranks_from_permutation": lambda s: ss.ranks_from_permutation(
        ss.softsort_permutation_matrix(s, tau=0.3)),
}


def test_xla_matches_eager():
    """Every case's output and gradient in a graph and under XLA equal the eager ones (all
    cases in one function: one trace and one XLA compilation per mode)."""
    x = tf.constant(np.random.RandomState(8).randn(3, 6).astype(np.float32))

    def with_grad(s, make):
        with tf.GradientTape() as tape:
            tape.watch(s)
            out = make(s)
            weights = np.random.RandomState(9).randn(*out.shape).astype(np.float32)
            loss = tf.reduce_sum(out * weights)
        return out, tape.gradient(loss, s)

    def every_case(s):
        return {name: with_grad(s, make) for name, make in XLA_CASES.items()}

    eager = every_case(x)
    for mode, results in (("graph", tf.function(every_case)(x)),
                          ("xla", tf.function(every_case, jit_compile=True)(x))):
        for name, (out, grad) in results.items():
            eager_out, eager_grad = eager[name]
            np.testing.assert_allclose(out.numpy(), eager_out.numpy(), atol=2e-5,
                                       err_msg=f"{name} {mode}")
            np.testing.assert_allclose(grad.numpy(), eager_grad.numpy(), atol=2e-4,
                                       err_msg=f"{name} {mode}")
    for name, (_, eager_grad) in eager.items():
        assert np.abs(eager_grad.numpy()).max() > 1e-3, name


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float64])
@pytest.mark.parametrize("method", ["softsort", "neuralsort", "sinkhorn"])
def test_dtypes(dtype, method):
    s = separated(10, (2, 5), gap=1.0)
    kwargs = dict(epsilon=1e-3) if method == "sinkhorn" else dict(tau=0.05)
    out = OPS[method](tf.constant(s, dtype), **kwargs)
    assert out.dtype == dtype
    ref = OPS[method](tf.constant(s, tf.float32), **kwargs)
    np.testing.assert_allclose(tf.cast(out, tf.float32).numpy(), ref.numpy(), atol=1e-2)
    stochastic = ss.stochastic_permutation_matrix(tf.constant(s, dtype), 2, 0, method, **kwargs)
    assert stochastic.dtype == dtype and stochastic.shape == (2, 2, 5, 5)


@pytest.mark.parametrize("method, kwargs", [
    ("softsort", dict(tau=1e-4, distance_power=0.1)),  # τ^(−1/p) = 1e40 overflowed
    ("softsort", dict(tau=1e-30)),
    ("softsort", dict(tau=1e-30, distance_power=2.0)),
    ("softsort", dict(tau=1e30, distance_power=0.5)),
    ("neuralsort", dict(tau=1e-30)),  # max|s|/τ overflowed
    ("neuralsort", dict(tau=1e-37)),
])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e30])
def test_extreme_temperatures_stay_finite_and_exact(method, kwargs, scale):
    """NaN once max|s|/τ overflowed; uniform rows with a wrong argmax for p < 1 (issue 15,
    item 9). The limits are the exact permutation (τ → 0) or uniform rows (τ → ∞)."""
    s = tf.constant(separated(3, (2, 5), gap=1.0) * scale, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(s)
        p = OPS[method](s, **kwargs)
        loss = tf.reduce_sum(p * np.random.RandomState(0).randn(2, 5, 5))
    grad = tape.gradient(loss, s).numpy()
    p = p.numpy()
    assert np.all(np.isfinite(p)) and np.all(np.isfinite(grad))
    if kwargs["tau"] < 1:
        np.testing.assert_allclose(p, np_perm_matrix(s.numpy(), "DESCENDING"), atol=1e-6)
    else:  # |d|^0.5 / 1e30 ≈ 0: uniform rows (float64 reference)
        np.testing.assert_allclose(p, np_soft_sort(s.numpy(), **{
            "tau": kwargs["tau"], "power": kwargs["distance_power"],
            "direction": "DESCENDING"}), rtol=1e-5)


def test_integer_scores_are_accepted():
    out = ss.softsort_permutation_matrix([[3, 1, 2]], tau=0.01)
    assert out.dtype == tf.float32
    np.testing.assert_allclose(out.numpy()[0], np.eye(3)[[0, 2, 1]], atol=1e-6)


@pytest.mark.parametrize("call, match", [
    (lambda: ss.softsort_permutation_matrix([1.0, 2.0], tau=0.0), "tau"),
    (lambda: ss.softsort_permutation_matrix([1.0, 2.0], distance_power=-1.0), "distance_power"),
    (lambda: ss.neuralsort_permutation_matrix([1.0, 2.0], tau=float("nan")), "tau"),
    (lambda: ss.neuralsort_permutation_matrix([1.0, 2.0], direction="UP"), "direction"),
    (lambda: ss.softsort_permutation_matrix([1.0, 2.0], hard="yes"), "hard"),
    (lambda: ss.softsort_permutation_matrix(3.0), "rank"),
    (lambda: ss.softsort_permutation_matrix(np.zeros([2, 0])), "n >= 1"),
    (lambda: ss.permutation_matrix([1.0, 2.0], "bubble"), "method"),
    (lambda: ss.permutation_matrix([1.0, 2.0], "sinkhorn", axis=0), "axis"),
    (lambda: ss.gumbel_perturb([1.0, 2.0], 0, seed=1), "num_samples"),
    (lambda: ss.gumbel_perturb([1.0, 2.0], 2, seed=[1, 2, 3]), "seed"),
    (lambda: ss.gumbel_perturb([1.0, 2.0], 2, seed=1.5), "seed"),
    (lambda: ss.permute_values(tf.zeros([2, 3]), tf.zeros([2])), "perm"),
    (lambda: ss.permute_values(tf.zeros([3, 3]), tf.zeros([4])), "values"),
    (lambda: ss.ranks_from_permutation(tf.zeros([3, 4])), "perm"),
])
def test_bad_arguments_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_neural_sort_graph_is_quadratic():
    """No tensor of the forward or backward graph exceeds batch · n² elements, and
    no matrix product costs more than batch · n² multiply-adds (A_s·(1·1ᵀ) would)."""
    batch, n = 3, 40
    s = tf.Variable(np.random.RandomState(0).randn(batch, n).astype(np.float32))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            perm = ss.neuralsort_permutation_matrix(s, tau=0.5)
            loss = ss.permutation_cross_entropy(tf.argsort(-s), perm)
        return tape.gradient(loss, s)

    graph = step.get_concrete_function().graph
    sizes = [t.shape.num_elements() for op in graph.get_operations() for t in op.outputs
             if t.shape.is_fully_defined()]
    assert max(sizes) == batch * n * n
    products = [op for op in graph.get_operations() if "MatMul" in op.type]
    for op in products:
        a, b = (t.shape.as_list() for t in op.inputs[:2])
        contraction = a[-2] if op.get_attr("adj_x") else a[-1]
        assert op.outputs[0].shape.num_elements() * contraction <= batch * n * n, op.type
    assert products  # the gradient of A_s·1 uses two matrix-vector products


def _vm_size() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


def test_neural_sort_memory_bound_at_n_2000():
    """NeuralSort at n = 2000, batch 4 (forward + backward) runs with the address space
    capped 1.5 GiB above its current size; one n × n × n float32 tensor would need
    4·2000³·4 B = 128 GB."""
    n = 2000
    s = tf.Variable(np.random.RandomState(0).randn(4, n).astype(np.float32))
    order = tf.argsort(-s)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vm_size() + 1536 * 2**20
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        with pytest.raises(MemoryError):  # control: the cap binds
            bytearray(2**31)
        with tf.GradientTape() as tape:
            perm = ss.neuralsort_permutation_matrix(s, tau=0.1)
            loss = tf.reduce_mean(ss.permutation_cross_entropy(order, perm))
        grad = tape.gradient(loss, s)
        row_sums, finite = tf.reduce_sum(perm, -1), tf.reduce_all(tf.math.is_finite(grad))
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    np.testing.assert_allclose(row_sums.numpy(), 1.0, atol=1e-4)
    assert bool(finite) and float(tf.reduce_max(tf.abs(grad))) > 0


@pytest.mark.parametrize("name", sorted(MATRIX_OPERATORS))
@settings(max_examples=20, deadline=None)
@given(batch=padded_batches())
def test_padded_matrix_equals_unpadded_matrix(name, batch):
    fn, has_gradient = MATRIX_OPERATORS[name]
    x, mask, seed = batch
    rng = np.random.RandomState(seed)
    n = x.shape[1]
    weights = rng.randn(2, n, n)
    perm, grad = matrix_and_gradient(fn, x, mask, weights, has_gradient)
    assert np.all(np.isfinite(perm))
    for r in range(2):
        valid = mask[r]
        nv = valid.sum()
        block_weights = weights[r][:nv][:, valid]
        ref, ref_grad = matrix_and_gradient(fn, x[r, valid][None], None, block_weights[None],
                                             has_gradient)
        # Valid block = the unpadded matrix; padded rows and columns exactly 0.
        np.testing.assert_allclose(perm[r], embed_block(ref[0], valid), rtol=1e-12, atol=1e-14)
        assert np.all(perm[r][nv:] == 0) and np.all(perm[r][:, ~valid] == 0)
        if has_gradient:
            assert np.all(np.isfinite(grad[r]))
            np.testing.assert_allclose(grad[r][valid], ref_grad[0], rtol=1e-9, atol=1e-11)
            assert np.all(grad[r][~valid] == 0)


def test_mask_of_rank_one_and_zero_one_values_broadcast():
    x = np.array([[3.0, np.nan, 1.0], [0.0, 5.0, 2.0]], np.float32)
    by_bool = ss.softsort_permutation_matrix(x, mask=np.array([[True, False, True]] * 2))
    np.testing.assert_array_equal(ss.softsort_permutation_matrix(x, mask=[1, 0, 1]).numpy(),
                                  by_bool.numpy())
    with pytest.raises(ValueError, match="mask"):
        ss.softsort_permutation_matrix(x, mask=[True, False])


@pytest.mark.parametrize("method", ["softsort", "neuralsort", "sinkhorn"])
def test_ragged_scores_give_ragged_matrices_of_each_list(method):
    lists = [[3.0, 1.0, 2.0, 0.5], [5.0], [0.0, -1.0]]
    kw = dict(epsilon=1e-3) if method == "sinkhorn" else dict(tau=0.3)
    out = ss.permutation_matrix(tf.ragged.constant(lists), method, **kw)
    assert isinstance(out, tf.RaggedTensor)
    assert out.shape.rank == 3
    for row, values in zip(out.to_list(), lists, strict=True):
        ref = ss.permutation_matrix([values], method, **kw).numpy()[0]
        np.testing.assert_allclose(np.array(row), ref, atol=1e-5)
    hard = ss.permutation_matrix(tf.ragged.constant(lists), method, hard=True, **kw)
    np.testing.assert_array_equal(hard.to_list()[0],
                                  ss.hard_permutation_matrix([lists[0]]).numpy()[0])
    stochastic = ss.stochastic_permutation_matrix(tf.ragged.constant(lists), 2, 0, method, **kw)
    assert [len(s[0]) for s in stochastic.to_list()] == [4, 1, 2]

"""Tests of `softsort_tf.ops.kendall`: Kendall's τ (hard and smooth), the Kendall
embedding, and the Kendall and Mallows kernels, against scipy and brute force. The layer,
loss and metric are tested in `tests/layers`, `tests/losses` and `tests/metrics`."""

import itertools

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from numpy_references import scipy_tau
from operator_cases import assert_finite_close, tied_rows, weighted_gradient_check

from softsort_tf.layers.kendall import KendallEmbedding
from softsort_tf.losses.kendall import KendallTauLoss
from softsort_tf.metrics.kendall import KendallTau
from softsort_tf.ops import kendall as K

ALGORITHMS = ("pairwise", "merge")


def brute_counts(a, b):
    """(discordant pairs, pairs tied in exactly one, concordant pairs), by brute force."""
    nd = half = nc = 0
    for i, j in itertools.combinations(range(len(a)), 2):
        sa, sb = np.sign(a[j] - a[i]), np.sign(b[j] - b[i])
        nd += sa * sb < 0
        nc += sa * sb > 0
        half += (sa == 0) != (sb == 0)
    return nd, half, nc


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_tau_equals_scipy_with_ties(algorithm):
    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 7, 20, 65):
        x, y = tied_rows(rng, 8, n), tied_rows(rng, 8, n, levels=5)
        y[0] = rng.normal(size=n)  # a list without ties in y
        x[1] = 3.0  # constant targets: weight 0
        tau, w = K.kendall_tau(x, y, algorithm=algorithm, return_weights=True)
        expected = [scipy_tau(a, b) for a, b in zip(x, y, strict=True)]
        assert_finite_close(tau, expected, atol=1e-12)
        defined = [n >= 2 and np.ptp(a) > 0 and np.ptp(b) > 0 for a, b in zip(x, y, strict=True)]
        np.testing.assert_array_equal(w.numpy(), np.array(defined, np.float64))


def test_tau_large_n_merge_equals_scipy():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.permutation(3000)[None], tied_rows(rng, 1, 3000, 50)])
    y = np.concatenate([rng.permutation(3000)[None], tied_rows(rng, 1, 3000, 70)])
    tau = K.kendall_tau(tf.constant(x), tf.constant(y), algorithm="merge")
    assert_finite_close(tau, [scipy_tau(a, b) for a, b in zip(x, y, strict=True)], atol=1e-9)


def test_tau_masks_ragged_and_negative_labels():
    rng = np.random.default_rng(3)
    x, y = tied_rows(rng, 4, 9), rng.normal(size=(4, 9))
    mask = rng.random((4, 9)) < 0.7
    mask[3] = False  # a list without valid items
    x_pad, y_pad = x.copy(), y.copy()
    x_pad[~mask], y_pad[~mask] = np.nan, np.inf  # padded values are never read
    for algorithm in ALGORITHMS:
        tau, w = K.kendall_tau(x_pad, y_pad, mask=mask, algorithm=algorithm, return_weights=True)
        expected = [scipy_tau(a[m], b[m]) for a, b, m in zip(x, y, mask, strict=True)]
        assert_finite_close(tau, expected, atol=1e-12)
        assert float(w[3]) == 0.0
    labels = np.where(mask, x, -1.0)
    tau = K.kendall_tau(labels, y, negative_labels_are_padding=True)
    assert_finite_close(tau, expected, atol=1e-12)
    ragged_x = tf.ragged.constant([list(a[m]) for a, m in zip(x, mask, strict=True)], tf.float64)
    ragged_y = tf.ragged.constant([list(b[m]) for b, m in zip(y, mask, strict=True)], tf.float64)
    assert_finite_close(K.kendall_tau(ragged_x, ragged_y), expected, atol=1e-12)


def test_tau_axis_dtypes_and_nan():
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(3, 6, 2)), rng.normal(size=(3, 6, 2))
    tau = K.kendall_tau(x, y, axis=1)
    assert tau.shape == (3, 2)
    assert_finite_close(tau[1, 0], scipy_tau(x[1, :, 0], y[1, :, 0]), atol=1e-12)
    half = K.kendall_tau(tf.constant(x, tf.float16), tf.constant(y, tf.float16), axis=1)
    assert half.dtype == tf.float16
    y[0, 2, 1] = np.nan
    tau = K.kendall_tau(x, y, axis=1).numpy()
    assert np.isnan(tau[0, 1]) and np.isfinite(np.delete(tau.ravel(), 1)).all()


def kernel_fns(algorithm):
    u = np.linspace(0.5, 2.0, 8)
    return {
        "kendall": lambda a, b=None: K.kendall_kernel(a, b, algorithm=algorithm),
        "mallows": lambda a, b=None: K.mallows_kernel(a, b, lam=0.3, algorithm=algorithm),
        "weighted_add": lambda a, b=None: K.weighted_kendall_kernel(
            a, b, u, combination="additive"),
        "weighted_mult": lambda a, b=None: K.weighted_kendall_kernel(a, b, u),
    }


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_kernels_symmetric_psd_and_right_invariant(algorithm):
    rng = np.random.default_rng(5)
    x = np.concatenate([tied_rows(rng, 10, 8), rng.normal(size=(10, 8))])
    y = rng.normal(size=(6, 8))
    perm = rng.permutation(8)
    for name, fn in kernel_fns(algorithm).items():
        if name.startswith("weighted"):
            x_used = x[10:]  # defined for total rankings
        else:
            x_used = x
        gram = fn(x_used).numpy()
        assert np.all(np.isfinite(gram)), name
        np.testing.assert_allclose(gram, gram.T, atol=1e-12, err_msg=name)
        assert np.linalg.eigvalsh(gram).min() >= -1e-6, name
        cross = fn(x_used, y).numpy()
        permuted = fn(x_used[:, perm], y[:, perm]).numpy()
        assert_finite_close(permuted, cross, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_kernel_values_brute_force(algorithm):
    rng = np.random.default_rng(6)
    x, y = tied_rows(rng, 5, 7), tied_rows(rng, 4, 7, levels=3)
    tau = K.kendall_kernel(x, y, algorithm=algorithm).numpy()
    nd = K.discordant_pairs(x, y, algorithm=algorithm).numpy()
    mallows = K.mallows_kernel(x, y, lam=0.7, algorithm=algorithm).numpy()
    for p, q in itertools.product(range(5), range(4)):
        d, half, _ = brute_counts(x[p], y[q])
        assert nd[p, q] == d + half / 2
        np.testing.assert_allclose(mallows[p, q], np.exp(-0.7 * (d + half / 2)), rtol=1e-12)
        np.testing.assert_allclose(tau[p, q], scipy_tau(x[p], y[q]), atol=1e-12)
    # Without ties: n_d is the plain count and ½‖Φ(x) − Φ(y)‖² over the ordered pairs.
    a, b = rng.permutation(6)[None].astype(float), rng.permutation(6)[None].astype(float)
    phi = [(r[:, None] < r[None, :]).astype(float) for r in (a[0], b[0])]
    nd = float(K.discordant_pairs(a, b, algorithm=algorithm)[0, 0])
    assert nd == brute_counts(a[0], b[0])[0] == 0.5 * np.sum((phi[0] - phi[1]) ** 2)


def test_kernel_is_cosine_of_signed_embedding_batched_and_masked():
    rng = np.random.default_rng(7)
    x, y = tied_rows(rng, 2 * 3, 6).reshape(2, 3, 6), rng.normal(size=(1, 4, 6))
    s_x = K.kendall_embedding(x, signed=True).numpy()
    s_y = K.kendall_embedding(y, signed=True).numpy()
    norms = np.linalg.norm(s_x, axis=-1)[..., :, None] * np.linalg.norm(s_y, axis=-1)[..., None, :]
    expected = np.where(norms > 0, np.einsum("bpk,bqk->bpq", s_x, np.broadcast_to(
        s_y, (2, 4, 15))) / np.where(norms > 0, norms, 1), 0)
    for algorithm in ALGORITHMS:
        assert_finite_close(K.kendall_kernel(x, y, algorithm=algorithm), expected, atol=1e-12)
    x_mask = rng.random((2, 3, 6)) < 0.8
    y_mask = rng.random((1, 4, 6)) < 0.8
    for algorithm in ALGORITHMS:
        k = K.kendall_kernel(x, y, x_mask=x_mask, y_mask=y_mask, algorithm=algorithm).numpy()
        m = K.mallows_kernel(x, y, 0.5, x_mask=x_mask, y_mask=y_mask, algorithm=algorithm).numpy()
        for b, p, q in itertools.product(range(2), range(3), range(4)):
            both = x_mask[b, p] & y_mask[0, q]
            a, c = x[b, p][both], y[0, q][both]
            np.testing.assert_allclose(k[b, p, q], scipy_tau(a, c), atol=1e-12)
            d, half, _ = brute_counts(a, c)
            np.testing.assert_allclose(m[b, p, q], np.exp(-0.5 * (d + half / 2)), rtol=1e-12)


def test_weighted_kendall_kernel_brute_force():
    rng = np.random.default_rng(8)
    n = 7
    x, y = rng.normal(size=(4, n)), rng.normal(size=(3, n))
    u = rng.random(n) + 0.1
    top3 = (np.arange(1, n + 1) > n - 3).astype(float)
    for combination, weights in (("additive", u), ("multiplicative", u),
                                 ("multiplicative", top3)):
        k = K.weighted_kendall_kernel(x, y, weights, combination=combination).numpy()
        for p, q in itertools.product(range(4), range(3)):
            rx = scipy.stats.rankdata(x[p]).astype(int)
            ry = scipy.stats.rankdata(y[q]).astype(int)

            def pair_weight(r, i, j, combination=combination, weights=weights):
                a, b = weights[r[i] - 1], weights[r[j] - 1]
                return a + b if combination == "additive" else a * b

            total = sum(pair_weight(rx, i, j) * pair_weight(ry, i, j)
                        for i in range(n) for j in range(n)
                        if i != j and x[p, i] < x[p, j] and y[q, i] < y[q, j])
            np.testing.assert_allclose(k[p, q], total, rtol=1e-12)
    ones = K.weighted_kendall_kernel(x, y, np.ones(n)).numpy()
    expected = [[brute_counts(a, b)[2] for b in y] for a in x]
    np.testing.assert_allclose(ones, expected)


def test_embedding_pair_order_ties_and_hard_limit():
    rng = np.random.default_rng(9)
    x = tied_rows(rng, 3, 6)
    i, j = np.triu_indices(6, 1)
    hard = K.kendall_embedding(x).numpy()
    np.testing.assert_array_equal(hard, (x[:, i] < x[:, j]).astype(float))
    signed = K.kendall_embedding(x, signed=True).numpy()
    np.testing.assert_array_equal(signed, np.sign(x[:, j] - x[:, i]))
    tied = x[:, i] == x[:, j]
    for sigma in (1e-2, 1e-4):
        smooth = K.kendall_embedding(x, smooth_scale=sigma).numpy()
        assert_finite_close(smooth[~tied], hard[~tied], atol=1e-12)
        assert_finite_close(smooth[tied], 0.5, atol=0)
    smooth = K.kendall_embedding(x, smooth_scale=0.7).numpy()
    expected = scipy.stats.norm.cdf((x[:, j] - x[:, i]) / (0.7 * np.sqrt(2)))
    assert_finite_close(smooth, expected, atol=1e-12)
    assert_finite_close(K.kendall_embedding(x, smooth_scale=0.7, signed=True),
                        2 * expected - 1, atol=1e-12)
    # Padded items: their pairs are 0, their values (NaN) are not read.
    mask = np.ones((3, 6), bool)
    mask[:, 4] = False
    x_nan = x.copy()
    x_nan[:, 4] = np.nan
    out = K.kendall_embedding(x_nan, smooth_scale=0.7, mask=mask).numpy()
    padded_pair = (i == 4) | (j == 4)
    assert_finite_close(out[:, padded_pair], 0.0)
    assert_finite_close(out[:, ~padded_pair], expected[:, ~padded_pair], atol=1e-12)
    # Item axis other than the last.
    assert K.kendall_embedding(np.zeros((6, 2)), axis=0).shape == (15, 2)


def test_embedding_and_soft_tau_gradients_match_finite_differences():
    rng = np.random.default_rng(10)
    x = tf.constant(rng.normal(size=(2, 5)))
    t = tf.constant(tied_rows(rng, 2, 5))
    mask = tf.constant([[True] * 5, [True, True, False, True, True]])
    # Gradients of random weightings of all outputs against central differences along
    # every entry of x, each function's copies evaluated in one batched call (rows are
    # independent lists; the mask and targets are stacked with them).
    for name, fn in (
            ("embedding", lambda v, t_, m: K.kendall_embedding(v, smooth_scale=0.8, mask=m)),
            ("signed", lambda v, t_, m: K.kendall_embedding(v, smooth_scale=0.8, signed=True)),
            ("soft tau", lambda v, t_, m: K.soft_kendall_tau(t_, v, smooth_scale=0.6, mask=m))):
        theoretical, numerical = weighted_gradient_check(fn, [x, t, mask], num_weights=3)
        assert np.all(np.isfinite(theoretical)), name
        np.testing.assert_allclose(theoretical, numerical, atol=1e-6, err_msg=name)
    with tf.GradientTape() as tape:
        tape.watch(x)
        tau = K.soft_kendall_tau(t, x, smooth_scale=0.6, mask=mask)
    grad = tape.gradient(tau, x).numpy()
    assert grad[1, 2] == 0.0  # padded entry


def test_soft_tau_is_expected_tau_and_tends_to_tau_b():
    rng = np.random.default_rng(11)
    t, p = tied_rows(rng, 1, 6)[0], rng.normal(size=6)
    sigma = 0.8
    soft = float(K.soft_kendall_tau(t, p, smooth_scale=sigma))
    noisy = p + sigma * rng.normal(size=(4000, 6))
    # τ-b of t against every noisy row at once (all pairs, numpy), checked against scipy.
    i, j = np.triu_indices(6, 1)
    sign_t, sign_q = np.sign(t[j] - t[i]), np.sign(noisy[:, j] - noisy[:, i])
    taus = (sign_q @ sign_t) / np.sqrt(np.sum(sign_t != 0) * np.sum(sign_q != 0, axis=1))
    np.testing.assert_allclose(taus[:20], [scipy_tau(t, q) for q in noisy[:20]], atol=1e-12)
    monte_carlo = np.mean(taus)
    assert abs(soft - monte_carlo) < 0.02
    limit = K.soft_kendall_tau(t, p, smooth_scale=1e-6)
    assert_finite_close(limit, scipy_tau(t, p), atol=1e-9)
    constant = K.soft_kendall_tau(np.ones(6), p, smooth_scale=1.0, return_weights=True)
    assert_finite_close([float(constant[0]), float(constant[1])], [0.0, 0.0])


def test_dynamic_n_and_xla_match_eager():
    rng = np.random.default_rng(12)
    spec = [tf.TensorSpec([None, None], tf.float32)] * 2

    def everything(a, b):
        return (K.kendall_tau(a, b, algorithm="merge"), K.kendall_tau(a, b, algorithm="pairwise"),
                K.kendall_tau(a, b, mask=b > -0.5),
                K.kendall_kernel(a, b, algorithm="merge"),
                K.mallows_kernel(a, b, 0.2, algorithm="pairwise"),
                K.kendall_embedding(a, smooth_scale=0.5),
                K.soft_kendall_tau(a, b, smooth_scale=0.5, mask=b > -0.5))

    dynamic = tf.function(everything, input_signature=spec)
    xla = tf.function(everything, input_signature=spec, jit_compile=True)
    for n in (3, 9):
        a = tf.constant(tied_rows(rng, 4, n), tf.float32)
        b = tf.constant(rng.normal(size=(4, n)), tf.float32)
        eager = [t.numpy() for t in everything(a, b)]
        for want, graph in zip(eager, dynamic(a, b), strict=True):
            assert_finite_close(graph, want, atol=1e-6)
    # One XLA compilation, against the eager values at n = 9 (computed once above).
    for want, compiled in zip(eager, xla(a, b), strict=True):
        assert_finite_close(compiled, want, atol=1e-6)


def test_bad_inputs_raise_clear_errors():
    cases = [
        (lambda: K.kendall_embedding([1.0, 2.0], smooth_scale=0.0), "smooth_scale"),
        (lambda: K.kendall_embedding([1.0, 2.0], smooth_scale=-1.0), "smooth_scale"),
        (lambda: K.kendall_tau([1.0, 2.0], [1.0, 2.0, 3.0]), "same shape"),
        (lambda: K.kendall_tau([1.0, 2.0], [1.0, 2.0], algorithm="fast"), "algorithm"),
        (lambda: K.kendall_kernel([1.0, 2.0]), "rank >= 2"),
        (lambda: K.kendall_kernel([[1.0, 2.0]], [[1.0, 2.0, 3.0]]), "same n"),
        (lambda: K.mallows_kernel([[1.0, 2.0]], lam=-1.0), "lam"),
        (lambda: K.weighted_kendall_kernel([[1.0, 2.0]], rank_weights=[1.0]), "rank_weights"),
        (lambda: K.weighted_kendall_kernel([[1.0, 2.0]], rank_weights=[1.0, 1.0],
                                           combination="max"), "combination"),
        (lambda: K.soft_kendall_tau([1.0, 2.0], [1.0, 2.0], smooth_scale=None), "smooth_scale"),
        (lambda: KendallEmbedding(smooth_scale=float("inf")), "smooth_scale"),
        (lambda: KendallEmbedding(signed="yes"), "signed"),
        (lambda: KendallTau(axis=1.5), "axis"),
        (lambda: KendallTau(algorithm="x"), "algorithm"),
        (lambda: KendallTauLoss(smooth_scale=0), "smooth_scale"),
        (lambda: KendallTauLoss(negative_labels_are_padding=1), "negative_labels_are_padding"),
    ]
    for fn, word in cases:
        with pytest.raises(ValueError, match=word):
            fn()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_tau_of_integers_beyond_float64_precision(algorithm):
    """int64 values above 2⁵³ are compared as integers (cast to float64, 2⁵³ and 2⁵³ + 1
    tied): τ = 1 as scipy says, and a reversed list gives −1."""
    big = np.array([[2**53, 2**53 + 1, 2**53 + 2, 2**53 + 3],
                    [2**62 + 3, 2**62 + 2, 2**62 + 1, 2**62]], np.int64)
    order = np.array([[1, 2, 3, 4], [1, 2, 3, 4]], np.int64)
    want = [scipy.stats.kendalltau(a.tolist(), b.tolist()).statistic
            for a, b in zip(big, order, strict=True)]
    np.testing.assert_allclose(want, [1.0, -1.0])
    for y_true, y_pred in ((big, order), (order, big), (big, big[::-1])):
        tau = K.kendall_tau(y_true, y_pred, algorithm=algorithm).numpy()
        assert np.all(np.isfinite(tau))
        expected = [scipy.stats.kendalltau(a.tolist(), b.tolist()).statistic
                    for a, b in zip(y_true, y_pred, strict=True)]
        np.testing.assert_allclose(tau, expected, atol=1e-12)

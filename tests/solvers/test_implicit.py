"""Tests of `softsort_tf.solvers.implicit`: implicit differentiation of the Sinkhorn
fixed point against unrolled gradients, the CG and dense solves, float32 gradients in the
hard regime (eager, graph and XLA), and reproducibility between identical calls."""

import numpy as np
import tensorflow as tf
from operator_cases import implicit_or_unrolled

import softsort_tf as ss


def test_implicit_and_unrolled_gradients_agree():
    x = tf.constant(np.random.RandomState(3).randn(4, 40), tf.float64)
    weights = tf.constant(np.random.RandomState(4).randn(4, 40), tf.float64)

    def grad(implicit, solver="auto"):
        with tf.GradientTape() as tape:
            tape.watch(x)
            r = ss.sinkhorn_rank(x, epsilon=1e-2, threshold=1e-12, max_iterations=20000,
                                 implicit_diff=implicit_or_unrolled(implicit, solver))
            loss = tf.reduce_sum(r * weights)
        return tape.gradient(loss, x).numpy()

    g_unr = grad(False)  # the unrolled gradient does not depend on the implicit solver
    for solver in ("cg", "dense"):
        g_imp = grad(True, solver)
        assert np.abs(g_imp).max() > 1e-2, solver
        np.testing.assert_allclose(g_imp, g_unr, atol=1e-6 * np.abs(g_unr).max(),
                                   err_msg=solver)


def test_cg_and_dense_implicit_solvers_agree_float32():
    x = tf.constant(np.random.RandomState(5).rand(8, 50), tf.float32)
    v = tf.constant(np.random.RandomState(6).randn(8, 50), tf.float32)

    def grad(solver):
        with tf.GradientTape() as tape:
            tape.watch(x)
            s = ss.sinkhorn_sort(x, epsilon=1e-2, squash=None,
                                 implicit_diff=ss.ImplicitDiff(solver=solver))
            loss = tf.reduce_sum(s * v)
        return tape.gradient(loss, x).numpy()

    dense = grad("dense")
    np.testing.assert_allclose(grad("cg"), dense, atol=2e-3 * np.abs(dense).max())


def test_float32_gradients_in_the_hard_regime_match_float64_in_every_mode():
    """float32 implicit gradients at small ε were rounding noise (ranks at ε = 1e-4 off by
    19 where |g| ≤ 3.3) and differed between eager, graph and XLA (issue 15, item 4).
    Ranks and the top-k mask; their graph and XLA gradients at ε = 1e-4 are computed by
    one graph and one XLA program."""
    rng = np.random.RandomState(15)
    x, w = rng.randn(3, 10), rng.randn(3, 10)
    fns = {
        "rank": lambda v, e: ss.sinkhorn_rank(v, epsilon=e),
        "topk": lambda v, e: ss.sinkhorn_topk(v, 3, epsilon=e),
    }

    def grad(op, v, eps):
        with tf.GradientTape() as tape:
            tape.watch(v)
            out = fns[op](v, eps)
            loss = tf.reduce_sum(out * tf.cast(w[:, :out.shape[-1]], v.dtype))
        return tape.gradient(loss, v)

    def both(v, eps):
        return {op: grad(op, v, eps) for op in fns}

    x32 = tf.constant(x, tf.float32)
    compiled = {"graph": tf.function(both)(x32, 1e-4),
                "xla": tf.function(both, jit_compile=True)(x32, 1e-4)}  # compiles are slow
    for op in fns:
        for eps in (1e-3, 1e-4, 1e-5):
            g64 = grad(op, tf.constant(x), eps).numpy()
            tol = 2e-3 * np.abs(g64).max() + 1e-5
            modes = {"eager": grad(op, x32, eps)}
            if eps == 1e-4:
                modes.update({mode: out[op] for mode, out in compiled.items()})
            for mode, g32 in modes.items():
                np.testing.assert_allclose(g32.numpy(), g64, atol=tol,
                                           err_msg=f"{op}, ε = {eps}, {mode}")


def test_reproducibility_between_identical_calls_is_as_documented():
    """Issue 15, item 10: `implicit_diff=None` gradients differed between identical calls.
    As documented: forward values and implicit gradients are bit-identical (eager and
    graph), unrolled gradients bit-identical eagerly and within a few ulps of the largest
    entry under `tf.function`."""
    rng = np.random.RandomState(16)
    x = tf.constant(rng.randn(8, 100), tf.float32)
    w = tf.constant(rng.randn(8, 100), tf.float32)

    def with_grad(v, implicit):
        with tf.GradientTape() as tape:
            tape.watch(v)
            r = ss.sinkhorn_rank(v, implicit_diff=implicit_or_unrolled(implicit))
            loss = tf.reduce_sum(r * w)
        return r.numpy(), tape.gradient(loss, v).numpy()

    for implicit in (True, False):
        eager = [with_grad(x, implicit) for _ in range(3)]
        for r, g in eager[1:]:
            np.testing.assert_array_equal(r, eager[0][0])
            np.testing.assert_array_equal(g, eager[0][1])

    @tf.function
    def graph_grad(v, implicit):
        with tf.GradientTape() as tape:
            tape.watch(v)
            r = ss.sinkhorn_rank(v, implicit_diff=implicit_or_unrolled(implicit))
            loss = tf.reduce_sum(r * w)
        return r, tape.gradient(loss, v)

    for implicit in (True, False):
        runs = [[t.numpy() for t in graph_grad(x, implicit)] for _ in range(4)]
        scale = np.abs(runs[0][1]).max()
        for r, g in runs[1:]:
            np.testing.assert_array_equal(r, runs[0][0])
            if implicit:
                np.testing.assert_array_equal(g, runs[0][1])
            else:
                np.testing.assert_allclose(g, runs[0][1], rtol=0,
                                           atol=4 * np.spacing(np.float32(scale)))


def test_auto_backward_method_by_number_of_targets():
    """'auto': float64 Cholesky up to 16 targets, float64 CG up to 64 (under XLA the
    Cholesky of 64 targets was 10× slower than CG), CG in the input dtype above."""
    from softsort_tf.solvers.implicit import backward_method, float64_backward

    got = {m: backward_method("auto", m) for m in (1, 16, 17, 64, 65, None)}
    assert got == {1: "cholesky", 16: "cholesky", 17: "cg64", 64: "cg64", 65: "cg",
                   None: "cg"}
    assert backward_method("dense", 500) == "cholesky" and backward_method("cg", 4) == "cg"
    assert [float64_backward("auto", m) for m in (16, 64, 65)] == [True, True, False]


def test_float64_cg_backward_matches_cholesky_and_float32_matches_float64():
    """Ranks of 48 entries take the float64 CG backward ('auto', static n): in float64 it
    agrees with the Cholesky solve from soft to nearly hard plans, and float32 gradients
    of nearly hard plans (eager, XLA with static n, and XLA with unknown n, which takes
    the Cholesky solve) agree with the float64 ones."""
    rng = np.random.RandomState(48)
    x, w = rng.randn(3, 48), rng.randn(3, 48)

    def grad(v, eps, solver="auto"):
        with tf.GradientTape() as tape:
            tape.watch(v)
            out = ss.sinkhorn_rank(v, epsilon=eps, implicit_diff=ss.ImplicitDiff(solver))
            loss = tf.reduce_sum(out * tf.cast(w, v.dtype))
        return tape.gradient(loss, v)

    # The four float64 gradients (Cholesky and CG at both ε) in one graph: one trace.
    epsilons = (1e-3, 1e-5)
    float64_grads = tf.function(lambda v: {(eps, solver): grad(v, eps, solver)
                                           for eps in epsilons for solver in ("dense", "auto")})
    float64_grads = {key: g.numpy() for key, g in float64_grads(tf.constant(x)).items()}
    for eps in epsilons:
        cholesky, cg64 = float64_grads[eps, "dense"], float64_grads[eps, "auto"]
        scale = np.abs(cholesky).max()
        assert scale > 1.0, eps
        assert np.isfinite(cg64).all() and np.isfinite(cholesky).all()
        np.testing.assert_allclose(cg64, cholesky, atol=1e-5 * scale, err_msg=f"ε = {eps}")
    x32 = tf.constant(x, tf.float32)
    # One XLA program: its first input has a static shape (float64 CG), its second an
    # unknown one (Cholesky).
    xla = tf.function(lambda static, unknown: (grad(static, 1e-5), grad(unknown, 1e-5)),
                      jit_compile=True,
                      input_signature=[tf.TensorSpec(x.shape, tf.float32),
                                       tf.TensorSpec([None, None], tf.float32)])
    xla_static, xla_dynamic = xla(x32, x32)
    for mode, got in (("eager", grad(x32, 1e-5)), ("xla static n", xla_static),
                      ("xla unknown n", xla_dynamic)):
        assert np.isfinite(got.numpy()).all(), mode
        np.testing.assert_allclose(got.numpy(), cholesky, atol=2e-3 * scale, err_msg=mode)

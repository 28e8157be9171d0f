"""Tests of `softsort_tf.ops.sinkhorn`: shapes, dtypes and compilation.

A list length and batch size unknown at trace time (`tf.function` with an
`input_signature` of `None` dimensions, graph and XLA, with and without masks), run-time
checks of the arguments that must be below n, lists of one item, XLA against eager mode,
the `info` of `return_info=True`, reduced precision and large integers. Keras models fed
several list lengths are in `tests/layers/test_sinkhorn.py`."""

import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss

KW = dict(epsilon=1e-2, threshold=1e-5)


# (A few float32 rows stall just above this threshold; graph, XLA and eager agree anyway.)
pytestmark = pytest.mark.filterwarnings("ignore::softsort_tf.SinkhornConvergenceWarning")


OPERATORS = {
    "rank": lambda x, **kw: ss.sinkhorn_rank(x, **kw),
    "cdf": lambda x, **kw: ss.sinkhorn_cdf(x, direction="DESCENDING", **kw),
    "cdf_num_targets": lambda x, **kw: ss.sinkhorn_cdf(x, num_targets=4, **kw),
    "sort": lambda x, **kw: ss.sinkhorn_sort(x, **kw),
    "sort_topk": lambda x, **kw: ss.sinkhorn_sort(x, topk=2, direction="DESCENDING", **kw),
    "quantile": lambda x, **kw: ss.sinkhorn_quantile(x, [0.2, 0.5], **kw),
    "quantile_normalization": lambda x, **kw: ss.sinkhorn_quantile_normalization(
        x, [0.0, 1.0, 3.0], **kw),
    "topk_mask": lambda x, **kw: ss.sinkhorn_topk(x, 2, **kw),
    "permutation_matrix": lambda x, **kw: ss.sinkhorn_permutation_matrix(x, **kw),
}


SPEC = tf.TensorSpec([None, None], tf.float32)


MASK_SPEC = tf.TensorSpec([None, None], tf.bool)


def _inputs(batch, n, seed):
    rng = np.random.RandomState(seed)
    x = rng.randn(batch, n).astype(np.float32)
    mask = rng.rand(batch, n) < 0.7
    mask[:, 0] = True
    return x, mask


# XLA compiles once per concrete shape (about 6 s per operator and shape on the test
# machine): a few operators covering every kind of target (default grid with a mask,
# top-k and quantile targets per row, two-bin mask, the plan read-out). The rank with a
# mask is compiled with its gradient by
# `test_masked_gradients_with_unknown_n_compile_under_xla`, which checks its values too.
XLA_MASKS = {"sort_topk": (False, True), "quantile": (True,), "topk_mask": (False,),
             "permutation_matrix": (True,)}


def _xla_calling(graph, spec):
    """An XLA function running the trace of the graph function `graph`."""
    return tf.function(lambda *args: graph(*args), input_signature=spec, jit_compile=True)


def _all_operators(x, m):
    """Every operator without and with the mask `m`: `{(name, use_mask): output}`."""
    return {(name, use_mask): op(x, **(dict(mask=m) if use_mask else {}), **KW)
            for name, op in OPERATORS.items() for use_mask in (False, True)}


def test_unknown_n_and_batch_match_eager():
    """Graph mode (every operator, with and without a mask) and XLA (`XLA_MASKS`) with
    the list length and the batch size unknown at trace time: one trace for every
    shape, the values of eager mode. One graph function returns every operator's
    output; the XLA function calls it and returns those of `XLA_MASKS` (XLA compiles
    only what they need: one XLA program per shape instead of one per operator), so
    both run the same trace; the eager references are computed once for both. Each
    case is asserted on its own, its name in the message."""
    graph = tf.function(_all_operators, input_signature=[SPEC, MASK_SPEC])
    xla_cases = [(name, use_mask) for name, masks in XLA_MASKS.items() for use_mask in masks]
    xla = tf.function(lambda x, m: {case: out for case, out in graph(x, m).items()
                                    if case in xla_cases},
                      input_signature=[SPEC, MASK_SPEC], jit_compile=True)
    for batch, n in ((3, 5), (2, 8)):
        x, mask = _inputs(batch, n, seed=n)
        results = {"graph": graph(x, mask), "xla": xla(x, mask)}
        for name, use_mask in results["graph"]:
            expected = OPERATORS[name](x, **(dict(mask=mask) if use_mask else {}), **KW).numpy()
            for mode, outputs in results.items():
                if (name, use_mask) in outputs:
                    np.testing.assert_allclose(
                        outputs[name, use_mask].numpy(), expected, atol=2e-5,
                        err_msg=f"{name}, mask={use_mask}, {mode}, n={n}")
    assert set(results["xla"]) == set(xla_cases) and len(results["graph"]) == 2 * len(OPERATORS)
    for mode, f in (("graph", graph), ("xla", xla)):  # one trace for every shape
        assert f.experimental_get_tracing_count() == 1, mode


GRADIENT_OPERATORS = ("rank", "sort_topk", "quantile")


def test_gradients_with_unknown_n():
    """Gradients with n and the batch unknown at trace time equal those of eager mode.
    One graph function returns the gradient of every operator of `GRADIENT_OPERATORS`
    (one trace); each is asserted on its own, its name in the message."""

    def grads(x):
        out = {}
        for name in GRADIENT_OPERATORS:
            with tf.GradientTape() as tape:
                tape.watch(x)
                # sin: a sum of ranks is constant (zero gradient); this one is not.
                loss = tf.reduce_sum(tf.sin(3.0 * OPERATORS[name](x, **KW)))
            out[name] = tape.gradient(loss, x)
        return out

    graph = tf.function(grads, input_signature=[SPEC])
    for n in (5, 9):
        x, _ = _inputs(2, n, seed=n)
        got = graph(x)
        expected = grads(tf.constant(x))
        for name in GRADIENT_OPERATORS:
            want = expected[name].numpy()
            assert np.all(np.isfinite(want)) and np.abs(want).max() > 1e-2, (name, n)
            np.testing.assert_allclose(got[name].numpy(), want, atol=1e-4,
                                       err_msg=f"{name}, n={n}")
    assert graph.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("call, name", [
    (lambda x: ss.sinkhorn_sort(x, topk=4), "topk"),
    (lambda x: ss.sinkhorn_topk(x, 4), "k"),
])
def test_k_below_n_is_checked_at_run_time(call, name):
    f = tf.function(call, input_signature=[SPEC])
    f(np.zeros([1, 6], np.float32))  # fine: 4 < 6
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"`{name}` = 4 must be smaller"):
        f(np.zeros([1, 4], np.float32))


def test_k_not_below_n_gives_nan_under_xla():
    """XLA drops run-time assertions: the rows are poisoned (NaN) instead. (Both
    operators in one compiled function: one compile per list length.)"""
    f = tf.function(lambda x: {"topk": ss.sinkhorn_sort(x, topk=4),
                               "k": ss.sinkhorn_topk(x, 4)},
                    input_signature=[SPEC], jit_compile=True)
    fine = f(np.arange(6.0, dtype=np.float32)[None])
    poisoned = f(np.arange(4.0, dtype=np.float32)[None])
    for name in ("topk", "k"):
        assert np.all(np.isfinite(fine[name].numpy())), name
        assert np.all(np.isnan(poisoned[name].numpy())), name


def test_k_may_exceed_n_valid_with_a_mask_and_unknown_n():
    f = tf.function(lambda x, m: ss.sinkhorn_sort(x, topk=3, mask=m, direction="DESCENDING",
                                                  epsilon=1e-3),
                    input_signature=[SPEC, MASK_SPEC])
    out = f(np.array([[1.0, 5.0, 3.0]], np.float32), np.array([[True, True, False]])).numpy()
    np.testing.assert_allclose(out, [[5.0, 1.0, 0.0]], atol=1e-3)


def test_unknown_n_keeps_the_dense_backward_of_short_lists():
    """With m = n unknown at trace time the backward solve is still chosen by m (dense
    float64 for m <= 64, CG above, via `tf.cond`): CG alone made these float32 rank
    gradients wrong by 1.2 (scale 19) where the float64 reference and static n agree
    to 2e-4."""
    rng = np.random.RandomState(0)
    w = rng.randn(4, 10)

    def grad(v, weights):
        with tf.GradientTape() as tape:
            tape.watch(v)
            loss = tf.reduce_sum(ss.sinkhorn_rank(v, epsilon=1e-3) * weights)
        return tape.gradient(loss, v)

    x = rng.randn(4, 10)
    reference = grad(tf.constant(x), w).numpy()
    dynamic = tf.function(grad, input_signature=[SPEC, SPEC])
    got = dynamic(x.astype(np.float32), w.astype(np.float32)).numpy()
    np.testing.assert_allclose(got, reference, atol=1e-3 * np.abs(reference).max())
    # Long lists take the CG branch: finite and equal to static n.
    x_long = rng.randn(2, 80).astype(np.float32)
    w_long = rng.randn(2, 80).astype(np.float32)
    np.testing.assert_allclose(dynamic(x_long, w_long).numpy(),
                               grad(tf.constant(x_long), w_long).numpy(), atol=1e-3)


def test_masked_gradients_with_unknown_n_compile_under_xla():
    """The backward solve chosen by m when m is unknown compiles under XLA (a choice
    made on the whole solve, forward loop included, failed there once differentiated:
    'No registered FakeParam OpKernel for XLA_CPU_JIT'): n = 6 (dense) and n = 80 (CG)
    through one trace. The masked ranks it returns are those of eager mode as well
    (the rank with a mask of `test_unknown_n_and_batch_match_eager` under XLA)."""

    def grad(v, m, weights):
        with tf.GradientTape() as tape:
            tape.watch(v)
            ranks = ss.sinkhorn_rank(v, mask=m, **KW)
            loss = tf.reduce_sum(ranks * weights)
        return ranks, tape.gradient(loss, v)

    xla = tf.function(grad, input_signature=[SPEC, MASK_SPEC, SPEC], jit_compile=True)
    for batch, n in ((3, 6), (2, 80)):  # the dense and the CG backward solve
        rng = np.random.RandomState(n)
        x, mask = _inputs(batch, n, seed=n)
        w = rng.randn(batch, n).astype(np.float32)
        ranks, got = (t.numpy() for t in xla(x, mask, w))
        expected_ranks, expected = (t.numpy() for t in grad(tf.constant(x), mask, w))
        # float32 ranks up to 80 after hundreds of iterations: XLA's and eager's exp and
        # log differ in their last bits, so a few ulps of the rank (rtol 1e-6 ≈ 8 ulps).
        np.testing.assert_allclose(ranks, expected_ranks, rtol=1e-6, atol=2e-5,
                                   err_msg=f"n={n}")
        np.testing.assert_allclose(got, expected, atol=1e-3 * np.abs(expected).max(),
                                   err_msg=f"n={n}")
        assert np.all(got[~mask] == 0.0)
    assert xla.experimental_get_tracing_count() == 1


def test_info_reports_iterations_and_error_with_batch_shape():
    x = np.random.RandomState(9).randn(2, 3, 10)
    r, info = ss.sinkhorn_rank(x, axis=1, return_info=True, threshold=1e-4)
    assert r.shape == (2, 3, 10)
    assert info.num_iterations.shape == (2, 10) and info.error.shape == (2, 10)
    assert np.all(info.error.numpy() < 1e-4)
    _, info = ss.sinkhorn_rank(x, return_info=True, epsilon=1e-4, max_iterations=7,
                               initializer="zeros", threshold=1e-12)
    assert np.all(info.num_iterations.numpy() <= 10)  # rounded up to check_every = 5
    assert np.all(info.error.numpy() > 1e-12)


XLA_OPERATORS = {
    "rank": lambda v: ss.sinkhorn_rank(v, axis=1),
    "sort": lambda v: ss.sinkhorn_sort(v, topk=3, direction="DESCENDING"),
    "cdf": lambda v: ss.sinkhorn_cdf(v, axis=0, threshold=1e-5),
    "quantile": lambda v: ss.sinkhorn_quantile(v, [0.25, 0.5]),
    "qnorm": lambda v: ss.sinkhorn_quantile_normalization(v, [1.0, 2.0, 4.0]),
    "topk": lambda v: ss.sinkhorn_topk(v, 3, implicit_diff=None),
    "perm": lambda v: ss.sinkhorn_permutation_matrix(v),
}


def test_xla_matches_eager():
    """Values and gradients of every operator (static shapes) under XLA and eagerly;
    one compiled function returns them all (one trace, one compile)."""
    x = tf.constant(np.random.RandomState(10).randn(3, 4, 9), tf.float32)

    def with_grad(f, v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            out = f(v)
            loss = tf.reduce_sum(tf.sin(out))
        return out, tape.gradient(loss, v)

    def everything(v):
        return {op: with_grad(f, v) for op, f in XLA_OPERATORS.items()}

    xla = tf.function(everything, jit_compile=True)(x)
    for op, f in XLA_OPERATORS.items():
        eager_out, eager_grad = with_grad(f, x)
        xla_out, xla_grad = xla[op]
        np.testing.assert_allclose(xla_out.numpy(), eager_out.numpy(), atol=1e-4, rtol=1e-4,
                                   err_msg=op)
        np.testing.assert_allclose(xla_grad.numpy(), eager_grad.numpy(), atol=1e-3,
                                   rtol=1e-3, err_msg=op)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_dtypes(dtype):
    x32 = np.random.RandomState(11).randn(2, 6).astype(np.float32)
    x = tf.cast(x32, dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        r = ss.sinkhorn_rank(x)
        loss = tf.reduce_sum(tf.cast(r, tf.float32) * tf.range(6, dtype=tf.float32))
    g = tape.gradient(loss, x)
    assert r.dtype == dtype and g.dtype == dtype
    ref = ss.sinkhorn_rank(tf.cast(x, tf.float32)).numpy()
    tol = {tf.float16: 1e-2, tf.bfloat16: 5e-2}.get(dtype, 1e-5)
    np.testing.assert_allclose(tf.cast(r, tf.float32).numpy(), ref, rtol=tol, atol=tol * 6)
    assert np.all(np.isfinite(tf.cast(g, tf.float32).numpy()))
    assert ss.sinkhorn_quantile(x, 0.5).dtype == dtype


@pytest.mark.parametrize("dtype, out_dtype", [(tf.int32, tf.float32), (tf.int64, tf.float64),
                                              (tf.uint32, tf.float32)])
def test_large_integers_stay_distinct(dtype, out_dtype):
    """Integers above 2²⁴ collapsed into ties in float32 (issue 15, item 8)."""
    big = np.array([[16777217, 16777216, 16777218, 16777219]])
    x = tf.constant(big, dtype)
    ranks = ss.sinkhorn_rank(x, epsilon=1e-3)
    assert ranks.dtype == out_dtype
    np.testing.assert_allclose(ranks.numpy(), [[2, 1, 3, 4]], atol=1e-3)
    np.testing.assert_array_equal(ss.rankdata(x).numpy(), [[2, 1, 3, 4]])
    s = ss.sinkhorn_sort(x, epsilon=1e-3)
    assert s.dtype == out_dtype
    if out_dtype == tf.float64:
        np.testing.assert_allclose(s.numpy(), np.sort(big), rtol=0, atol=1e-3)
    np.testing.assert_allclose(ss.softsort_permutation_matrix(x, tau=0.01).numpy()[0],
                               np.eye(4)[[3, 2, 0, 1]], atol=1e-6)
    assert ss.hard_permutation_matrix(x).dtype == out_dtype


ONE_ITEM_OPS = {
    "rank": lambda v: ss.sinkhorn_rank(v),
    "cdf": lambda v: ss.sinkhorn_cdf(v),
    "sort": lambda v: ss.sinkhorn_sort(v),
    "quantile": lambda v: ss.sinkhorn_quantile(v, [0.25, 0.5]),
    "normalization": lambda v: ss.sinkhorn_quantile_normalization(v, [3.0]),
    "matrix": lambda v: ss.sinkhorn_permutation_matrix(v),
    "topk_masked": lambda v: ss.sinkhorn_topk(v, 1, mask=tf.ones_like(v) > 0),
}


def test_one_item_lists_of_unknown_length_equal_the_static_result():
    """Lists of one item with n unknown at trace time, in a graph and under XLA: the same
    values as with a static n (rank 1, CDF 1, the value itself as its sort, the 1 × 1
    matrix 1). Every operator in one traced function, which the XLA function calls (one
    trace for both); the static results are computed once for both."""
    x = tf.constant([[0.7], [-2.0]])
    spec = [tf.TensorSpec([None, None])]
    graph = tf.function(lambda v: {name: op(v) for name, op in ONE_ITEM_OPS.items()},
                        input_signature=spec)
    results = {"graph": graph(x), "xla": _xla_calling(graph, spec)(x)}
    for name, op in ONE_ITEM_OPS.items():
        expected = op(x).numpy()
        for mode, traced in results.items():
            got = traced[name].numpy()
            assert got.shape == expected.shape, (name, mode)
            assert np.all(np.isfinite(got)), (name, mode)
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6,
                                       err_msg=f"{name}, {mode}")
    assert graph.experimental_get_tracing_count() == 1


def test_one_item_lists_hard_values_and_ragged_groups_of_single_items():
    x = tf.constant([[0.7]])
    np.testing.assert_allclose(ss.sinkhorn_rank(x).numpy(), [[1.0]])
    np.testing.assert_allclose(ss.sinkhorn_cdf(x).numpy(), [[1.0]])
    ragged = tf.ragged.constant([[0.3], [2.0, 1.0, 3.0], [5.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    ranks = ss.sinkhorn_rank(ragged, epsilon=1e-3)
    np.testing.assert_allclose(ranks[0].numpy(), [1.0])
    np.testing.assert_allclose(ranks[1].numpy(), [2.0, 1.0, 3.0], atol=1e-3)
    sort = ss.sinkhorn_sort(ragged, epsilon=1e-3)
    np.testing.assert_allclose(sort[0].numpy(), [0.3], rtol=1e-6)
    traced = tf.function(lambda r: ss.sinkhorn_sort(r, epsilon=1e-3), input_signature=[
        tf.RaggedTensorSpec([None, None], tf.float32, 1)])
    np.testing.assert_allclose(traced(ragged)[0].numpy(), [0.3], rtol=1e-6)


def test_topk_of_unknown_n_in_float64():
    """k checked against an unknown n in float64 (the poison of the k >= n rows was a
    float32 NaN): the three top-k paths run and match the static-shape results."""
    spec = [tf.TensorSpec([None, None], tf.float64)]
    x = np.random.RandomState(3).randn(2, 6)
    calls = {"front_door": lambda v: ss.soft_topk(v, 2, method="sinkhorn", **KW),
             "topk_mask": lambda v: ss.sinkhorn_topk(v, 2, **KW),
             "sort_topk": lambda v: ss.sinkhorn_sort(v, topk=2, **KW)}
    for name, call in calls.items():
        got = tf.function(call, input_signature=spec)(x)
        assert got.dtype == tf.float64, name
        want = call(tf.constant(x)).numpy()
        assert np.all(np.isfinite(got.numpy())), name
        np.testing.assert_allclose(got.numpy(), want, atol=1e-12, err_msg=name)

"""Tests of `softsort_tf.ops.transport`, the transport problem shared by every Sinkhorn
operator: the `SinkhornConvergenceWarning`, the smallest ε each dtype resolves, and the
target grid (`regular_grid`, the `targets` argument).

Rows that stop at `max_iterations` unconverged are reported by a
`SinkhornConvergenceWarning` in eager mode, and never cost a host round-trip inside
`tf.function`/XLA."""

import warnings

import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss
from softsort_tf.ops import transport as transport_lib
from softsort_tf.ops.transport import regular_grid
from softsort_tf.options import SinkhornOptions

X = np.random.default_rng(0).normal(size=(3, 50))


CAPPED = dict(epsilon=1e-4, max_iterations=3)  # far from converged after 3 iterations


def test_eager_unconverged_call_warns_with_the_rows_and_the_error():
    with pytest.warns(ss.SinkhornConvergenceWarning):
        _, info = ss.sinkhorn_rank(X, return_info=True, **CAPPED)
    assert np.all(info.error.numpy() > 1e-3)  # the premise: every row is unconverged
    with pytest.warns(ss.SinkhornConvergenceWarning,
                      match=r"3 of 3 rows: they stopped after 3 iterations .* > `threshold` "
                            r"= 0.001") as record:
        ss.sinkhorn_rank(X, **CAPPED)
    assert record[0].filename == __file__  # points at the caller
    assert issubclass(ss.SinkhornConvergenceWarning, UserWarning)


@pytest.mark.parametrize("op", [
    lambda x, **kw: ss.sinkhorn_sort(x, **kw),
    lambda x, **kw: ss.sinkhorn_quantile(x, [0.2, 0.8], **kw),
    lambda x, **kw: ss.sinkhorn_cdf(x, **kw),
    lambda x, **kw: ss.SinkhornRank(**kw)(x),
])
def test_every_operator_and_layer_warns(op):
    with pytest.warns(ss.SinkhornConvergenceWarning):
        op(X, **CAPPED)


def test_only_unconverged_rows_are_counted():
    x = np.stack([np.linspace(0.0, 1.0, 50), X[0]])  # a regular row converges at once
    with pytest.warns(ss.SinkhornConvergenceWarning):
        _, info = ss.sinkhorn_rank(x, return_info=True, squash=None, epsilon=1e-3,
                                   max_iterations=5)
    err = info.error.numpy()
    assert err[0] < 1e-3 < err[1]
    with pytest.warns(ss.SinkhornConvergenceWarning, match="1 of 2 rows"):
        ss.sinkhorn_rank(x, squash=None, epsilon=1e-3, max_iterations=5)


def test_converged_and_nan_calls_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ss.SinkhornConvergenceWarning)
        ss.sinkhorn_rank(X, epsilon=1e-2)
        x = X.copy()
        x[1, 3] = np.nan  # a NaN row stops at once with a NaN error: not a silent cap
        out = ss.sinkhorn_rank(x, epsilon=1e-2).numpy()
    assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2]]).all()


@pytest.mark.parametrize("jit_compile", [False, True])
def test_graph_and_xla_calls_neither_warn_nor_sync(jit_compile):
    @tf.function(jit_compile=jit_compile)
    def ranks(x):
        return ss.sinkhorn_rank(x, **CAPPED)

    x = tf.constant(X)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ss.SinkhornConvergenceWarning)
        ranks(x)
    graph = ranks.get_concrete_function(x).graph
    host_ops = {"PyFunc", "EagerPyFunc", "PyFuncStateless"}
    assert not host_ops & {op.type for op in graph.get_operations()}


@pytest.mark.parametrize("op", [ss.sinkhorn_sort, ss.sinkhorn_rank,
                                lambda v, **kw: ss.sinkhorn_topk(v, 2, **kw)])
def test_epsilon_below_what_the_dtype_resolves_is_rejected(op):
    """float32 sorts exploded to 1e9 at ε = 1e-10 and inf from 1e-11 (issue 15, item 3)."""
    x = np.random.RandomState(14).randn(3, 8)
    for eps in (1e-7, 1e-11):
        with pytest.raises(ValueError, match="`epsilon`.*float32.*float64"):
            op(x.astype(np.float32), epsilon=eps)
    with pytest.raises(ValueError, match="`epsilon`.*float64"):
        op(x, epsilon=1e-16)
    # At the smallest accepted ε each dtype converges to a finite, nearly hard result.
    for dtype in (np.float32, np.float64):
        eps = transport_lib.min_epsilon(dtype)
        out, info = op(x.astype(dtype), epsilon=eps, return_info=True)
        assert np.all(info.error.numpy() < 1e-3)
        assert np.all(np.isfinite(out.numpy()))
    s = ss.sinkhorn_sort(x.astype(np.float32), epsilon=transport_lib.min_epsilon(
        np.float32)).numpy()
    np.testing.assert_allclose(s, np.sort(x, axis=1), atol=1e-2)


@pytest.mark.parametrize("m, expected", [(1, [0.5]), (2, [0.0, 1.0]),
                                         (5, [0.0, 0.25, 0.5, 0.75, 1.0])])
def test_regular_grid_values(m, expected):
    for b in (np.full(m, 1.0 / m), np.random.default_rng(m).uniform(0.1, 1.0, (3, m))):
        y = regular_grid(tf.constant(b)).numpy()
        np.testing.assert_allclose(y, np.broadcast_to(expected, b.shape), atol=1e-15)


def test_targets_argument_is_validated_and_not_a_solver_option():
    assert "targets" not in SinkhornOptions.field_names()
    for bad in ("paper", "Regular", None, 1):
        with pytest.raises(ValueError, match="`targets` must be one of"):
            ss.sinkhorn_rank([[1.0, 2.0]], targets=bad)
        with pytest.raises(ValueError, match="`targets` must be one of"):
            ss.SinkhornRank(targets=bad)

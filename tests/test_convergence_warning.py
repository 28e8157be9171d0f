"""Rows that stop at `max_iterations` unconverged are reported by a
`SinkhornConvergenceWarning` in eager mode, and never cost a host round-trip inside
`tf.function`/XLA (issue 10, item 4)."""

import warnings

import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss

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

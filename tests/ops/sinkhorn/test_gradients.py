"""Tests of `softsort_tf.ops.sinkhorn`: gradients of every operator against finite
differences, with respect to the inputs and to the input and target weights, for the
implicit and the unrolled backward pass. (Implicit against unrolled gradients, the CG and
dense solves and their float32 accuracy are tested in `tests/solvers/test_implicit.py`.)"""

import numpy as np
import pytest
import tensorflow as tf
from operator_cases import implicit_or_unrolled

import softsort_tf as ss

GRAD_KW = dict(epsilon=0.05, threshold=1e-13, max_iterations=20000)


@pytest.mark.parametrize("implicit", [True, False])
@pytest.mark.parametrize("op", ["rank", "sort", "quantile", "qnorm", "topk"])
def test_gradients_match_finite_differences(op, implicit):
    x = tf.constant(np.random.RandomState(1).randn(2, 5), tf.float64)
    diff = implicit_or_unrolled(implicit)
    fns = {
        "rank": lambda v: ss.sinkhorn_rank(v, implicit_diff=diff, **GRAD_KW),
        "sort": lambda v: ss.sinkhorn_sort(v, implicit_diff=diff, direction="DESCENDING",
                                           **GRAD_KW),
        "quantile": lambda v: ss.sinkhorn_quantile(v, [0.3, 0.7], implicit_diff=diff,
                                                   **GRAD_KW),
        "qnorm": lambda v: ss.sinkhorn_quantile_normalization(
            v, [0.0, 1.0, 5.0], implicit_diff=diff, power=1.5, **GRAD_KW),
        # Two target bins converge slowly at ε = 0.05: a larger ε reaches the threshold.
        "topk": lambda v: ss.sinkhorn_topk_mask(v, 2, implicit_diff=diff,
                                                **{**GRAD_KW, "epsilon": 0.3}),
    }
    theoretical, numerical = tf.test.compute_gradient(fns[op], [x], delta=1e-5)
    assert np.abs(theoretical[0]).max() > 1e-3  # a real, non-zero Jacobian
    np.testing.assert_allclose(theoretical[0], numerical[0], atol=2e-5, rtol=1e-3)


@pytest.mark.parametrize("implicit", [True, False])
def test_gradients_wrt_weights_match_finite_differences(implicit):
    rng = np.random.RandomState(2)
    x = tf.constant(rng.randn(2, 5), tf.float64)
    w = tf.constant(rng.uniform(0.5, 1.5, (2, 5)), tf.float64)
    tw = tf.constant([0.2, 0.5, 0.3], tf.float64)
    diff = implicit_or_unrolled(implicit)

    def f_a(w_):
        return ss.sinkhorn_cdf(x, weights=w_, num_targets=3, implicit_diff=diff,
                               **GRAD_KW)

    def f_b(tw_):
        return ss.sinkhorn_sort(x, target_weights=tw_, implicit_diff=diff, **GRAD_KW)

    for f, arg in [(f_a, w), (f_b, tw)]:
        theoretical, numerical = tf.test.compute_gradient(f, [arg], delta=1e-5)
        assert np.abs(theoretical[0]).max() > 1e-3
        np.testing.assert_allclose(theoretical[0], numerical[0], atol=2e-5, rtol=1e-3)

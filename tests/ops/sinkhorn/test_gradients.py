"""Tests of `softsort_tf.ops.sinkhorn`: gradients of every operator against finite
differences, with respect to the inputs and to the input and target weights, for the
implicit and the unrolled backward pass. (Implicit against unrolled gradients, the CG and
dense solves and their float32 accuracy are tested in `tests/solvers/test_implicit.py`.)

The full Jacobians (cross-row entries included) are compared entry by entry, as
`tf.test.compute_gradient` would, but both come from one batched forward and backward
pass (`operator_cases.batched_jacobians`) instead of 3·x.size separate solves."""

import numpy as np
import pytest
import tensorflow as tf
from operator_cases import batched_jacobians, implicit_or_unrolled

import softsort_tf as ss

GRAD_KW = dict(epsilon=0.05, threshold=1e-13, max_iterations=20000)


def _assert_jacobians_match(theoretical, numerical, name):
    assert np.abs(theoretical).max() > 1e-3, name  # a real, non-zero Jacobian
    np.testing.assert_allclose(theoretical, numerical, atol=2e-5, rtol=1e-3, err_msg=name)


@pytest.mark.parametrize("implicit", [True, False])
@pytest.mark.parametrize("op", ["rank", "sort", "quantile", "qnorm", "topk"])
def test_gradients_match_finite_differences(op, implicit):
    x = np.random.RandomState(1).randn(2, 5)
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
        "topk": lambda v: ss.sinkhorn_topk(v, 2, implicit_diff=diff,
                                                **{**GRAD_KW, "epsilon": 0.3}),
    }
    _assert_jacobians_match(*batched_jacobians(fns[op], [x], delta=1e-5), op)


@pytest.mark.parametrize("implicit", [True, False])
def test_gradients_wrt_weights_match_finite_differences(implicit):
    rng = np.random.RandomState(2)
    x = rng.randn(2, 5)
    w = rng.uniform(0.5, 1.5, (2, 5))
    tw = np.array([0.2, 0.5, 0.3])
    diff = implicit_or_unrolled(implicit)

    def f_a(x_, w_):
        return ss.sinkhorn_cdf(x_, weights=w_, num_targets=3, implicit_diff=diff, **GRAD_KW)

    def f_b(x_, tw_):
        return ss.sinkhorn_sort(x_, target_weights=tw_, implicit_diff=diff, **GRAD_KW)

    _assert_jacobians_match(*batched_jacobians(f_a, [x, w], wrt=1, delta=1e-5), "weights")
    # The target weights `[m]` shared by the rows: the batched Jacobians need one row of
    # target weights per row of x (`[batch, m]`, the same values). Their Jacobian is
    # checked against finite differences; the gradient of the shared `[m]` weights
    # must then be its sum over the rows, for a random output weighting.
    tw_rows = np.stack([tw] * 2)
    theoretical, numerical = batched_jacobians(f_b, [x, tw_rows], wrt=1, delta=1e-5)
    _assert_jacobians_match(theoretical, numerical, "target_weights per row")
    u = rng.randn(theoretical.shape[0])
    tw_t = tf.constant(tw)
    with tf.GradientTape() as tape:
        tape.watch(tw_t)
        out = f_b(tf.constant(x), tw_t)
        loss = tf.reduce_sum(tf.reshape(out, [-1]) * u)
    shared = tape.gradient(loss, tw_t).numpy()
    np.testing.assert_allclose(out.numpy().ravel(), f_b(x, tw_rows).numpy().ravel(),
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(shared, (u @ theoretical).reshape(2, 3).sum(0),
                               rtol=1e-6, atol=1e-9, err_msg="shared target_weights")

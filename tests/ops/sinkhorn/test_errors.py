"""Tests of `softsort_tf.ops.sinkhorn`: bad arguments raise a `ValueError` naming the
argument; NaN and Inf inputs propagate per row without hanging the solver."""

import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss


def test_nan_propagates_without_hanging_and_can_raise():
    x = np.random.RandomState(12).randn(3, 6)
    x[1, 2] = np.nan
    x[2, 0] = np.inf
    r, info = ss.sinkhorn_rank(x, return_info=True, max_iterations=100_000)
    r = r.numpy()
    assert np.all(np.isfinite(r[0]))
    assert np.all(np.isnan(r[1]))
    assert not np.all(np.isfinite(r[2]))
    assert info.num_iterations.numpy().max() < 100
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or Inf"):
        ss.sinkhorn_rank(x, check_numerics=True)


BAD_CALLS = [
    (lambda: ss.sinkhorn_rank([1.0, 2.0], epsilon=0.0), "epsilon"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], epsilon=-1.0), "epsilon"),
    (lambda: ss.sinkhorn_sort([1.0, 2.0], power=0.0), "power"),
    (lambda: ss.sinkhorn_cdf([1.0, 2.0], threshold=0.0), "threshold"),
    (lambda: ss.sinkhorn_cdf([1.0, 2.0], max_iterations=0), "max_iterations"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], 0.0), "quantiles"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], 1.0), "quantiles"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], [0.6, 0.4]), "increasing"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], [0.4, 0.4]), "increasing"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], 0.5, width=1.0), "width"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], [0.4, 0.5], width=0.2), "width"),
    (lambda: ss.sinkhorn_quantile([1.0, 2.0, 3.0], 0.05, width=0.2), "width"),
    (lambda: ss.sinkhorn_topk([1.0, 2.0, 3.0], 0), "`k`"),
    (lambda: ss.sinkhorn_topk([1.0, 2.0, 3.0], 3), "`k`"),
    (lambda: ss.sinkhorn_sort([1.0, 2.0, 3.0], topk=3), "topk"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], direction="UP"), "direction"),
    (lambda: ss.sinkhorn_rank([[1.0, 2.0]], axis=2), "axis"),
    (lambda: ss.sinkhorn_rank([[1.0, 2.0]], axis=-3), "axis"),
    (lambda: ss.sinkhorn_rank(3.0), "rank"),
    (lambda: ss.sinkhorn_rank(np.zeros([2, 0])), "n = 0"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], squash="tanh"), "squash"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], weights=[1.0, 2.0, 3.0]), "weights"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], epsilon_start=1.0, epsilon_decay=1.5),
     "epsilon_decay"),
    # Issue 15: raw TensorFlow errors (or silent NaN) before.
    (lambda: ss.sinkhorn_rank([1.0, 2.0], num_targets=0), "num_targets"),
    (lambda: ss.sinkhorn_cdf([1.0, 2.0], num_targets=-1), "num_targets"),
    (lambda: ss.sinkhorn_sort([1.0, 2.0], num_targets=2.5), "num_targets"),
    (lambda: ss.sinkhorn_rank(np.zeros([3, 4]), weights=np.ones([1, 4])), "weights"),
    (lambda: ss.sinkhorn_rank(np.zeros([3, 4]), weights=[1.0, -1.0, 1.0, 1.0]), "weights"),
    (lambda: ss.sinkhorn_rank(np.zeros([3, 4]), weights=np.zeros([3, 4])), "weights"),
    (lambda: ss.sinkhorn_sort([1.0, 2.0, 3.0], target_weights=[0.5, 0.0, 0.5]),
     "target_weights"),
    (lambda: ss.sinkhorn_sort([1.0, 2.0, 3.0], target_weights=[0.5, -0.1, 0.5]),
     "target_weights"),
    (lambda: ss.sinkhorn_cdf([1.0, 2.0, 3.0], target_weights=[0.5, np.nan]),
     "target_weights"),
    (lambda: ss.sinkhorn_quantile_normalization(np.zeros([3, 4]), np.zeros([2, 5])),
     "target_values"),
    (lambda: ss.sinkhorn_quantile_normalization(np.zeros([2, 5, 3]), np.zeros([3, 2, 4]),
                                                axis=1), "target_values"),
    (lambda: ss.sinkhorn_quantile_normalization(np.zeros([2, 5, 3]), np.zeros([6, 4]),
                                                axis=1), "target_values"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], power=1.0), "power"),
    (lambda: ss.sinkhorn_rank([1.0, 2.0], power=0.5), "power"),
]


@pytest.mark.parametrize("call,match", BAD_CALLS)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_quantile_normalization_rejects_a_bad_direction():
    with pytest.raises(ValueError, match="`direction`"):
        ss.sinkhorn_quantile_normalization([1.0, 2.0], [0.0, 1.0], direction="UP")


def test_per_row_target_weights_of_the_wrong_batch_size_are_rejected():
    x = np.random.default_rng(4).normal(size=(3, 5))
    with pytest.raises(ValueError, match="`target_weights`"):
        ss.sinkhorn_sort(x, target_weights=np.full((2, 4), 0.25))
    ok = ss.sinkhorn_sort(x, target_weights=np.full((3, 4), 0.25))
    assert ok.shape == (3, 4)

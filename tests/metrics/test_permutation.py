"""Tests of `softsort_tf.metrics.permutation`: the exact and element-wise permutation
accuracies on hand-made cases (their serialisation, padding and unknown lengths are
tested with the loss in `tests/losses/test_permutation.py` and `tests/ops/test_wrapper.py`)."""

import numpy as np
from operator_cases import hand_made_batch

import softsort_tf as ss


def test_metrics_on_hand_made_cases():
    order, perm = hand_made_batch()
    np.testing.assert_allclose(ss.exact_permutation_accuracy(order, perm), [1, 0, 0])
    np.testing.assert_allclose(ss.elementwise_permutation_accuracy(order, perm),
                               [1, 1 / 3, 2 / 3], rtol=1e-6)
    for y_true in (order, np.eye(3)[order], order.astype(np.float32)):
        exact, elementwise = ss.ExactPermutationAccuracy(), ss.ElementwisePermutationAccuracy()
        exact.update_state(y_true, perm)
        elementwise.update_state(y_true, perm)
        np.testing.assert_allclose(float(exact.result()), 1 / 3, rtol=1e-6)
        np.testing.assert_allclose(float(elementwise.result()), 6 / 9, rtol=1e-6)
    exact, elementwise = ss.ExactPermutationAccuracy(), ss.ElementwisePermutationAccuracy()
    weights = np.array([1.0, 2.0, 0.0])
    exact.update_state(order, perm, sample_weight=weights)
    elementwise.update_state(order, perm, sample_weight=weights)
    np.testing.assert_allclose(float(exact.result()), 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(float(elementwise.result()), (1 + 2 / 3) / 3, rtol=1e-6)
    # States accumulate over batches and reset.
    exact.update_state(order[:1], perm[:1])
    np.testing.assert_allclose(float(exact.result()), 2 / 4, rtol=1e-6)
    exact.reset_state()
    exact.update_state(order[1:], perm[1:])
    assert float(exact.result()) == 0.0

"""Tests of `softsort_tf.metrics.kendall`: the streaming `KendallTau` metric."""

import numpy as np
from numpy_references import scipy_tau
from operator_cases import assert_finite_close, tied_rows

from softsort_tf.metrics.kendall import KendallTau


def test_metric_streaming_padding_and_no_nan():
    rng = np.random.default_rng(13)
    labels, scores = tied_rows(rng, 5, 6), rng.normal(size=(5, 6))
    labels[2] = 1.0  # tied targets: skipped
    labels[3, 1:] = -1.0  # one valid item: skipped
    labels[4, [0, 3]] = -1.0
    metric = KendallTau(negative_labels_are_padding=True)
    metric.update_state(labels[:3], scores[:3], sample_weight=[1.0, 2.0, 5.0])
    metric.update_state(labels[3:], scores[3:])
    valid = labels[4] >= 0
    values = [scipy_tau(labels[0], scores[0]), scipy_tau(labels[1], scores[1]),
              scipy_tau(labels[4][valid], scores[4][valid])]
    expected = (values[0] + 2 * values[1] + values[2]) / 4
    assert_finite_close(float(metric.result()), expected, atol=1e-6)
    empty = KendallTau(negative_labels_are_padding=True)
    assert float(empty.result()) == 0.0
    empty.update_state(-np.ones((2, 4)), np.zeros((2, 4)))
    empty.update_state(np.zeros((0, 4)), np.zeros((0, 4)))
    assert float(empty.result()) == 0.0
    clone = KendallTau.from_config(metric.get_config())
    assert clone.get_config() == metric.get_config()
    assert clone.fn_kwargs == dict(axis=-1, negative_labels_are_padding=True, algorithm="auto")

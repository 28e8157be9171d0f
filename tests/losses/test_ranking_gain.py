"""The gains of `soft_ndcg`: linear (the grade) at the scale-free default, NDCG's
2^y − 1 with an explicit temperature (measured in docs/RESULTS.md)."""

import numpy as np
import pytest
import tensorflow as tf

from softsort_tf.losses.ranking import SoftNDCGLoss, soft_ndcg

LABELS = np.array([[3.0, 1.0, 0.0, 2.0, -1.0],
                   [0.0, 4.0, 1.0, 1.0, 0.0]])
SCORES = np.array([[0.3, 1.2, -0.4, 0.9, 7.0],
                   [0.1, -0.2, 0.8, 0.5, 0.05]])


def _ndcg(labels, scores, gain):
    """NumPy NDCG of each list (hard ranks by decreasing score; labels < 0 are
    padding) with gains `gain(y)`."""
    out = []
    for y, s in zip(labels, scores, strict=True):
        valid = y >= 0
        y, s = y[valid], s[valid]
        ranks = np.empty(len(s))
        ranks[np.argsort(-s)] = np.arange(1, len(s) + 1)
        dcg = np.sum(gain(y) / np.log2(1.0 + ranks))
        ideal = np.sum(np.sort(gain(y))[::-1] / np.log2(np.arange(2.0, len(y) + 2.0)))
        out.append(dcg / ideal)
    return np.array(out)


def test_scale_free_default_weighs_grades_linearly():
    """At the scale-free default the gain of grade y is y: with a relative temperature
    small enough for hard ranks, the value is the NDCG with linear gains, in float64 to
    1e-9 (0.790 and 0.619 here; 0.681 and 0.461 with 2^y − 1)."""
    value = soft_ndcg(LABELS, SCORES, method="softsort", temperature=1e-6,
                      scale_free=True).numpy()
    assert np.all(np.isfinite(value))
    np.testing.assert_allclose(value, _ndcg(LABELS, SCORES, lambda y: y), rtol=1e-9)
    assert np.all(np.abs(value - _ndcg(LABELS, SCORES, lambda y: 2.0 ** y - 1.0)) > 0.01)


@pytest.mark.parametrize("method", ["sinkhorn", "lapsum", "softsort"])
def test_default_equals_exponential_gains_of_log2_one_plus_grade(method):
    """`gain='linear'` is NDCG's gain of the labels log₂(1 + y) (value and gradient),
    and the default of `SoftNDCGLoss` without a temperature; padded entries get zero
    gradient."""
    scores = tf.constant(SCORES)

    def value_and_gradient(labels, **kwargs):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            v = soft_ndcg(labels, scores, method=method, **kwargs)
        return v.numpy(), tape.gradient(v, scores).numpy()

    v0, g0 = value_and_gradient(LABELS)
    mapped = np.where(LABELS >= 0, np.log2(1.0 + np.maximum(LABELS, 0.0)), LABELS)
    v1, g1 = value_and_gradient(mapped, gain="exponential", scale_free=True)
    assert np.all(np.isfinite(v0)) and np.all(np.isfinite(g0)) and np.abs(g0).max() > 0
    np.testing.assert_allclose(v0, v1, rtol=1e-10)
    np.testing.assert_allclose(g0, g1, rtol=1e-8, atol=1e-12)
    assert g0[0, 4] == 0.0
    loss = SoftNDCGLoss(method, reduction="none")
    np.testing.assert_allclose(loss(LABELS, SCORES).numpy(), 1.0 - v0, rtol=1e-6)


def test_explicit_temperature_keeps_ndcg_gains_and_config_round_trip():
    """A temperature in score units keeps 2^y − 1 (→ the NDCG itself); the config holds
    the resolved gain; a bad gain is refused by name."""
    value = soft_ndcg(LABELS, SCORES, method="softsort", temperature=1e-6).numpy()
    np.testing.assert_allclose(value, _ndcg(LABELS, SCORES, lambda y: 2.0 ** y - 1.0),
                               rtol=1e-9)
    assert SoftNDCGLoss().get_config()["gain"] == "linear"
    assert SoftNDCGLoss(temperature=0.5).get_config()["gain"] == "exponential"
    config = SoftNDCGLoss("lapsum", gain="exponential").get_config()
    assert config["gain"] == "exponential" and config["scale_free"]
    restored = SoftNDCGLoss.from_config(config)
    np.testing.assert_allclose(float(restored(LABELS, SCORES)),
                               float(SoftNDCGLoss("lapsum", gain="exponential")(LABELS, SCORES)),
                               rtol=1e-12)
    assert abs(float(restored(LABELS, SCORES)) - float(SoftNDCGLoss("lapsum")(LABELS, SCORES))
               ) > 1e-4
    with pytest.raises(ValueError, match="gain"):
        SoftNDCGLoss(gain="log")
    with pytest.raises(ValueError, match="gain"):
        soft_ndcg(LABELS, SCORES, gain="quadratic")

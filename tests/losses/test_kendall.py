"""Tests of `softsort_tf.losses.kendall`: the Kendall τ loss."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from operator_cases import assert_finite_close

from softsort_tf.losses.kendall import KendallTauLoss
from softsort_tf.metrics.kendall import KendallTau
from softsort_tf.ops import kendall as K


def test_loss_config_mixed_precision_and_values():
    loss = KendallTauLoss(smooth_scale=0.3, negative_labels_are_padding=False)
    clone = KendallTauLoss.from_config(loss.get_config())
    assert clone.get_config() == loss.get_config()
    assert (clone.fn_kwargs["smooth_scale"], clone.fn_kwargs["negative_labels_are_padding"]) == (
        0.3, False)
    rng = np.random.default_rng(14)
    t, p = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    per_list = KendallTauLoss(smooth_scale=0.3, reduction=None,
                              negative_labels_are_padding=False)(t, p)
    expected = 1 - K.soft_kendall_tau(t, p, smooth_scale=0.3).numpy()
    assert_finite_close(per_list, expected, atol=1e-6)
    policy = keras.config.dtype_policy()
    try:
        keras.config.set_dtype_policy("mixed_float16")
        value = KendallTauLoss()(tf.constant(t, tf.float16), tf.constant(p, tf.float16))
        assert value.dtype == tf.float32 and np.isfinite(float(value))
    finally:
        keras.config.set_dtype_policy(policy)


@pytest.mark.slow
def test_model_fit_with_loss_and_metric_decreases_loss(tmp_path):
    rng = np.random.default_rng(15)
    features = rng.normal(size=(256, 8, 4)).astype(np.float32)
    labels = (features @ np.array([1.0, -2.0, 0.5, 0.0], np.float32)).astype(np.float32)
    labels = labels - labels.min()  # relevance-like, >= 0
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((None, 4)), keras.layers.Dense(1),
                              keras.layers.Reshape((-1,))])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss=KendallTauLoss(smooth_scale=0.5),
                  metrics=[KendallTau()])
    history = model.fit(features, labels, batch_size=64, epochs=4, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.2
    assert history.history["kendall_tau"][-1] > 0.8
    path = str(tmp_path / "scorer.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.loss, KendallTauLoss)
    np.testing.assert_allclose(loaded.predict(features[:4], verbose=0),
                               model.predict(features[:4], verbose=0), atol=1e-6)

"""Tests of `softsort_tf.layers.kendall`: the `KendallEmbedding` layer."""

import keras
import numpy as np

from softsort_tf.layers.kendall import KendallEmbedding
from softsort_tf.ops import kendall as K


def test_layer_config_masking_and_keras_save(tmp_path):
    layer = KendallEmbedding(smooth_scale=0.5, signed=True)
    clone = KendallEmbedding.from_config(layer.get_config())
    assert (clone.smooth_scale, clone.signed) == (0.5, True)
    inputs, valid = keras.Input((4,)), keras.Input((4,), dtype="bool")
    embedded = KendallEmbedding(smooth_scale=0.5, signed=True)(inputs, mask=valid)
    model = keras.Model([inputs, valid], keras.layers.Dense(1)(embedded))
    x = np.array([[0.3, -1.0, 2.0, np.nan], [1.0, 0.0, 0.5, 0.2]], np.float32)
    mask = np.array([[True, True, True, False], [True] * 4])
    emb = keras.Model([inputs, valid], embedded)([x, mask]).numpy()
    unpadded = K.kendall_embedding(x[:1, :3], smooth_scale=0.5, signed=True).numpy()
    i, j = np.triu_indices(4, 1)
    np.testing.assert_allclose(emb[0][j < 3], unpadded[0], atol=1e-6)
    np.testing.assert_array_equal(emb[0][j == 3], 0.0)
    x = [x, mask]
    path = str(tmp_path / "kendall.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), atol=1e-6)
    assert KendallEmbedding().compute_output_shape((None, 5)) == (None, 10)

"""Small Keras layers shared by several test modules (not a test module)."""

import keras


@keras.saving.register_keras_serializable(package="softsort_tf_tests")
class Squeeze(keras.layers.Layer):
    """[batch, n, 1] → [batch, n], passing the Keras mask on."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, x):
        return keras.ops.squeeze(x, -1)


class SqueezeKeepingMask(keras.layers.Layer):
    """`[batch, n, 1]` → `[batch, n]`, passing the items' Keras mask on."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, x, mask=None):
        return keras.ops.squeeze(x, -1)

    def compute_mask(self, x, mask=None):
        return mask

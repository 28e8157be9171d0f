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


def unknown_length_batches(data, batch_size):
    """A `tf.data.Dataset` of `data` (an array, or a tuple/dict nest of arrays with the
    same leading axis) in batches of `batch_size` whose batch axis AND list axis (axis 1)
    have no static size. Keras then traces its step once for lists of any length: fed
    lists of several lengths in turn, a model runs every length with the one graph of
    unknown length (instead of a trace for the first length and a retrace for the rest)."""
    import numpy as np
    import tensorflow as tf

    arrays = tf.nest.map_structure(np.asarray, data)
    size = len(tf.nest.flatten(arrays)[0])
    spec = tf.nest.map_structure(lambda a: tf.TensorSpec(
        (None,) + ((None,) + a.shape[2:] if a.ndim > 1 else ()), tf.as_dtype(a.dtype)),
        arrays)

    def generate():
        for start in range(0, size, batch_size):
            yield tf.nest.map_structure(lambda a, s=start: a[s:s + batch_size], arrays)

    dataset = tf.data.Dataset.from_generator(generate, output_signature=spec)
    return dataset.apply(tf.data.experimental.assert_cardinality(-(-size // batch_size)))


def unknown_length_inference(model, item_shape=(), dtype="float32"):
    """`model`'s inference call (`training=False`) as ONE graph whose batch axis and list
    axis (axis 1) have no static size: inputs `[batch, n, *item_shape]`, every batch and
    list length run by the one trace, outputs as numpy arrays. (`model.predict` traces a
    graph of static shapes first, relaxes the batch axis at the next shape, then the list
    axis: three traces for two lengths.)"""
    import numpy as np
    import tensorflow as tf

    spec = tf.TensorSpec((None, None) + tuple(item_shape), dtype)
    graph = tf.function(lambda x: model(x, training=False), input_signature=[spec])
    return lambda x: tf.nest.map_structure(np.asarray, graph(x))

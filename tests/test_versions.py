"""The versions the package declares are the versions its tests run on (issue 43).

- `softsort_tf._keras` imports and reads a tensor's Keras mask on a Keras without the
  `get_keras_mask` accessor (before Keras 3.6 the mask is the `_keras_mask` attribute).
"""

from __future__ import annotations

import importlib.util

import keras
import numpy as np
import tensorflow as tf

import softsort_tf._keras as keras_contracts


def test_the_keras_mask_without_keras_accessor(monkeypatch):
    """`softsort_tf/_keras.py` loaded afresh where Keras has no `get_keras_mask` (as
    Keras < 3.6): it imports, and reads the mask from the tensor's `_keras_mask`."""
    import keras.src.backend

    monkeypatch.delattr(keras.backend, "get_keras_mask", raising=False)
    monkeypatch.delattr(keras.src.backend, "get_keras_mask", raising=False)
    spec = importlib.util.spec_from_file_location("keras_contracts_without_accessor",
                                                  keras_contracts.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = tf.constant([[1.0, 2.0, 0.0]])
    assert module.get_keras_mask(x) is None
    x._keras_mask = tf.constant([[True, True, False]])
    np.testing.assert_array_equal(module.get_keras_mask(x), [[True, True, False]])


def test_the_keras_mask_of_a_masking_layer():
    masked = keras.layers.Masking(mask_value=0.0)(tf.constant([[[1.0], [2.0], [0.0]]]))
    np.testing.assert_array_equal(keras_contracts.get_keras_mask(masked), [[True, True, False]])

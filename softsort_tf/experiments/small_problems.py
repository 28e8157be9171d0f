"""Two small learning problems that check the losses end to end in seconds.

- `digits_accuracy`: an MLP (64 → 64 → 10) on scikit-learn's 8×8 digits (1797 images,
  shuffled with seed 0: 1200 train / 597 test, pixels / 16), Adam 1e-2, batch 128,
  15 epochs; returns the test top-1 accuracy of a model trained with the given loss.
- `outlier_slope`: y = 3x + 1 + N(0, 0.05²) on 200 points x ~ U(0, 1), 30 % of them
  replaced by gross outliers around y = 4 − 6x; one Dense(1) unit from zero weights,
  full batch, Adam 0.1, 100 steps; returns the fitted slope (true: 3).

`tests/losses/test_top_k.py` and `tests/losses/test_regression.py` assert on them and
`scripts/compare_target_grids.py` runs them on both target grids (docs/RESULTS.md).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

__all__ = ["digits_accuracy", "outlier_data", "outlier_slope"]


def digits_accuracy(loss, seed: int = 0, epochs: int = 15) -> float:
    """Test accuracy of the 8×8-digits MLP trained with `loss` (see the module docstring).

    Args:
      loss: a Keras loss taking sparse labels and logits `[batch, 10]`.
      seed: seed of the initialisation and the batches (the split is fixed).
      epochs: training epochs.
    """
    from sklearn.datasets import load_digits  # noqa: PLC0415 (only this problem needs it)

    images, labels = load_digits(return_X_y=True)
    order = np.random.RandomState(0).permutation(len(labels))
    images = (images[order] / 16.0).astype(np.float32)
    labels = labels[order].astype(np.int32)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(1e-2), loss=loss,
                  metrics=[keras.metrics.SparseTopKCategoricalAccuracy(k=1, name="acc")])
    model.fit(images[:1200], labels[:1200], batch_size=128, epochs=epochs, verbose=0)
    return float(model.evaluate(images[1200:], labels[1200:], verbose=0,
                                return_dict=True)["acc"])


def outlier_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`(x, y)` float32 `[200]`: the line y = 3x + 1 with 30 % gross outliers."""
    rng = np.random.RandomState(seed)
    n = 200
    x = rng.uniform(0, 1, n).astype(np.float32)
    y = (3 * x + 1 + 0.05 * rng.randn(n)).astype(np.float32)
    outliers = rng.permutation(n)[: int(0.3 * n)]
    y[outliers] = (4 - 6 * x[outliers] + 0.5 * rng.randn(outliers.size)).astype(np.float32)
    return x, y


def outlier_slope(loss, seed: int = 0) -> float:
    """Slope of a linear model fitted with `loss` to `outlier_data(seed)` (true: 3)."""
    x, y = outlier_data(seed)
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((1,)),
                              keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(keras.optimizers.Adam(0.1), loss=loss)
    data = tf.data.Dataset.from_tensors((x[:, None], y[:, None])).repeat(100)
    model.fit(data, epochs=1, verbose=0, shuffle=False)
    return float(model.layers[0].kernel.numpy()[0, 0])

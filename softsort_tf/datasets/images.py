"""Small image-classification sets for the top-k and kNN binaries.

| source                | images                      | classes | needs       |
|-----------------------|-----------------------------|---------|-------------|
| `digits` (default)    | 1797 8×8×1 (scikit-learn)   | 10      | nothing     |
| `embedded`            | the digits as 28×28×1 (1)   | 10      | nothing     |
| `mnist`, `fashion_mnist` | 70000 28×28×1            | 10      | network (tensorflow-datasets) |
| `cifar10`, `cifar100` | 60000 32×32×3               | 10, 100 | network (tensorflow-datasets) |
| `npz`                 | an MNIST-format npz file    | 10      | the file    |

(1) resized to MNIST's format by `large_mnist.embedded_digit_images`.

`load_image_splits` returns float32 images in [0, 1] with a channel axis and int64
labels, split into train / validation / test. tfds sets keep their canonical test
split and hold out the last `validation_size` training images for validation; the
scikit-learn digits (both sizes) are split 70 / 10 / 20 % per class with a fixed seed (the split
never depends on the run's seed).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from softsort_tf.datasets.arrays import Splits

__all__ = ["SOURCES", "ImageSplits", "load_image_splits"]

SOURCES = ("digits", "embedded", "mnist", "fashion_mnist", "cifar10", "cifar100", "npz")
TFDS_SOURCES = ("mnist", "fashion_mnist", "cifar10", "cifar100")
DIGITS_FRACTIONS = (0.7, 0.1)  # train, validation; the rest is test
_DIGITS_SPLIT_SEED = 20191208


@dataclasses.dataclass(frozen=True)
class ImageSplits(Splits):
    """Train / validation / test images `[N, H, W, C]` float32 in [0, 1], labels `[N]` int64."""

    num_classes: int
    source: str

    @property
    def image_shape(self) -> tuple:
        return tuple(self.x_train.shape[1:])


def _as_images(x) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[..., None]
    scale = 255.0 if x.dtype == np.uint8 or x.max() > 1.0 else 1.0
    return (x.astype(np.float32) / scale).astype(np.float32)


def _digits(mnist_size: bool):
    if mnist_size:
        from softsort_tf.datasets import large_mnist  # noqa: PLC0415

        images, labels = large_mnist.embedded_digit_images()
    else:
        from sklearn.datasets import load_digits  # noqa: PLC0415 (optional heavy import)

        digits = load_digits()
        images = (digits.images.astype(np.float32) / 16.0)[..., None]
        labels = digits.target.astype(np.int64)
    rng = np.random.default_rng(_DIGITS_SPLIT_SEED)
    parts = ([], [], [])
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_train = int(round(DIGITS_FRACTIONS[0] * len(idx)))
        n_val = int(round(DIGITS_FRACTIONS[1] * len(idx)))
        for part, chunk in zip(parts, np.split(idx, [n_train, n_train + n_val]), strict=True):
            part.append(chunk)
    train, val, test = (np.sort(np.concatenate(p)) for p in parts)
    return (images[train], labels[train], images[val], labels[val], images[test],
            labels[test], 10)


def _tfds(name: str, validation_size: int):
    import tensorflow_datasets as tfds  # noqa: PLC0415 (optional heavy import)

    (train, test), info = tfds.load(name, split=["train", "test"], batch_size=-1,
                                    as_supervised=True, with_info=True)
    (x, y), (x_test, y_test) = tfds.as_numpy(train), tfds.as_numpy(test)
    v = len(x) - validation_size
    return (x[:v], y[:v], x[v:], y[v:], x_test, y_test, info.features["label"].num_classes)


def _npz(path: str, validation_size: int):
    if not path or not os.path.exists(path):
        raise ValueError(f"source='npz' needs an existing npz file, got {path!r}.")
    with np.load(path) as f:
        x, y, x_test, y_test = f["x_train"], f["y_train"], f["x_test"], f["y_test"]
    v = len(x) - validation_size
    return x[:v], y[:v], x[v:], y[v:], x_test, y_test, 10


def load_image_splits(source: str = "digits", npz_path: str | None = None,
                      validation_size: int = 5000,
                      limit_per_split: int | None = None) -> ImageSplits:
    """Loads an image-classification set (module docstring).

    Args:
      source: one of `SOURCES`.
      npz_path: the npz file of `source='npz'` (keys x_train, y_train, x_test, y_test).
      validation_size: training images held out for validation (tfds and npz sources).
      limit_per_split: keep only the first images of each split (quick runs and tests).

    Returns:
      An `ImageSplits`.

    Example:
    >>> s = load_image_splits("digits")
    >>> s.image_shape, s.num_classes, len(s.y_train) + len(s.y_val) + len(s.y_test)
    ((8, 8, 1), 10, 1797)
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}.")
    if limit_per_split is not None and limit_per_split < 1:
        raise ValueError(f"limit_per_split must be a positive int or None, got "
                         f"{limit_per_split}.")
    if source in ("digits", "embedded"):
        parts = _digits(mnist_size=source == "embedded")
    elif source == "npz":
        parts = _npz(npz_path, validation_size)
    else:
        parts = _tfds(source, validation_size)
    *arrays, num_classes = parts
    arrays = [(_as_images(a) if i % 2 == 0 else np.asarray(a, np.int64).reshape(-1))
              for i, a in enumerate(arrays)]
    if limit_per_split is not None:
        arrays = [a[:limit_per_split] for a in arrays]
    return ImageSplits(*arrays, num_classes=int(num_classes), source=source)

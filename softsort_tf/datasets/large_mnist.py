"""Large-MNIST: sequences of 4-digit handwritten numbers as a `tf.data` pipeline.

The benchmark of the NeuralSort paper (Grover et al., 2019, App. D.1) reused by the
SoftSort paper (Prillo & Eisenschlos, 2020, §5.2-5.3): each number is drawn uniformly
in [0, 9999]; each of its 4 decimal digits is drawn as a random digit image of that
class, and the 4 tiles are stacked top to bottom (thousands first) into one 112×28
image. An example is a sequence of `n` such images, labelled with the permutation that
sorts the numbers in DESCENDING order (`permutation[i]` is the index of the i-th
largest number, the convention of `softsort_tf.PermutationCrossEntropy`) and with the
numbers themselves (for median regression).

Digit images come from one split only, so no handwritten digit is shared between
training, validation and test sequences:

| source       | train                     | validation              | test              |
|--------------|---------------------------|-------------------------|-------------------|
| `tfds`, `npz`| MNIST train 5000..59999   | MNIST train 0..4999     | MNIST test (10k)  |
| `embedded`   | 1/14 … see `EMBEDDED_FRACTIONS` of scikit-learn's 1797 8×8 digits      |||

(the MNIST validation split is the first 5000 training images, as in TensorFlow's
legacy `read_data_sets` used by the original code: 55k / 5k / 10k).

Sampling is fully vectorised (one gather of `[batch, n, 4]` digit images per batch)
and uses stateless random ops keyed by `(seed, step)`: batch `step` of a stream is the
same whatever was sampled before, which makes runs reproducible and lets a resumed
run continue with exactly the batches it would have seen.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import tensorflow as tf

__all__ = [
    "DIGITS_PER_NUMBER",
    "EMBEDDED_FRACTIONS",
    "MAX_NUMBER",
    "SOURCES",
    "DigitSplit",
    "DigitSplits",
    "LargeMnistSampler",
    "load_digit_splits",
    "make_dataset",
]

DIGITS_PER_NUMBER = 4
MAX_NUMBER = 10 ** DIGITS_PER_NUMBER - 1  # numbers are uniform in [0, 9999]
TILE = 28  # MNIST digit images are 28×28
MNIST_VALIDATION_SIZE = 5000
SOURCES = ("embedded", "tfds", "npz")
# Fractions of the 1797 scikit-learn digits (per class) given to train / validation /
# test: the 55k / 5k / 10k proportions of MNIST.
EMBEDDED_FRACTIONS = (55 / 70, 5 / 70, 10 / 70)
_NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
_EMBEDDED_SPLIT_SEED = 20200707  # fixed: the embedded splits never depend on --seed


@dataclasses.dataclass(frozen=True)
class DigitSplit:
    """Digit images of one split.

    Attributes:
      images: `[num_images, 28, 28]` uint8, MNIST scale (0 = background, 255 = ink).
      labels: `[num_images]` int64 digit classes 0-9.
      ids: `[num_images]` int64 identifiers of the images in their source (unique
        over all splits of one source), to check that no image crosses splits.
    """

    images: np.ndarray
    labels: np.ndarray
    ids: np.ndarray

    def __post_init__(self):
        if self.images.ndim != 3 or self.images.shape[1:] != (TILE, TILE):
            raise ValueError(f"images must be [num_images, 28, 28], got {self.images.shape}.")
        if not len(self.images) == len(self.labels) == len(self.ids):
            raise ValueError("images, labels and ids must have the same length.")
        missing = sorted(set(range(10)) - set(np.unique(self.labels).tolist()))
        if missing:
            raise ValueError(f"every digit class 0-9 needs at least one image; missing {missing}.")

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, limit: int | None) -> DigitSplit:
        """The first `limit` images of each class (all when `limit` is None), in order."""
        if limit is None:
            return self
        keep = np.sort(np.concatenate(
            [np.flatnonzero(self.labels == c)[:limit] for c in range(10)]))
        return DigitSplit(self.images[keep], self.labels[keep], self.ids[keep])


@dataclasses.dataclass(frozen=True)
class DigitSplits:
    """Disjoint train / validation / test digit splits of one source."""

    train: DigitSplit
    validation: DigitSplit
    test: DigitSplit
    source: str

    def split(self, name: str) -> DigitSplit:
        if name not in ("train", "validation", "test"):
            raise ValueError(f"split must be 'train', 'validation' or 'test', got {name!r}.")
        return getattr(self, name)


def _mnist_splits(x_train, y_train, x_test, y_test, source: str) -> DigitSplits:
    x_train = np.asarray(x_train, np.uint8).reshape(-1, TILE, TILE)
    x_test = np.asarray(x_test, np.uint8).reshape(-1, TILE, TILE)
    y_train = np.asarray(y_train, np.int64).reshape(-1)
    y_test = np.asarray(y_test, np.int64).reshape(-1)
    ids_train = np.arange(len(x_train), dtype=np.int64)
    ids_test = len(x_train) + np.arange(len(x_test), dtype=np.int64)
    v = MNIST_VALIDATION_SIZE
    return DigitSplits(
        train=DigitSplit(x_train[v:], y_train[v:], ids_train[v:]),
        validation=DigitSplit(x_train[:v], y_train[:v], ids_train[:v]),
        test=DigitSplit(x_test, y_test, ids_test),
        source=source)


def embedded_digit_images() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1797 8×8 digits, resized to MNIST's format.

    Each 8×8 image (intensities 0-16) is resized bilinearly (with antialiasing) to a
    20×20 box and padded by 4 pixels on each side to 28×28, as MNIST centres its digits
    in a 20×20 box; intensities are rescaled to 0-255 uint8.

    Returns:
      `(images [1797, 28, 28] uint8, labels [1797] int64)`, in scikit-learn's order.
    """
    from sklearn.datasets import load_digits  # noqa: PLC0415 (optional heavy import)

    digits = load_digits()
    small = digits.images.astype(np.float32)[..., None] / 16.0  # [N, 8, 8, 1] in [0, 1]
    box = tf.image.resize(small, (20, 20), method="bilinear", antialias=True).numpy()
    box = np.clip(np.rint(box[..., 0] * 255.0), 0, 255).astype(np.uint8)
    images = np.pad(box, ((0, 0), (4, 4), (4, 4)))
    return images, digits.target.astype(np.int64)


def _embedded_splits() -> DigitSplits:
    images, labels = embedded_digit_images()
    rng = np.random.default_rng(_EMBEDDED_SPLIT_SEED)
    parts = ([], [], [])
    for c in range(10):  # stratified: each split gets the same class proportions
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_train = int(round(EMBEDDED_FRACTIONS[0] * len(idx)))
        n_val = int(round(EMBEDDED_FRACTIONS[1] * len(idx)))
        for part, chunk in zip(parts, np.split(idx, [n_train, n_train + n_val]), strict=True):
            part.append(chunk)
    ids = [np.sort(np.concatenate(p)) for p in parts]
    train, val, test = (DigitSplit(images[i], labels[i], i.astype(np.int64)) for i in ids)
    return DigitSplits(train, val, test, source="embedded")


def load_digit_splits(source: str = "embedded", mnist_npz: str | None = None,
                      limit_per_class: int | None = None) -> DigitSplits:
    """Loads digit images and splits them into disjoint train / validation / test sets.

    Args:
      source: `'embedded'` (default; scikit-learn's 8×8 digits resized to 28×28, no
        network and no file needed), `'tfds'` (tensorflow-datasets `mnist`, downloaded
        on first use) or `'npz'` (a local file with `x_train, y_train, x_test, y_test`).
      mnist_npz: path of the npz file, required when `source='npz'`.
      limit_per_class: keep only the first `limit_per_class` images of each class in each
        split (for quick tests); None keeps everything.

    Returns:
      A `DigitSplits`. For MNIST: 55000 / 5000 / 10000 images.

    Example:
    >>> splits = load_digit_splits("embedded")
    >>> splits.train.images.shape[1:], len(splits.test) > 0
    ((28, 28), True)
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}.")
    if limit_per_class is not None and limit_per_class < 1:
        raise ValueError(f"limit_per_class must be a positive int or None, got {limit_per_class}.")
    if source == "embedded":
        splits = _embedded_splits()
    elif source == "npz":
        if not mnist_npz:
            raise ValueError("mnist_npz (a path) is required when source='npz'.")
        if not os.path.exists(mnist_npz):
            raise ValueError(f"mnist_npz={mnist_npz!r} does not exist.")
        with np.load(mnist_npz) as f:
            missing = [key for key in _NPZ_KEYS if key not in f.files]
            if missing:
                raise ValueError(f"mnist_npz={mnist_npz!r} lacks the arrays {missing} "
                                 f"(an MNIST npz holds {list(_NPZ_KEYS)}).")
            splits = _mnist_splits(*(f[key] for key in _NPZ_KEYS), "npz")
    else:
        import tensorflow_datasets as tfds  # noqa: PLC0415 (optional heavy import)

        train, test = tfds.as_numpy(tfds.load("mnist", split=["train", "test"],
                                              batch_size=-1, as_supervised=True))
        splits = _mnist_splits(train[0], train[1], test[0], test[1], "tfds")
    if limit_per_class is not None:
        splits = DigitSplits(splits.train.take(limit_per_class),
                             splits.validation.take(limit_per_class),
                             splits.test.take(limit_per_class), splits.source)
    return splits


class LargeMnistSampler:
    """Draws batches of large-MNIST sequences from one digit split.

    Args:
      split: the `DigitSplit` the digit images come from.
      n: numbers per sequence (≥ 2).

    Example:
    >>> sampler = LargeMnistSampler(load_digit_splits().test, n=3)
    >>> batch = sampler.sample(batch_size=2, seed=[0, 0])
    >>> batch["images"].shape, batch["permutation"].shape
    (TensorShape([2, 3, 112, 28, 1]), TensorShape([2, 3]))
    """

    def __init__(self, split: DigitSplit, n: int):
        if int(n) != n or n < 2:
            raise ValueError(f"n must be an int >= 2, got {n}.")
        self.n = int(n)
        self.split = split
        self._images = tf.constant(split.images)  # [N, 28, 28] uint8
        counts = np.bincount(split.labels, minlength=10)
        table = np.zeros((10, counts.max()), np.int32)  # table[c, k]: k-th image of class c
        for c in range(10):
            table[c, :counts[c]] = np.flatnonzero(split.labels == c)
        self._table = tf.constant(table)
        self._counts = tf.constant(counts, tf.float32)

    def sample(self, batch_size: int, seed) -> dict[str, tf.Tensor]:
        """One batch, a pure function of `seed` (a `[2]` int tensor).

        Returns:
          A dict with
          - `images`: `[batch, n, 112, 28, 1]` float32 in [0, 1];
          - `numbers`: `[batch, n]` int32 in [0, 9999];
          - `permutation`: `[batch, n]` int32, the DESCENDING argsort of `numbers`
            (ties, rare, keep their sequence order);
          - `digit_indices`: `[batch, n, 4]` int32 rows of `split.images` used for the
            thousands, hundreds, tens and units tiles.
        """
        seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=2)
        shape = [batch_size, self.n]
        numbers = tf.random.stateless_uniform(shape, seeds[0], minval=0, maxval=MAX_NUMBER + 1,
                                              dtype=tf.int32)
        powers = tf.constant([1000, 100, 10, 1], tf.int32)
        digits = (numbers[..., None] // powers) % 10  # [batch, n, 4]
        u = tf.random.stateless_uniform(shape + [DIGITS_PER_NUMBER], seeds[1])
        counts = tf.gather(self._counts, digits)
        rank = tf.minimum(tf.cast(tf.floor(u * counts), tf.int32),
                          tf.cast(counts, tf.int32) - 1)
        digit_indices = tf.gather_nd(self._table, tf.stack([digits, rank], axis=-1))
        tiles = tf.gather(self._images, digit_indices)  # [batch, n, 4, 28, 28]
        images = tf.reshape(tiles, shape + [DIGITS_PER_NUMBER * TILE, TILE, 1])
        permutation = tf.argsort(numbers, axis=-1, direction="DESCENDING", stable=True)
        return {
            "images": tf.cast(images, tf.float32) / 255.0,
            "numbers": numbers,
            "permutation": tf.cast(permutation, tf.int32),
            "digit_indices": digit_indices,
        }


def make_dataset(split: DigitSplit, n: int, batch_size: int, seed: int,
                 num_batches: int | None = None, start_step: int = 0) -> tf.data.Dataset:
    """A `tf.data.Dataset` of large-MNIST batches.

    Batch `step` is `LargeMnistSampler(split, n).sample(batch_size, [seed, step])` with
    `step = start_step, start_step + 1, ...`, so the stream is deterministic and a
    resumed run can restart it at the step it had reached.

    Args:
      split: digit images to draw from.
      n: numbers per sequence.
      batch_size: sequences per batch.
      seed: int seed of the stream.
      num_batches: number of batches; None for an endless stream.
      start_step: index of the first batch.

    Returns:
      A dataset of dicts as returned by `LargeMnistSampler.sample`, plus `step`
      (`[batch]` int64, the batch index repeated, a seed for stochastic models).

    Example:
    >>> ds = make_dataset(load_digit_splits().validation, n=5, batch_size=4, seed=1,
    ...                   num_batches=2)
    >>> [b["images"].shape[:2] for b in ds]
    [TensorShape([4, 5]), TensorShape([4, 5])]
    """
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size}.")
    if num_batches is not None and num_batches < 1:
        raise ValueError(f"num_batches must be a positive int or None, got {num_batches}.")
    sampler = LargeMnistSampler(split, n)
    stop = None if num_batches is None else start_step + num_batches
    steps = (tf.data.Dataset.counter(start_step) if stop is None
             else tf.data.Dataset.range(start_step, stop))

    def _batch(step):
        out = sampler.sample(batch_size, tf.stack([tf.constant(seed, tf.int64), step]))
        out["step"] = tf.fill([batch_size], step)
        return out

    return steps.map(_batch, num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=True).prefetch(tf.data.AUTOTUNE)

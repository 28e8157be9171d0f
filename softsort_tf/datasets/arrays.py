"""In-memory data: train / validation / test splits, and resumable, deterministic
mini-batch streams over arrays.

Batch `step` of a stream depends only on `(seed, step)`: epoch e = step // steps_per_epoch
visits the examples in a random order keyed by `(seed, e)`, so a run restarted at a
step sees exactly the batches it would have seen (`training.fit_resumable` restarts
the stream at `epochs_completed · steps_per_epoch`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

__all__ = ["Splits", "shuffled_batches", "steps_per_epoch"]


@dataclasses.dataclass(frozen=True)
class Splits:
    """Train / validation / test arrays: inputs `x_*` and targets `y_*`, one example per
    row. The data sets' split classes add their own fields after these six.

    Example:
    >>> s = Splits(*(np.zeros((n, 2)) for n in (4, 4, 1, 1, 2, 2)))
    >>> s.map_x(lambda x: x[:, :1]).x_train.shape
    (4, 1)
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def map_x(self, fn):
        """A copy with `fn` applied to the inputs of every split."""
        return dataclasses.replace(self, x_train=fn(self.x_train), x_val=fn(self.x_val),
                                   x_test=fn(self.x_test))


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    """Full batches per epoch (the last partial batch of an epoch is dropped)."""
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size}.")
    if num_examples < batch_size:
        raise ValueError(f"batch_size={batch_size} is larger than the {num_examples} "
                         "training examples.")
    return num_examples // batch_size


def shuffled_batches(arrays, batch_size: int, seed: int, start_step: int = 0) -> tf.data.Dataset:
    """An endless stream of shuffled batches of `arrays`, starting at batch `start_step`.

    Args:
      arrays: a tuple (or nest) of arrays with the same first dimension N.
      batch_size: examples per batch (epochs have `steps_per_epoch(N, batch_size)` batches).
      seed: int seed of the shuffling.
      start_step: index of the first batch of the stream.

    Returns:
      A `tf.data.Dataset` of batches with the structure of `arrays`.

    Example:
    >>> ds = shuffled_batches((np.arange(10), np.arange(10) * 2), 4, seed=0, start_step=1)
    >>> x, y = next(iter(ds))
    >>> bool(np.all(y.numpy() == 2 * x.numpy())), x.shape
    (True, TensorShape([4]))
    """
    tensors = tf.nest.map_structure(tf.convert_to_tensor, arrays)
    n = int(tf.nest.flatten(tensors)[0].shape[0])
    spe = steps_per_epoch(n, batch_size)
    first_epoch, skip = divmod(int(start_step), spe)

    def epoch_batches(epoch):
        order = tf.argsort(tf.random.stateless_uniform(
            [n], tf.stack([tf.constant(seed, tf.int64), epoch])))
        index = tf.reshape(order[:spe * batch_size], [spe, batch_size])
        return tf.data.Dataset.from_tensor_slices(index)

    ds = tf.data.Dataset.counter(first_epoch).flat_map(epoch_batches).skip(skip)
    ds = ds.map(lambda idx: tf.nest.map_structure(lambda t: tf.gather(t, idx), tensors),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)

"""Differentiable k-nearest-neighbours (SoftSort paper §5.4; NeuralSort paper §6).

An embedding CNN is trained on episodes: a step draws `num_queries` query images and
`num_candidates` other candidate images (100 and 100, as in the papers) from the
training split; each query scores the candidates by the negative squared distance of their
embeddings, s_j = −‖φ(q) − φ(c_j)‖²; a relaxed sorting permutation P̂ of those scores
(SoftSort or NeuralSort, deterministic or with Gumbel noise; row i = the i-th nearest
candidate) is applied to the candidates' one-hot labels Y, and the class
probabilities are the mean of the first k rows of P̂ Y. The loss is minus the
probability of the query's class (SoftSort App. A.3.2). The validation loss (queries
from the validation split, candidates from the training split, deterministic P̂)
picks the best epoch. The test accuracy is that of a plain kNN classifier on the learned
embeddings (scikit-learn's `KNeighborsClassifier`: majority vote of the k nearest
training images, Euclidean distance; a tie of counts goes to the class whose neighbours
are nearer, see `knn_classifier`).

Embedding CNN (SoftSort App. A.3.1 for MNIST; the appendix text reads "FC 50", which
we take as the 500 units of the LeNet layer it comes from):
    Conv 5×5 20 (valid), ReLU → max-pool 2 → Conv 5×5 50 (valid), ReLU → max-pool 2 →
    Flatten → Dense 500, ReLU (the embedding).
It is used for every data source (the paper uses a ResNet-18 for Fashion-MNIST and
CIFAR-10; we do not). Optimiser: SGD with momentum 0.9 (papers); learning rate and τ
are flags (the papers grid-search them; their chosen values are not available to us).
Our defaults, τ = 0.1 (on squared embedding distances) and learning rate 0.01, were
chosen from two short runs on the offline digits (τ = 1 learned more slowly).
"""

from __future__ import annotations

import dataclasses
import os
import time

import keras
import numpy as np
import tensorflow as tf
from sklearn.neighbors import KNeighborsClassifier

import softsort_tf as ss
from softsort_tf.datasets import arrays, images
from softsort_tf.experiments import models, training

__all__ = ["KNN_METHODS", "KnnConfig", "KnnEmbedder", "build_embedding_cnn", "knn_classifier",
           "plain_knn_accuracy", "run"]

KNN_METHODS = ("softsort", "neuralsort")
EMBED_BATCH = 1000


def build_embedding_cnn(image_shape: tuple, name: str = "embedding") -> keras.Sequential:
    """The MNIST embedding CNN (module docstring): `[batch, H, W, C]` -> `[batch, 500]`."""
    L = keras.layers
    return keras.Sequential([
        keras.Input(image_shape),
        L.Conv2D(20, 5, activation="relu"), L.MaxPooling2D(2),
        L.Conv2D(50, 5, activation="relu"), L.MaxPooling2D(2),
        L.Flatten(), L.Dense(500, activation="relu"),
    ], name=name)


def knn_class_probabilities(perm: tf.Tensor, candidate_labels: tf.Tensor, k: int,
                            num_classes: int) -> tf.Tensor:
    """Mean of the first k rows of P̂ applied to the one-hot candidate labels.

    Args:
      perm: `[..., C, C]` relaxed permutation matrices (row i = i-th nearest).
      candidate_labels: `[C]` int labels.
      k: neighbours.
      num_classes: classes.

    Returns:
      `[..., num_classes]` class probabilities (rows sum to 1).

    Example:
    >>> p = tf.eye(3)[None]  # the candidates are already sorted
    >>> knn_class_probabilities(p, tf.constant([1, 1, 0]), 3, 2).numpy().round(2)
    array([[0.33, 0.67]], dtype=float32)
    """
    onehot = tf.one_hot(candidate_labels, num_classes, dtype=perm.dtype)
    return tf.reduce_mean(tf.matmul(perm[..., :k, :], onehot), axis=-2)


@keras.saving.register_keras_serializable(package="softsort_tf")
class KnnEmbedder(keras.Model):
    """The embedding CNN and the differentiable kNN read-out of an episode.

    Call on `{"queries": [Q, H, W, C], "candidates": [C_n, H, W, C],
    "candidate_labels": [C_n], "step": [Q]}`; returns `[Q, num_classes]` class
    probabilities (averaged over the Gumbel samples of a stochastic model in training).
    `embed(images)` gives the `[N, 500]` embeddings.

    Args:
      image_shape: `(H, W, C)`.
      num_classes: classes.
      k: neighbours read from P̂.
      method: 'softsort' or 'neuralsort'.
      tau: temperature (on squared embedding distances).
      stochastic, num_samples: Gumbel-perturbed scores in training.
      seed: seed of the noise (with the step).
      method_kwargs: the family's own settings (e.g. `{"distance_power": 2.0}` for
        'softsort'), passed to its relaxed matrix.

    Example:
    >>> model = KnnEmbedder((28, 28, 1), num_classes=10, k=3)
    >>> episode = {"queries": tf.zeros([4, 28, 28, 1]), "candidates": tf.zeros([6, 28, 28, 1]),
    ...            "candidate_labels": tf.range(6), "step": tf.zeros([4], tf.int64)}
    >>> model(episode).shape
    TensorShape([4, 10])
    """

    def __init__(self, image_shape=(28, 28, 1), num_classes=10, k=9, method="softsort",
                 tau=16.0, stochastic=False, num_samples=5, seed=0, method_kwargs=None,
                 **kwargs):
        super().__init__(**kwargs)
        if method not in KNN_METHODS:
            raise ValueError(f"method must be one of {KNN_METHODS}, got {method!r}.")
        if int(k) != k or k < 1:
            raise ValueError(f"k must be a positive int, got {k}.")
        self.image_shape, self.num_classes, self.k = tuple(image_shape), int(num_classes), int(k)
        self.method, self.tau, self.stochastic = method, float(tau), bool(stochastic)
        self.num_samples, self.seed = int(num_samples), int(seed)
        self.method_kwargs = models.parse_method_kwargs(method, method_kwargs)
        self.embedding = build_embedding_cnn(self.image_shape)

    def build(self, input_shape=None):
        self.embedding.build((None,) + self.image_shape)
        self.built = True

    def embed(self, x, training=False):
        return self.embedding(x, training=training)

    def call(self, inputs, training=None):
        q = self.embed(inputs["queries"], training)
        c = self.embed(inputs["candidates"], training)
        d2 = (tf.reduce_sum(q * q, -1)[:, None] - 2.0 * tf.matmul(q, c, transpose_b=True)
              + tf.reduce_sum(c * c, -1)[None, :])
        labels = inputs["candidate_labels"]
        if self.stochastic and bool(training):
            seed = tf.stack([tf.constant(self.seed, tf.int64),
                             tf.cast(inputs["step"][0], tf.int64)])
            perm = ss.stochastic_permutation_matrix(-d2, self.num_samples, seed, self.method,
                                                    tau=self.tau, **self.method_kwargs)
            probs = knn_class_probabilities(perm, labels, self.k, self.num_classes)
            return tf.reduce_mean(probs, axis=1)
        perm = ss.permutation_matrix(-d2, self.method, tau=self.tau, **self.method_kwargs)
        return knn_class_probabilities(perm, labels, self.k, self.num_classes)

    def get_config(self):
        return {**super().get_config(), "image_shape": self.image_shape,
                "num_classes": self.num_classes, "k": self.k, "method": self.method,
                "tau": self.tau, "stochastic": self.stochastic,
                "num_samples": self.num_samples, "seed": self.seed,
                "method_kwargs": self.method_kwargs}


def negative_probability(y_true, probs):
    """Per-query loss: minus the kNN probability of the true class (SoftSort A.3.2)."""
    labels = tf.cast(tf.reshape(y_true, [-1]), tf.int32)
    return -tf.gather(probs, labels, batch_dims=1)


@dataclasses.dataclass
class KnnConfig(training.RunConfig):
    """Everything a kNN run depends on (the binary's flags)."""

    dataset: str = "embedded"
    mnist_npz: str | None = None
    method: str = "softsort"
    stochastic: bool = False
    num_samples: int = 5
    k: int = 9
    tau: float = 0.1
    method_kwargs: str | None = None
    num_queries: int = 100
    num_candidates: int = 100
    steps_per_epoch: int = 100
    num_val_episodes: int = 10
    seed: int = 0
    limit_per_split: int | None = None
    jit_compile: bool = True
    # This binary's defaults of `RunConfig` fields.
    output_dir: str = "/tmp/softsort_tf_knn"
    epochs: int = 20
    learning_rate: float = 1e-2

    def finalize(self) -> KnnConfig:
        """Validates the fields; returns self."""
        if self.mnist_npz and self.dataset == "embedded":
            self.dataset = "npz"
        self.check(method=KNN_METHODS, dataset=images.SOURCES)
        models.parse_method_kwargs(self.method, self.method_kwargs)  # a clear error now
        if self.k > self.num_candidates:
            raise ValueError(f"k={self.k} must be <= num_candidates={self.num_candidates}.")
        return self


def _episodes(queries, candidates, num_queries: int, num_candidates: int, seed: int,
              start_step: int = 0, num_steps: int | None = None) -> tf.data.Dataset:
    """Episodes `(features, query_labels)` from resumable shuffled streams.

    Training (`candidates is queries`): one batch of `num_queries + num_candidates`
    distinct images per step, split into queries and candidates (a query is never its
    own candidate). Validation: queries from their split, candidates from the training
    split, each from its own stream.
    """
    if candidates is queries:
        both = arrays.shuffled_batches(queries, num_queries + num_candidates, seed,
                                       start_step)
        pairs = both.map(lambda x, y: ((x[:num_queries], y[:num_queries]),
                                       (x[num_queries:], y[num_queries:])))
    else:
        pairs = tf.data.Dataset.zip((
            arrays.shuffled_batches(queries, num_queries, seed, start_step),
            arrays.shuffled_batches(candidates, num_candidates, seed + 7919, start_step)))
    ds = tf.data.Dataset.zip((pairs, tf.data.Dataset.counter(start_step)))
    if num_steps is not None:
        ds = ds.take(num_steps)

    def to_example(pair, step):
        (qx, qy), (cx, cy) = pair
        features = {"queries": qx, "candidates": cx, "candidate_labels": cy,
                    "step": tf.fill([num_queries], step)}
        return features, qy

    return ds.map(to_example)


def embed_all(model: KnnEmbedder, x: np.ndarray) -> np.ndarray:
    """Embeddings of `x` in batches."""
    return np.concatenate([np.asarray(model.embed(x[i:i + EMBED_BATCH]))
                           for i in range(0, len(x), EMBED_BATCH)])


def _nearer_neighbours_first(distances: np.ndarray) -> np.ndarray:
    """Vote weights of the k neighbours of each query (`distances` `[queries, k]`,
    nearest first): B + (k − j) for the j-th nearest (j = 0, …, k − 1), with
    B = k(k + 1)/2 + 1 larger than any sum of the bonuses k − j. The vote of a class is
    then its count times B plus its bonus, in exact integer arithmetic: the most
    neighbours win; a tie of counts goes to the class whose neighbours have the smaller
    sum of ranks (nearer on the whole); a tie of both goes to the smaller label."""
    k = distances.shape[-1]
    votes = k * (k + 1) // 2 + 1 + (k - np.arange(k))
    return np.tile(votes.astype(np.float64), distances.shape[:-1] + (1,))


def knn_classifier(k: int) -> KNeighborsClassifier:
    """Plain kNN on embeddings: scikit-learn's `KNeighborsClassifier` (Euclidean distance,
    exact neighbours), majority vote of the k nearest; ties of counts go to the class
    whose neighbours are nearer (see `_nearer_neighbours_first`).

    Example:
    >>> e = np.array([[0.0], [1.0], [10.0]]); y = np.array([0, 0, 1])
    >>> knn_classifier(1).fit(e, y).score(np.array([[0.5], [9.0]]), np.array([0, 1]))
    1.0
    """
    return KNeighborsClassifier(n_neighbors=k, weights=_nearer_neighbours_first,
                                algorithm="brute", metric="euclidean")


def plain_knn_accuracy(model: KnnEmbedder, splits, k: int) -> float:
    """Accuracy on the test split of plain kNN over the training split's embeddings."""
    classifier = knn_classifier(k).fit(embed_all(model, splits.x_train), splits.y_train)
    return float(classifier.score(embed_all(model, splits.x_test), splits.y_test))


def run(config: KnnConfig) -> dict:
    """Runs (or resumes) one kNN training run; returns the results (also results.json)."""
    config = config.finalize()
    wall = time.time()
    strategy = training.prepare_runtime(config)
    chief = training.is_chief(strategy)
    splits = images.load_image_splits(config.dataset, config.mnist_npz,
                                      limit_per_split=config.limit_per_split)
    train = (splits.x_train, splits.y_train)
    with training.output_directory(config.output_dir):
        with strategy.scope():
            model = KnnEmbedder(splits.image_shape, splits.num_classes, config.k,
                                config.method, config.tau, config.stochastic,
                                config.num_samples, config.seed,
                                models.parse_method_kwargs(config.method,
                                                           config.method_kwargs))
            model.build()
            # XLA cannot place distributed variables: a strategy other than 'default'
            # runs without it.
            model.compile(keras.optimizers.SGD(config.learning_rate, momentum=0.9),
                          loss=negative_probability,
                          metrics=[keras.metrics.SparseCategoricalAccuracy("accuracy")],
                          jit_compile=config.jit_compile and config.strategy == "default")
        val = _episodes((splits.x_val, splits.y_val), train, config.num_queries,
                        config.num_candidates, seed=10_000 + config.seed,
                        num_steps=config.num_val_episodes).cache()

        def untrained():
            return {"untrained_test_knn_accuracy": plain_knn_accuracy(model, splits, config.k)}

        fit = training.fit_resumable(
            model, lambda step: _episodes(train, train, config.num_queries,
                                          config.num_candidates, config.seed, step),
            val, epochs=config.epochs, steps_per_epoch=config.steps_per_epoch,
            output_dir=config.output_dir, monitor="val_loss", mode="min", writer=chief,
            stop_after_epochs=config.stop_after_epochs, verbose=config.verbose,
            on_fresh_start=untrained)
        results = {"task": "knn", "flags": dataclasses.asdict(config),
                   "machine": training.machine_info(), "finished": fit.finished,
                   "epochs_completed": fit.epochs_completed, "best_epoch": fit.best_epoch,
                   "history": fit.history, "num_train": len(splits.y_train),
                   "num_test": len(splits.y_test),
                   "train_steps": fit.epochs_completed * config.steps_per_epoch,
                   "train_seconds_all_sessions": float(sum(fit.history.get("epoch_seconds",
                                                                           [])))}
        if fit.finished:
            model.load_weights(fit.best_path)
            acc = plain_knn_accuracy(model, splits, config.k)
            results["metrics"] = {"test_knn_accuracy": acc, "best_val_loss": fit.best_value,
                                  **fit.extra}
            results["wall_time_s"] = time.time() - wall  # this session, evaluation included
            if chief:
                training.write_json(os.path.join(config.output_dir, "results.json"), results)
            print(f"kNN {config.method}{' (stochastic)' if config.stochastic else ''} k={config.k}"
                  f" on {config.dataset}: test accuracy of plain kNN on the embeddings {acc:.4f} "
                  f"(untrained {fit.extra.get('untrained_test_knn_accuracy', float('nan')):.4f})")
        else:
            results["wall_time_s"] = time.time() - wall
    return results

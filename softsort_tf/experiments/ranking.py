"""Learning to rank on a synthetic task: our listwise losses against a pointwise MSE.

No public learning-to-rank data set is used: the task is synthetic (`make_queries`).
Each query holds a variable number of documents (5–200 by default, uniform); each
document has `num_features` Gaussian features. A hidden scorer, a fixed random
two-layer network plus a per-query offset (query difficulty), gives each document a
true score; relevance grades 0–4 are that score plus Gaussian noise, cut at global
thresholds so that most documents are irrelevant (grade 0), as in web-search data.
Batches of queries are padded to their longest list (label −1 = padding, the
convention of `softsort_tf.losses.ranking`), so the model sees a new list length at
almost every step.

Every variant trains the same per-document scorer (an MLP `[batch, n, d] → [batch, n]`)
with one loss:

- `mse`: pointwise mean squared error between scores and grades over the valid
  documents (the baseline);
- `soft_ndcg_<method>`: `ss.SoftNDCGLoss(method)` for method sinkhorn, softsort,
  neuralsort;
- `listwise_<method>`: `ss.ListwisePermutationLoss(method)` for neuralsort, softsort;
- `spearman`: `ss.SpearmanLoss(negative_labels_are_padding=True)`.

Every loss takes the batches as they come, padded to the batch's longest list: the
operators work with a list length unknown when the step is traced (one trace for all
lengths) and give padded documents no mass.

Validation queries choose nothing but are logged each epoch (NDCG@10, MRR); the test
NDCG@10 and MRR reported in `results.csv` are those of the last epoch's weights on
held-out test queries (drawn from the same distribution, never seen in training).
`results.csv` also holds two references on the test queries: the hidden scorer itself
(noise-free scores; the grades are noisy, so it is not 1) and a random order.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

import softsort_tf as ss
from softsort_tf.experiments import training

__all__ = ["LOSSES", "Queries", "RankingConfig", "build_scorer", "make_queries", "run",
           "user_item_lists"]

LOSSES = ("mse", "soft_ndcg_sinkhorn", "soft_ndcg_softsort", "soft_ndcg_neuralsort",
          "listwise_neuralsort", "listwise_softsort", "spearman")
# Cumulative share of documents below grades 1, 2, 3, 4.
GRADE_QUANTILES = (0.6, 0.8, 0.92, 0.98)
EVAL_BATCH_SIZE = 64


@dataclasses.dataclass
class RankingConfig(training.RunConfig):
    """Everything a ranking run depends on (the binary's flags)."""

    losses: tuple = ("mse", "soft_ndcg_sinkhorn", "soft_ndcg_neuralsort",
                     "listwise_neuralsort")
    num_features: int = 16
    num_train_queries: int = 2000
    num_val_queries: int = 200
    num_test_queries: int = 500
    min_list_size: int = 5
    max_list_size: int = 200
    label_noise: float = 0.5
    tau: float | None = None
    epsilon: float | None = None
    seed: int = 0
    steps_per_epoch: int | None = None
    batch_size: int = 16
    # This binary's defaults of `RunConfig` fields.
    output_dir: str = "/tmp/softsort_tf_ranking"
    learning_rate: float = 1e-3

    def finalize(self) -> RankingConfig:
        """Validates the fields (a `ValueError` names the field); returns self."""
        self.losses = tuple(self.losses)
        if not self.losses:
            raise ValueError(f"losses must name at least one of {LOSSES}.")
        self.check(losses=LOSSES)
        if not 1 <= self.min_list_size <= self.max_list_size:
            raise ValueError(f"min_list_size and max_list_size must satisfy 1 <= "
                             f"min_list_size <= max_list_size, got {self.min_list_size}, "
                             f"{self.max_list_size}.")
        if not self.label_noise >= 0:
            raise ValueError(f"label_noise must be >= 0, got {self.label_noise}.")
        return self

    def steps(self) -> int:
        return self.steps_per_epoch or -(-self.num_train_queries // self.batch_size)


# ---------------------------------------------------------------------------------
# The synthetic task.
# ---------------------------------------------------------------------------------
@dataclasses.dataclass
class Queries:
    """Queries as ragged lists: `features` `[Q, (n), d]`, `labels` and `true_scores`
    `[Q, (n)]` (`tf.RaggedTensor`)."""

    features: tf.RaggedTensor
    labels: tf.RaggedTensor
    true_scores: tf.RaggedTensor


class _HiddenScorer:
    """A fixed random two-layer network, the task's notion of relevance."""

    def __init__(self, num_features: int, rng: np.random.Generator):
        self.w1 = rng.normal(size=(num_features, 32)) / np.sqrt(num_features)
        self.w2 = rng.normal(size=32) / np.sqrt(32)
        self.linear = rng.normal(size=num_features) / np.sqrt(num_features)

    def __call__(self, x):
        return x @ self.linear + np.tanh(x @ self.w1) @ self.w2


def make_queries(num_queries: int, config: RankingConfig, seed: int,
                 thresholds: np.ndarray | None = None) -> tuple[Queries, np.ndarray]:
    """Draws `num_queries` queries (see the module docstring).

    The hidden scorer depends on `config.seed` only (the same task for the train,
    validation and test queries); `seed` draws the queries.

    Returns:
      `(queries, thresholds)`: the grade thresholds are the `GRADE_QUANTILES` of the
      noisy scores of these queries unless given (pass the training ones to the others).
    """
    scorer = _HiddenScorer(config.num_features, np.random.default_rng([config.seed, 7]))
    rng = np.random.default_rng([config.seed, seed])
    lengths = rng.integers(config.min_list_size, config.max_list_size + 1, size=num_queries)
    feats = rng.normal(size=(int(lengths.sum()), config.num_features))
    offsets = np.repeat(rng.normal(scale=0.5, size=num_queries), lengths)
    true = scorer(feats) + offsets
    noisy = true + rng.normal(scale=config.label_noise, size=true.shape)
    if thresholds is None:
        thresholds = np.quantile(noisy, GRADE_QUANTILES)
    labels = np.searchsorted(thresholds, noisy).astype(np.float32)
    splits = np.concatenate([[0], np.cumsum(lengths)])

    def ragged(values):
        return tf.RaggedTensor.from_row_splits(values.astype(np.float32), splits)

    return Queries(ragged(feats), ragged(labels), ragged(true)), thresholds


def _dense(t):
    """One row of a ragged dataset (a rank-0-ragged tensor) as a dense tensor."""
    return t.to_tensor() if isinstance(t, tf.RaggedTensor) else t


def padded_batches(queries: Queries, batch_size: int, *, shuffle_seed: int | None = None,
                   start_step: int = 0, pad_to: int | None = None) -> tf.data.Dataset:
    """`(features [b, n, d], labels [b, n])` batches, padded to the batch's longest list
    (or to `pad_to`) with features 0 and label −1. With `shuffle_seed`: shuffled each
    epoch, repeated forever, from batch `start_step` on."""
    ds = tf.data.Dataset.from_tensor_slices((queries.features, queries.labels)).map(
        lambda f, y: (_dense(f), _dense(y)))
    if shuffle_seed is not None:
        ds = ds.shuffle(int(queries.labels.nrows()), seed=shuffle_seed,
                        reshuffle_each_iteration=True).repeat()
    d = queries.features.shape[-1]
    shapes = ([pad_to, d], [pad_to]) if pad_to else ([None, d], [None])
    ds = ds.padded_batch(batch_size, padded_shapes=shapes, padding_values=(0.0, -1.0))
    if start_step:
        ds = ds.skip(start_step)
    return ds.prefetch(2)


# ---------------------------------------------------------------------------------
# Model and losses.
# ---------------------------------------------------------------------------------
def build_scorer(num_features: int) -> keras.Model:
    """Per-document MLP: features `[batch, n, d]` (any n) → scores `[batch, n]`."""
    inputs = keras.Input((None, num_features))
    h = keras.layers.Dense(64, activation="relu")(inputs)
    h = keras.layers.Dense(32, activation="relu")(h)
    scores = keras.layers.Reshape((-1,))(keras.layers.Dense(1)(h))
    return keras.Model(inputs, scores, name="document_scorer")


@keras.saving.register_keras_serializable(package="softsort_tf")
def masked_mse(y_true, y_pred):
    """Pointwise mean squared error over the valid documents of each list (label ≥ 0)."""
    scores = tf.convert_to_tensor(y_pred)
    labels = tf.cast(y_true, scores.dtype)
    w = tf.cast(labels >= 0, scores.dtype)
    return tf.reduce_sum(w * tf.square(scores - labels), axis=-1) / tf.maximum(
        tf.reduce_sum(w, axis=-1), 1.0)


def make_loss(name: str, config: RankingConfig):
    if name == "mse":
        return masked_mse
    if name == "spearman":
        return ss.SpearmanLoss(negative_labels_are_padding=True,
                            **({} if config.epsilon is None else {"epsilon": config.epsilon}))
    kind, method = name.rsplit("_", 1)
    # The family's temperature: ε for a family whose temperature is ε, τ otherwise.
    temperature = {"epsilon": config.epsilon}.get(ss.get_family(method).temperature,
                                                  config.tau)
    if kind == "soft_ndcg":
        return ss.SoftNDCGLoss(method=method, temperature=temperature)
    return ss.ListwisePermutationLoss(method=method, temperature=temperature)


def _metrics():
    return [ss.NDCGMetric(k=10, name="ndcg_at_10"), ss.MRRMetric(name="mrr")]


def evaluate_scores(queries: Queries, scores) -> dict:
    """NDCG@10 and MRR of given per-document scores (ragged `[Q, (n)]`)."""
    values, weights = ss.ndcg(queries.labels, scores, k=10)
    rr, rr_weights = ss.reciprocal_rank(queries.labels, scores)
    return {"ndcg_at_10": float(tf.reduce_sum(values * weights) / tf.reduce_sum(weights)),
            "mrr": float(tf.reduce_sum(rr * rr_weights) / tf.reduce_sum(rr_weights))}


# ---------------------------------------------------------------------------------
# The run.
# ---------------------------------------------------------------------------------
def _run_one(config: RankingConfig, data: dict, name: str,
             strategy: tf.distribute.Strategy) -> dict:
    out = os.path.join(config.output_dir, name)
    done_path = os.path.join(out, "results.json")
    if os.path.exists(done_path):
        with open(done_path) as f:
            return json.load(f)
    keras.backend.clear_session()
    keras.utils.set_random_seed(config.seed)
    with training.output_directory(out):
        with strategy.scope():
            model = build_scorer(config.num_features)
            model.compile(keras.optimizers.Adam(config.learning_rate),
                          loss=make_loss(name, config), metrics=_metrics())
        val = padded_batches(data["val"], EVAL_BATCH_SIZE)
        test = padded_batches(data["test"], EVAL_BATCH_SIZE)
        start = time.time()
        fit = training.fit_resumable(
            model, lambda step: padded_batches(data["train"], config.batch_size,
                                               shuffle_seed=config.seed, start_step=step),
            val, epochs=config.epochs, steps_per_epoch=config.steps(), output_dir=out,
            monitor="val_ndcg_at_10", mode="max", writer=training.is_chief(strategy),
            stop_after_epochs=config.stop_after_epochs, verbose=config.verbose,
            on_fresh_start=lambda: {"untrained_test": model.evaluate(
                test, verbose=0, return_dict=True)})
        result = {"loss": name, "finished": fit.finished,
                  "epochs_completed": fit.epochs_completed,
                  "steps_per_epoch": config.steps(),
                  "val_ndcg_at_10_curve": fit.history.get("val_ndcg_at_10", []),
                  "train_seconds_all_sessions": float(sum(fit.history.get("epoch_seconds",
                                                                          []))),
                  "session_seconds": time.time() - start,
                  "untrained_test_ndcg_at_10": fit.extra.get("untrained_test", {}).get(
                      "ndcg_at_10")}
        if fit.finished:
            logs = model.evaluate(test, verbose=0, return_dict=True)
            result.update(test_ndcg_at_10=float(logs["ndcg_at_10"]),
                          test_mrr=float(logs["mrr"]))
            if training.is_chief(strategy):
                training.write_json(done_path, result)
    return result


def run(config: RankingConfig) -> dict:
    """Trains every loss of `config.losses` and writes `results.csv` and `summary.json`
    once all of them are finished (an interrupted run writes neither; rerun to resume).

    Returns:
      The summary: `finished`, one result per loss (test NDCG@10, MRR, seconds) and the
      references.
    """
    config.finalize()
    strategy = training.prepare_runtime(config)
    train, thresholds = make_queries(config.num_train_queries, config, seed=1)
    val, _ = make_queries(config.num_val_queries, config, seed=2, thresholds=thresholds)
    test, _ = make_queries(config.num_test_queries, config, seed=3, thresholds=thresholds)
    data = {"train": train, "val": val, "test": test}
    with training.output_directory(config.output_dir):
        results = {name: _run_one(config, data, name, strategy) for name in config.losses}
        if not all(r["finished"] for r in results.values()):
            return {"finished": False, "results": results, "references": {}}
        rng = np.random.default_rng([config.seed, 4])
        random_scores = tf.ragged.map_flat_values(
            lambda v: tf.constant(rng.permutation(int(v.shape[0])), tf.float32),
            test.labels)
        references = {"hidden_scorer": evaluate_scores(test, test.true_scores),
                      "random_order": evaluate_scores(test, random_scores)}
        rows = [[name, r.get("test_ndcg_at_10"), r.get("test_mrr"),
                 r.get("untrained_test_ndcg_at_10"), r["epochs_completed"],
                 round(r["train_seconds_all_sessions"], 1)] for name, r in results.items()]
        rows += [[f"({name})", ref["ndcg_at_10"], ref["mrr"], None, None, None]
                 for name, ref in references.items()]
        with open(os.path.join(config.output_dir, "results.csv"), "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["loss", "test_ndcg_at_10", "test_mrr",
                             "untrained_test_ndcg_at_10", "epochs", "train_seconds"])
            writer.writerows(rows)
        summary = {"finished": True, "results": results, "references": references,
                   "config": dataclasses.asdict(config), "machine": training.machine_info(),
                   "num_documents": {k: int(tf.size(q.labels.flat_values))
                                     for k, q in data.items()}}
        training.write_json(os.path.join(config.output_dir, "summary.json"), summary)
    return summary


def user_item_lists(seed: int, users: int = 300, items: int = 600, rated: int = 100,
                    dim: int = 8, train_lists: int = 50, test_lists: int = 5, n: int = 5,
                    noise: float = 1.0,
                    probs: tuple[float, ...] = (0.4, 0.25, 0.18, 0.11, 0.06)):
    """Synthetic listwise ratings in the shape of Keras-RS's listwise example.

    Users and items have latent vectors; a grade is the quantile bin (probabilities
    `probs`) of u·v + noise, so relevance is personal (no item is good for everyone) and
    `probs[0]` of the labels are 0. Each user's `rated` items are split 80/20 into the
    items of its training and test lists (lists of `n` distinct items).

    Returns:
      `((user, item, grades), (user, item, grades))` for training and test: `[lists]`
      int32 users, `[lists, n]` int32 items and float32 grades.
    """
    rng = np.random.default_rng(seed)
    u_vec = rng.normal(size=(users, dim)) / np.sqrt(dim)
    i_vec = rng.normal(size=(items, dim))
    z = u_vec @ i_vec.T + noise * rng.normal(size=(users, items))
    grades = np.searchsorted(np.quantile(z, np.cumsum(probs)[:-1]), z).astype(np.float32)
    cut = int(0.8 * rated)
    pools = [rng.choice(items, rated, replace=False) for _ in range(users)]

    def lists(per_user, part):
        user = np.repeat(np.arange(users), per_user).astype(np.int32)
        item = np.stack([rng.choice(pools[u][:cut] if part == 0 else pools[u][cut:], n,
                                    replace=False) for u in user]).astype(np.int32)
        return user, item, grades[user[:, None], item]

    return lists(train_lists, 0), lists(test_lists, 1)

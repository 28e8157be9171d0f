"""The two large-MNIST experiments (sorting, median regression) behind the binaries.

`run(config)` does a whole run: data, strategy, model, resumable training, best
checkpoint, test metrics next to the untrained model's, and `results.json`. The
binaries `scripts/train_sort.py` and `scripts/train_median.py` only turn the shared
flags (`softsort_tf.experiments.flags`) into an `ExperimentConfig`; `scripts/demo.py`
calls `run` directly.

Defaults follow the published protocol (NeuralSort, Grover et al. 2019, App. D.1; the
SoftSort paper, Prillo & Eisenschlos 2020, App. A.1-A.2):
- sorting: Adam lr 0.005, batch 20 sequences, 100 epochs of 55000 / (4 · 20) = 687 steps;
  one `temperature` whose default follows the family's units
  (`default_temperature`): τ = 1024 for n ≤ 7 and 128 above on the raw CNN scores for
  the families whose temperature is in the units of the scores (the SoftSort paper's
  setting for SoftSort and NeuralSort; LapSum's α likewise), its inverse 1/1024 or 1/128
  for a steepness (sorting networks); a family that normalises the scores itself runs on
  the raw scores (`default_settings`: Sinkhorn without its squash) at ε = 100
  (`RAW_SCORES_TEMPERATURE`; docs/RESULTS.md, "What separates Sinkhorn from SoftSort"),
  or, with its normalisation on (`method_kwargs`), at Cuturi et al.'s ε = 0.005;
- median: Adam lr 0.001, batch 5 sequences, 100 epochs of 55000 / (4 · 5) = 2750 steps;
  τ by the same rule (the paper's grid-searched values are not available to us);
- best epoch on validation exact accuracy (sorting) or validation MSE (median);
  test metrics on hard (row-wise argmax) permutations.

Faster schedules (issue 14, docs/RESULTS.md "time to accuracy"): `precision=
'mixed_bfloat16'` runs the CNN in bfloat16 (scores, operator and loss stay float32),
`lr_schedule='cosine'` with `warmup_steps` decays the learning rate to 0 over the run's
`epochs × steps_per_epoch` steps, `patience` stops when validation stops improving,
`max_train_minutes` bounds the training time and `save_every_epoch` keeps each epoch's
weights for an accuracy-vs-wall-time curve (`scripts/time_to_accuracy.py`). The
defaults keep the published protocol (float32, constant learning rate, all epochs).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

import softsort_tf
from softsort_tf.datasets import large_mnist
from softsort_tf.experiments import models, training

__all__ = ["TASKS", "ExperimentConfig", "build_model", "dataset_error", "default_settings",
           "default_tau", "default_temperature", "evaluate", "make_datasets",
           "method_settings", "n_error", "objective", "prepare_runtime", "run",
           "settings_text"]

TASKS = ("sort", "median")
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
LR_SCHEDULES = ("constant", "cosine")
NUM_TRAIN_DIGITS = 55000
VALUE_SCALE = 1e-4  # median values in [0, 9999] are regressed as value · 1e-4 in [0, 1)
EVAL_BATCH_SIZE = 100


# ε of Cuturi et al. on the large-MNIST task: the default of a temperature that does not
# depend on the scale of the CNN scores.
NORMALIZED_TEMPERATURE = 5e-3
# The default temperature of a family that normalises the scores, run on the raw CNN
# scores instead (`Family.raw_scores_settings`): Sinkhorn at ε = 100 starts soft and is
# hardened by the CNN's growing scale, as SoftSort at τ = 1024; with the squash, P̂ is
# hard from the first step (docs/RESULTS.md, "What separates Sinkhorn from SoftSort").
RAW_SCORES_TEMPERATURE = 100.0


def default_tau(n: int) -> float:
    """τ of the SoftSort paper on raw CNN scores: 1024 for n ≤ 7, else 128."""
    return 1024.0 if n <= 7 else 128.0


def default_settings(method: str) -> dict:
    """The binaries' default settings of `method`: its `raw_scores_settings` (a family
    that normalises the scores applied to the raw CNN scores), else none.

    Example:
    >>> default_settings("sinkhorn"), default_settings("softsort")
    ({'squash': None}, {})
    """
    return dict(softsort_tf.get_family(method).raw_scores_settings or {})


def method_settings(method: str, method_kwargs: str | dict | None) -> dict:
    """The settings of a run of `method`: `method_kwargs` (checked by
    `models.parse_method_kwargs`) merged over `default_settings(method)`.

    Example:
    >>> method_settings("sinkhorn", '{"targets": "centres"}')
    {'squash': None, 'targets': 'centres'}
    """
    return {**default_settings(method), **models.parse_method_kwargs(method, method_kwargs)}


def settings_text(settings: dict) -> str | None:
    """`settings` as the JSON text of a config's `method_kwargs` (None when empty)."""
    return json.dumps(settings) if settings else None


def default_temperature(method: str, n: int, settings: dict | None = None) -> float:
    """The binaries' default temperature of `method` with its `settings` (None: its
    `default_settings`) for sequences of n numbers: `default_tau(n)` in the units of the
    raw CNN scores, scaled by the family's `temperature_units` (1/τ for a steepness);
    `RAW_SCORES_TEMPERATURE` for a normalising family on the raw scores, else
    `NORMALIZED_TEMPERATURE` for a temperature independent of the scores' scale.

    Example:
    >>> default_temperature("softsort", 3), default_temperature("sinkhorn", 3)
    (1024.0, 100.0)
    >>> default_temperature("sinkhorn", 3, {"squash": "logistic"})
    0.005
    """
    family = softsort_tf.get_family(method)
    settings = default_settings(method) if settings is None else settings
    if family.on_raw_scores(settings):
        return RAW_SCORES_TEMPERATURE
    return family.temperature_for_scale(default_tau(n), NORMALIZED_TEMPERATURE)


@dataclasses.dataclass
class ExperimentConfig(training.RunConfig):
    """Everything a run depends on (the binaries' flags).

    `None` budget / hyper-parameter fields take the task's published default (module
    docstring); `finalize()` fills them in.
    """

    task: str = "sort"
    method: str = "softsort"
    stochastic: bool = False
    num_samples: int = 5
    n: int = 5
    temperature: float | None = None
    method_kwargs: str | None = None
    log_cross_entropy: bool = True
    batch_size: int | None = None
    steps_per_epoch: int | None = None
    seed: int = 0
    eval_seed: int = 1
    dataset: str = "embedded"
    mnist_npz: str | None = None
    digits_per_class: int | None = None
    num_val_sequences: int = 1000
    num_test_sequences: int = 10000
    precision: str = "float32"
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    patience: int | None = None
    max_train_minutes: float | None = None
    save_every_epoch: bool = False
    jit_compile: bool = False
    # This binary's defaults of `RunConfig` fields.
    epochs: int = 100
    deterministic_ops: bool = True
    verbose: int | str = "auto"

    def finalize(self) -> ExperimentConfig:
        """Validates the config and fills in the task's defaults."""
        self.check(task=TASKS, method=models.permutation_methods(),
                   dataset=large_mnist.SOURCES,
                   precision=PRECISIONS, lr_schedule=LR_SCHEDULES)
        for error in (n_error(self.task, self.n), dataset_error(self.dataset, self.mnist_npz)):
            if error:
                raise ValueError(error)
        sort = self.task == "sort"
        if self.batch_size is None:
            self.batch_size = 20 if sort else 5
        if self.learning_rate is None:
            self.learning_rate = 0.005 if sort else 0.001
        settings = method_settings(self.method, self.method_kwargs)  # a clear error now
        self.method_kwargs = settings_text(settings)
        if self.temperature is None:
            self.temperature = default_temperature(self.method, self.n, settings)
        if self.steps_per_epoch is None:
            self.steps_per_epoch = NUM_TRAIN_DIGITS // (large_mnist.DIGITS_PER_NUMBER
                                                        * self.batch_size)
        if self.warmup_steps >= self.epochs * self.steps_per_epoch:
            raise ValueError(f"warmup_steps must be < epochs * steps_per_epoch = "
                             f"{self.epochs * self.steps_per_epoch}, got {self.warmup_steps}.")
        return self


def n_error(task: str, n: int) -> str | None:
    """Why `n` numbers per sequence do not suit `task` (the median needs an odd n)."""
    if task == "median" and isinstance(n, int) and n % 2 == 0:
        return f"n must be odd for the median task, got {n}."
    return None


def dataset_error(dataset: str, mnist_npz: str | None) -> str | None:
    """Why the digit source `dataset` cannot be used with `mnist_npz`."""
    if dataset == "npz" and not mnist_npz:
        return "dataset='npz' needs mnist_npz (the path of an MNIST npz file)."
    return None


def _labels(batch: dict, task: str) -> tf.Tensor:
    if task == "sort":
        return batch["permutation"]
    median = tf.sort(batch["numbers"], axis=-1)[:, batch["numbers"].shape[-1] // 2]
    return tf.cast(median, tf.float32) * VALUE_SCALE


def _to_example(task: str, samples: int | None = None):
    """Maps a sampler batch to `(features, labels)`; labels get a `samples` axis (the
    Gumbel samples of a stochastic model in training) unless `samples` is None."""

    def fn(batch):
        labels = _labels(batch, task)
        if samples is not None:
            labels = tf.repeat(labels[:, None], samples, axis=1)
        return {"images": batch["images"], "step": batch["step"]}, labels

    return fn


def learning_rate_schedule(config: ExperimentConfig):
    """Adam's learning rate: the constant `learning_rate`, or (`lr_schedule='cosine'`) a
    linear warm-up from 0 over `warmup_steps` followed by a cosine decay to 0 at the last
    of the run's `epochs × steps_per_epoch` steps.

    The schedule is a function of the optimizer's step count, which `BackupAndRestore`
    restores: a resumed run continues the same schedule.
    """
    if config.lr_schedule == "constant":
        return config.learning_rate
    total = config.epochs * config.steps_per_epoch
    warmup = config.warmup_steps
    if warmup:
        return keras.optimizers.schedules.CosineDecay(
            0.0, decay_steps=total - warmup, warmup_target=config.learning_rate,
            warmup_steps=warmup)
    return keras.optimizers.schedules.CosineDecay(config.learning_rate, decay_steps=total)


def log_cross_entropy(config: ExperimentConfig) -> bool:
    """Whether the sorting loss is computed from log P̂ (`log_cross_entropy`, for the
    operators with a log-domain matrix; LapSum's P̂ goes through the probability floor)."""
    return (config.task == "sort" and config.log_cross_entropy
            and softsort_tf.get_family(config.method).log_domain)


def _compile(model: keras.Model, config: ExperimentConfig) -> None:
    optimizer = keras.optimizers.Adam(learning_rate_schedule(config))
    jit = config.jit_compile and config.strategy == "default"
    if config.task == "sort":
        # Labels are orderings `[batch, (S,) n]` (Keras casts them to float): say so.
        targets = "indices"
        loss = softsort_tf.PermutationCrossEntropy(y_true_format=targets,
                                                   from_log=log_cross_entropy(config))
        model.compile(optimizer, loss=loss,
                      metrics=[softsort_tf.ExactPermutationAccuracy(
                                   name="exact_accuracy", y_true_format=targets),
                               softsort_tf.ElementwisePermutationAccuracy(
                                   name="elementwise_accuracy", y_true_format=targets)],
                      jit_compile=jit)
    else:
        model.compile(optimizer, loss="mse", metrics=[keras.metrics.MeanSquaredError("mse")],
                      jit_compile=jit)


def evaluate(model: keras.Model, dataset: tf.data.Dataset, task: str) -> dict:
    """Test metrics: hard-permutation accuracies (sort) or MSE ×1e-4, R², Spearman (median).

    Sorting: `exact_accuracy` (all n positions right) and `elementwise_accuracy`
    (proportion of positions right) of the row-wise argmax of P̂, and the loss.
    Median: `mse` on values scaled to [0, 1) (value / 10⁴; reported ×1e-4 like the
    papers, so a constant predictor scores ≈ 356.8 at n = 5), `r2` = 1 − MSE / Var(true
    medians) and Spearman's rank correlation between predicted and true medians.

    Under a multi-worker strategy every worker evaluates the whole `dataset` and gets
    the metrics of one worker: sorting through `model.evaluate` (the metric states are
    summed over workers, `training.adapt_to_strategy`), the median from the
    predictions, which every worker computes for all sequences (its R² and Spearman
    need all of them).
    """
    if task == "sort":
        training.adapt_to_strategy(model)
        logs = model.evaluate(dataset, verbose=0, return_dict=True)
        return {"exact_accuracy": float(logs["exact_accuracy"]),
                "elementwise_accuracy": float(logs["elementwise_accuracy"]),
                "loss": float(logs["loss"])}
    preds, truth = [], []
    for features, labels in dataset:
        preds.append(np.asarray(model(features, training=False)))
        truth.append(labels.numpy())
    pred, true = np.concatenate(preds), np.concatenate(truth)
    mse = float(np.mean((pred - true) ** 2))
    return {"mse_1e-4": mse / VALUE_SCALE, "r2": 1.0 - mse / float(np.var(true)),
            "spearman": float(softsort_tf.spearman_correlation(true.astype(np.float64),
                                                               pred.astype(np.float64),
                                                               axis=0))}


prepare_runtime = training.prepare_runtime  # devices, seeds, determinism -> strategy


def objective(task: str) -> tuple[str, str]:
    """(monitored validation metric, 'max' or 'min') that picks the best epoch / trial."""
    return ("val_exact_accuracy", "max") if task == "sort" else ("val_mse", "min")


def make_datasets(config: ExperimentConfig):
    """(train_dataset(start_step), validation dataset, test dataset) of a finalised config.

    The training stream is endless and deterministic given `config.seed`; starting it at
    `start_step` gives the batches a resumed run would have seen. Validation and test
    sequences depend on `config.eval_seed` only, so runs and trials are compared on the
    same sequences. The batches are global batches of `config.batch_size` sequences:
    under a multi-worker strategy every worker builds the same stream and
    `training.fit_resumable` gives each worker its slice of every batch.
    """
    splits = large_mnist.load_digit_splits(config.dataset, config.mnist_npz,
                                           config.digits_per_class)
    train_samples = config.num_samples if config.stochastic else None

    def eval_dataset(split: str, sequences: int) -> tf.data.Dataset:
        batch = min(EVAL_BATCH_SIZE, sequences)
        seed = config.eval_seed * 2 + (split == "test")
        ds = large_mnist.make_dataset(splits.split(split), config.n, batch, seed,
                                      num_batches=-(-sequences // batch))
        return ds.map(_to_example(config.task))

    def train_dataset(start_step: int) -> tf.data.Dataset:
        ds = large_mnist.make_dataset(splits.train, config.n, config.batch_size, config.seed,
                                      start_step=start_step)
        return ds.map(_to_example(config.task, train_samples))

    return (train_dataset, eval_dataset("validation", config.num_val_sequences),
            eval_dataset("test", config.num_test_sequences))


def build_model(config: ExperimentConfig) -> keras.Model:
    """The task's model, built and compiled (call inside the strategy's scope)."""
    model_cls = models.PermutationLearner if config.task == "sort" else models.MedianRegressor
    model = model_cls(config.method, temperature=config.temperature,
                      stochastic=config.stochastic, num_samples=config.num_samples,
                      seed=config.seed, cnn_dtype=config.precision,
                      log=log_cross_entropy(config),
                      method_kwargs=models.parse_method_kwargs(config.method,
                                                               config.method_kwargs))
    model.build()
    _compile(model, config)
    return model


def run(config: ExperimentConfig) -> dict:
    """Runs (or resumes) one experiment; returns the results dict (also in results.json).

    When training stops early (`stop_after_epochs`) the results hold `"finished": False`
    and no test metrics, and no results.json is written. A run that fails before writing
    anything removes the output folder it created.
    """
    config = config.finalize()
    with training.output_directory(config.output_dir):
        return _run(config)


def _run(config: ExperimentConfig) -> dict:
    wall_start = time.time()
    strategy = prepare_runtime(config)
    chief = training.is_chief(strategy)
    num_workers = training.worker_index(strategy)[1]
    if config.batch_size % num_workers:
        raise ValueError(f"batch_size (the global batch) must be a multiple of the "
                         f"{num_workers} workers, got {config.batch_size}.")

    train_dataset, val_ds, test_ds = make_datasets(config)
    with strategy.scope():
        model = build_model(config)
    monitor, mode = objective(config.task)
    fit = training.fit_resumable(
        model, train_dataset, val_ds, epochs=config.epochs,
        steps_per_epoch=config.steps_per_epoch, output_dir=config.output_dir,
        monitor=monitor, mode=mode, writer=chief, stop_after_epochs=config.stop_after_epochs,
        verbose=config.verbose, patience=config.patience,
        max_train_seconds=(None if config.max_train_minutes is None
                           else 60.0 * config.max_train_minutes),
        save_every_epoch=config.save_every_epoch,
        on_fresh_start=lambda: {"untrained": evaluate(model, test_ds, config.task)})
    results = {
        "task": config.task,
        "flags": dataclasses.asdict(config),
        "machine": training.machine_info(),
        "finished": fit.finished,
        "stopped_early": fit.stopped_early,
        "resumed_from_epoch": fit.resumed_from_epoch,
        "epochs_completed": fit.epochs_completed,
        "best_epoch": fit.best_epoch,
        "history": fit.history,
        "train_seconds_this_session": fit.train_seconds,
        # Over all sessions of the run (epochs, validation included).
        "train_seconds_all_sessions": float(sum(fit.history.get("epoch_seconds", []))),
        "train_steps": fit.epochs_completed * config.steps_per_epoch,
    }
    if not fit.finished:
        results["wall_time_s"] = time.time() - wall_start
        return results
    if os.path.exists(fit.best_path):  # else no epoch had a finite validation metric
        model.load_weights(fit.best_path)
    trained = evaluate(model, test_ds, config.task)
    untrained = fit.extra.get("untrained", {})
    metrics = {f"test_{k}": v for k, v in trained.items()}
    metrics.update({f"untrained_test_{k}": v for k, v in untrained.items()})
    metrics[f"best_{monitor}"] = fit.best_value
    results["metrics"] = metrics
    results["test_sequences"] = _rounded(config.num_test_sequences)
    results["wall_time_s"] = time.time() - wall_start
    if chief:
        training.write_json(os.path.join(config.output_dir, "results.json"), results)
    _print_summary(config, trained, untrained)
    return results


def _rounded(sequences: int) -> int:
    """Sequences an evaluation set really holds (whole batches of `EVAL_BATCH_SIZE`)."""
    batch = min(EVAL_BATCH_SIZE, sequences)
    return -(-sequences // batch) * batch


def _print_summary(config: ExperimentConfig, trained: dict, untrained: dict) -> None:
    print(f"\n{config.task} / {config.method}{' (stochastic)' if config.stochastic else ''}"
          f", n={config.n}, dataset={config.dataset}: test metrics")
    print(f"  {'metric':<22}{'untrained':>12}{'trained':>12}")
    for key, value in trained.items():
        before = untrained.get(key, float("nan"))
        print(f"  {key:<22}{before:>12.4f}{value:>12.4f}")
    print(f"Results: {os.path.join(config.output_dir, 'results.json')}")

"""Training infrastructure shared by the experiment binaries: strategies, resumable fits.

`fit_resumable` is `keras.Model.fit` with Keras' own callbacks doing the bookkeeping:
- `BackupAndRestore`: the model and optimizer after every epoch; a run that is killed
  and restarted with the same `output_dir` continues after its last finished epoch
  (the data streams are keyed by step, so it also sees the same batches);
- `ModelCheckpoint`: the weights of the best epoch on a validation metric (its best
  value so far carried over a restart);
- `CSVLogger`: the per-epoch logs of all sessions, epoch times included;
- `TensorBoard` logs and Keras' progress bar.

`output_directory` creates a run's folder and removes it again if the run fails before
writing anything; `write_json` writes results atomically.

Multi-worker training (`make_strategy('multi_worker')`, `tf.distribute.
MultiWorkerMirroredStrategy`, cluster from `TF_CONFIG`), as `fit_resumable` runs it:
- data: every worker builds the same stream of *global* batches and keeps its own
  contiguous slice of each (`split_batches`: worker i of W takes rows
  [i·B/W, (i+1)·B/W) of a batch of B), so W workers step on exactly the batches one
  worker would, and `batch_size` always means the global batch;
- gradients: Keras averages the per-replica losses (each the reduction over the
  replica's own slice), so a loss that is a mean over examples or lists steps as on
  one worker; a batch statistic (the trimmed / least-quantile regression losses) is
  taken over each replica's slice and averaged over replicas;
- evaluation: every worker evaluates the whole validation / test set and Keras sums
  the metric states over the workers, so the metrics are those of one worker; the
  results are written by the chief (worker 0) only;
- `distribute_batches` hands the replicas their data itself
  (`distribute_datasets_from_function`): `tf.distribute` neither shards nor rebatches;
- checkpoints: every worker backs up its state after each epoch, the chief in
  `output_dir/backup`, worker i > 0 in `output_dir/worker-i/backup` (on one machine or
  a shared file system the folders do not collide); a restarted cluster resumes, on
  every worker, after the last epoch all workers backed up;
- Keras 3's `fit` / `evaluate` do not run under a multi-worker strategy as they are;
  `adapt_to_strategy` makes them run (it is applied by `fit_resumable`, and is what
  a user's own model needs).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import importlib.util
import json
import math
import os
import platform
import shutil
import socket
import time
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from softsort_tf.experiments import checks

__all__ = ["STRATEGIES", "EpochTimer", "FitResult", "PatienceStop", "RunConfig",
           "StopAfterEpochs", "TimeBudgetStop", "adapt_to_strategy", "best_epoch",
           "build_training_state", "distribute_batches", "fit_resumable", "is_chief",
           "is_multi_worker", "machine_info", "make_strategy", "output_directory",
           "prepare_runtime", "read_history", "set_cpu_devices", "should_stop_early",
           "split_batches", "worker_index", "write_json"]

STRATEGIES = ("default", "mirrored", "multi_worker")


@dataclasses.dataclass
class RunConfig:
    """The settings of a training run that every training binary has (the flags of
    `flags.define_run_flags`); a binary's config adds its own fields and may change
    these defaults."""

    output_dir: str = "/tmp/softsort_tf_run"
    epochs: int = 10
    learning_rate: float | None = None
    strategy: str = "default"
    num_cpu_devices: int = 0
    deterministic_ops: bool = False
    stop_after_epochs: int | None = None
    verbose: int | str = 2

    def check(self, **choices: tuple) -> None:
        """Raises a `ValueError` naming the first field that is not allowed: `strategy`
        and the fields of `choices` (name=allowed values) outside their values, or a
        field `checks.setting_error` rejects."""
        checks.check_config(self, strategy=STRATEGIES, **choices)


def set_cpu_devices(count: int) -> None:
    """Splits the CPU into `count` logical devices (to try `mirrored` without GPUs).

    Must run before TensorFlow initialises its devices.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])


_MULTI_WORKER: dict = {}


def make_strategy(name: str) -> tf.distribute.Strategy:
    """`'default'` (one device), `'mirrored'` (all local GPUs, else all logical CPUs) or
    `'multi_worker'` (`MultiWorkerMirroredStrategy`, cluster from `TF_CONFIG`; created
    once per process, later calls return the same strategy)."""
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker":
        # Collective ops are configured once per process: one strategy per process.
        if _MULTI_WORKER.get("strategy") is None:
            _MULTI_WORKER["strategy"] = tf.distribute.MultiWorkerMirroredStrategy()
        return _MULTI_WORKER["strategy"]
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r}.")


def prepare_runtime(config) -> tf.distribute.Strategy:
    """Devices, seeds and op determinism of a run; returns its strategy.

    Args:
      config: a `RunConfig`; its `seed`, if it has one, seeds Python, numpy and
        TensorFlow.
    """
    if config.num_cpu_devices:
        set_cpu_devices(config.num_cpu_devices)
    if getattr(config, "seed", None) is not None:
        keras.utils.set_random_seed(config.seed)
    if config.deterministic_ops:
        tf.config.experimental.enable_op_determinism()
    return make_strategy(config.strategy)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes checkpoints and results (always, except on the
    non-chief workers of a multi-worker cluster)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (
        resolver.task_type == "worker" and resolver.task_id == 0
        and "chief" not in resolver.cluster_spec().as_dict())


def is_multi_worker(strategy: tf.distribute.Strategy | None) -> bool:
    """Whether `strategy` is a `MultiWorkerMirroredStrategy` over more than one worker."""
    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and strategy.extended._in_multi_worker_mode())  # no public accessor


def worker_index(strategy: tf.distribute.Strategy | None) -> tuple[int, int]:
    """`(index, num_workers)` of this process in its cluster: `(0, 1)` unless
    `strategy` is multi-worker; the chief (or worker 0 when there is no chief) is 0,
    then the workers in order (the input pipeline order of `tf.distribute`)."""
    if not is_multi_worker(strategy):
        return 0, 1
    resolver = strategy.cluster_resolver
    cluster = resolver.cluster_spec().as_dict()
    chiefs = len(cluster.get("chief", []))
    num_workers = chiefs + len(cluster.get("worker", []))
    if resolver.task_type == "chief":
        return 0, num_workers
    return chiefs + int(resolver.task_id), num_workers


def _batch_slices(dataset: tf.data.Dataset, parts: int, first: int,
                  count: int) -> tf.data.Dataset:
    """Slices `first, ..., first + count - 1` of the `parts` slices of every batch, as
    consecutive elements (slice k: rows `[k·B // parts, (k+1)·B // parts)` of a batch of
    B rows, every component sliced along axis 0)."""

    def piece(batch, k):
        first_leaf = tf.nest.flatten(batch)[0]
        rows = (first_leaf.nrows() if isinstance(first_leaf, tf.RaggedTensor)
                else tf.shape(first_leaf, out_type=tf.int64)[0])
        k = tf.cast(k, tf.int64)
        start, stop = rows * k // parts, rows * (k + 1) // parts
        sliced = tf.nest.map_structure(lambda t: t[start:stop], batch)
        return sliced if len(sliced) > 1 else sliced[0]

    if count == 1:
        return dataset.map(lambda *batch: piece(batch, first))
    return dataset.flat_map(lambda *batch: tf.data.Dataset.range(first, first + count).map(
        lambda k: piece(batch, k)))


def split_batches(dataset: tf.data.Dataset, num_workers: int, index: int) -> tf.data.Dataset:
    """Worker `index`'s share of every batch of `dataset`: how the workers split a
    global batch.

    Every worker builds the same stream of global batches; worker i of W keeps rows
    `[i·B // W, (i+1)·B // W)` of each batch of B rows (every component of the batch
    sliced along axis 0), so together the workers step on each global batch exactly
    once. The stream must be the same on every worker (deterministic, e.g. seeded
    shuffles), and W should divide B for every worker to weigh equally.

    Args:
      dataset: batches whose every component has the batch axis first (dense or ragged).
      num_workers: W ≥ 1.
      index: this worker's index in [0, W).

    Returns:
      The dataset of slices (`dataset` itself when W = 1).

    Example:
    >>> ds = tf.data.Dataset.range(8).batch(4)
    >>> [b.numpy().tolist() for b in split_batches(ds, 2, 1)]
    [[2, 3], [6, 7]]
    """
    if int(num_workers) != num_workers or num_workers < 1:
        raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}.")
    if int(index) != index or not 0 <= index < num_workers:
        raise ValueError(f"index must be an int in [0, {num_workers}), got {index!r}.")
    if num_workers == 1:
        return dataset
    return _batch_slices(dataset, int(num_workers), int(index), 1)


def distribute_batches(strategy: tf.distribute.Strategy, dataset: tf.data.Dataset, *,
                       split: bool) -> tf.distribute.DistributedDataset:
    """`dataset` of global batches distributed over the replicas of `strategy`, with
    no automatic sharding or rebatching by `tf.distribute`.

    Args:
      strategy: the strategy (W workers of R replicas each).
      dataset: the same stream of batches on every worker.
      split: True (training): replica r = i·R + j (worker i, local replica j) gets
        slice r of the W·R slices of every batch (`split_batches` with W·R parts), so
        one step of the cluster consumes one global batch. False (evaluation): every
        worker reads all of `dataset`, its R replicas splitting each batch; the metric
        states, summed over workers, then give the metrics of one worker.
    """

    def per_worker(context: tf.distribute.InputContext) -> tf.data.Dataset:
        workers = context.num_input_pipelines
        replicas = context.num_replicas_in_sync // workers
        if split:
            return _batch_slices(dataset, workers * replicas,
                                 context.input_pipeline_id * replicas, replicas)
        return dataset if replicas == 1 else _batch_slices(dataset, replicas, 0, replicas)

    return strategy.distribute_datasets_from_function(per_worker)


def adapt_to_strategy(model: keras.Model) -> keras.Model:
    """Makes Keras 3's `fit` / `evaluate` of `model` run under a multi-worker strategy.

    The model must have been created (and compiled) in the scope of a
    `tf.distribute.MultiWorkerMirroredStrategy` with several workers; under any other
    strategy the model is returned unchanged. With Keras 3.15 / TF 2.21, `fit` and
    `evaluate` fail there before the first step (reducing the first distributed batch
    over workers to build the model, and averaging the step's scalar logs over axis 0).
    This sets, on `model` only:
    - the first-batch build to use this worker's local batch;
    - `train_step` / `test_step` to return their logs with a leading axis of 1, which
      Keras' average over workers then removes;
    - `fit` to take a `tf.data.Dataset` `x` of global batches (as on one worker) and
      give each replica its slice of every batch, and `fit(validation_data=)` and
      `evaluate` to have every worker evaluate the whole `tf.data.Dataset` (the metric
      states are summed over workers: the metrics of one worker). See
      `distribute_batches`.

    Call it once, after `compile` and before the first `fit` / `evaluate`; give `fit`
    and `evaluate` `tf.data.Dataset`s that are the same on every worker.

    Example (on every worker of the cluster of `TF_CONFIG`):

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            model.compile("sgd", loss=ss.SoftTrimmedRegressionLoss(0.0, 0.8))
        adapt_to_strategy(model).fit(global_batches, epochs=2, steps_per_epoch=10)

    Returns:
      `model`.
    """
    strategy = model.distribute_strategy
    if not is_multi_worker(strategy) or getattr(model, "_softsort_adapted", False):
        return model

    def local(value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    def symbolic_build(iterator=None, data_batch=None):
        if iterator is not None:
            # Keras' epoch iterator yields (step, batches) in Keras 3.10 and (first step,
            # last step, batches) in newer ones (3.15): the batches come last.
            for *_, batches in iterator:
                data_batch = tf.nest.map_structure(local, next(batches))
                break
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    def with_leading_axis(step):
        def step_fn(data):
            return tf.nest.map_structure(lambda v: tf.expand_dims(v, 0), step(data))
        return step_fn

    fit, evaluate = model.fit, model.evaluate

    def fit_fn(x=None, *args, validation_data=None, **kwargs):
        if isinstance(x, tf.data.Dataset):
            x = distribute_batches(strategy, x, split=True)
        if isinstance(validation_data, tf.data.Dataset):
            validation_data = distribute_batches(strategy, validation_data, split=False)
        return fit(x, *args, validation_data=validation_data, **kwargs)

    def evaluate_fn(x=None, *args, **kwargs):
        if isinstance(x, tf.data.Dataset):
            x = distribute_batches(strategy, x, split=False)
        return evaluate(x, *args, **kwargs)

    model._maybe_symbolic_build = symbolic_build
    model.train_step = with_leading_axis(model.train_step)
    model.test_step = with_leading_axis(model.test_step)
    model.fit, model.evaluate = fit_fn, evaluate_fn
    model._softsort_adapted = True
    return model


def _all_workers_min(strategy: tf.distribute.Strategy, value: int) -> int:
    """The smallest of the workers' `value`s (a collective: every worker must call it)."""
    per_replica = strategy.run(lambda: tf.constant([value], tf.int64))
    return int(tf.reduce_min(strategy.gather(per_replica, axis=0)))


def machine_info() -> dict:
    """Host, OS, CPU count and TensorFlow / Keras versions and devices."""
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "devices": [d.name for d in tf.config.list_logical_devices()],
    }


def write_json(path: str, obj: dict) -> None:
    """Writes `obj` as JSON atomically (temporary file, then rename)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=_to_builtin)
    os.replace(tmp, path)


def _to_builtin(x):
    if isinstance(x, (np.generic, np.ndarray)):
        return x.tolist()
    return str(x)


@contextlib.contextmanager
def output_directory(path: str):
    """Creates the run folder `path`; removes it again if the run fails before writing a
    file in it (a folder that existed before is left alone).

    Example:
    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "run")
    >>> try:
    ...     with output_directory(path):
    ...         raise RuntimeError("no data")
    ... except RuntimeError:
    ...     pass
    >>> os.path.exists(path)
    False
    """
    created = not os.path.exists(path)
    os.makedirs(path, exist_ok=True)
    try:
        yield path
    except BaseException:
        if created and not any(files for _, _, files in os.walk(path)):
            shutil.rmtree(path, ignore_errors=True)
        raise


class EpochTimer(keras.callbacks.Callback):
    """Adds the epoch's wall time to the epoch logs as `epoch_seconds` (put it before
    the callbacks that should record it, e.g. `CSVLogger`)."""

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["epoch_seconds"] = time.time() - getattr(self, "_start", time.time())


class StopAfterEpochs(keras.callbacks.Callback):
    """Stops training (as an interruption would) once `epochs` epochs are completed."""

    def __init__(self, epochs: int):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 >= self.epochs:
            self.model.stop_training = True


class PatienceStop(keras.callbacks.Callback):
    """Early stopping that survives a restart: stops once `patience` epochs have passed
    since the best epoch on `monitor` (the best so far is given when resuming).

    Args:
      monitor, mode: the metric and 'max' or 'min'.
      patience: epochs without improvement before stopping.
      best_epoch, best_value: the best (1-based) epoch and value of the epochs already
        completed (None when there are none).
    """

    def __init__(self, monitor: str, mode: str, patience: int,
                 best_epoch: int | None = None, best_value: float | None = None):
        super().__init__()
        self.monitor, self.mode, self.patience = monitor, mode, patience
        self.best_epoch, self.best_value = best_epoch, best_value

    def on_epoch_end(self, epoch, logs=None):
        value = float((logs or {}).get(self.monitor, math.nan))
        if math.isfinite(value) and (self.best_value is None or (
                value > self.best_value if self.mode == "max" else value < self.best_value)):
            self.best_epoch, self.best_value = epoch + 1, value
        if should_stop_early(epoch + 1, self.best_epoch, self.patience):
            self.model.stop_training = True


class TimeBudgetStop(keras.callbacks.Callback):
    """Stops training after the epoch at which the training time of all sessions (the
    `epoch_seconds` of the epochs, validation included) reaches `seconds`.

    Args:
      seconds: the budget.
      spent: seconds spent by the sessions before this one.
    """

    def __init__(self, seconds: float, spent: float = 0.0):
        super().__init__()
        self.seconds, self.spent = float(seconds), float(spent)

    def on_epoch_end(self, epoch, logs=None):
        self.spent += float((logs or {}).get("epoch_seconds", 0.0))
        stop = self.spent >= self.seconds
        strategy = self.model.distribute_strategy
        if is_multi_worker(strategy):  # the workers' clocks differ: stop when one does
            stop = not _all_workers_min(strategy, int(not stop))
        if stop:
            self.model.stop_training = True


def should_stop_early(epochs_completed: int, best: int | None, patience: int | None) -> bool:
    """Whether `patience` epochs have passed since the best epoch `best` (1-based)."""
    if patience is None or not epochs_completed:
        return False
    return epochs_completed - (best or 0) >= patience


def read_history(path: str, epochs: int) -> dict[str, list[float]]:
    """The per-epoch logs of the first `epochs` epochs in `CSVLogger`'s file `path`.

    An epoch logged twice (a session stopped after logging it but before backing it up
    runs it again) counts once, with its last row.
    """
    rows = {}
    if os.path.exists(path):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                rows[int(row.pop("epoch"))] = row
    history: dict[str, list[float]] = {}
    for epoch in range(epochs):
        for key, value in rows.get(epoch, {}).items():
            history.setdefault(key, []).append(float(value))
    return history


def best_epoch(values: list[float], mode: str) -> tuple[int | None, float | None]:
    """(1-based epoch, value) of the best finite value (the first one on ties)."""
    best, best_value = None, None
    for epoch, value in enumerate(values, start=1):
        if not math.isfinite(value):
            continue
        if best_value is None or (value > best_value if mode == "max" else value < best_value):
            best, best_value = epoch, value
    return best, best_value


@dataclasses.dataclass
class FitResult:
    """What `fit_resumable` did, and the run's state over all its sessions.

    Attributes:
      resumed_from_epoch: epochs completed before this session.
      epochs_completed: epochs completed now.
      finished: whether all epochs are completed.
      train_seconds: wall time of this session's `fit`.
      history: per-epoch logs of all sessions (`CSVLogger`'s file), `epoch_seconds`
        included.
      best_epoch, best_value: the best epoch on the monitored metric (1-based).
      best_path: weights of the best epoch (`ModelCheckpoint`).
      extra: what `on_fresh_start` returned in the run's first session.
      stopped_early: whether `patience` ended the run before `epochs`.
      out_of_time: whether `max_train_seconds` ended the run before `epochs`.
    """

    resumed_from_epoch: int
    epochs_completed: int
    finished: bool
    train_seconds: float
    history: dict
    best_epoch: int | None
    best_value: float | None
    best_path: str
    extra: dict
    stopped_early: bool = False
    out_of_time: bool = False


def _backed_up_epoch(backup_dir: str, suffix: str = "") -> int:
    """Epochs completed according to `BackupAndRestore`'s metadata in `backup_dir`
    (`suffix='.bkp'`: its previous backup)."""
    path = os.path.join(backup_dir, "training_metadata.json" + suffix)
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return int(json.load(f)["epoch"])


def with_known_length(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` with its number of batches known to tf.data (counted once if needed).

    Keras' graph-mode (non-XLA) `evaluate` over a dataset of unknown length whose batch
    shape is static adds one phantom batch to every stateful metric when the iterator
    runs out (the count is incremented by the static batch size, the total is not; Keras
    issue 23084): an accuracy over 3 batches is reported ×3/4. A dataset whose length
    tf.data knows is read exactly that many steps and is not affected.

    Raises:
      ValueError: if `dataset` is infinite.
    """
    length = int(dataset.cardinality())
    if length == tf.data.INFINITE_CARDINALITY:
        raise ValueError("validation_dataset must be finite, got an infinite dataset.")
    if length == tf.data.UNKNOWN_CARDINALITY:
        length = int(dataset.reduce(np.int64(0), lambda count, _: count + 1))
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(length))
    return dataset


def _agree_on_resume_epoch(strategy: tf.distribute.Strategy, backup_dir: str) -> int:
    """The epoch every worker resumes after: the last one all workers backed up.

    A worker stopped between the end of an epoch and its backup is one epoch behind the
    others; those roll back to their previous backup (kept by `BackupAndRestore(
    double_checkpoint=True)`).

    Raises:
      ValueError: if a worker's backups do not reach back to the agreed epoch (e.g. one
        worker restarted with an empty output folder).
    """
    mine = _backed_up_epoch(backup_dir)
    agreed = _all_workers_min(strategy, mine)
    if agreed == mine:
        return mine
    weights = os.path.join(backup_dir, "latest.weights.h5")
    metadata = os.path.join(backup_dir, "training_metadata.json")
    previous = _backed_up_epoch(backup_dir, suffix=".bkp")
    if previous != agreed or not os.path.exists(weights + ".bkp"):
        raise ValueError(
            f"this worker backed up epoch {mine} in {backup_dir} but another worker's last "
            f"backup is epoch {agreed}; restart every worker with the folders of the "
            "interrupted run (or remove them all to start afresh).")
    shutil.copyfile(weights + ".bkp", weights)
    shutil.copyfile(metadata + ".bkp", metadata)
    print(f"Rolling back to epoch {agreed}, the last epoch every worker backed up.")
    return agreed


def build_training_state(model: keras.Model, data) -> bool:
    """Creates the optimizer's slots and the compiled loss' and metrics' variables of
    `model` (compiled) from one batch, then resets the metrics.

    Without a distribution strategy Keras creates them inside the first trace of the
    train step, and a `tf.function` whose first trace creates variables is traced a
    second time: building them first halves the tracing of the first epoch. Under a
    strategy (the model's, or one in scope) Keras builds them itself before tracing,
    and this does nothing.

    Args:
      model: a compiled Keras model.
      data: a `tf.data.Dataset` of batches (its first batch is used) or one batch
        `(x, y)` / `(x, y, sample_weight)`.

    Returns:
      Whether the state was built (False under a distribution strategy).
    """
    default = tf.distribute.get_strategy()
    if tf.distribute.has_strategy() or model.distribute_strategy is not default:
        return False
    if isinstance(data, tf.data.Dataset):
        data = next(iter(data.take(1)))
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    y_pred = model(x, training=False)
    model.compute_loss(x, y, y_pred, sample_weight, training=False)
    model.compute_metrics(x, y, y_pred, sample_weight)
    model.reset_metrics()
    model.optimizer.build(model.trainable_variables)
    return True


def fit_resumable(model: keras.Model, make_train_dataset: Callable[[int], tf.data.Dataset],
                  validation_dataset: tf.data.Dataset, *, epochs: int, steps_per_epoch: int,
                  output_dir: str, monitor: str, mode: str, writer: bool = True,
                  stop_after_epochs: int | None = None, verbose: int | str = "auto",
                  on_fresh_start: Callable[[], dict] | None = None,
                  patience: int | None = None, max_train_seconds: float | None = None,
                  save_every_epoch: bool = False,
                  callbacks: list[keras.callbacks.Callback] | None = None) -> FitResult:
    """Trains `model` (built and compiled) with per-epoch backups and automatic resume.

    Files in `output_dir`: `backup/` (`BackupAndRestore`: model and optimizer after the
    last finished epoch), `checkpoints/best.weights.h5` (`ModelCheckpoint`: the best
    epoch on `monitor`), `checkpoints/fresh_start.json` (`on_fresh_start`'s dict),
    `history.csv` (`CSVLogger`), `tensorboard/`.

    Under a multi-worker strategy (the model's) the model is adapted
    (`adapt_to_strategy`): each worker trains on its slice of every global batch of
    `make_train_dataset`, every worker evaluates the whole validation set, and worker
    i > 0 keeps its files in `output_dir/worker-i/` (module docstring). A restarted
    cluster resumes after the last epoch all workers backed up, and the stopping rules
    decide the same on every worker.

    Args:
      model: a built, compiled model (created under the strategy's scope).
      make_train_dataset: `start_step -> dataset` of training batches from that step on.
      validation_dataset: finite dataset evaluated after every epoch (its length is
        counted once when tf.data does not know it, see `with_known_length`).
      epochs: total epochs of the run (resumed epochs included).
      steps_per_epoch: training steps per epoch.
      output_dir: the run's folder.
      monitor, mode: the validation metric choosing the best epoch; mode 'max' or 'min'.
      writer: whether this process writes the run's files in `output_dir` (False on
        non-chief workers, which keep their backups in `output_dir/worker-i/`).
      stop_after_epochs: stop (as an interruption would) once this many epochs are
        completed; for tests of resume. None never stops.
      verbose: passed to `fit` (1: progress bar, 2: one line per epoch).
      on_fresh_start: called once, before the first epoch of a fresh (not resumed) run;
        the dict it returns (e.g. the untrained model's test metrics) survives restarts.
      patience: early stopping: stop once this many epochs have passed since the best
        epoch on `monitor`; a resumed run stops where an uninterrupted one would (and a
        rerun of a stopped run does not train again). None trains all `epochs`.
      max_train_seconds: stop after the epoch at which the training time of all
        sessions (`epoch_seconds`, validation included) reaches this budget; the run then
        counts as finished. None: no budget.
      save_every_epoch: also keep the weights of every epoch,
        `checkpoints/epoch-NNN.weights.h5` (for accuracy-vs-time curves).
      callbacks: more Keras callbacks, run after the bookkeeping ones (their logs
        include `epoch_seconds`).

    Returns:
      A `FitResult`.
    """
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}.")
    validation_dataset = with_known_length(validation_dataset)
    strategy = model.distribute_strategy
    multi_worker = is_multi_worker(strategy)
    if multi_worker:
        adapt_to_strategy(model)
    if not writer:
        output_dir = os.path.join(output_dir, f"worker-{worker_index(strategy)[0]}")
    backup_dir = os.path.join(output_dir, "backup")
    ckpt_dir = os.path.join(output_dir, "checkpoints")
    os.makedirs(ckpt_dir, exist_ok=True)
    history_path = os.path.join(output_dir, "history.csv")
    best_path = os.path.join(ckpt_dir, "best.weights.h5")
    extra_path = os.path.join(ckpt_dir, "fresh_start.json")

    initial_epoch = (_agree_on_resume_epoch(strategy, backup_dir) if multi_worker
                     else _backed_up_epoch(backup_dir))
    if initial_epoch:
        print(f"Resuming after epoch {initial_epoch} from {backup_dir}.")
    elif on_fresh_start is not None:
        write_json(extra_path, on_fresh_start())
    history_before = read_history(history_path, initial_epoch)
    best_before, best_so_far = best_epoch(history_before.get(monitor, []), mode)
    spent_before = float(sum(history_before.get("epoch_seconds", [])))
    start = time.time()
    train = (initial_epoch < min(epochs, stop_after_epochs or epochs)
             and not should_stop_early(initial_epoch, best_before, patience)
             and not _out_of_time(spent_before, max_train_seconds))
    if multi_worker:  # the workers' clocks differ: train only if every worker would
        train = bool(_all_workers_min(strategy, int(train)))
    if train:
        bookkeeping = [
            EpochTimer(),
            keras.callbacks.CSVLogger(history_path, append=True),
            keras.callbacks.ModelCheckpoint(best_path, monitor=monitor, mode=mode,
                                            save_best_only=True, save_weights_only=True,
                                            initial_value_threshold=best_so_far),
            keras.callbacks.BackupAndRestore(backup_dir, delete_checkpoint=False,
                                             double_checkpoint=multi_worker),
        ]
        if stop_after_epochs is not None:
            bookkeeping.append(StopAfterEpochs(stop_after_epochs))
        if patience is not None:
            bookkeeping.append(PatienceStop(monitor, mode, patience, best_before, best_so_far))
        if max_train_seconds is not None:
            bookkeeping.append(TimeBudgetStop(max_train_seconds, spent_before))
        if save_every_epoch:
            bookkeeping.append(keras.callbacks.ModelCheckpoint(
                os.path.join(ckpt_dir, "epoch-{epoch:03d}.weights.h5"),
                save_weights_only=True, save_best_only=False))
        if importlib.util.find_spec("tensorboard") is not None:
            bookkeeping.append(keras.callbacks.TensorBoard(
                os.path.join(output_dir, "tensorboard"), profile_batch=0))
        else:
            print("tensorboard is not installed: no TensorBoard logs (pip install tensorboard).")
        build_training_state(model, validation_dataset)
        model.fit(make_train_dataset(initial_epoch * steps_per_epoch), epochs=epochs,
                  initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
                  validation_data=validation_dataset, callbacks=bookkeeping + list(callbacks or []),
                  verbose=verbose,
                  shuffle=False)
    train_seconds = time.time() - start
    completed = _backed_up_epoch(backup_dir)
    history = read_history(history_path, completed)
    best, best_value = best_epoch(history.get(monitor, []), mode)
    extra = {}
    if os.path.exists(extra_path):
        with open(extra_path) as f:
            extra = json.load(f)
    stopped_early = completed < epochs and should_stop_early(completed, best, patience)
    out_of_time = completed < epochs and _out_of_time(
        float(sum(history.get("epoch_seconds", []))), max_train_seconds)
    return FitResult(resumed_from_epoch=initial_epoch, epochs_completed=completed,
                     finished=completed >= epochs or stopped_early or out_of_time,
                     train_seconds=train_seconds, history=history, best_epoch=best,
                     best_value=best_value, best_path=best_path, extra=extra,
                     stopped_early=stopped_early, out_of_time=out_of_time)


def _out_of_time(spent: float, budget: float | None) -> bool:
    return budget is not None and spent >= budget

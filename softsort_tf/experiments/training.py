"""Training infrastructure shared by the binaries: strategies, resumable checkpoints, results.

`fit_resumable` wraps `keras.Model.fit` with
- a checkpoint of the model and optimizer every epoch, and automatic resume: a run that
  is killed and restarted with the same `output_dir` continues after its last finished
  epoch (the data streams are keyed by step, so it also sees the same batches);
- the best weights chosen on a validation metric;
- TensorBoard logs and Keras' progress bar.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import os
import platform
import socket
import time
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

__all__ = ["STRATEGIES", "EpochCheckpoint", "fit_resumable", "machine_info", "make_strategy",
           "set_cpu_devices", "write_json"]

STRATEGIES = ("default", "mirrored", "multi_worker")


def set_cpu_devices(count: int) -> None:
    """Splits the CPU into `count` logical devices (to try `mirrored` without GPUs).

    Must run before TensorFlow initialises its devices.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])


def make_strategy(name: str) -> tf.distribute.Strategy:
    """`'default'` (one device), `'mirrored'` (all local GPUs, else all logical CPUs) or
    `'multi_worker'` (`MultiWorkerMirroredStrategy`, cluster from `TF_CONFIG`)."""
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r}.")


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes checkpoints and results (always, except on the
    non-chief workers of a multi-worker cluster)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (
        resolver.task_type == "worker" and resolver.task_id == 0
        and "chief" not in resolver.cluster_spec().as_dict())


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


class EpochCheckpoint(keras.callbacks.Callback):
    """Checkpoints model + optimizer every epoch and keeps the best weights.

    Files in `directory`:
    - `epoch-{k}.weights.h5`: the model and optimizer after epoch k (the last one kept);
    - `best.weights.h5`: the model after the epoch with the best `monitor` value;
    - `state.json`: epochs completed, the current checkpoint's file name, the best value
      and epoch, the per-epoch history and `extra` (anything the caller stores). It is
      written last, atomically, so it always names a complete checkpoint.

    Args:
      directory: where the files go.
      monitor: the `logs` key deciding the best epoch (e.g. `'val_exact_accuracy'`).
      mode: `'max'` or `'min'`.
      stop_after_epochs: stop training (as an interruption would) once this many epochs
        are completed; for tests of resume. None never stops.
    """

    def __init__(self, directory: str, monitor: str, mode: str = "max",
                 stop_after_epochs: int | None = None):
        super().__init__()
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}.")
        self.directory, self.monitor, self.mode = directory, monitor, mode
        self.stop_after_epochs = stop_after_epochs
        os.makedirs(directory, exist_ok=True)
        self.state_path = os.path.join(directory, "state.json")
        self.best_path = os.path.join(directory, "best.weights.h5")
        self.state = {"epochs_completed": 0, "checkpoint": None, "best_value": None,
                      "best_epoch": None, "history": {}, "extra": {}}
        if os.path.exists(self.state_path):
            with open(self.state_path) as f:
                self.state = json.load(f)

    @property
    def epochs_completed(self) -> int:
        return int(self.state["epochs_completed"])

    def restore(self, model: keras.Model) -> int:
        """Loads the last checkpoint into `model` (built, compiled); returns its epoch."""
        if not self.state["checkpoint"]:
            return 0
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        model.load_weights(os.path.join(self.directory, self.state["checkpoint"]))
        return self.epochs_completed

    def save_state(self) -> None:
        write_json(self.state_path, self.state)

    def _better(self, value: float) -> bool:
        best = self.state["best_value"]
        if best is None:
            return True
        return value > best if self.mode == "max" else value < best

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        logs["epoch_seconds"] = time.time() - getattr(self, "_epoch_start", time.time())
        done = epoch + 1
        for key, value in logs.items():
            self.state["history"].setdefault(key, []).append(float(value))
        value = float(logs[self.monitor])
        if np.isfinite(value) and self._better(value):
            self.model.save_weights(self.best_path + ".tmp.weights.h5")
            os.replace(self.best_path + ".tmp.weights.h5", self.best_path)
            self.state["best_value"], self.state["best_epoch"] = value, done
        name = f"epoch-{done}.weights.h5"
        self.model.save_weights(os.path.join(self.directory, name))
        self.state["epochs_completed"], self.state["checkpoint"] = done, name
        self.save_state()
        for old in glob.glob(os.path.join(self.directory, "epoch-*.weights.h5")):
            if os.path.basename(old) != name:
                os.remove(old)
        if self.stop_after_epochs is not None and done >= self.stop_after_epochs:
            self.model.stop_training = True


@dataclasses.dataclass
class FitResult:
    """What `fit_resumable` did: epochs run now, where it resumed from, the checkpoint."""

    resumed_from_epoch: int
    epochs_completed: int
    finished: bool
    train_seconds: float
    checkpoint: EpochCheckpoint


def fit_resumable(model: keras.Model, make_train_dataset: Callable[[int], tf.data.Dataset],
                  validation_dataset: tf.data.Dataset, *, epochs: int, steps_per_epoch: int,
                  output_dir: str, monitor: str, mode: str, writer: bool = True,
                  stop_after_epochs: int | None = None, verbose: int | str = "auto",
                  on_fresh_start: Callable[[], dict] | None = None) -> FitResult:
    """Trains `model` (built and compiled) with per-epoch checkpoints and automatic resume.

    Args:
      model: a built, compiled model (created under the strategy's scope).
      make_train_dataset: `start_step -> dataset` of training batches from that step on.
      validation_dataset: finite dataset evaluated after every epoch.
      epochs: total epochs of the run (resumed epochs included).
      steps_per_epoch: training steps per epoch.
      output_dir: the run's folder: `checkpoints/` and `tensorboard/` go there.
      monitor, mode: the validation metric choosing the best epoch.
      writer: whether this process writes the checkpoints (False on non-chief workers,
        which write to a throw-away folder).
      stop_after_epochs: see `EpochCheckpoint`.
      verbose: passed to `fit` (1: progress bar, 2: one line per epoch).
      on_fresh_start: called once, before the first epoch of a fresh (not resumed) run;
        the dict it returns is stored in the checkpoint state's `extra` (e.g. the
        untrained model's test metrics) and survives restarts.

    Returns:
      A `FitResult`; `checkpoint.state['extra']` holds `on_fresh_start`'s dict.
    """
    ckpt_dir = os.path.join(output_dir, "checkpoints")
    if not writer:
        ckpt_dir = os.path.join(output_dir, f"worker-tmp-{os.getpid()}")
    checkpoint = EpochCheckpoint(ckpt_dir, monitor, mode, stop_after_epochs)
    initial_epoch = checkpoint.restore(model)
    if initial_epoch:
        print(f"Resuming from the checkpoint of epoch {initial_epoch} in {ckpt_dir}.")
    elif on_fresh_start is not None:
        checkpoint.state["extra"] = on_fresh_start()
        checkpoint.save_state()
    start = time.time()
    if initial_epoch < epochs and not (stop_after_epochs and initial_epoch >= stop_after_epochs):
        callbacks = [checkpoint]
        if importlib.util.find_spec("tensorboard") is not None:
            callbacks.append(keras.callbacks.TensorBoard(
                os.path.join(output_dir, "tensorboard"), profile_batch=0))
        else:
            print("tensorboard is not installed: no TensorBoard logs (pip install tensorboard).")
        model.fit(make_train_dataset(initial_epoch * steps_per_epoch), epochs=epochs,
                  initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
                  validation_data=validation_dataset, callbacks=callbacks, verbose=verbose,
                  shuffle=False)
    return FitResult(resumed_from_epoch=initial_epoch,
                     epochs_completed=checkpoint.epochs_completed,
                     finished=checkpoint.epochs_completed >= epochs,
                     train_seconds=time.time() - start, checkpoint=checkpoint)

"""Accuracy-vs-wall-time curves of large-MNIST runs (`scripts/time_to_accuracy.py`).

A run trained with `save_every_epoch=True` keeps the weights of every epoch
(`checkpoints/epoch-NNN.weights.h5`) and its per-epoch wall time (`history.csv`,
`epoch_seconds`, validation included). `epoch_curve` evaluates every kept epoch on the
run's test sequences, after the run: the test set never influences training or the
choice of the reported epoch (that is the best validation epoch), it only draws the
curve of what the run had reached at each point of its wall time.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re

import numpy as np

import softsort_tf
from softsort_tf.experiments import large_mnist, training

__all__ = ["epoch_curve", "load_config", "plot_curves", "time_to_reach"]

_EPOCH_FILE = re.compile(r"epoch-(\d+)\.weights\.h5$")


def _results(run_dir: str) -> dict:
    path = os.path.join(run_dir, "results.json")
    if not os.path.exists(path):
        raise ValueError(f"{run_dir!r} has no results.json (is the run finished?).")
    with open(path) as f:
        return json.load(f)


def load_config(run_dir: str) -> large_mnist.ExperimentConfig:
    """The `ExperimentConfig` of a finished run, from its `results.json`."""
    flags = dict(_results(run_dir)["flags"])
    if flags.get("temperature") is None and flags.get("method") in softsort_tf.FAMILIES:
        # A run recorded before the one --temperature flag: its family's own name.
        flags["temperature"] = flags.get(softsort_tf.FAMILIES[flags["method"]].temperature)
    names = {field.name for field in dataclasses.fields(large_mnist.ExperimentConfig)}
    return large_mnist.ExperimentConfig(**{k: v for k, v in flags.items() if k in names})


def epoch_curve(run_dir: str, num_test_sequences: int | None = None,
                every: int = 1) -> list[dict]:
    """Test metrics of every saved epoch of a run, with the wall time to reach it.

    Args:
      run_dir: the run's `output_dir` (trained with `save_every_epoch=True`).
      num_test_sequences: test sequences to evaluate (default: the run's own).
      every: evaluate every `every`-th epoch only (and the last and the best validation
        epoch).

    Returns:
      One dict per saved epoch: `epoch` (1-based), `steps`, `train_seconds` (cumulative
      `epoch_seconds`, validation included), the validation metric of the epoch and
      `test_*` metrics (`large_mnist.evaluate`).
    """
    config = load_config(run_dir)
    if num_test_sequences is not None:
        config.num_test_sequences = num_test_sequences
    config = config.finalize()
    files = sorted(glob.glob(os.path.join(run_dir, "checkpoints", "epoch-*.weights.h5")))
    if not files:
        raise ValueError(f"{run_dir!r} kept no per-epoch weights (train with "
                         "--save_every_epoch).")
    results = _results(run_dir)
    history = training.read_history(os.path.join(run_dir, "history.csv"),
                                    results["epochs_completed"])
    seconds = np.cumsum(history.get("epoch_seconds", []))
    monitor, _ = large_mnist.objective(config.task)
    keep = {results.get("best_epoch"), results["epochs_completed"]}
    _, _, test_ds = large_mnist.make_datasets(config)
    model = large_mnist.build_model(config)
    rows = []
    for path in files:
        epoch = int(_EPOCH_FILE.search(path).group(1))
        if epoch > len(seconds) or (epoch % every and epoch not in keep):
            continue
        model.load_weights(path)
        metrics = large_mnist.evaluate(model, test_ds, config.task)
        row = {"epoch": epoch, "steps": epoch * config.steps_per_epoch,
               "train_seconds": float(seconds[epoch - 1]),
               monitor: float(history[monitor][epoch - 1])}
        row.update({f"test_{k}": v for k, v in metrics.items()})
        rows.append(row)
    return rows


def time_to_reach(rows: list[dict], metric: str, target: float,
                  mode: str = "max") -> float | None:
    """Wall time (s) of the first row whose `metric` reaches `target` (None: never)."""
    for row in rows:
        value = row[metric]
        if (value >= target) if mode == "max" else (value <= target):
            return row["train_seconds"]
    return None


def plot_curves(curves: dict[str, list[dict]], metric: str, path: str, *,
                title: str, targets: dict[str, float] | None = None) -> None:
    """Plots `metric` against training wall time (minutes), one line per run.

    Args:
      curves: label -> rows of `epoch_curve`.
      metric: the column to plot, e.g. 'test_exact_accuracy'.
      path: the PNG to write.
      title: the figure's title.
      targets: label -> a horizontal reference line (e.g. the published accuracy).
    """
    import matplotlib  # noqa: PLC0415 (optional: the dev / benchmark extras)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, rows in curves.items():
        ax.plot([r["train_seconds"] / 60 for r in rows], [r[metric] for r in rows],
                marker="o", markersize=3, label=label)
    for label, value in (targets or {}).items():
        ax.axhline(value, linestyle="--", linewidth=1, color="gray")
        ax.text(0.01, value, label, transform=ax.get_yaxis_transform(), fontsize=8,
                color="gray", va="bottom")
        low, high = ax.get_ylim()
        ax.set_ylim(low, max(high, value + 0.05 * (high - low)))
    ax.set_xlabel("training wall time (minutes, validation included)")
    ax.set_ylabel(metric.replace("_", " "))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

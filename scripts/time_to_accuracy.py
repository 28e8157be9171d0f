"""Test accuracy vs training wall time of finished large-MNIST runs.

Each run must have been trained with `--save_every_epoch` (scripts/train_sort.py or
scripts/train_median.py). Every kept epoch is evaluated on the run's test sequences
(after training: the test set plays no part in training or in choosing the reported
epoch); the table (CSV) and a plot (PNG) show what each run had reached after how many
minutes of training.

Example:

    python scripts/time_to_accuracy.py \\
        --runs=SoftSort=runs/n3_softsort,NeuralSort=runs/n3_neuralsort \\
        --target=0.930 --target_label="published (NeuralSort)" \\
        --output_png=docs/time_to_accuracy_n3.png --output_csv=runs/n3_curves.csv \\
        --title="large-MNIST, n = 3"
"""

import csv
import os

from absl import flags

from softsort_tf.experiments import curves
from softsort_tf.experiments import flags as experiment_flags

_RUNS = flags.DEFINE_list("runs", None, "label=run_dir pairs (comma-separated).")
_METRIC = flags.DEFINE_string("metric", "test_exact_accuracy",
                              "Column to plot (test_exact_accuracy, test_mse_1e-4, ...).")
_TARGET = flags.DEFINE_float("target", None, "A reference value drawn as a line.")
_TARGET_LABEL = flags.DEFINE_string("target_label", "published", "Label of --target.")
_TITLE = flags.DEFINE_string("title", "large-MNIST", "Plot title.")
_NUM_TEST = flags.DEFINE_integer("num_test_sequences", None,
                                 "Test sequences (default: each run's own).", lower_bound=1)
_EVERY = flags.DEFINE_integer("every", 1, "Evaluate every k-th epoch (and the last and the "
                               "best validation epoch).", lower_bound=1)
_PNG = flags.DEFINE_string("output_png", None, "Plot to write.")
_CSV = flags.DEFINE_string("output_csv", None, "Table to write (one row per run and epoch).")
flags.mark_flags_as_required(["runs"])


def _parse_runs(pairs: list[str]) -> dict[str, str]:
    runs = {}
    for pair in pairs:
        label, sep, path = pair.partition("=")
        if not sep or not label or not os.path.isdir(path):
            raise flags.ValidationError(f"--runs: expected label=existing_dir, got {pair!r}.")
        runs[label] = path
    return runs


def main(argv):
    del argv
    runs = _parse_runs(_RUNS.value)
    results = {label: curves.epoch_curve(path, _NUM_TEST.value, _EVERY.value)
               for label, path in runs.items()}
    for label, rows in results.items():
        reached = (curves.time_to_reach(rows, _METRIC.value, _TARGET.value)
                   if _TARGET.value is not None else None)
        best = max(rows, key=lambda r: r[_METRIC.value])
        print(f"{label}: best {_METRIC.value} {best[_METRIC.value]:.4f} at epoch "
              f"{best['epoch']} ({best['train_seconds'] / 60:.1f} min); "
              + (f"reached {_TARGET.value} after {reached / 60:.1f} min"
                 if reached is not None else "target not reached"))
    if _CSV.value:
        fields = ["run"] + list(next(iter(results.values()))[0])
        with open(_CSV.value, "w", newline="") as f:
            writer = csv.DictWriter(f, fields)
            writer.writeheader()
            for label, rows in results.items():
                for row in rows:
                    writer.writerow({"run": label, **row})
    if _PNG.value:
        targets = {_TARGET_LABEL.value: _TARGET.value} if _TARGET.value is not None else None
        curves.plot_curves(results, _METRIC.value, _PNG.value, title=_TITLE.value,
                           targets=targets)
        print(f"Plot: {_PNG.value}")


if __name__ == "__main__":
    experiment_flags.run_binary(main)

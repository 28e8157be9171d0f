"""Accuracy-vs-time curves of large-MNIST runs (`softsort_tf.experiments.curves`) and
their binary `scripts/time_to_accuracy.py`, on a run with the faster schedule
(bfloat16 CNN, cosine learning rate with warm-up, time budget, per-epoch weights)."""

import csv
import os

import numpy as np
import pytest

from softsort_tf.experiments import curves
from softsort_tf.experiments import large_mnist as experiment
from softsort_tf.experiments.large_mnist import ExperimentConfig

# As many test as validation sequences: one shape of evaluation batches, one trace. The
# bfloat16 CNN runs slowly on a CPU without bfloat16 units (about 1 s per step of 12
# images here): batches of 2 sequences (6 images), and 2 steps per epoch, so that a
# row's `steps` (epoch × steps per epoch) differs from its epoch.
TINY = dict(task="sort", n=3, batch_size=2, steps_per_epoch=2, epochs=2, num_val_sequences=2,
            num_test_sequences=2, digits_per_class=10, verbose=0)


@pytest.mark.slow
def test_fast_schedule_run_keeps_epochs_and_draws_the_curve(tmp_path, run_binaries):
    config = dict(TINY, precision="mixed_bfloat16", lr_schedule="cosine", warmup_steps=2,
                  save_every_epoch=True, patience=5, max_train_minutes=30.0)
    out = str(tmp_path / "run")
    results = experiment.run(ExperimentConfig(output_dir=out, **config))
    assert results["finished"] and results["epochs_completed"] == 2
    files = sorted(os.listdir(os.path.join(out, "checkpoints")))
    assert "epoch-001.weights.h5" in files and "epoch-002.weights.h5" in files
    rows = curves.epoch_curve(out)
    assert [r["epoch"] for r in rows] == [1, 2] and rows[1]["steps"] == 4
    assert 0 < rows[0]["train_seconds"] < rows[1]["train_seconds"]
    seconds = np.cumsum(results["history"]["epoch_seconds"])
    np.testing.assert_allclose([r["train_seconds"] for r in rows], seconds)
    # The best validation epoch's row is the run's reported test result.
    best = rows[results["best_epoch"] - 1]
    assert best["test_exact_accuracy"] == pytest.approx(
        results["metrics"]["test_exact_accuracy"])
    assert curves.time_to_reach(rows, "test_exact_accuracy", -1.0) == rows[0]["train_seconds"]
    assert curves.time_to_reach(rows, "test_exact_accuracy", 2.0) is None
    # Same seeds, same numbers (determinism with the bfloat16 CNN too).
    twin = experiment.run(ExperimentConfig(output_dir=str(tmp_path / "twin"), **config))
    assert twin["history"]["val_loss"] == results["history"]["val_loss"]
    assert twin["metrics"] == results["metrics"]
    png = str(tmp_path / "curve.png")
    csv_path = str(tmp_path / "curve.csv")
    proc, bad = run_binaries([
        # --every=2: the binary's curve is the sparse one (epoch 2, and the best epoch).
        {"argv": ["time_to_accuracy.py", f"--runs=bf16={out}", "--target=0.5", "--every=2",
                  f"--output_png={png}", f"--output_csv={csv_path}"], "timeout": 300},
        {"argv": ["time_to_accuracy.py", f"--runs={out}"], "timeout": 120}])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert os.path.getsize(png) > 1000
    with open(csv_path) as f:
        sparse = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in sparse] == sorted({2, results["best_epoch"]})
    for row in sparse:  # the rows of the full curve computed above
        want = rows[int(row["epoch"]) - 1]
        assert row["run"] == "bf16" and int(row["steps"]) == want["steps"]
        assert float(row["test_exact_accuracy"]) == pytest.approx(want["test_exact_accuracy"])
    assert bad.returncode != 0 and "label=existing_dir" in bad.stderr

"""The faster large-MNIST schedules (issue 14): bfloat16 CNN, cosine learning rate with
warm-up, time budget, per-epoch weights and the accuracy-vs-time curves."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_training import _fit

from softsort_tf.experiments import curves, models, training
from softsort_tf.experiments import large_mnist as experiment
from softsort_tf.experiments.large_mnist import ExperimentConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = dict(task="sort", n=3, batch_size=4, steps_per_epoch=3, epochs=2, num_val_sequences=4,
            num_test_sequences=8, digits_per_class=10, verbose=0)


def test_cosine_schedule_warms_up_linearly_then_decays_to_zero():
    config = ExperimentConfig(lr_schedule="cosine", warmup_steps=10, epochs=4,
                              steps_per_epoch=25, learning_rate=0.01).finalize()
    schedule = experiment.learning_rate_schedule(config)
    lr = [float(schedule(step)) for step in (0, 5, 10, 55, 100)]
    np.testing.assert_allclose(lr[:3], [0.0, 0.005, 0.01], atol=1e-9)
    np.testing.assert_allclose(lr[3], 0.005, rtol=1e-5)  # half-way through the decay
    assert lr[4] == pytest.approx(0.0, abs=1e-9)
    constant = ExperimentConfig(learning_rate=0.01).finalize()
    assert experiment.learning_rate_schedule(constant) == 0.01
    with pytest.raises(ValueError, match="warmup_steps"):
        ExperimentConfig(lr_schedule="cosine", warmup_steps=100, epochs=4,
                         steps_per_epoch=25).finalize()
    for bad in (dict(precision="float8"), dict(lr_schedule="linear"), dict(patience=0),
                dict(max_train_minutes=-1.0), dict(warmup_steps=-1)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ExperimentConfig(**bad).finalize()


def test_bfloat16_cnn_gives_float32_scores_close_to_the_float32_cnn():
    full = models.build_cnn("a")
    half = models.build_cnn("b", "mixed_bfloat16")
    half.set_weights(full.get_weights())
    images = tf.random.stateless_uniform([6, 112, 28, 1], [0, 1])
    assert half.layers[0].compute_dtype == "bfloat16"
    assert half(images).dtype == tf.float32
    a, b = full(images).numpy(), half(images).numpy()
    # bfloat16 has an 8-bit significand: about 2-3 significant digits.
    np.testing.assert_allclose(b, a, atol=0.05 * np.abs(a).max() + 1e-3)


def test_time_budget_stops_the_run_and_a_rerun_does_not_train_again(tmp_path):
    out = str(tmp_path / "run")
    first = _fit(out, patience=None, max_train_seconds=1e-9)
    assert first.epochs_completed == 1 and first.finished and first.out_of_time
    again = _fit(out, patience=None, max_train_seconds=1e-9)
    assert again.epochs_completed == 1 and again.finished and again.out_of_time
    # Without the budget the same folder trains on.
    more = _fit(out, patience=None, epochs=3)
    assert more.epochs_completed == 3 and not more.out_of_time


@pytest.mark.slow
def test_fast_schedule_run_keeps_epochs_and_draws_the_curve(tmp_path):
    config = dict(TINY, precision="mixed_bfloat16", lr_schedule="cosine", warmup_steps=2,
                  save_every_epoch=True, patience=5, max_train_minutes=30.0)
    out = str(tmp_path / "run")
    results = experiment.run(ExperimentConfig(output_dir=out, **config))
    assert results["finished"] and results["epochs_completed"] == 2
    files = sorted(os.listdir(os.path.join(out, "checkpoints")))
    assert "epoch-001.weights.h5" in files and "epoch-002.weights.h5" in files
    rows = curves.epoch_curve(out)
    assert [r["epoch"] for r in rows] == [1, 2] and rows[1]["steps"] == 6
    assert 0 < rows[0]["train_seconds"] < rows[1]["train_seconds"]
    seconds = np.cumsum(results["history"]["epoch_seconds"])
    np.testing.assert_allclose([r["train_seconds"] for r in rows], seconds)
    # The best validation epoch's row is the run's reported test result.
    best = rows[results["best_epoch"] - 1]
    assert best["test_exact_accuracy"] == pytest.approx(
        results["metrics"]["test_exact_accuracy"])
    assert curves.time_to_reach(rows, "test_exact_accuracy", -1.0) == rows[0]["train_seconds"]
    assert curves.time_to_reach(rows, "test_exact_accuracy", 2.0) is None
    sparse = curves.epoch_curve(out, every=2)  # epoch 2, and the best epoch
    assert [r["epoch"] for r in sparse] == sorted({2, results["best_epoch"]})
    # Same seeds, same numbers (determinism with the bfloat16 CNN too).
    twin = experiment.run(ExperimentConfig(output_dir=str(tmp_path / "twin"), **config))
    assert twin["history"]["val_loss"] == results["history"]["val_loss"]
    assert twin["metrics"] == results["metrics"]
    png = str(tmp_path / "curve.png")
    csv_path = str(tmp_path / "curve.csv")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "time_to_accuracy.py"),
         f"--runs=bf16={out}", "--target=0.5", f"--output_png={png}",
         f"--output_csv={csv_path}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert os.path.getsize(png) > 1000
    with open(csv_path) as f:
        assert len(f.read().splitlines()) == 3
    bad = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "time_to_accuracy.py"),
         f"--runs={out}"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "label=existing_dir" in bad.stderr


def test_train_sort_help_lists_the_schedule_flags():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "train_sort.py"),
                           "--helpshort"], capture_output=True, text=True, timeout=120)
    for flag in ("--precision", "--lr_schedule", "--warmup_steps", "--patience",
                 "--max_train_minutes", "--[no]save_every_epoch", "--[no]jit_compile"):
        assert flag in proc.stdout, flag


def test_keras_policy_is_left_alone():
    before = keras.config.dtype_policy().name
    models.build_cnn("c", "mixed_bfloat16")
    assert keras.config.dtype_policy().name == before
    assert training.TimeBudgetStop(1.0).seconds == 1.0

"""The large-MNIST experiments (`softsort_tf.experiments.large_mnist`) and their binaries
`scripts/train_sort.py` and `scripts/train_median.py`: configuration, loss, metrics,
learning-rate schedule, smoke runs, resume and strategies.

Runs are tiny (a few steps of batch 4): they check the plumbing, not accuracy.
"""

import glob
import json
import math
import os

import h5py
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from softsort_tf.experiments import large_mnist as experiment
from softsort_tf.experiments.large_mnist import ExperimentConfig

# As many test as validation sequences: both sets come in batches of one shape, so a
# model traces its test step once (not once for each set).
TINY = dict(batch_size=4, steps_per_epoch=2, epochs=1, num_val_sequences=4,
            num_test_sequences=4, digits_per_class=10, verbose=0, deterministic_ops=False)
TINY_FLAGS = ["--batch_size=4", "--steps_per_epoch=2", "--epochs=1", "--num_val_sequences=4",
              "--num_test_sequences=4", "--digits_per_class=10", "--verbose=2"]


def _weights(path):
    """All arrays of a `.weights.h5` file (model and optimizer), by their h5 path."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return out


def _assert_finite_metrics(results, keys):
    for key in keys:
        assert math.isfinite(results["metrics"][key]), (key, results["metrics"])


def _check_outputs(output_dir, results):
    with open(os.path.join(output_dir, "results.json")) as f:
        saved = json.load(f)
    assert saved["metrics"] == pytest.approx(results["metrics"])
    assert saved["flags"]["output_dir"] == output_dir and saved["wall_time_s"] > 0
    assert saved["machine"]["tensorflow"] == tf.__version__
    assert glob.glob(os.path.join(output_dir, "tensorboard", "train", "events.out.tfevents*"))
    assert glob.glob(os.path.join(output_dir, "tensorboard", "validation", "events.out*"))
    assert os.path.exists(os.path.join(output_dir, "checkpoints", "best.weights.h5"))
    with open(os.path.join(output_dir, "history.csv")) as f:  # keras.callbacks.CSVLogger
        assert len(f.read().splitlines()) == 1 + saved["epochs_completed"]
    return saved


@pytest.mark.slow
def test_resume_after_interruption_continues_with_the_same_weights(tmp_path):
    # Stochastic SoftSort: the Gumbel noise of a step must also be the same after resume.
    config = dict(TINY, task="sort", n=3, epochs=2, stochastic=True, num_samples=2)
    stopped = str(tmp_path / "stopped")
    first = experiment.run(ExperimentConfig(output_dir=stopped, stop_after_epochs=1, **config))
    assert not first["finished"] and first["epochs_completed"] == 1 and "metrics" not in first
    backup = os.path.join("backup", "latest.weights.h5")  # keras.callbacks.BackupAndRestore
    after_epoch_1 = _weights(os.path.join(stopped, backup))

    resumed = experiment.run(ExperimentConfig(output_dir=stopped, **config))
    assert resumed["resumed_from_epoch"] == 1 and resumed["epochs_completed"] == 2
    assert len(resumed["history"]["loss"]) == 2

    reference_dir = str(tmp_path / "reference")
    reference = experiment.run(ExperimentConfig(output_dir=reference_dir, **config))
    assert reference["resumed_from_epoch"] == 0
    # Epoch 1 of the uninterrupted run matches the checkpoint the resumed run started from,
    # and every later epoch matches too: nothing was lost or repeated.
    for key, values in reference["history"].items():
        if key != "epoch_seconds":
            assert resumed["history"][key] == pytest.approx(values, rel=1e-5), key
    final = _weights(os.path.join(stopped, backup))
    final_ref = _weights(os.path.join(reference_dir, backup))
    assert final.keys() == final_ref.keys() and len(final) > 8
    for key in final:
        np.testing.assert_allclose(final[key], final_ref[key], rtol=1e-5, atol=1e-6,
                                   err_msg=key)
    assert any(not np.array_equal(after_epoch_1[k], final[k]) for k in final)  # it trained
    # The best-epoch weights too: the best value so far is carried over the restart.
    best = os.path.join("checkpoints", "best.weights.h5")
    best_resumed, best_ref = _weights(os.path.join(stopped, best)), _weights(
        os.path.join(reference_dir, best))
    for key in best_ref:
        np.testing.assert_allclose(best_resumed[key], best_ref[key], rtol=1e-5, atol=1e-6,
                                   err_msg=key)
    # The untrained numbers come from the first session and survive the restart.
    assert resumed["metrics"]["untrained_test_exact_accuracy"] == pytest.approx(
        reference["metrics"]["untrained_test_exact_accuracy"])
    saved = _check_outputs(stopped, resumed)
    best = int(np.argmax(saved["history"]["val_exact_accuracy"])) + 1
    assert saved["best_epoch"] == best
    assert saved["metrics"]["best_val_exact_accuracy"] == max(
        saved["history"]["val_exact_accuracy"])


@pytest.mark.slow
@pytest.mark.parametrize("task, method", [("sort", "sinkhorn"), ("median", "neuralsort")])
def test_smoke_on_a_slice_of_mnist_npz(tmp_path, mnist_npz, task, method):
    out = str(tmp_path / task)
    results = experiment.run(ExperimentConfig(
        task=task, method=method, n=3, dataset="npz", mnist_npz=mnist_npz, output_dir=out, **TINY))
    assert results["flags"]["dataset"] == "npz" and results["finished"]
    if task == "sort":
        _assert_finite_metrics(results, ["test_exact_accuracy", "test_elementwise_accuracy",
                                         "untrained_test_exact_accuracy"])
        assert 0.0 <= results["metrics"]["test_exact_accuracy"] <= 1.0
    else:
        _assert_finite_metrics(results, ["test_mse_1e-4", "test_r2", "test_spearman",
                                         "untrained_test_mse_1e-4"])
    _check_outputs(out, results)


OUTSIDE_FAMILY = os.path.join(os.path.dirname(__file__), "outside_matrix_family.py")


@pytest.fixture(scope="module")
def binaries(run_binaries, tmp_path_factory):
    """The two binaries, run once: name -> (results.json, stdout)."""
    tmp = tmp_path_factory.mktemp("binaries")
    cases = {
        "sort": ["train_sort.py", f"--output_dir={tmp / 'sort'}", *TINY_FLAGS, "--n=3",
                 "--strategy=mirrored", "--num_cpu_devices=2",
                 '--method_kwargs={"distance_power": 2.0}'],
        # A family registered outside the package (by the file --family_modules imports)
        # is a --method like the built-in ones.
        "median": ["train_median.py", f"--output_dir={tmp / 'median'}", *TINY_FLAGS, "--n=3",
                   "--stochastic", "--num_samples=2", f"--family_modules={OUTSIDE_FAMILY}",
                   "--method=gaussian_matrix_test"],
    }
    procs = run_binaries([{"argv": argv, "timeout": 300} for argv in cases.values()])
    out = {}
    for name, proc in zip(cases, procs, strict=True):
        assert proc.returncode == 0, proc.stderr[-3000:]
        with open(tmp / name / "results.json") as f:
            out[name] = json.load(f), proc.stdout
    return out


@pytest.mark.slow
def test_train_sort_binary_mirrored_on_two_logical_cpus(binaries):
    results, stdout = binaries["sort"]
    cpus = [d for d in results["machine"]["devices"] if "CPU" in d]
    assert len(cpus) == 2 and results["flags"]["strategy"] == "mirrored"
    _assert_finite_metrics(results, ["test_exact_accuracy", "test_elementwise_accuracy",
                                     "untrained_test_exact_accuracy",
                                     "untrained_test_elementwise_accuracy"])
    assert "exact_accuracy" in stdout and "untrained" in stdout  # the printed comparison
    # Published defaults that were not overridden.
    assert results["flags"]["learning_rate"] == 0.005
    assert results["flags"]["temperature"] == 1024.0
    assert json.loads(results["flags"]["method_kwargs"]) == {"distance_power": 2.0}


@pytest.mark.slow
def test_train_median_binary_on_embedded_digits(binaries):
    results, _ = binaries["median"]
    assert results["flags"]["dataset"] == "embedded" and results["task"] == "median"
    assert results["flags"]["method"] == "gaussian_matrix_test"
    _assert_finite_metrics(results, ["test_mse_1e-4", "test_r2", "test_spearman"])
    assert results["flags"]["learning_rate"] == 0.001


def test_median_evaluation_metrics_and_bad_configs():
    # The median task's test metrics, Spearman's ρ with ties averaged (as scipy).
    pred = np.array([1.0, 2.0, 2.0, 3.0, 3.0, 0.5], np.float32)
    true = np.array([1.0, 2.0, 3.0, 4.0, 4.0, 2.0], np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(({"pred": pred}, true)).batch(4)
    metrics = experiment.evaluate(lambda features, training: features["pred"], dataset,
                                  "median")
    mse = np.mean((pred.astype(np.float64) - true) ** 2)
    assert metrics["spearman"] == pytest.approx(scipy.stats.spearmanr(pred, true).statistic,
                                                rel=1e-6)
    assert metrics["r2"] == pytest.approx(1 - mse / np.var(true), rel=1e-5)
    assert metrics["mse_1e-4"] == pytest.approx(mse / experiment.VALUE_SCALE, rel=1e-5)
    with pytest.raises(ValueError, match="method"):
        ExperimentConfig(method="bubblesort").finalize()
    with pytest.raises(ValueError, match="odd"):
        ExperimentConfig(task="median", n=4).finalize()
    with pytest.raises(ValueError, match="strategy"):
        ExperimentConfig(strategy="tpu").finalize()
    config = ExperimentConfig(task="sort", n=9).finalize()
    assert (config.temperature, config.batch_size, config.steps_per_epoch) == (128.0, 20, 687)
    # One temperature, its default in the family's units (raw CNN scores: τ = 128 for
    # n = 9; a steepness: 1/128). Sinkhorn runs on the raw scores by default, at ε = 100,
    # its settings merged over that default; with its squash on, ε is Cuturi et al.'s 0.005.
    assert ExperimentConfig(method="sorting_network", n=9).finalize().temperature == 1.0 / 128
    assert ExperimentConfig(method="lapsum", n=3).finalize().temperature == 1024.0
    raw = ExperimentConfig(method="sinkhorn", n=3).finalize()
    assert (raw.temperature, json.loads(raw.method_kwargs)) == (100.0, {"squash": None})
    centres = ExperimentConfig(method="sinkhorn", n=3,
                               method_kwargs='{"targets": "centres"}').finalize()
    assert (centres.temperature, json.loads(centres.method_kwargs)) == (
        100.0, {"squash": None, "targets": "centres"})
    squashed = ExperimentConfig(method="sinkhorn", n=3,
                                method_kwargs='{"squash": "logistic"}').finalize()
    assert (squashed.temperature, json.loads(squashed.method_kwargs)) == (
        5e-3, {"squash": "logistic"})
    assert ExperimentConfig(method="softsort", n=3).finalize().method_kwargs is None
    config = ExperimentConfig(task="median").finalize()
    assert (config.learning_rate, config.batch_size, config.steps_per_epoch) == (1e-3, 5, 2750)


@pytest.mark.parametrize("method", ["sinkhorn", "softsort", "lapsum"])
def test_sorting_loss_is_computed_from_log_p_for_the_log_domain_operators(method):
    """The sorting model outputs log P̂ and the loss reads it without the probability
    floor for the operators with a log-domain matrix (a nearly hard Sinkhorn P̂ then
    keeps the gradient of its wrongly ordered rows); LapSum keeps P̂ and the floor."""
    config = ExperimentConfig(task="sort", method=method, n=3, dataset="embedded").finalize()
    assert config.temperature == experiment.default_temperature(method, 3)
    model = experiment.build_model(config)
    log_domain = method != "lapsum"
    assert model.log is log_domain
    assert model.loss.get_config()["from_log"] is log_domain
    images = tf.random.stateless_uniform([4, 3, 112, 28, 1], [1, 2])
    out = model({"images": images, "step": tf.zeros([4], tf.int64)}).numpy()
    rows = np.exp(out).sum(-1) if log_domain else out.sum(-1)
    np.testing.assert_allclose(rows, 1.0, atol=1e-4)
    off = ExperimentConfig(task="sort", method=method, n=3, dataset="embedded",
                           log_cross_entropy=False).finalize()
    assert experiment.build_model(off).loss.get_config()["from_log"] is False


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


@pytest.mark.slow
def test_profile_script_times_the_operator_as_the_model_calls_it(run_binaries):
    """scripts/profile_sort_step.py builds the operator and loss the way the model does
    (each family's temperature, log P̂ where the family has it)."""
    (proc,) = run_binaries([{"argv": ["profile_sort_step.py", "--method=lapsum",
                                      "--parts=operator", "--steps=1", "--repeats=1"],
                             "timeout": 300}], check=True)
    rows = [line.split("|") for line in proc.stdout.splitlines()
            if line.startswith("| lapsum")]
    assert [row[3].strip() for row in rows] == ["False", "True"], proc.stdout  # XLA off, on
    for row in rows:  # ms / step and images / s: positive, finite
        assert 0 < float(row[4]) < 1e4 and 0 < float(row[5]) < 1e9, row

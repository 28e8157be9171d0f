"""keras-tuner search (softsort_tf.experiments.tuning, scripts/tune.py), tiny budgets.

These check the plumbing of the search (conditional space, resume, best trial, test
evaluation, bad arguments), not the quality of the hyper-parameters found.
"""

import json
import math
import os

import keras_tuner as kt
import numpy as np
import pytest

from softsort_tf.experiments import tuning
from softsort_tf.experiments.large_mnist import ExperimentConfig

TINY = dict(batch_size=4, steps_per_epoch=2, epochs=1, num_val_sequences=8,
            num_test_sequences=8, digits_per_class=10, verbose=0, deterministic_ops=False)
SPACE = dict(methods=("softsort", "neuralsort", "sinkhorn"), temperature_scores=(8.0, 64.0),
             temperature_normalized=(1e-3, 1e-2), learning_rate=(1e-12, 1e-12))


def _check_trial(hp):
    space = tuning.SearchSpace(**SPACE)
    assert hp["method"] in space.methods
    assert space.learning_rate[0] <= hp["learning_rate"] <= space.learning_rate[1]
    # Conditional: the range of the family's units only (τ in the scores' units for
    # SoftSort and NeuralSort, and ε for Sinkhorn, on the raw scores by default).
    scores, normalized = "temperature_scores", "temperature_normalized"
    assert scores in hp and normalized not in hp
    assert space.temperature_scores[0] <= hp[scores] <= space.temperature_scores[1]


@pytest.fixture(scope="module")
def searches(tmp_path_factory):
    """One random search of 1 trial with patience 1 and a learning rate of 1e-12 (the
    validation score never improves: the trial stops after its second epoch of three),
    then the same search resumed in the same folder with one more trial and no patience
    (it trains all three epochs): the resumed search picks the best of 2 trials."""
    out = str(tmp_path_factory.mktemp("search") / "search")
    config = dict(task="sort", n=3, output_dir=out, **dict(TINY, epochs=3))
    first = tuning.search(ExperimentConfig(patience=1, **config), tuning.SearchSpace(**SPACE),
                          max_trials=1)
    with open(os.path.join(out, "tuning.json")) as f:
        saved = json.load(f)
    second = tuning.search(ExperimentConfig(**config), tuning.SearchSpace(**SPACE),
                           max_trials=2)
    return first, saved, second


def _check_best(results):
    """`results["best"]` is a trial of the best score, with finite test metrics."""
    scores = [t["score"] for t in results["trials"]]
    assert results["best"]["best_val_exact_accuracy"] == max(scores)
    assert results["best"]["hyperparameters"] in [
        t["hyperparameters"] for t in results["trials"] if t["score"] == max(scores)]
    for key in ("test_exact_accuracy", "test_elementwise_accuracy", "test_loss"):
        assert math.isfinite(results["best"][key])


@pytest.mark.slow
def test_search_records_trials_picks_the_best_and_resumes(searches):
    first, saved, second = searches
    assert len(first["trials"]) == 1
    _check_best(first)
    assert saved["trials"] == first["trials"]

    # Same folder, larger budget: the finished trial is kept, one more is run, and the
    # best of both (one trained by the first process) is picked.
    assert len(second["trials"]) == 2
    assert second["trials"][:1] == first["trials"]
    for trial in second["trials"]:
        assert trial["status"] == "COMPLETED" and 0.0 <= trial["score"] <= 1.0
        _check_trial(trial["hyperparameters"])
    # The two trials differ (else picking the best would be trivial).
    assert second["trials"][0]["hyperparameters"] != second["trials"][1]["hyperparameters"]
    _check_best(second)


@pytest.mark.slow
def test_patience_ends_a_trial_that_stopped_improving(searches):
    # With patience 1 the trial stops after its second epoch instead of training all
    # three; the trial of the resumed search, without patience, trains all three.
    first, _, second = searches
    assert [t["epochs_trained"] for t in first["trials"]] == [2]
    assert [t["epochs_trained"] for t in second["trials"]] == [2, 3]


@pytest.mark.parametrize("method, method_kwargs, units, squash", [
    ("softsort", None, "scores", None),  # Sinkhorn's defaults: the raw scores
    ("sinkhorn", '{"squash": "logistic"}', "normalized", "logistic"),  # the config's
])
def test_hypermodel_applies_the_trial_hyperparameters(method, method_kwargs, units, squash):
    config = ExperimentConfig(task="median", n=3, method=method, method_kwargs=method_kwargs,
                              **TINY).finalize()
    hypermodel = tuning.LargeMnistHyperModel(config, tuning.SearchSpace(**SPACE).validate())
    hp = kt.HyperParameters()
    hp.Fixed("method", "sinkhorn")
    hp.Fixed(f"temperature_{units}", 0.004)
    hp.Fixed("learning_rate", 3e-4)
    model = hypermodel.build(hp)
    assert (model.method, model.temperature) == ("sinkhorn", 0.004)
    assert model.method_kwargs == {"squash": squash}
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(3e-4)
    images = np.zeros((2, 3, 112, 28, 1), np.float32)
    out = model({"images": images, "step": np.zeros([2], np.int64)})
    assert out.shape == (2,)


@pytest.mark.slow
def test_hyperband_on_the_median_task(tmp_path):
    out = str(tmp_path / "hyperband")
    config = ExperimentConfig(task="median", n=3, output_dir=out, **dict(TINY, epochs=2))
    results = tuning.search(config, tuning.SearchSpace(temperature_scores=(8.0, 64.0)),
                            tuner="hyperband")
    assert results["objective"] == {"name": "val_mse", "direction": "min"}
    assert results["trials"]
    assert results["best"]["best_val_mse"] == min(t["score"] for t in results["trials"]
                                                  if t["score"] is not None)
    assert math.isfinite(results["best"]["test_mse_1e-4"])


@pytest.mark.parametrize("kwargs, match", [
    (dict(tuner="grid"), "tuner"),
    (dict(max_trials=0), "max_trials"),
    (dict(space=tuning.SearchSpace(methods=("bubblesort",))), "methods"),
    (dict(space=tuning.SearchSpace(temperature_scores=(10.0, 1.0))), "temperature_scores"),
    (dict(space=tuning.SearchSpace(learning_rate=(0.0, 1e-3))), "learning_rate"),
])
def test_bad_arguments_raise(tmp_path, kwargs, match):
    config = ExperimentConfig(task="sort", n=3, output_dir=str(tmp_path), **TINY)
    with pytest.raises(ValueError, match=match):
        tuning.search(config, **kwargs)


@pytest.mark.slow
def test_tune_binary(tmp_path, run_binaries):
    out = str(tmp_path / "binary")
    argv = ["tune.py", f"--output_dir={out}", "--task=sort", "--n=3",
            "--methods=softsort,neuralsort", "--max_trials=1", "--temperature_range_scores=8,64",
            "--epochs=1",
            "--steps_per_epoch=2", "--batch_size=4", "--num_val_sequences=8",
            "--num_test_sequences=8", "--digits_per_class=10", "--verbose=0",
            "--nodeterministic_ops", "--strategy=mirrored", "--num_cpu_devices=2"]
    bad_argv = ["tune.py", f"--output_dir={tmp_path / 'bad'}", "--task=sort",
               "--temperature_range_scores=8"]
    proc, bad = run_binaries([{"argv": argv, "timeout": 600}, {"argv": bad_argv, "timeout": 120}])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # One trial (not the default 10): the flag reached the search. Several trials, the
    # best one and resuming are the search fixture's (test_search_records_trials_...).
    assert "random search, 1 trials" in proc.stdout
    with open(os.path.join(out, "tuning.json")) as f:
        saved = json.load(f)
    assert saved["space"]["temperature_scores"] == [8.0, 64.0] and len(saved["trials"]) == 1
    assert saved["flags"]["strategy"] == "mirrored"
    assert bad.returncode != 0 and "temperature_range_scores" in bad.stderr
    assert not os.path.exists(tmp_path / "bad")

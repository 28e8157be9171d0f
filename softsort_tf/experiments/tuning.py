"""keras-tuner search over the relaxation and the optimiser of a large-MNIST experiment.

`search(config, space)` tunes the hyper-parameters that matter most for the relaxed
sorting operators, on the validation sequences of the task (`objective`: validation
exact-permutation accuracy for sorting, validation MSE for the median):

- `method` (when `space.methods` has several): families with a relaxed matrix;
- the family's `temperature`, log-uniform over the range of its units
  (`Family.temperature_units`: raw CNN scores for τ and α, and for Sinkhorn's ε on the
  raw scores, the binaries' default; their inverse for a steepness; the scale-free range
  for Sinkhorn's ε with its squash), one hyper-parameter per unit
  (`temperature_scores`, `temperature_inverse_scores`, `temperature_normalized`),
  active only for the methods of those units;
- `learning_rate` of Adam, log-uniform.

Every other setting (n, batch, epochs, steps per epoch, data, `tf.distribute`
strategy, the CNN's dtype policy, the learning-rate schedule) comes from the
`ExperimentConfig`, as for `train_sort.py` / `train_median.py`; with `patience` set, a
trial stops once its validation score has not improved for that many epochs (cheap
trials: many short epochs, e.g. `steps_per_epoch=100`). Every trial trains
on the same stream of training batches and is scored on the same validation
sequences. The search state lives in `output_dir/search/` (keras-tuner's project
folder): rerunning with the same folder resumes it and does not repeat finished
trials. When it ends, the best trial's model is evaluated on the test sequences and
`output_dir/tuning.json` records every trial and the best one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time

import keras
import keras_tuner as kt

import softsort_tf as ss
from softsort_tf.experiments import large_mnist, models, training

__all__ = ["TUNERS", "LargeMnistHyperModel", "SearchSpace", "range_is_valid", "search"]

TUNERS = ("random", "bayesian", "hyperband")


def _check_range(name: str, bounds: tuple[float, float]) -> tuple[float, float]:
    low, high = (float(v) for v in bounds)
    if not (0 < low <= high and math.isfinite(high)):
        raise ValueError(f"`{name}` must be a range 0 < low <= high, got {bounds}.")
    return low, high


def range_is_valid(bounds) -> bool:
    """Whether `bounds` is a pair of numbers `0 < low <= high` (strings allowed)."""
    try:
        _check_range("range", bounds)
    except (TypeError, ValueError):
        return False
    return True


@dataclasses.dataclass
class SearchSpace:
    """Ranges of the search (all sampled log-uniformly).

    Defaults bracket the published settings: τ = 1024 / 128 (SoftSort paper, raw CNN
    scores), ε = 0.005 (Cuturi et al.), Adam lr 0.005 (sorting) / 0.001 (median).

    Attributes:
      methods: the operators to choose from (one: the method is fixed).
      temperature_scores: (low, high) of a temperature in the units of the raw CNN
        scores (SoftSort's and NeuralSort's τ, LapSum's α, Sinkhorn's ε on raw scores).
      temperature_inverse_scores: (low, high) of a temperature in their inverse units
        (the sorting networks' steepness β).
      temperature_normalized: (low, high) of a temperature independent of the scores'
        scale (Sinkhorn's ε on squashed scores).
      learning_rate: (low, high) of Adam's learning rate.
    """

    methods: tuple[str, ...] = ("softsort",)
    temperature_scores: tuple[float, float] = (16.0, 4096.0)
    temperature_inverse_scores: tuple[float, float] = (1.0 / 4096.0, 1.0 / 16.0)
    temperature_normalized: tuple[float, float] = (1e-3, 1e-1)
    learning_rate: tuple[float, float] = (1e-4, 1e-2)

    def validate(self) -> SearchSpace:
        able = models.permutation_methods()
        if not self.methods or any(m not in able for m in self.methods):
            raise ValueError(f"`methods` must be a non-empty subset of {able}, got "
                             f"{self.methods}.")
        self.methods = tuple(dict.fromkeys(self.methods))
        for units in ss.TEMPERATURE_UNITS:
            name = f"temperature_{units}"
            setattr(self, name, _check_range(name, getattr(self, name)))
        self.learning_rate = _check_range("learning_rate", self.learning_rate)
        return self


class LargeMnistHyperModel(kt.HyperModel):
    """Builds the task's model of `config` with hyper-parameters drawn from `space`.

    Args:
      config: a finalised `ExperimentConfig`; its method, temperature and learning rate
        are replaced by the trial's.
      space: the `SearchSpace`.
    """

    def __init__(self, config: large_mnist.ExperimentConfig, space: SearchSpace):
        super().__init__(name=f"large_mnist_{config.task}")
        self.config, self.space = config, space
        # [hyper-parameters, epochs] of every trial trained, kept over restarts.
        self._epochs_path = os.path.join(config.output_dir, "epochs_trained.json")
        self.epochs_trained: list = []
        if os.path.exists(self._epochs_path):
            with open(self._epochs_path) as f:
                self.epochs_trained = json.load(f)

    def trial_config(self, hp: kt.HyperParameters) -> large_mnist.ExperimentConfig:
        """The `ExperimentConfig` of one set of hyper-parameters."""
        space = self.space
        if len(space.methods) > 1:
            method = hp.Choice("method", list(space.methods))
        else:
            method = hp.Fixed("method", space.methods[0])
        temperature = self.config.temperature if method == self.config.method else None
        for units in dict.fromkeys(self._units(m) for m in space.methods):
            users = [m for m in space.methods if self._units(m) == units]
            name = f"temperature_{units}"
            with hp.conditional_scope("method", users):
                if method in users:
                    temperature = hp.Float(name, *getattr(space, name), sampling="log")
        learning_rate = hp.Float("learning_rate", *space.learning_rate, sampling="log")
        settings = self._settings(method)
        config = dataclasses.replace(self.config, method=method, learning_rate=learning_rate,
                                     temperature=temperature,
                                     method_kwargs=large_mnist.settings_text(settings))
        if temperature is None:
            config.temperature = large_mnist.default_temperature(method, config.n, settings)
        return config

    def _settings(self, method: str) -> dict:
        """The family's own settings in a trial of `method`: the config's for its method,
        else the binaries' defaults (`large_mnist.method_settings`)."""
        own = self.config.method_kwargs if method == self.config.method else None
        return large_mnist.method_settings(method, own)

    def _units(self, method: str) -> str:
        """The units of the temperature of `method` in a trial (`Family.units`)."""
        return ss.get_family(method).units(self._settings(method))

    def build(self, hp: kt.HyperParameters) -> keras.Model:
        return large_mnist.build_model(self.trial_config(hp))

    def fit(self, hp: kt.HyperParameters, model: keras.Model, *args, **kwargs):
        """`model.fit`, recording how many epochs the trial trained (early stopping).

        The optimizer's and metrics' variables are created first from a validation
        batch (`training.build_training_state`, as `training.fit_resumable` does), so
        that Keras traces the train step once.
        """
        if kwargs.get("validation_data") is not None:
            training.build_training_state(model, kwargs["validation_data"])
        history = model.fit(*args, **kwargs)
        self.epochs_trained.append([dict(hp.values), len(history.epoch)])
        training.write_json(self._epochs_path, self.epochs_trained)
        return history

    def epochs_of(self, hyperparameters: dict) -> int | None:
        """Epochs trained by the trial of `hyperparameters` (None: not recorded)."""
        found = [epochs for values, epochs in self.epochs_trained if values == hyperparameters]
        return found[-1] if found else None


def _make_tuner(name: str, hypermodel: kt.HyperModel, objective: kt.Objective, *,
                max_trials: int, max_epochs: int, directory: str, seed: int,
                executions_per_trial: int, distribution_strategy) -> kt.Tuner:
    common = dict(objective=objective, directory=directory, project_name="search",
                  overwrite=False, seed=seed, executions_per_trial=executions_per_trial,
                  distribution_strategy=distribution_strategy)
    if name == "random":
        return kt.RandomSearch(hypermodel, max_trials=max_trials, **common)
    if name == "bayesian":
        return kt.BayesianOptimization(hypermodel, max_trials=max_trials, **common)
    # Hyperband sets each trial's epochs itself (up to max_epochs).
    return kt.Hyperband(hypermodel, max_epochs=max(max_epochs, 2), factor=3, **common)


def search(config: large_mnist.ExperimentConfig, space: SearchSpace | None = None, *,
           tuner: str = "random", max_trials: int = 10,
           executions_per_trial: int = 1) -> dict:
    """Runs (or resumes) a keras-tuner search; returns the results (also `tuning.json`).

    Args:
      config: the experiment (task, n, budget per trial, data); `config.epochs` and
        `config.steps_per_epoch` are each trial's budget (Hyperband: the largest one).
      space: the `SearchSpace` (default: the method of `config`, default ranges).
      tuner: 'random' (default), 'bayesian' (Gaussian-process optimisation) or
        'hyperband' (successive halving of the epoch budget; ignores `max_trials`).
      max_trials: trials of the random / Bayesian search.
      executions_per_trial: trainings per trial, averaged (reduces the seed noise).

    Returns:
      A dict with the best hyper-parameters, its validation score, the test metrics of
      its model and every trial (hyper-parameters, score, status).
    """
    config = config.finalize()
    space = (space or SearchSpace(methods=(config.method,))).validate()
    if tuner not in TUNERS:
        raise ValueError(f"`tuner` must be one of {TUNERS}, got {tuner!r}.")
    for name, value in (("max_trials", max_trials),
                        ("executions_per_trial", executions_per_trial)):
        if int(value) != value or value < 1:
            raise ValueError(f"`{name}` must be a positive int, got {value}.")
    with training.output_directory(config.output_dir):
        return _search(config, space, tuner, max_trials, executions_per_trial)


def _search(config: large_mnist.ExperimentConfig, space: SearchSpace, tuner: str,
            max_trials: int, executions_per_trial: int) -> dict:
    wall_start = time.time()
    strategy = large_mnist.prepare_runtime(config)
    train_dataset, val_ds, test_ds = large_mnist.make_datasets(config)
    monitor, mode = large_mnist.objective(config.task)
    hypermodel = LargeMnistHyperModel(config, space)
    kt_tuner = _make_tuner(tuner, hypermodel, kt.Objective(monitor, direction=mode),
                           max_trials=max_trials, max_epochs=config.epochs,
                           directory=config.output_dir, seed=config.seed,
                           executions_per_trial=executions_per_trial,
                           distribution_strategy=(None if config.strategy == "default"
                                                  else strategy))
    verbose = config.verbose if config.verbose != "auto" else 1
    # Short trials: `patience` ends a trial whose validation score has stopped improving.
    callbacks = ([] if config.patience is None else [keras.callbacks.EarlyStopping(
        monitor, mode=mode, patience=config.patience)])
    kt_tuner.search(train_dataset(0), validation_data=val_ds, epochs=config.epochs,
                    steps_per_epoch=config.steps_per_epoch, verbose=verbose,
                    callbacks=callbacks)

    trials = []
    for trial in kt_tuner.oracle.trials.values():
        values = dict(trial.hyperparameters.values)
        trials.append({"trial_id": trial.trial_id, "status": str(trial.status),
                       "score": trial.score, "epochs_trained": hypermodel.epochs_of(values),
                       "hyperparameters": values})
    best_hp = kt_tuner.get_best_hyperparameters(1)[0]
    best_trial = kt_tuner.oracle.get_best_trials(1)[0]
    best_model = kt_tuner.get_best_models(1)[0]
    test = large_mnist.evaluate(best_model, test_ds, config.task)
    results = {
        "task": config.task,
        "tuner": tuner,
        "objective": {"name": monitor, "direction": mode},
        "flags": dataclasses.asdict(config),
        "space": dataclasses.asdict(space),
        "machine": training.machine_info(),
        "best": {"hyperparameters": dict(best_hp.values), f"best_{monitor}": best_trial.score,
                 **{f"test_{k}": v for k, v in test.items()}},
        "trials": sorted(trials, key=lambda t: t["trial_id"]),
        "wall_time_s": time.time() - wall_start,
    }
    training.write_json(os.path.join(config.output_dir, "tuning.json"), results)
    _print_summary(results)
    return results


def _print_summary(results: dict) -> None:
    best = results["best"]
    print(f"\n{results['tuner']} search, {len(results['trials'])} trials, objective "
          f"{results['objective']['name']} ({results['objective']['direction']})")
    for name, value in best["hyperparameters"].items():
        print(f"  best {name:<23}{value}")
    for name, value in best.items():
        if name != "hyperparameters":
            print(f"  {name:<28}{value:.4f}")

"""keras-tuner search of τ / ε and the learning rate on a large-MNIST task.

Searches the relaxation's temperature (SoftSort / NeuralSort τ, Sinkhorn ε), the
operator itself (`--methods`) and Adam's learning rate, each trial trained with the
budget of the shared experiment flags (`--epochs`, `--steps_per_epoch`, ...) and
scored on the validation sequences; see `softsort_tf.experiments.tuning`.

Example (a quick search on the offline digits):

    python scripts/tune.py --output_dir=/tmp/tune --task=sort --n=3 \
        --methods=softsort,neuralsort --max_trials=6 --epochs=2 --steps_per_epoch=50

Restarting with the same --output_dir resumes the search; `tuning.json` in it lists
every trial and the test metrics of the best one.
"""

from absl import app, flags

from softsort_tf.experiments import flags as experiment_flags
from softsort_tf.experiments import large_mnist, models, tuning

experiment_flags.define_flags(None)
_TASK = flags.DEFINE_enum("task", "sort", large_mnist.TASKS, "Task to tune.")
_TUNER = flags.DEFINE_enum("tuner", "random", tuning.TUNERS,
                           "Search algorithm (hyperband ignores --max_trials).")
_MAX_TRIALS = flags.DEFINE_integer("max_trials", 10, "Trials of the random/Bayesian search.")
_EXECUTIONS = flags.DEFINE_integer("executions_per_trial", 1,
                                   "Trainings per trial, averaged.")
_METHODS = flags.DEFINE_list("methods", None, "Operators to choose from, a subset of "
                             f"{','.join(models.METHODS)}; default: --method alone.")
_TAU_RANGE = flags.DEFINE_list("tau_range", ["16", "4096"], "low,high of τ (log-uniform).")
_EPSILON_RANGE = flags.DEFINE_list("epsilon_range", ["0.001", "0.1"],
                                   "low,high of the Sinkhorn ε (log-uniform).")
_LR_RANGE = flags.DEFINE_list("learning_rate_range", ["0.0001", "0.01"],
                              "low,high of the learning rate (log-uniform).")


def _pair(name: str, values: list[str]) -> tuple[float, float]:
    if len(values) != 2:
        raise app.UsageError(f"--{name} takes two values, low,high; got {values}.")
    return float(values[0]), float(values[1])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    config = experiment_flags.config_from_flags(_TASK.value)
    space = tuning.SearchSpace(
        methods=tuple(_METHODS.value or [config.method]),
        tau=_pair("tau_range", _TAU_RANGE.value),
        epsilon=_pair("epsilon_range", _EPSILON_RANGE.value),
        learning_rate=_pair("learning_rate_range", _LR_RANGE.value))
    tuning.search(config, space, tuner=_TUNER.value, max_trials=_MAX_TRIALS.value,
                  executions_per_trial=_EXECUTIONS.value)


if __name__ == "__main__":
    app.run(main)

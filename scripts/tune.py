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

from absl import flags

from softsort_tf.experiments import flags as experiment_flags
from softsort_tf.experiments import models, tuning

experiment_flags.define_flags(None)  # --task chooses sort or median
_TUNER = flags.DEFINE_enum("tuner", "random", tuning.TUNERS,
                           "Search algorithm (hyperband ignores --max_trials).")
_MAX_TRIALS = flags.DEFINE_integer("max_trials", 10, "Trials of the random/Bayesian search.",
                                   lower_bound=1)
_EXECUTIONS = flags.DEFINE_integer("executions_per_trial", 1,
                                   "Trainings per trial, averaged.", lower_bound=1)
_OPERATORS = ",".join(models.PERMUTATION_METHODS)
_METHODS = flags.DEFINE_list("methods", None, "Operators to choose from, a subset of "
                             f"{_OPERATORS}; default: --method alone.")
flags.register_validator(_METHODS,
                         lambda methods: set(methods or ()) <= set(models.PERMUTATION_METHODS),
                         f"must be a subset of {_OPERATORS}.")
_TAU_RANGE = flags.DEFINE_list("tau_range", ["16", "4096"], "low,high of τ (log-uniform).")
_EPSILON_RANGE = flags.DEFINE_list("epsilon_range", ["0.001", "0.1"],
                                   "low,high of the Sinkhorn ε (log-uniform).")
_ALPHA_RANGE = flags.DEFINE_list("alpha_range", ["16", "4096"],
                                 "low,high of LapSum's α (log-uniform).")
_STEEPNESS_RANGE = flags.DEFINE_list("steepness_range", ["0.000244140625", "0.0625"],
                                     "low,high of the sorting networks' steepness "
                                     "(log-uniform).")
_LR_RANGE = flags.DEFINE_list("learning_rate_range", ["0.0001", "0.01"],
                              "low,high of the learning rate (log-uniform).")
for _range in (_TAU_RANGE, _EPSILON_RANGE, _ALPHA_RANGE, _STEEPNESS_RANGE, _LR_RANGE):
    flags.register_validator(_range, tuning.range_is_valid,
                             "must be two numbers low,high with 0 < low <= high.")


def main(argv):
    del argv  # run_binary rejects positional arguments
    config = experiment_flags.config_from_flags()
    space = tuning.SearchSpace(
        methods=tuple(_METHODS.value or [config.method]),
        tau=tuple(_TAU_RANGE.value), epsilon=tuple(_EPSILON_RANGE.value),
        alpha=tuple(_ALPHA_RANGE.value), steepness=tuple(_STEEPNESS_RANGE.value),
        learning_rate=tuple(_LR_RANGE.value))
    tuning.search(config, space, tuner=_TUNER.value, max_trials=_MAX_TRIALS.value,
                  executions_per_trial=_EXECUTIONS.value)


if __name__ == "__main__":
    experiment_flags.run_binary(main)

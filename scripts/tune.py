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
_METHODS = flags.DEFINE_list("methods", None, "Operators to choose from, families with a "
                             "relaxed matrix (softsort, neuralsort, sinkhorn, lapsum, "
                             "sorting_network, ...); default: --method alone.")
flags.register_validator(
    _METHODS, lambda methods: set(methods or ()) <= set(models.permutation_methods()),
    "must be families with a relaxed permutation matrix.")
_SCORES_RANGE = flags.DEFINE_list(
    "temperature_range_scores", ["16", "4096"],
    "low,high of a temperature in the units of the raw CNN scores (τ, α; log-uniform).")
_INVERSE_RANGE = flags.DEFINE_list(
    "temperature_range_inverse_scores", ["0.000244140625", "0.0625"],
    "low,high of a temperature in inverse units of the scores (steepness; log-uniform).")
_NORMALIZED_RANGE = flags.DEFINE_list(
    "temperature_range_normalized", ["0.001", "0.1"],
    "low,high of a temperature independent of the scores' scale (Sinkhorn's ε; "
    "log-uniform).")
_LR_RANGE = flags.DEFINE_list("learning_rate_range", ["0.0001", "0.01"],
                              "low,high of the learning rate (log-uniform).")
for _range in (_SCORES_RANGE, _INVERSE_RANGE, _NORMALIZED_RANGE, _LR_RANGE):
    flags.register_validator(_range, tuning.range_is_valid,
                             "must be two numbers low,high with 0 < low <= high.")


def main(argv):
    del argv  # run_binary rejects positional arguments
    config = experiment_flags.config_from_flags()
    space = tuning.SearchSpace(
        methods=tuple(_METHODS.value or [config.method]),
        temperature_scores=tuple(_SCORES_RANGE.value),
        temperature_inverse_scores=tuple(_INVERSE_RANGE.value),
        temperature_normalized=tuple(_NORMALIZED_RANGE.value),
        learning_rate=tuple(_LR_RANGE.value))
    tuning.search(config, space, tuner=_TUNER.value, max_trials=_MAX_TRIALS.value,
                  executions_per_trial=_EXECUTIONS.value)


if __name__ == "__main__":
    experiment_flags.run_binary(main)

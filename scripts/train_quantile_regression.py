"""Quantile regression: pinball loss vs the τ-S-quantile (Cuturi et al. 2019, Table 1).

One run (data set, τ, loss, seed); `scripts/run_quantile_regression_grid.py` runs the
paper's grid. The offline default is a synthetic data set generated in memory:

    python scripts/train_quantile_regression.py --output_dir=/tmp/qr
    python scripts/train_quantile_regression.py --output_dir=/tmp/qr_bio --dataset=bio \
        --data_dir=../shared/data/cqr --quantile=0.1 --loss=squantile

Restarting with the same --output_dir resumes the run.
"""

from absl import flags

from softsort_tf.datasets import cqr
from softsort_tf.experiments import flags as experiment_flags
from softsort_tf.experiments import quantile_regression

_D = quantile_regression.QuantileRegressionConfig()
experiment_flags.define_run_flags(epochs=_D.epochs, steps_per_epoch=_D.steps_per_epoch,
                                  batch_size=_D.batch_size, learning_rate=_D.learning_rate,
                                  defaults_help={"epochs": "an epoch is a validation "
                                                 "interval of steps_per_epoch steps"})
# Keras turns XLA off under op determinism (5x slower steps here).
flags.FLAGS.set_default("deterministic_ops", False)
flags.DEFINE_enum("dataset", _D.dataset, cqr.ALL_DATASETS,
                  "Data set (softsort_tf.datasets.cqr); 'synthetic' needs no file.")
flags.DEFINE_string("data_dir", _D.data_dir, "Folder of the data files (not for 'synthetic').")
flags.DEFINE_enum("loss", _D.loss, quantile_regression.LOSSES,
                  "pinball loss, or the τ-S-quantile loss.")
flags.DEFINE_float("quantile", _D.quantile, "Quantile level in (0, 1).", lower_bound=0.0,
                   upper_bound=1.0)
flags.DEFINE_integer("patience", _D.patience, "Early stopping: epochs without a better "
                     "validation pinball loss.", lower_bound=1)
flags.DEFINE_float("epsilon", _D.epsilon, "Sinkhorn regularisation of the S-quantile.",
                   lower_bound=0.0)
flags.DEFINE_float("width", None, "Mass t of the middle bin; default min(0.1, τ, 1 − τ).")
flags.DEFINE_enum("squash", _D.squash, ["logistic", "atan", "robust"],
                  "How the S-quantile maps the residuals into [0, 1].")
flags.DEFINE_enum("targets", _D.targets, ["regular", "centres"],
                  "Where the S-quantile's three bins sit on [0, 1].")
flags.DEFINE_enum("output_init", _D.output_init, quantile_regression.OUTPUT_INITS,
                  "'quantile': start as the constant training τ-quantile (output kernel 0, "
                  "bias the τ-quantile); 'glorot': Keras' default initialisation.")
flags.DEFINE_float("validation_fraction", _D.validation_fraction,
                   "Share of the training part used for early stopping.")
flags.DEFINE_bool("jit_compile", _D.jit_compile, "XLA-compile the training step.")


def main(argv):
    del argv
    quantile_regression.run(
        experiment_flags.dataclass_from_flags(quantile_regression.QuantileRegressionConfig))


if __name__ == "__main__":
    experiment_flags.run_binary(main)

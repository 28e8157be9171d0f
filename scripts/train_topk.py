"""Soft top-k loss vs cross-entropy, and soft quantile-normalisation layers, on a vanilla CNN.

Cuturi et al. (2019) §4, Figs. 4 and 6. Trains every variant × seed and writes
curves.csv / curves.png (test accuracy per epoch, mean ± std over seeds). The offline
default is scikit-learn's 8×8 digits:

    python scripts/train_topk.py --output_dir=/tmp/topk --quantile_norm_layers
    python scripts/train_topk.py --output_dir=/content/topk --dataset=cifar10 \
        --epochs=50 --num_seeds=3 --batch_size=128 --quantile_norm_layers

Restarting with the same --output_dir resumes (finished runs are skipped).
"""

from absl import flags

from softsort_tf.datasets import images
from softsort_tf.experiments import flags as experiment_flags
from softsort_tf.experiments import topk

_D = topk.TopKConfig()
experiment_flags.define_run_flags(epochs=_D.epochs, batch_size=_D.batch_size,
                                  learning_rate=_D.learning_rate,
                                  defaults_help={"steps_per_epoch": "unused: one pass "
                                                 "over the training images"})
flags.DEFINE_enum("dataset", _D.dataset, images.SOURCES,
                  "Images: digits (offline), embedded, mnist, fashion_mnist, cifar10, "
                  "cifar100 (tensorflow-datasets), npz.")
flags.DEFINE_string("npz_path", None, "npz file of --dataset=npz.")
flags.DEFINE_list("losses", list(_D.losses), "Losses to compare: cross_entropy, soft_topk.")
flags.DEFINE_bool("quantile_norm_layers", _D.quantile_norm_layers,
                  "Also train the CNN with a SinkhornQuantileNormalization after each conv "
                  "block, with cross-entropy (variant cross_entropy_qn, Fig. 6).")
flags.DEFINE_integer("num_targets", _D.num_targets, "m of the quantile normalisation.",
                     lower_bound=1)
flags.DEFINE_integer("k", _D.k, "k of the soft top-k loss.", lower_bound=1)
flags.DEFINE_float("epsilon", _D.epsilon, "Sinkhorn regularisation of the soft top-k loss.",
                   lower_bound=0.0)
flags.DEFINE_enum("topk_form", _D.topk_form, ["rank", "cdf"],
                  "Soft top-k form: rank (talk) or cdf (arXiv text).")
flags.DEFINE_integer("num_seeds", _D.num_seeds, "Runs (seeds 0..n-1) per variant.",
                     lower_bound=1)
flags.DEFINE_integer("limit_per_split", None, "Keep only this many images per split.")


def main(argv):
    del argv
    topk.run(experiment_flags.dataclass_from_flags(
        topk.TopKConfig, losses=tuple(flags.FLAGS.losses)))


if __name__ == "__main__":
    experiment_flags.run_binary(main)

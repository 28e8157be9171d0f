"""SUQUAN and Kendall kernels on the 45 one-vs-one problems (talk "permutations as inputs").

Linear logistic regression on raw pixels, on pixels quantile-normalised onto a fixed
target (uniform, Gaussian, median of the training quantile functions) and with SUQUAN
(the target quantile function learned jointly with the model), then Kendall-kernel
SVMs against linear SVMs / logistic regression on raw pixels at small training sizes
(`softsort_tf.experiments.suquan`). MNIST from an npz file (the default path is the
project's shared data folder), scikit-learn's digits offline, or tensorflow-datasets:

    python scripts/train_suquan.py --output_dir=/tmp/suquan_mnist
    python scripts/train_suquan.py --output_dir=/tmp/suquan_digits --dataset=digits \
        --validation_size=1 --kernel_sizes=50,100
    python scripts/train_suquan.py --output_dir=/tmp/suquan_cifar10 --dataset=cifar10 \
        --train_size=10000 --val_size=2000

Results go to --output_dir, one file per problem as it finishes; restarting with the
same --output_dir resumes (finished problems and Gram blocks are skipped).
"""

from absl import flags

from softsort_tf.experiments import flags as experiment_flags
from softsort_tf.experiments import suquan

_D = suquan.SuquanConfig()
flags.DEFINE_string("output_dir", None, "Run folder: per-problem results, Gram blocks, "
                    "results.json. Restarting with the same folder resumes the run.")
flags.mark_flag_as_required("output_dir")
flags.DEFINE_enum("dataset", _D.dataset, suquan.SOURCES,
                  "npz (an MNIST-format file, --mnist_npz), digits (scikit-learn, offline, "
                  "8×8), mnist or cifar10 (tensorflow-datasets; CIFAR-10 in grey levels).")
flags.DEFINE_string("mnist_npz", _D.mnist_npz, "npz with x_train, y_train, x_test, y_test.")
flags.DEFINE_integer("validation_size", _D.validation_size,
                     "Last training images held out for validation (npz and "
                     "tensorflow-datasets sources).", lower_bound=1)
flags.DEFINE_list("pairs", [], "Problems as a-b (e.g. 3-5,4-9); default all 45.")
flags.DEFINE_list("normalizations", list(_D.normalizations),
                  f"Inputs of the linear models, among {', '.join(suquan.NORMALIZATIONS)} "
                  "(empty: the kernel methods only).")
flags.DEFINE_integer("train_size", _D.train_size, "Training images per problem.",
                     lower_bound=1)
flags.DEFINE_integer("val_size", _D.val_size, "Validation images per problem.", lower_bound=1)
flags.DEFINE_integer("num_levels", None, "Levels m of the target quantile functions "
                     "(default: one per pixel).", lower_bound=1)
flags.DEFINE_list("l2_grid", [str(v) for v in _D.l2_grid],
                  "L2 strengths tried (chosen on validation).")
flags.DEFINE_integer("steps", _D.steps, "Full-batch Adam steps.", lower_bound=1)
flags.DEFINE_integer("eval_every", _D.eval_every, "Steps between validation checks (the "
                     "best step on validation is kept).", lower_bound=1)
flags.DEFINE_float("learning_rate", _D.learning_rate, "Adam learning rate.", lower_bound=0.0)
flags.DEFINE_bool("jit_compile", _D.jit_compile, "XLA-compile the training steps.")
flags.DEFINE_list("kernel_sizes", [str(v) for v in _D.kernel_sizes],
                  "Training sizes of the kernel methods (even; empty: skip them).")
flags.DEFINE_integer("kernel_test_per_class", _D.kernel_test_per_class,
                     "Test images per digit for the kernel methods.", lower_bound=1)
flags.DEFINE_integer("kernel_block", _D.kernel_block, "Rows per Gram block.", lower_bound=1)
flags.DEFINE_integer("cv_folds", _D.cv_folds, "Cross-validation folds choosing C.",
                     lower_bound=2)
flags.DEFINE_integer("seed", _D.seed, "Seed of the samples.")
flags.DEFINE_integer("stop_after_pairs", None, "Stop (as if interrupted) after this many "
                     "new problems; rerun without it to resume. For tests.", lower_bound=0)
flags.DEFINE_integer("verbose", _D.verbose, "0 silent, 1 one line per problem.")


def _parse_pairs(values):
    pairs = []
    for value in values:
        a, sep, b = value.partition("-")
        if not sep or not a.isdigit() or not b.isdigit():
            raise flags.ValidationError(f"--pairs: expected a-b with digits, got {value!r}.")
        pairs.append((int(a), int(b)))
    return tuple(pairs)


@flags.validator("pairs", "expected a-b with digits 0 <= a < b <= 9")
def _check_pairs(values):
    return all(0 <= a < b <= 9 for a, b in _parse_pairs(values))


@flags.validator("normalizations",
                 f"each normalization must be one of {suquan.NORMALIZATIONS}")
def _check_normalizations(values):
    return all(v in suquan.NORMALIZATIONS for v in values)


def main(argv):
    del argv
    f = flags.FLAGS
    config = experiment_flags.dataclass_from_flags(
        suquan.SuquanConfig, pairs=_parse_pairs(f.pairs),
        normalizations=tuple(f.normalizations),
        l2_grid=tuple(float(v) for v in f.l2_grid),
        kernel_sizes=tuple(int(v) for v in f.kernel_sizes))
    suquan.run(config)


if __name__ == "__main__":
    experiment_flags.run_binary(main)

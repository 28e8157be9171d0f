"""absl flags shared by `scripts/train_sort.py` and `scripts/train_median.py`.

Each binary calls `define_flags(task)` at import time and `config_from_flags(task)` in
`main`. Budget / hyper-parameter flags left unset take the task's published defaults
(see `softsort_tf.experiments.large_mnist`).
"""

from __future__ import annotations

from absl import flags

from softsort_tf.datasets.large_mnist import SOURCES
from softsort_tf.experiments.large_mnist import ExperimentConfig
from softsort_tf.experiments.models import METHODS
from softsort_tf.experiments.training import STRATEGIES

__all__ = ["config_from_flags", "define_flags"]


def define_flags(task: str | None) -> None:
    """Defines the flags of the `task` binary ('sort', 'median', or None for both)."""
    sort = task == "sort"
    d = ExperimentConfig()

    def per_task(sort_value, median_value) -> str:
        if task is None:
            return f"{sort_value} (sort) / {median_value} (median)"
        return str(sort_value if sort else median_value)

    flags.DEFINE_enum("method", d.method, METHODS, "Relaxed sorting operator.")
    flags.DEFINE_bool("stochastic", d.stochastic,
                      "Train with Gumbel-perturbed scores (reparameterised Plackett-Luce).")
    flags.DEFINE_integer("num_samples", d.num_samples, "Gumbel samples per sequence (stochastic).")
    flags.DEFINE_integer("n", d.n, "Numbers per sequence" + ("." if sort else " (odd for the "
                                                          "median)."))
    flags.DEFINE_float("tau", None, "SoftSort/NeuralSort temperature on raw CNN scores; "
                       "default 1024 for n <= 7, else 128 (SoftSort paper).")
    flags.DEFINE_float("epsilon", d.epsilon, "Sinkhorn regularisation (Cuturi et al.: 0.005).")
    flags.DEFINE_float("learning_rate", None,
                       f"Adam learning rate; default {per_task(0.005, 0.001)}.")
    flags.DEFINE_integer("batch_size", None,
                         f"Sequences per batch; default {per_task(20, 5)}.")
    flags.DEFINE_integer("epochs", d.epochs, "Epochs (published protocol: 100).")
    flags.DEFINE_integer("steps_per_epoch", None, "Steps per epoch; default 55000 / "
                         f"(4 * batch_size) = {per_task(687, 2750)} with the default batch.")
    flags.DEFINE_integer("seed", d.seed, "Seed of initialisation, training data and noise.")
    flags.DEFINE_integer("eval_seed", d.eval_seed,
                         "Seed of the validation and test sequences (fixed across runs).")
    flags.DEFINE_enum("dataset", d.dataset, SOURCES,
                      "Digit source: embedded (scikit-learn digits, offline), tfds, npz.")
    flags.DEFINE_string("mnist_npz", None, "npz with x_train/y_train/x_test/y_test "
                        "(--dataset=npz; implied when given).")
    flags.DEFINE_integer("digits_per_class", None,
                         "Keep only this many digit images per class and split (quick runs).")
    flags.DEFINE_integer("num_val_sequences", d.num_val_sequences, "Validation sequences.")
    flags.DEFINE_integer("num_test_sequences", d.num_test_sequences, "Test sequences.")
    flags.DEFINE_string("output_dir", None, "Run folder: checkpoints, TensorBoard, "
                        "results.json. Restarting with the same folder resumes the run.")
    flags.DEFINE_enum("strategy", d.strategy, STRATEGIES, "tf.distribute strategy.")
    flags.DEFINE_integer("num_cpu_devices", d.num_cpu_devices,
                         "Split the CPU into this many logical devices (0: leave as is), "
                         "e.g. to try --strategy=mirrored without GPUs.")
    flags.DEFINE_bool("deterministic_ops", d.deterministic_ops,
                      "tf.config.experimental.enable_op_determinism().")
    flags.DEFINE_integer("stop_after_epochs", None, "Stop (as if interrupted) after this many "
                         "epochs; rerun without it to resume. For tests.")
    flags.DEFINE_integer("verbose", 1, "Keras verbosity: 1 progress bar, 2 one line per epoch.")
    flags.mark_flag_as_required("output_dir")


def config_from_flags(task: str) -> ExperimentConfig:
    """The `ExperimentConfig` of the parsed flags."""
    f = flags.FLAGS
    names = [field for field in ExperimentConfig.__dataclass_fields__ if field != "task"]
    config = ExperimentConfig(task=task, **{name: f[name].value for name in names})
    if config.mnist_npz and not f["dataset"].present:
        config.dataset = "npz"
    return config

"""absl flags shared by the experiment binaries: one program family, one flag module.

A binary picks the groups it needs at import time, defines its own flags next to them,
and hands its `main` to `run_binary`:

- `define_run_flags`: output folder, seed, budget, optimiser, `tf.distribute` strategy,
  determinism, verbosity;
- `define_relaxation_flags`: the relaxed sorting operator and its temperature
  (`method`, `temperature`, `stochastic`, `num_samples`);
- `define_large_mnist_flags`: the large-MNIST data (`n`, digit source, evaluation sets);
- `define_speed_flags`: the large-MNIST binaries' faster schedules (precision, learning
  rate schedule, early stopping, time budget, XLA, per-epoch weights);
- `define_flags(task)`: all four, as `scripts/train_sort.py`, `scripts/train_median.py`
  and `scripts/tune.py` use them; `config_from_flags(task)` turns them into an
  `ExperimentConfig`.

Flags defined here count as key flags of the binary that calls these functions, so its
`--help` lists them. Every flag has a validator (`softsort_tf.experiments.checks`): a
bad value stops the binary before it starts, with absl's one-line
`FATAL Flags parsing error: flag --epochs=0: ...` (exit code 1) instead of a traceback.
Budget / hyper-parameter flags left unset take the task's published defaults (see
`softsort_tf.experiments.large_mnist`).

A new binary:

    from absl import flags
    from softsort_tf.experiments import flags as experiment_flags

    experiment_flags.define_run_flags(batch_size=32, learning_rate=1e-3, epochs=10)
    experiment_flags.define_relaxation_flags()
    _K = flags.DEFINE_integer("k", 3, "Top-k size.", lower_bound=1)

    def main(argv):
        del argv
        config = experiment_flags.dataclass_from_flags(MyConfig, k=_K.value)
        ...

    if __name__ == "__main__":
        experiment_flags.run_binary(main)
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

import tensorflow as tf
from absl import app, flags

from softsort_tf.datasets.large_mnist import SOURCES
from softsort_tf.experiments import checks
from softsort_tf.experiments.large_mnist import (
    LR_SCHEDULES,
    PRECISIONS,
    TASKS,
    ExperimentConfig,
    dataset_error,
    n_error,
)
from softsort_tf.experiments.training import STRATEGIES

__all__ = ["config_from_flags", "dataclass_from_flags", "define_flags",
           "define_large_mnist_flags", "define_relaxation_flags", "define_run_flags",
           "define_speed_flags", "import_family_modules", "run_binary"]

# The DEFINE_* calls below are attributed to the module calling these functions (the
# binary): its key flags, listed by --help.
flags.disclaim_key_flags()

_DEFAULTS = ExperimentConfig()


# Every flag of the groups below: name -> (type, help). The type is bool, int, float, str,
# or the tuple of allowed values of an enum flag. A flag's default is that of the
# `ExperimentConfig` field of its name, unless its group passes another.
_FLAGS = {
    # define_run_flags
    "output_dir": (str, "Run folder: checkpoints, TensorBoard, results. Restarting with the "
                   "same folder resumes the run."),
    "seed": (int, "Seed of initialisation, training data and noise."),
    "epochs": (int, "Epochs."),
    "steps_per_epoch": (int, "Training steps per epoch."),
    "batch_size": (int, "Batch size."),
    "learning_rate": (float, "Learning rate of the optimiser."),
    "strategy": (STRATEGIES, "tf.distribute strategy."),
    "num_cpu_devices": (int, "Split the CPU into this many logical devices (0: leave as is), "
                        "e.g. to try --strategy=mirrored without GPUs."),
    "deterministic_ops": (bool, "tf.config.experimental.enable_op_determinism()."),
    "stop_after_epochs": (int, "Stop (as if interrupted) after this many epochs; rerun "
                          "without it to resume. For tests."),
    "verbose": (int, "Keras verbosity: 0 silent, 1 progress bar, 2 one line per epoch."),
    # define_relaxation_flags
    "method": (str, "Relaxed sorting operator: a family with a relaxed permutation "
               "matrix (softsort, neuralsort, sinkhorn, lapsum, sorting_network, or one registered "
               "by a module of --family_modules)."),
    "temperature": (float, "The family's temperature (tau, epsilon, alpha, steepness, ...); "
                    "default: the binary's for the family (large-MNIST: 1024 for n <= 7, "
                    "else 128, on the raw CNN scores, SoftSort paper; its inverse for a "
                    "steepness; Sinkhorn's epsilon: 100 on the raw scores, 0.005 on "
                    "squashed ones, Cuturi et al.; kNN: 0.1)."),
    "method_kwargs": (str, "The family's own settings as a JSON object, merged over the "
                      "large-MNIST binaries' defaults (Sinkhorn: '{\"squash\": null}', the raw CNN "
                      "scores), e.g. '{\"squash\": \"logistic\"}' or "
                      "'{\"network\": \"bitonic\"}' (sorting networks)."),
    "family_modules": (str, "Comma-separated modules to import before the flags are "
                       "checked: modules that register families (ss.register_family) "
                       "whose names --method then accepts."),
    "log_cross_entropy": (bool, "Sorting loss from log P-hat (SoftSort, NeuralSort, "
                          "Sinkhorn), without the probability floor."),
    "stochastic": (bool, "Train with Gumbel-perturbed scores (reparameterised Plackett-Luce)."),
    "num_samples": (int, "Gumbel samples per sequence (stochastic)."),
    # define_large_mnist_flags
    "task": (TASKS, "Large-MNIST task."),
    "n": (int, "Numbers per sequence."),
    "dataset": (SOURCES, "Digit source: embedded (scikit-learn digits, offline), tfds, npz."),
    "mnist_npz": (str, "npz with x_train/y_train/x_test/y_test (--dataset=npz; implied when "
                  "given)."),
    "digits_per_class": (int, "Keep only this many digit images per class and split "
                         "(quick runs)."),
    "eval_seed": (int, "Seed of the validation and test sequences (fixed across runs)."),
    "num_val_sequences": (int, "Validation sequences."),
    "num_test_sequences": (int, "Test sequences."),
    # define_speed_flags
    "precision": (PRECISIONS, "Dtype policy of the CNN (mixed_bfloat16: ~2x faster on CPUs "
                  "with AVX-512 BF16; scores, operator and loss stay float32)."),
    "lr_schedule": (LR_SCHEDULES, "constant (published) or cosine: linear warm-up over "
                    "--warmup_steps, then cosine decay to 0 at the last step of --epochs."),
    "warmup_steps": (int, "Warm-up steps of --lr_schedule=cosine."),
    "patience": (int, "Stop when validation has not improved for this many epochs (None: "
                 "train all epochs)."),
    "max_train_minutes": (float, "Stop after the epoch at which training (all sessions, "
                          "validation included) has taken this long."),
    "save_every_epoch": (bool, "Keep every epoch's weights (scripts/time_to_accuracy.py)."),
    "jit_compile": (bool, "XLA-compile the train step (ignored under --deterministic_ops, "
                    "which Keras runs without XLA)."),
}
_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
           str: flags.DEFINE_string}


def _validate(name: str) -> None:
    """Registers `checks.setting_error` as the validator of the flag `name`."""
    def checker(value):
        error = checks.setting_error(name, value)
        if error:
            raise flags.ValidationError(error)
        return True

    flags.register_validator(name, checker)


def _define(names: tuple[str, ...], defaults: dict | None = None,
            notes: dict[str, str] | None = None) -> None:
    """Defines the flags `names` of `_FLAGS`, each validated with `checks.setting_error`.

    Args:
      names: keys of `_FLAGS`.
      defaults: name -> default, for flags whose default is not the `ExperimentConfig`
        field's.
      notes: name -> text appended to the flag's help (`"Batch size; <text>."`).
    """
    defaults, notes = defaults or {}, notes or {}
    for name in names:
        kind, help_text = _FLAGS[name]
        if name in notes:
            help_text = f"{help_text.removesuffix('.')}; {notes[name]}."
        default = defaults[name] if name in defaults else getattr(_DEFAULTS, name)
        if isinstance(kind, tuple):
            flags.DEFINE_enum(name, default, kind, help_text)
        else:
            _DEFINE[kind](name, default, help_text)
        _validate(name)


def _multi_validate(names: list[str], error_fn: Callable[..., str | None]) -> None:
    """Registers `error_fn(*values)` (a message or None) on the flags `names`."""
    def checker(values):
        error = error_fn(*(values[name] for name in names))
        if error:
            raise flags.ValidationError(error)
        return True

    flags.register_multi_flags_validator(names, checker)


def define_run_flags(*, epochs: int = _DEFAULTS.epochs, steps_per_epoch: int | None = None,
                     batch_size: int | None = None, learning_rate: float | None = None,
                     seed: int = _DEFAULTS.seed, defaults_help: dict[str, str] | None = None
                     ) -> None:
    """Defines the flags of a training run (folder, seed, budget, optimiser, devices).

    Flags: `output_dir` (required), `seed`, `epochs`, `steps_per_epoch`, `batch_size`,
    `learning_rate`, `strategy`, `num_cpu_devices`, `deterministic_ops`,
    `stop_after_epochs`, `verbose`.

    Args:
      epochs, steps_per_epoch, batch_size, learning_rate, seed: the binary's defaults
        (None: the binary picks one itself; say which in `defaults_help`).
      defaults_help: flag name -> text appended to its help, e.g.
        `{"batch_size": "default 20"}`.
    """
    _define(("output_dir", "seed", "epochs", "steps_per_epoch", "batch_size", "learning_rate",
             "strategy", "num_cpu_devices", "deterministic_ops", "stop_after_epochs",
             "verbose"),
            defaults=dict(output_dir=None, seed=seed, epochs=epochs,
                          steps_per_epoch=steps_per_epoch, batch_size=batch_size,
                          learning_rate=learning_rate, verbose=1),
            notes=defaults_help)
    flags.mark_flag_as_required("output_dir")


def define_relaxation_flags() -> None:
    """Defines the relaxed sorting operator's flags: `method`, `temperature`,
    `method_kwargs`, `family_modules`, `log_cross_entropy`, `stochastic`, `num_samples`."""
    _define(("method", "temperature", "method_kwargs", "log_cross_entropy", "stochastic",
             "num_samples"))
    _define(("family_modules",), defaults=dict(family_modules=None))


def define_large_mnist_flags(task: str | None) -> None:
    """Defines the large-MNIST data flags of `task` ('sort', 'median', or None: a
    `--task` flag chooses): `n`, `dataset`, `mnist_npz`, `digits_per_class`,
    `eval_seed`, `num_val_sequences`, `num_test_sequences`."""
    _define(("task",) if task is None else ())
    _define(("n", "dataset", "mnist_npz", "digits_per_class", "eval_seed", "num_val_sequences",
             "num_test_sequences"),
            notes=None if task == "sort" else {"n": "odd for the median"})
    if task is None:
        _multi_validate(["task", "n"], n_error)
    else:
        flags.register_validator("n", lambda n: n_error(task, n) is None,
                                 "n must be odd for the median task.")
    _multi_validate(["dataset", "mnist_npz"], dataset_error)


def define_speed_flags() -> None:
    """Defines the flags of the faster large-MNIST schedules (defaults: the published
    protocol): `precision`, `lr_schedule`, `warmup_steps`, `patience`,
    `max_train_minutes`, `save_every_epoch`, `jit_compile`."""
    _define(("precision", "lr_schedule", "warmup_steps", "patience", "max_train_minutes",
             "save_every_epoch", "jit_compile"))


def define_flags(task: str | None) -> None:
    """Defines the flags of the large-MNIST binary of `task` ('sort', 'median', or None:
    a `--task` flag chooses, as in `scripts/tune.py`)."""
    sort = task == "sort"

    def per_task(sort_value, median_value) -> str:
        if task is None:
            return f"default {sort_value} (sort) / {median_value} (median)"
        return f"default {sort_value if sort else median_value}"

    define_large_mnist_flags(task)
    define_relaxation_flags()
    define_speed_flags()
    define_run_flags(defaults_help={
        "epochs": "published protocol: 100",
        "learning_rate": per_task(0.005, 0.001),
        "batch_size": per_task(20, 5) + " sequences",
        "steps_per_epoch": "55000 / (4 * batch_size): " + per_task(687, 2750)
                           + " with the default batch"})


def dataclass_from_flags(cls, **overrides):
    """An instance of the dataclass `cls` whose fields take the values of the flags of
    the same name (fields without a flag keep their defaults; `overrides` win)."""
    f = flags.FLAGS
    values = {field.name: f[field.name].value for field in dataclasses.fields(cls)
              if field.name in f}
    return cls(**{**values, **overrides})


def config_from_flags(task: str | None = None) -> ExperimentConfig:
    """The `ExperimentConfig` of the parsed flags (`task` None: the `--task` flag's)."""
    task = task or flags.FLAGS["task"].value
    config = dataclass_from_flags(ExperimentConfig, task=task)
    if config.mnist_npz and not flags.FLAGS["dataset"].present:
        config.dataset = "npz"
    return config


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's parser; an unexpected positional argument is a one-line error as well."""
    rest = app.parse_flags_with_usage(argv)
    if len(rest) > 1:
        sys.stderr.write(f"FATAL Flags parsing error: unexpected arguments {rest[1:]}\n"
                         "Pass --helpshort or --helpfull to see help on flags.\n")
        sys.exit(1)
    return rest


def _one_log_handler() -> None:
    """Leaves absl's handler (on the root logger) as the only one printing TF's logs.

    TensorFlow gives its logger a stream handler of its own when it is first used
    before absl's handler is installed; its records then also propagate to the root
    logger, so every TF log line was printed twice.
    """
    logger = tf.get_logger()
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.propagate = True


def import_family_modules(argv: list[str]) -> None:
    """Imports the modules of `--family_modules=a.b,path/to/c.py` in `argv` (module names
    or Python files), before absl parses the flags, so that `--method` is checked against
    the families they register."""
    import importlib
    import importlib.util
    import os

    for argument in argv[1:]:
        if not argument.startswith("--family_modules="):
            continue
        for module in filter(None, (m.strip() for m in argument.split("=", 1)[1].split(","))):
            if module.endswith(".py"):
                name = os.path.splitext(os.path.basename(module))[0]
                spec = importlib.util.spec_from_file_location(name, module)
                loaded = importlib.util.module_from_spec(spec)
                sys.modules[name] = loaded
                spec.loader.exec_module(loaded)
            else:
                importlib.import_module(module)


def run_binary(main: Callable[[list[str]], None]) -> None:
    """`absl.app.run(main)` for the experiment binaries: flag errors (positional
    arguments included) are one line, and each log line is printed once. The modules of
    `--family_modules` are imported first."""

    def main_with_one_log_handler(argv):
        _one_log_handler()
        return main(argv)

    import_family_modules(sys.argv)
    app.run(main_with_one_log_handler, flags_parser=_parse_flags)

"""Allowed values of the experiment settings, written once for configs and flags.

`setting_error(name, value)` says why a value is not allowed for a setting of that name
(`None`: it is allowed); a name means one thing in every binary. The experiment configs
raise it as a `ValueError` (`check_config`, from their `finalize`); the binaries' flags
(`softsort_tf.experiments.flags`) register it as an absl validator, so that a bad flag
value is a one-line error naming the flag.

A value of `None` always passes: it stands for "the task's default".

Example:
>>> setting_error("epochs", 0)
'epochs must be an int >= 1, got 0.'
>>> setting_error("temperature", "0.1")
"temperature must be a finite number > 0, got '0.1'."
>>> setting_error("temperature", 0.1) is None
True
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os

__all__ = ["check_config", "check_settings", "setting_error"]

# name -> smallest allowed int.
_INTS = {
    "n": 2, "epochs": 1, "steps_per_epoch": 1, "batch_size": 1, "num_samples": 1,
    "num_val_sequences": 1, "num_test_sequences": 1, "digits_per_class": 1,
    "stop_after_epochs": 1, "num_cpu_devices": 0, "max_trials": 1,
    "executions_per_trial": 1, "warmup_steps": 0, "patience": 1,
    # kNN, top-k, ranking
    "k": 1, "num_queries": 1, "num_candidates": 1, "num_val_episodes": 1,
    "limit_per_split": 1, "num_targets": 1, "num_seeds": 1, "num_features": 1,
    "num_train_queries": 1, "num_val_queries": 1, "num_test_queries": 1,
    # SUQUAN
    "validation_size": 1, "train_size": 1, "val_size": 1, "num_levels": 1, "steps": 1,
    "eval_every": 1, "kernel_test_per_class": 1, "kernel_block": 1, "cv_folds": 2,
    "stop_after_pairs": 0,
}
# Finite numbers > 0.
_POSITIVE = ("temperature", "tau", "epsilon", "learning_rate", "max_train_minutes")
_VERBOSITY = (0, 1, 2, "auto")


def setting_error(name: str, value) -> str | None:
    """Why `value` is not allowed for the setting `name`; None when it is (or unknown).

    Args:
      name: the setting (config field / flag name), e.g. `'epochs'`.
      value: its value.

    Returns:
      A one-sentence message naming the setting, the allowed range and the value, or
      None.
    """
    if value is None:
        return None
    if name in _INTS:
        low = _INTS[name]
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            return f"{name} must be an int >= {low}, got {value!r}."
    elif name in _POSITIVE:
        if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                or not math.isfinite(value) or value <= 0):
            return f"{name} must be a finite number > 0, got {value!r}."
    elif name == "verbose":
        if value not in _VERBOSITY or isinstance(value, bool):
            return f"verbose must be one of {_VERBOSITY}, got {value!r}."
    elif name == "method":
        from softsort_tf.experiments.models import permutation_methods  # registered now

        if value not in permutation_methods():
            return (f"method must be one of {permutation_methods()} (the families "
                    f"with a relaxed permutation matrix), got {value!r}.")
    elif name == "mnist_npz":
        if not os.path.isfile(value):
            return f"mnist_npz={value!r} is not a file."
    return None


def check_settings(settings: dict) -> None:
    """Raises a ValueError for the first setting of `settings` that is not allowed."""
    for name, value in settings.items():
        error = setting_error(name, value)
        if error:
            raise ValueError(error)


def check_config(config, **choices: tuple) -> None:
    """Raises a ValueError for the first field of the dataclass `config` that is not
    allowed: a field named in `choices` (name=allowed values) outside its values (for a
    tuple or list field: any of its items), or any field `setting_error` rejects.

    Example:
    >>> @dataclasses.dataclass
    ... class Config:
    ...     loss: str = "mse"
    ...     epochs: int = 0
    >>> check_config(Config(), loss=("mse", "mae"))
    Traceback (most recent call last):
    ...
    ValueError: epochs must be an int >= 1, got 0.
    """
    for name, allowed in choices.items():
        value = getattr(config, name)
        several = isinstance(value, (tuple, list))
        for item in value if several else (value,):
            if item not in allowed:
                rule = "be among" if several else "be one of"
                raise ValueError(f"{name} must {rule} {allowed}, got {item!r}.")
    check_settings(dataclasses.asdict(config))

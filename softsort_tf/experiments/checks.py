"""Allowed values of the experiment settings, written once for configs and flags.

`setting_error(name, value)` says why a value is not allowed for a setting of that name
(`None`: it is allowed). The experiment configs (`ExperimentConfig.finalize`) raise it as
a `ValueError`; the binaries' flags (`softsort_tf.experiments.flags`) register it as an
absl validator, so that a bad flag value is a one-line error naming the flag.

A value of `None` always passes: it stands for "the task's default".

Example:
>>> setting_error("epochs", 0)
'epochs must be an int >= 1, got 0.'
>>> setting_error("epsilon", "0.1")
"epsilon must be a finite number > 0, got '0.1'."
>>> setting_error("epsilon", 0.1) is None
True
"""

from __future__ import annotations

import math
import numbers
import os

__all__ = ["check_settings", "setting_error"]

# name -> smallest allowed int.
_INTS = {
    "n": 2, "epochs": 1, "steps_per_epoch": 1, "batch_size": 1, "num_samples": 1,
    "num_val_sequences": 1, "num_test_sequences": 1, "digits_per_class": 1,
    "stop_after_epochs": 1, "num_cpu_devices": 0, "max_trials": 1,
    "executions_per_trial": 1, "warmup_steps": 0, "patience": 1,
}
# Finite numbers > 0.
_POSITIVE = ("tau", "epsilon", "alpha", "steepness", "learning_rate", "max_train_minutes")
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

"""The base class of the Sinkhorn losses: one `SinkhornOptions`, validated once."""

from __future__ import annotations

import warnings

import keras
import numpy as np

from softsort_tf.options import OptionFieldsMixin, SinkhornOptions

_DEPRECATED = {"cost_power": "power"}


def full_precision_dtype(dtype=None):
    """`dtype` (a dtype or policy name, None for the global policy), or 'float32' where
    it computes in float16/bfloat16: the relaxed permutations, the Sinkhorn operators
    and their losses are computed and returned in float32 under a mixed precision
    policy (their gradients, ≈ 1/P̂ for a cross-entropy, overflow float16)."""
    policy = keras.dtype_policies.get(dtype) if dtype is not None else (
        keras.config.dtype_policy())
    return "float32" if policy.compute_dtype in ("float16", "bfloat16") else dtype


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False, got {value!r}.")
    return bool(value)


def _legacy_option_kwargs(kwargs: dict) -> dict:
    """Maps the former loss arguments `cost_power` and `solver_options` (a dict of
    advanced solver settings) onto the fields of `SinkhornOptions`, with a warning."""
    kwargs = dict(kwargs)
    for old, new in _DEPRECATED.items():
        if old in kwargs:
            warnings.warn(f"`{old}` is deprecated: pass `{new}` (a field of SinkhornOptions).",
                          DeprecationWarning, stacklevel=4)
            kwargs[new] = kwargs.pop(old)
    solver_options = kwargs.pop("solver_options", None)
    if solver_options:
        fields = SinkhornOptions.field_names()
        if not isinstance(solver_options, dict) or set(solver_options) - set(fields):
            raise ValueError(f"`solver_options` must be a dict of SinkhornOptions fields "
                             f"{list(fields)}, got {solver_options!r}.")
        warnings.warn("`solver_options` is deprecated: pass its entries as keyword "
                      "arguments or `options=SinkhornOptions(...)`.", DeprecationWarning,
                      stacklevel=4)
        kwargs.update(solver_options)
    return kwargs


class _SinkhornLoss(keras.losses.Loss, OptionFieldsMixin):
    """A Keras loss over Sinkhorn operators: holds one validated `SinkhornOptions`.

    Args:
      options: a `SinkhornOptions` (or its config dict); default `SinkhornOptions()`.
      reduction, name, dtype: as in `keras.losses.Loss` (a float16/bfloat16 dtype or
        policy computes in float32, see `full_precision_dtype`).
      **kwargs: fields of `SinkhornOptions` (`epsilon`, `power`, `threshold`,
        `max_iterations`, `implicit`, `squash`, ...) overriding those of `options`.

    The options are part of `get_config()`, one key per field.
    """

    def __init__(self, *, options: SinkhornOptions | dict | None = None, reduction, name,
                 dtype, **kwargs):
        super().__init__(name=name, reduction=reduction, dtype=full_precision_dtype(dtype))
        self.options, unknown = SinkhornOptions.split_kwargs(_legacy_option_kwargs(kwargs),
                                                             options)
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected arguments "
                            f"{sorted(unknown)}; its Sinkhorn options are "
                            f"{list(SinkhornOptions.field_names())}.")

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(self.options.get_config())
        return config

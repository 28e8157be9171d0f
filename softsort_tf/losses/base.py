"""The base class of the Sinkhorn losses: one `SinkhornOptions`, validated once."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import tensorflow as tf

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


def keras_mask(x):
    """The Keras mask attached to a tensor by a masking layer (None without one)."""
    return getattr(x, "_keras_mask", None)


class ItemMaskMixin:
    """For losses of lists `[..., n]` with one value per list: a Keras mask of `y_pred`
    of its shape (one flag per item, e.g. from `keras.layers.Masking` on the items) is
    the padding of the lists (softsort_tf._masking), not a mask of the per-list losses.

    `__call__` takes the mask off `y_pred` (Keras would multiply the per-list losses
    `[...]` by it) and hands it to `call` with the targets, as `y_true = (targets,
    mask)`; `call` reads it back with `split_item_mask`. Keras then reduces the losses
    as usual (`sample_weight` per list). Masks of another shape are left to Keras.
    """

    def __call__(self, y_true, y_pred, sample_weight=None):
        mask = keras_mask(y_pred)
        if mask is not None and mask.shape.rank == y_pred.shape.rank:
            y_pred = tf.identity(y_pred)  # the same values without the Keras mask
            y_true = (y_true, mask)
        return super().__call__(y_true, y_pred, sample_weight)


def split_item_mask(y_true):
    """`(targets, item mask or None)` of the `y_true` that `ItemMaskMixin` passes to
    `call`."""
    if isinstance(y_true, tuple):
        targets, mask = y_true
        return targets, tf.cast(mask, tf.bool)
    return y_true, None


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

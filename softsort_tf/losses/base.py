"""Base classes of the losses: a Keras loss that wraps its functional form.

`LossFunctionWrapper` (the pattern of Keras' own losses) holds a functional form
`fn(y_true, y_pred, **kwargs)` and its validated keyword arguments, which are its
config; `y_pred` must be a real tensor (checked before Keras casts it). `ListLoss` is
the one base of the losses of ranked lists (the shape of Keras-RS's list losses): it
reads Keras-RS's `y_true = {"labels": ..., "mask": ...}` and the Keras mask of `y_pred`
(one flag per item) and checks labels, scores and mask once per call
(`softsort_tf._lists.check_lists`), so a subclass gives its per-list maths alone.
`SinkhornLoss` takes the Sinkhorn settings, validated once at construction.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

import keras
import tensorflow as tf

from softsort_tf import _checks, _keras
from softsort_tf._keras import full_precision_dtype, get_keras_mask
from softsort_tf._lists import check_lists, lists_checked
from softsort_tf.ops.sinkhorn import SINKHORN, SinkhornSettings
from softsort_tf.options import SinkhornOptions

# The arguments `__call__` hands to `call` for one evaluation of a loss (a context
# variable, so that concurrent replicas of `tf.distribute` each see their own).
_CALL_ARGUMENTS: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "softsort_tf_loss_call_arguments", default=None)


class LossFunctionWrapper(keras.losses.Loss):
    """A Keras loss computed by a functional form `fn(y_true, y_pred, **kwargs)`.

    Args:
      fn: the functional form, returning one loss per example (or per list).
      reduction, name: as in `keras.losses.Loss`.
      dtype: as in `keras.losses.Loss`; a float16/bfloat16 dtype or policy computes
        in float32 (`softsort_tf._keras.full_precision_dtype`).
      **kwargs: the (validated) keyword arguments of `fn`: the config, and attributes.

    Class attribute `item_mask`: if True, a Keras mask of `y_pred` of its own shape is
    the padding of the lists, passed to `fn` as `mask=` (Keras would otherwise weight
    the per-list losses by it).
    """

    item_mask: bool = False

    def __init__(self, fn: Callable, *, reduction="sum_over_batch_size", name=None,
                 dtype=None, **kwargs):
        super().__init__(name=name, reduction=reduction, dtype=full_precision_dtype(dtype))
        self.fn = fn
        self.fn_kwargs = kwargs
        self.__dict__.update(kwargs)

    def call_arguments(self, y_pred, sample_weight=None) -> tuple[object, dict]:
        """`(y_pred, arguments of fn)` for one call: with `item_mask`, a Keras mask of
        `y_pred`'s shape is taken off `y_pred` (Keras would weight the per-list losses
        by it) and becomes `mask`."""
        del sample_weight
        mask = get_keras_mask(y_pred) if self.item_mask else None
        if mask is None or mask.shape.rank != y_pred.shape.rank:
            return y_pred, {}
        return tf.identity(y_pred), {"mask": tf.cast(mask, tf.bool)}

    def __call__(self, y_true, y_pred, sample_weight=None):
        y_pred, arguments = self.call_arguments(y_pred, sample_weight)
        if not isinstance(y_pred, tf.RaggedTensor):
            y_pred = tf.convert_to_tensor(y_pred)
        _checks.check_real_dtype("y_pred", y_pred.dtype)
        return self._call_with(arguments, y_true, y_pred, sample_weight)

    def _call_with(self, arguments: dict, y_true, y_pred, sample_weight):
        """Keras' `__call__` with `arguments` handed to `fn` (see `call`)."""
        token = _CALL_ARGUMENTS.set(arguments)
        try:
            return super().__call__(y_true, y_pred, sample_weight)
        finally:
            _CALL_ARGUMENTS.reset(token)

    def call(self, y_true, y_pred):
        return self.fn(y_true, y_pred, **self.fn_kwargs, **(_CALL_ARGUMENTS.get() or {}))

    def get_config(self) -> dict:
        return {**super().get_config(), **self.fn_kwargs}


class ListLoss(LossFunctionWrapper):
    """The one base of the losses of ranked lists: labels, scores `[..., n]` and mask
    are checked once per call and handed to `fn` as `(labels, scores, mask=)`, which
    returns one loss per list. A subclass that also takes `method=` lists `ListLoss`
    first (`class SoftNDCGLoss(ListLoss, MethodLoss)`)."""

    item_mask = True

    def __call__(self, y_true, y_pred, sample_weight=None):
        y_pred, arguments = self.call_arguments(y_pred, sample_weight)
        y_true, y_pred, mask = check_lists(y_true, y_pred, arguments.get("mask"))
        if mask is not None:
            arguments = {**arguments, "mask": mask}
        with lists_checked():  # checked above: the functional form only unpacks them
            return self._call_with(arguments, y_true, y_pred, sample_weight)


class SinkhornLoss(LossFunctionWrapper):
    """A `LossFunctionWrapper` whose `fn` runs Sinkhorn operators.

    Args:
      fn: the functional form; it receives `options`, `squash` and `targets`.
      fn_kwargs: its other (validated) keyword arguments.
      reduction, name, dtype: as in `LossFunctionWrapper`.
      **settings: `options` (a `SinkhornOptions` or its config dict), `squash` and
        `targets` (as in `sinkhorn_rank`), and fields of `SinkhornOptions` (`epsilon`,
        ...) overriding those of `options`; another name raises a `TypeError`.

    The config holds `fn_kwargs`, the fields of the options, `squash` and `targets`. ε
    must be one the compute dtype resolves (`Family.temperature_range`).
    """

    def __init__(self, fn: Callable, fn_kwargs: dict, *, reduction="sum_over_batch_size",
                 name=None, dtype=None, **settings):
        settings, _, rest = SinkhornSettings.create(SINKHORN, None, None, settings)
        if rest:
            raise TypeError(f"Unknown Sinkhorn option(s) {sorted(rest)}; the options are "
                            f"{list(SinkhornOptions.field_names())}.")
        super().__init__(fn, reduction=reduction, name=name, dtype=dtype, **fn_kwargs,
                         **settings.operator_kwargs())
        settings.check_temperature(None, _keras.compute_dtype(dtype))

    @property
    def options(self) -> SinkhornOptions | None:
        """The validated `SinkhornOptions` (None for a loss that runs no Sinkhorn)."""
        return self.fn_kwargs.get("options")

    def get_config(self) -> dict:
        config = super().get_config()
        options = config.pop("options", None)
        if options is not None:
            config.update(options.get_config())
        return config

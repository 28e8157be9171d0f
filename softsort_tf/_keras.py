"""Keras contracts shared by the layers and losses: the compute dtype (float32 under a
float16/bfloat16 policy: a cross-entropy's gradient, ≈ 1/P̂, overflows float16), the
Keras mask as an operator mask, output masks and shapes, and the `method=` arguments
(`MethodArguments`: the family's temperature, checked in the range of the compute
dtype, and its `Settings`; a setting of another family, or padding reaching a family
without masks, is refused)."""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from softsort_tf import _checks
from softsort_tf.ops.family import Family, Settings, get_family

try:  # Keras' accessor of a tensor's mask (public where the installed Keras exports it)
    from keras.backend import get_keras_mask as _keras_get_mask
except ImportError:
    try:  # Keras 3.6 - 3.x: private only
        from keras.src.backend import get_keras_mask as _keras_get_mask
    except ImportError:  # Keras < 3.6 keeps a tensor's mask in its `_keras_mask` attribute
        def _keras_get_mask(x):
            return getattr(x, "_keras_mask", None)


def full_precision_dtype(dtype=None):
    """'float32' if `dtype` computes in float16/bfloat16, else `dtype` unchanged.

    Args:
      dtype: a dtype or `keras.DTypePolicy` (or its name); None reads the global policy
        (`keras.config.dtype_policy()`), and is returned unchanged unless that policy
        computes in float16/bfloat16.

    Example:
    >>> full_precision_dtype("mixed_float16"), full_precision_dtype("float64")
    ('float32', 'float64')
    """
    policy = keras.dtype_policies.get(dtype) if dtype is not None else (
        keras.config.dtype_policy())
    return "float32" if policy.compute_dtype in ("float16", "bfloat16") else dtype


def full_precision_layer_kwargs(kwargs: dict) -> dict:
    """A layer's base keywords with its dtype float32 under a float16/bfloat16 policy
    (given as `dtype` or global), else unchanged: every layer computes and returns
    float32 then, so that ranks, sorts and matrices keep their resolution.

    Example:
    >>> full_precision_layer_kwargs({"dtype": "mixed_bfloat16", "name": "r"})
    {'dtype': 'float32', 'name': 'r'}
    """
    if "dtype" in kwargs or full_precision_dtype() == "float32":
        kwargs = {**kwargs, "dtype": full_precision_dtype(kwargs.get("dtype"))}
    return kwargs


def compute_dtype(dtype=None) -> str:
    """The dtype a loss or layer built with `dtype` computes in: that of its policy
    (`full_precision_dtype` first), or of `keras.config.floatx()` for None.

    Example:
    >>> compute_dtype("mixed_float16"), compute_dtype("float64")
    ('float32', 'float64')
    """
    dtype = full_precision_dtype(dtype)
    return keras.dtype_policies.get(dtype or keras.config.floatx()).compute_dtype


def layer_compute_dtype(layer_or_loss) -> str:
    """The dtype a Keras layer or loss computes its operators in: that of its dtype
    policy, float32 for a float16/bfloat16 one (`compute_dtype`)."""
    return compute_dtype(getattr(layer_or_loss, "dtype_policy", None) or layer_or_loss.dtype)


def get_keras_mask(x):
    """The Keras mask attached to `x` (a boolean tensor; Keras' own accessor), or None."""
    return _keras_get_mask(x)


def broadcast_keras_mask(inputs, mask):
    """A Keras mask as an operator mask: cast to bool and, when it lacks the input's last
    axis (Keras' `[batch, steps]` mask of `[batch, steps, features]`), broadcast along it."""
    if isinstance(mask, tf.RaggedTensor) or isinstance(inputs, tf.RaggedTensor):
        return mask
    mask = tf.cast(mask, tf.bool)
    inputs = tf.convert_to_tensor(inputs)
    if mask.shape.rank is not None and inputs.shape.rank is not None and \
            mask.shape.rank == inputs.shape.rank - 1:
        mask = tf.broadcast_to(mask[..., None], tf.shape(inputs))
    return mask


def sorted_mask(inputs, mask, axis: int, length: int | None = None):
    """The mask of a sorted output: True at the first n_valid positions along `axis`
    (the input mask sorted valid-first; `keras.ops`, for symbolic tensors too), its
    first `length` positions only if given (a top-k)."""
    ops = keras.ops
    mask = ops.cast(mask, "bool")
    if len(mask.shape) == len(inputs.shape) - 1:
        mask = ops.logical_and(ops.expand_dims(mask, -1), ops.ones_like(inputs, "bool"))
    prefix = ops.equal(ops.sort(ops.cast(ops.logical_not(mask), "int32"), axis=axis), 0)
    return prefix if length is None else ops.take(prefix, ops.arange(length), axis=axis)


def replace_axis(shape, axis: int, size) -> tuple:
    """`shape` with its `axis` of length `size`, or without it for None."""
    shape = list(shape)
    axis = _checks.check_axis(axis, len(shape))
    if size is None:
        del shape[axis]
    else:
        shape[axis] = size
    return tuple(shape)


def check_temperature(method: str, temperature, dtype=None, *, name: str = "temperature"):
    """`temperature` validated for `method` (`Family.check_temperature`)."""
    return get_family(method).check_temperature(temperature, dtype, name=name)


def check_padding(method: str, padded: bool, what: str) -> None:
    """Raises a `ValueError` if `padded` and `method` takes no mask; `what` says where
    the padding comes from."""
    if padded and not get_family(method).masks:
        raise ValueError(f"method={method!r} takes no mask, but {what} marks padding: pass "
                         f"lists without padding (and no mask), or use another method "
                         f"(e.g. 'lapsum').")


@dataclasses.dataclass
class MethodArguments:
    """The validated `method` arguments of a layer or loss: the `family`, its
    `settings`, the `temperature` kept (None: the family's default, or held by the
    settings) and the one `given` (for the range check)."""

    family: Family
    settings: Settings
    temperature: object
    given: object

    @property
    def method(self) -> str:
        return self.family.name

    @classmethod
    def create(cls, method: str, temperature, method_kwargs, kwargs: dict,
               operation: str = "rank") -> tuple[MethodArguments, dict]:
        """`(arguments, rest)`: the family's arguments taken out of a constructor's
        keywords, validated; `rest` is the other keywords (those of the Keras base)."""
        family = get_family(method)
        given = family.check_temperature(temperature)
        settings, kept, rest = family.settings.create(family, given, method_kwargs, kwargs,
                                                      operation)
        return cls(family, settings, kept, given), rest

    def check_dtype(self, dtype) -> None:
        """The temperature (as given, or the settings' own) in the range of `dtype`."""
        self.settings.check_temperature(self.given, dtype)

    def operator_kwargs(self) -> dict:
        """The keywords of a front-door call: `method`, `temperature` and the settings'."""
        return dict(method=self.family.name, temperature=self.temperature,
                    **self.settings.operator_kwargs())

    def get_config(self) -> dict:
        """`method`, `temperature`, `method_kwargs` and the settings' own keys."""
        temperature = self.temperature
        if temperature is not None and not isinstance(temperature, float):
            temperature = float(temperature.numpy())  # a variable's current value
        return dict(method=self.family.name, temperature=temperature,
                    method_kwargs=dict(self.settings.method_kwargs),
                    **self.settings.get_config())

"""Keras layers of the front door: `RankLayer`, `SortLayer`, `TopKLayer` and
`QuantileLayer` call `soft_rank`, `soft_sort`, `soft_topk` and `soft_quantile` with
`method=` a key of `FAMILIES` (the arguments' rule: `softsort_tf._keras`).

Every argument is validated at construction and is part of `get_config()`; Keras masks
are the operators' `mask`; under a float16/bfloat16 policy the layers compute in float32.
"""

from __future__ import annotations

import keras

from softsort_tf import _checks, _docs, _keras
from softsort_tf._keras import (
    broadcast_keras_mask,
    full_precision_layer_kwargs,
    layer_compute_dtype,
    replace_axis,
    sorted_mask,
)
from softsort_tf.ops import soft

_PACKAGE = "softsort_tf"


@_docs.fill
class _SoftLayer(keras.layers.Layer):
    """Common arguments, call and config of the front-door layers.

    Args:
      {method}
      {temperature}
      {direction}
        Default: that of the operation.
      {axis}
        The axis of the full input, batch axis included.
      {method_kwargs}
      **kwargs: the family's settings when they are arguments of their own (Sinkhorn:
        `options`, `squash`, `targets` and the fields of `SinkhornOptions` such as
        `epsilon`) and the base `keras.layers.Layer` arguments (name, dtype, ...).
    """

    operation: str = ""
    _config_keys: tuple[str, ...] = ()  # the subclass's own arguments, kept as attributes

    def __init__(self, method: str = "sinkhorn", temperature=None,
                 direction: str | None = None, axis: int = -1,
                 method_kwargs: dict | None = None, **kwargs):
        arguments, layer_kwargs = _keras.MethodArguments.create(
            method, temperature, method_kwargs, kwargs, self.operation)
        super().__init__(**full_precision_layer_kwargs(layer_kwargs))
        arguments.check_dtype(layer_compute_dtype(self))
        self._arguments = arguments
        for name, value in arguments.settings.attributes().items():
            setattr(self, name, value)
        self.method = method
        self.temperature = arguments.temperature
        self.method_kwargs = dict(arguments.settings.method_kwargs)
        self.direction = _checks.check_direction(
            direction or ("DESCENDING" if self.operation == "topk" else "ASCENDING"))
        self.axis = _checks.check_int("axis", axis)
        self.supports_masking = True

    def _call(self, fn, inputs, *args, mask=None, **kwargs):
        if mask is not None:
            mask = broadcast_keras_mask(inputs, mask)
        return fn(inputs, *args, direction=self.direction, axis=self.axis, mask=mask,
                  **self._operator_kwargs(), **kwargs)

    def _operator_kwargs(self) -> dict:
        return self._arguments.operator_kwargs()

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(direction=self.direction, axis=self.axis,
                      **self._arguments.get_config(),
                      **{key: getattr(self, key) for key in self._config_keys})
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class RankLayer(_SoftLayer):
    """Soft 1-based ranks along `axis` (`soft_rank`).

    Input `[batch, n]` (any rank), output the same shape (0 at padded entries).

    Args: those of `_SoftLayer` ('ASCENDING' by default).

    Example:
    >>> layer = RankLayer("lapsum", temperature=0.01)
    >>> np.round(layer(np.array([[0.3, -1.0, 2.0]])).numpy())
    array([[2., 1., 3.]], dtype=float32)
    """

    operation = "rank"

    def call(self, inputs, mask=None):
        return self._call(soft.soft_rank, inputs, mask=mask)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SortLayer(_SoftLayer):
    """Soft-sorted values along `axis` (`soft_sort`).

    Input `[batch, n]` (any rank), output the same shape: with a mask, the n_valid
    sorted values first, then 0 (the output mask marks them).

    Args: those of `_SoftLayer` ('ASCENDING' by default).

    Example:
    >>> layer = SortLayer("lapsum", temperature=0.01, direction="DESCENDING")
    >>> np.round(layer(np.array([[0.3, -1.0, 2.0]])).numpy(), 2)
    array([[ 2. ,  0.3, -1. ]], dtype=float32)
    """

    operation = "sort"

    def call(self, inputs, mask=None):
        return self._call(soft.soft_sort, inputs, mask=mask)

    def compute_mask(self, inputs, mask=None):
        """True at the first n_valid positions along `axis` (None without a mask)."""
        if mask is None:
            return None
        return sorted_mask(inputs, mask, _checks.check_axis(self.axis, len(inputs.shape)))


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TopKLayer(_SoftLayer):
    """Soft membership in the first k entries in `direction` order (`soft_topk`).

    Input `[batch, n]` (any rank), output the same shape: values in [0, 1] summing to k
    (min(k, n_valid) with a mask) along `axis` for 'sinkhorn' and 'lapsum'.

    Args:
      k: the number of entries selected, in [1, n) (a real k > 0 for 'lapsum').
      method, temperature, direction ('DESCENDING' by default), ...: see `_SoftLayer`.

    Example:
    >>> layer = TopKLayer(2, "lapsum", temperature=0.01)
    >>> np.round(layer(np.array([[0.1, 3.0, -1.0, 2.0]])).numpy())
    array([[0., 1., 0., 1.]], dtype=float32)
    """

    operation = "topk"
    _config_keys = ("k",)

    def __init__(self, k=1, method: str = "sinkhorn", temperature: float | None = None,
                 **kwargs):
        super().__init__(method, temperature, **kwargs)
        self.k = self._arguments.family.check_k(k)  # against n at the call

    def call(self, inputs, mask=None):
        return self._call(soft.soft_topk, inputs, self.k, mask=mask)

@keras.saving.register_keras_serializable(package=_PACKAGE)
class QuantileLayer(_SoftLayer):
    """Soft quantiles along `axis` (`soft_quantile`).

    Input `[batch, n]`; output `[batch, q]` (the axis replaced by the q levels), or
    `[batch]` for a scalar `quantiles`. No output mask.

    Args:
      quantiles: a level or an increasing sequence of levels in (0, 1).
      method, temperature, direction ('ASCENDING' by default; 'DESCENDING' gives the
        quantile from the top), ...: see `_SoftLayer`.

    Example:
    >>> layer = QuantileLayer(0.5, "lapsum", temperature=0.01)
    >>> round(float(layer(np.array([[5.0, 1.0, 3.0, 2.0, 4.0]]))[0]), 2)
    3.0
    """

    operation = "quantile"
    _config_keys = ("quantiles",)

    def __init__(self, quantiles=0.5, method: str = "sinkhorn",
                 temperature: float | None = None, **kwargs):
        super().__init__(method, temperature, **kwargs)
        levels, scalar = _checks.check_quantiles(quantiles)
        self.quantiles = float(levels[0]) if scalar else [float(q) for q in levels]

    def call(self, inputs, mask=None):
        return self._call(soft.soft_quantile, inputs, self.quantiles, mask=mask)

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        size = None if isinstance(self.quantiles, float) else len(self.quantiles)
        return replace_axis(input_shape, self.axis, size)

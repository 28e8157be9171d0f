"""Keras layers over the Sinkhorn operators of `softsort_tf.ops.sinkhorn`: the
front-door layers (`softsort_tf.layers.soft`) with method='sinkhorn', calling the
Sinkhorn operators with their own options (`zero_based`, `topk`, `width`, ...) and a
config without the front door's `method`, `temperature` and `method_kwargs`.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from softsort_tf import _checks, _docs
from softsort_tf._keras import replace_axis, sorted_mask
from softsort_tf.layers.soft import _SoftLayer
from softsort_tf.ops import sinkhorn as sinkhorn_ops
from softsort_tf.ops.sinkhorn import SINKHORN, SinkhornSettings
from softsort_tf.options import SinkhornOptions

_PACKAGE = "softsort_tf"


def sinkhorn_settings(kwargs: dict, options=None, squash="logistic",
                      targets: str = "regular") -> tuple[SinkhornSettings, dict]:
    """`(settings, rest)`: a Sinkhorn layer's validated settings and the other keyword
    arguments (those of `keras.layers.Layer`)."""
    settings, _, rest = SinkhornSettings.create(
        SINKHORN, None, None, {**kwargs, "options": options, "squash": squash,
                               "targets": targets})
    return settings, rest


@_docs.fill
class _SinkhornLayer(_SoftLayer):
    """Common arguments and config of the Sinkhorn layers.

    Args:
      {axis}
        The axis of the full input, batch axis included.
      {direction}
        Default 'ASCENDING'.
      options: a `SinkhornOptions` (or its config dict) with the solver settings.
      squash: how inputs are mapped into [0, 1] ('logistic', 'atan', 'robust' or None;
        see `softsort_tf.ops.squash`).
      targets: where the targets sit on [0, 1] ('regular' or 'centres').
      **kwargs: fields of `SinkhornOptions` (`epsilon`, `threshold`, ...), overriding
        those of `options` (ε in the range of the compute dtype), and the base
        `keras.layers.Layer` arguments (name, dtype, ...).
    """

    operation = "rank"  # the operation the settings are checked against

    def __init__(self, axis: int = -1, direction: str = "ASCENDING",
                 options: SinkhornOptions | dict | None = None, squash="logistic",
                 targets: str = "regular", **kwargs):
        super().__init__("sinkhorn", direction=direction, axis=axis, options=options,
                         squash=squash, targets=targets, **kwargs)

    def _operator_kwargs(self) -> dict:
        return self._arguments.settings.operator_kwargs()

    def get_config(self) -> dict:
        config = super().get_config()
        for key in ("method", "temperature", "method_kwargs"):
            del config[key]
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SinkhornRank(_SinkhornLayer):
    """Soft ranks in [1, n] (or [0, n − 1]) along `axis`; see `sinkhorn_rank`.

    Input shape `[batch, n]` (any rank), output the same shape.

    Args:
      zero_based: ranks in [0, n − 1] instead of [1, n].
      **kwargs: the Sinkhorn arguments of `_SinkhornLayer`.

    Example:
    >>> layer = SinkhornRank(epsilon=1e-3)
    >>> np.round(layer(np.array([[0.3, -1.0, 2.0]])).numpy())
    array([[2., 1., 3.]], dtype=float32)
    """

    _config_keys = ("zero_based",)

    def __init__(self, zero_based: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.zero_based = bool(zero_based)

    def call(self, inputs, mask=None):
        return self._call(sinkhorn_ops.sinkhorn_rank, inputs, mask=mask,
                          zero_based=self.zero_based)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SinkhornCDF(_SinkhornLayer):
    """The S-CDF in [0, 1] along `axis`; see `sinkhorn_cdf`.

    Input shape `[batch, n]` (any rank), output the same shape.

    Args:
      **kwargs: the Sinkhorn arguments of `_SinkhornLayer` (`axis`, `direction`,
        `options`, `squash`, `targets`, the `SinkhornOptions` fields such as
        `epsilon`) and those of `keras.layers.Layer`.

    Example:
    >>> layer = SinkhornCDF(epsilon=1e-3)
    >>> np.round(layer(np.array([[0.3, -1.0, 2.0, 1.0]])).numpy(), 2)
    array([[0.5 , 0.25, 1.  , 0.75]], dtype=float32)
    """

    def call(self, inputs, mask=None):
        return self._call(sinkhorn_ops.sinkhorn_cdf, inputs, mask=mask)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SinkhornSort(_SinkhornLayer):
    """Soft-sorted values along `axis`; see `sinkhorn_sort`.

    Input `[batch, n]`; output `[batch, m]` (m = `num_targets`, default n) or
    `[batch, k]` with `topk=k`.

    Args:
      topk: return only the first k values in `direction` order.
      num_targets: number of output values m.
      **kwargs: the Sinkhorn arguments of `_SinkhornLayer`.

    Example:
    >>> layer = SinkhornSort(direction="DESCENDING", topk=2, epsilon=1e-3)
    >>> np.round(layer(np.array([[0.3, -1.0, 2.0, 1.0]])).numpy(), 2)
    array([[2., 1.]], dtype=float32)
    """

    _config_keys = ("topk", "num_targets")

    def __init__(self, topk: int | None = None, num_targets: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if topk is not None:
            topk = _checks.check_positive_int("topk", topk)
        if num_targets is not None:
            num_targets = _checks.check_positive_int("num_targets", num_targets)
        if topk is not None and num_targets is not None:
            raise ValueError("`topk` and `num_targets` cannot both be set.")
        self.topk = topk
        self.num_targets = num_targets

    def call(self, inputs, mask=None):
        return self._call(sinkhorn_ops.sinkhorn_sort, inputs, mask=mask, topk=self.topk,
                          num_targets=self.num_targets)

    def compute_mask(self, inputs, mask=None):
        """True at the first n_valid (or min(k, n_valid)) positions along `axis`; None
        with `num_targets` or without a mask."""
        if mask is None or self.num_targets is not None:
            return None
        return sorted_mask(inputs, mask, _checks.check_axis(self.axis, len(inputs.shape)),
                           self.topk)

    def compute_output_shape(self, input_shape):
        size = self.topk or self.num_targets
        if size is None:
            return tuple(input_shape)
        return replace_axis(input_shape, self.axis, size)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SinkhornQuantile(_SinkhornLayer):
    """τ-S-quantiles along `axis` (paper eq. 4); see `sinkhorn_quantile`.

    Input `[batch, n]`; output `[batch, q]`, or `[batch]` for a scalar `quantiles`.

    Args:
      quantiles: a level or an increasing sequence of levels in (0, 1).
      width: mass of the bin around each level (default: see `quantile_target_weights`).
      **kwargs: the Sinkhorn arguments of `_SinkhornLayer`.

    Example:
    >>> layer = SinkhornQuantile(quantiles=0.5, epsilon=1e-4)
    >>> x = np.array([[3.0, 1.0, 4.0, 1.5, 5.0]])
    >>> round(float(layer(x)[0]), 2)
    3.0
    """

    _config_keys = ("quantiles", "width")

    def __init__(self, quantiles=0.5, width: float | None = None, **kwargs):
        super().__init__(**kwargs)
        levels, scalar = _checks.check_quantiles(quantiles)
        sinkhorn_ops.quantile_target_weights(levels, width)  # validates width
        self.quantiles = float(levels[0]) if scalar else [float(q) for q in levels]
        self.width = None if width is None else float(width)

    def call(self, inputs, mask=None):
        return self._call(sinkhorn_ops.sinkhorn_quantile, inputs, self.quantiles, mask=mask,
                          width=self.width)

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        size = None if isinstance(self.quantiles, float) else len(self.quantiles)
        return replace_axis(input_shape, self.axis, size)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SinkhornQuantileNormalization(_SinkhornLayer):
    """Soft quantile normalisation onto m learned, sorted target values (SUQUAN).

    Each input row keeps its order and takes its values from a learned, sorted target
    quantile function f = offset + scale · cumsum(softmax(h)), h ∈ R^m (Cuturi et al.
    2019, §4), starting at the uniform grid (1/m, …, 1); offset and (log-)scale are
    trained with `learn_range=True`, else f stays in (0, 1].

    Input `[batch, n]` (any rank), output the same shape.

    Args:
      num_targets: m, the number of target values (default 16, as in the paper).
      learn_range: also learn the offset and scale of f.
      **kwargs: the Sinkhorn arguments of `_SinkhornLayer`.

    Example:
    >>> layer = SinkhornQuantileNormalization(num_targets=4, epsilon=1e-4)
    >>> np.round(layer(np.array([[0.3, -1.0, 2.0, 1.0]])).numpy(), 2)
    array([[0.5 , 0.25, 1.  , 0.75]], dtype=float32)
    """

    _config_keys = ("num_targets", "learn_range")

    def __init__(self, num_targets: int = 16, learn_range: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.num_targets = _checks.check_positive_int("num_targets", num_targets)
        self.learn_range = bool(learn_range)

    def build(self, input_shape):
        self.logits = self.add_weight(name="logits", shape=(self.num_targets,),
                                      initializer="zeros", trainable=True)
        self.offset = self.add_weight(name="offset", shape=(), initializer="zeros",
                                      trainable=self.learn_range)
        self.log_scale = self.add_weight(name="log_scale", shape=(), initializer="zeros",
                                         trainable=self.learn_range)

    def target_values(self):
        """The current sorted target values f, shape `[m]`."""
        steps = tf.cumsum(tf.nn.softmax(self.logits))
        return self.offset + tf.exp(self.log_scale) * steps

    def call(self, inputs, mask=None):
        f = tf.cast(self.target_values(), inputs.dtype)
        return self._call(sinkhorn_ops.sinkhorn_quantile_normalization, inputs, f, mask=mask)

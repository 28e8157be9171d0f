"""The arguments of a layer or loss that computes with a family of `METHODS`.

One rule for every layer and loss that takes `method=` (`softsort_tf.layers.soft`, the
rank-based losses):

- `method`: a key of `softsort_tf.ops.soft.METHODS` (the losses default to 'sinkhorn');
  `temperature`: that family's temperature (`METHODS[method].temperature`), None for
  its default.
- Sinkhorn's settings are arguments of their own: `options`, the fields of
  `SinkhornOptions` (`epsilon`, `threshold`, ...), `squash` and `targets`. They are
  accepted only with method='sinkhorn', where `temperature` is the options' ε (the
  config holds it as `epsilon`).
- The other families' own arguments (`regularization` of 'permutahedron',
  `distance_power` of 'softsort', ...) go in one dict, `method_kwargs`, checked at
  construction by one call of the family's soft rank on a three-item list.
- 'permutahedron' has no masks: a mask, a Keras mask or padding reaching it raises a
  `ValueError`.
- A temperature must be one the compute dtype holds (`temperature_range`): a normal
  positive number of that dtype, and for 'sinkhorn' at least `transport.min_epsilon`
  (32 machine epsilons: 3.8e-6 in float32); checked at construction
  (`check_temperatures`, against `compute_dtype` of the layer or loss: float32 under
  a float16/bfloat16 policy). The same rule holds for every layer and loss with a
  temperature: the Sinkhorn layers' and losses' ε, SoftSort's and NeuralSort's τ.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from softsort_tf import _keras
from softsort_tf.ops.soft import get_method, soft_rank, temperature_kwargs
from softsort_tf.ops.transport import min_epsilon

SINKHORN_DEFAULTS = dict(options=None, squash="logistic", targets="regular")
_RESERVED = ("direction", "axis", "mask")


def temperature_range(method: str, dtype) -> tuple[float, float]:
    """`(low, high)`: the temperatures of `method` a computation in `dtype` holds.

    The positive normal numbers of `dtype` (below, the temperature rounds to 0 or loses
    its precision; above, to inf); for 'sinkhorn' (ε), from `transport.min_epsilon`.

    Example:
    >>> "%.3g, %.3g" % temperature_range("sinkhorn", "float32")
    '3.81e-06, 3.4e+38'
    """
    info = np.finfo(tf.as_dtype(dtype).as_numpy_dtype)
    low = min_epsilon(dtype) if method == "sinkhorn" else float(info.tiny)
    return low, float(info.max)


def check_temperature(method: str, temperature, dtype=None, *,
                      name: str = "temperature") -> float | None:
    """`temperature` as a float (None stays None), validated for `method` and, when
    `dtype` (the compute dtype) is given, in `temperature_range(method, dtype)`; `name`
    is the argument named by the message."""
    temperature_kwargs(method, temperature)
    if temperature is None:
        return None
    temperature = float(temperature)
    if dtype is not None:
        low, high = temperature_range(method, dtype)
        if not low <= temperature <= high:
            dtype = tf.as_dtype(dtype).name
            what = "Sinkhorn's ε" if method == "sinkhorn" else f"method={method!r}"
            raise ValueError(
                f"`{name}` ({what}) computing in {dtype} must be in [{low:.3g}, {high:.3g}], "
                f"got {temperature:g}: outside, {dtype} cannot hold the computation"
                + (" (compute in float64, dtype='float64', for a smaller ε)."
                   if method == "sinkhorn" and dtype != "float64" else "."))
    return temperature


def compute_dtype(layer_or_loss) -> str:
    """The dtype a Keras layer or loss computes its operators in: that of its dtype
    policy, float32 for a float16/bfloat16 one (`_keras.compute_dtype`)."""
    return _keras.compute_dtype(getattr(layer_or_loss, "dtype_policy", None)
                                or layer_or_loss.dtype)


def check_temperatures(method: str, dtype, temperature=None, options=None, *,
                       name: str = "temperature") -> float | None:
    """The temperature rule of every layer and loss (the module docstring), at
    construction: `temperature` (named `name`) in `temperature_range(method, dtype)`;
    without one, for 'sinkhorn', the ε of `options` (a `SinkhornOptions`, its default
    ε when it sets none), named `epsilon`.

    Returns:
      `temperature` as a float (None stays None).

    Example:
    >>> from softsort_tf.options import SinkhornOptions
    >>> check_temperatures("sinkhorn", "float32", options=SinkhornOptions(epsilon=1e-8))
    Traceback (most recent call last):
    ...
    ValueError: `epsilon` (Sinkhorn's ε) computing in float32 must be in [3.81e-06, ...
    """
    if temperature is None and method == "sinkhorn" and options is not None:
        check_temperature(method, options.solver_epsilon, dtype, name="epsilon")
    return check_temperature(method, temperature, dtype, name=name)


def check_method_kwargs(method: str, method_kwargs: dict | None,
                        operation: str = "rank") -> dict:
    """The validated `method_kwargs` of `method` (a new dict; `{}` for None).

    Raises a `ValueError` if `method` does not define `operation`, if `method_kwargs`
    is not a dict of argument names, holds an argument the layer or loss sets itself
    (`direction`, `axis`, `mask`, the temperature), is not empty with 'sinkhorn' (whose
    settings are arguments of their own), or is refused by the family's operator.
    """
    family = get_method(method)
    family.operation(operation)
    if method_kwargs is None:
        return {}
    if not isinstance(method_kwargs, dict) or not all(isinstance(k, str)
                                                      for k in method_kwargs):
        raise ValueError(f"`method_kwargs` must be a dict of argument names, got "
                         f"{method_kwargs!r}.")
    if not method_kwargs:
        return {}
    if method == "sinkhorn":
        raise ValueError("Sinkhorn's settings are arguments of their own (`options`, "
                         "`squash`, `targets` and `SinkhornOptions` fields such as "
                         f"`epsilon`): `method_kwargs` must be empty, got {method_kwargs!r}.")
    reserved = sorted(set(method_kwargs) & {*_RESERVED, family.temperature})
    if reserved:
        raise ValueError(f"`method_kwargs` cannot set `{reserved[0]}`: it is an argument of "
                         f"its own (the temperature is `temperature`).")
    with tf.init_scope():  # one eager call of the operator validates names and values
        try:
            soft_rank(tf.constant([[0.0, 1.0, 2.0]]), method, **method_kwargs)
        except TypeError as error:
            raise ValueError(f"`method_kwargs` {method_kwargs!r} are not arguments of "
                             f"method={method!r}: {error}") from None
    return dict(method_kwargs)


def check_sinkhorn_settings(method: str, options, squash, targets, option_kwargs: dict):
    """Raises a `ValueError` if Sinkhorn settings are given with another `method`."""
    if method == "sinkhorn":
        return
    if (options is not None or option_kwargs or squash != SINKHORN_DEFAULTS["squash"]
            or targets != SINKHORN_DEFAULTS["targets"]):
        raise ValueError(f"The Sinkhorn settings (`options`, `squash`, `targets`, "
                         f"{sorted(option_kwargs) or 'option fields'}) only apply to "
                         f"method='sinkhorn', got method={method!r}.")


def sinkhorn_option_kwargs(temperature, option_kwargs: dict) -> dict:
    """The `SinkhornOptions` fields with `temperature` as ε (unchanged for None)."""
    if temperature is None:
        return option_kwargs
    if option_kwargs.get("epsilon") is not None:
        raise ValueError("`temperature` and `epsilon` both set Sinkhorn's ε: pass one of "
                         "them.")
    return {**option_kwargs, "epsilon": temperature}


def check_padding(method: str, padded: bool, what: str) -> None:
    """Raises a `ValueError` if `padded` and `method` takes no mask; `what` says where
    the padding comes from."""
    if padded and not get_method(method).masks:
        raise ValueError(f"method={method!r} takes no mask, but {what} marks padding: pass "
                         f"lists without padding (and no mask), or use another method "
                         f"(e.g. 'lapsum').")

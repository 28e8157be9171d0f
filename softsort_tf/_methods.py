"""The arguments of a layer or loss that computes with a family of `FAMILIES`.

One rule for every layer and loss that takes `method=` (`softsort_tf.layers.soft`, the
rank-based losses), read from the family's record (`softsort_tf.ops.family`):

- `method`: a key of `FAMILIES` (the losses default to 'sinkhorn');
  `temperature`: that family's temperature (`FAMILIES[method].temperature`), None for
  its default: a real number, or a scalar tensor or variable for the families that
  learn it (`Family.tensor_temperature`).
- The family's own settings are split from the other keywords by its `Settings`: the
  Sinkhorn settings are arguments of their own (`options`, the fields of
  `SinkhornOptions` such as `epsilon`, `squash`, `targets`; `temperature` is the
  options' ε, held in the config as `epsilon`); the other families' own arguments
  (`regularization` of 'permutahedron', `distance_power` of 'softsort', ...) go in one
  dict, `method_kwargs`, checked at construction by one call of the family's operator
  on a three-item list. A setting of another family is refused, naming that family.
- A family without masks ('permutahedron'): a mask, a Keras mask or padding reaching
  it raises a `ValueError` (`check_padding`).
- A temperature must be one the compute dtype resolves (`Family.temperature_range`:
  a normal positive number of that dtype, and for 'sinkhorn' at least
  `transport.min_epsilon`, 32 machine epsilons: 3.8e-6 in float32); checked at
  construction against the compute dtype of the layer or loss (float32 under a
  float16/bfloat16 policy).
"""

from __future__ import annotations

import dataclasses

from softsort_tf.ops.family import Family, Settings, get_family


def temperature_range(method: str, dtype) -> tuple[float, float]:
    """`(low, high)`: the temperatures of `method` a computation in `dtype` resolves.

    Example:
    >>> "%.3g, %.3g" % temperature_range("sinkhorn", "float32")
    '3.81e-06, 3.4e+38'
    """
    return get_family(method).temperature_range(dtype)


def check_temperature(method: str, temperature, dtype=None, *, name: str = "temperature"):
    """`temperature` validated for `method` (`Family.check_temperature`): None stays
    None, a number becomes a float, a tensor of a family that learns it stays a tensor."""
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
    """The validated `method` arguments of a layer or loss (the rule above).

    Attributes:
      family: the `Family`.
      settings: its `Settings` (validated).
      temperature: the temperature the layer or loss keeps (None: the family's default,
        or held by the settings).
      given: the temperature as given (for the range check).
    """

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

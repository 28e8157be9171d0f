"""The arguments of a layer or loss that computes with a family of `FAMILIES`.

One rule for every layer and loss that takes `method=`, read from the family's record:
`temperature` is that family's (None: its default), checked at construction in the
range of the compute dtype (`Family.temperature_range`); the family's `Settings` split
its own keywords from the others (Sinkhorn's are arguments of their own, the other
families' go in the dict `method_kwargs`, checked by one call of the operator); a
setting of another family, or padding reaching a family without masks, is refused.
"""

from __future__ import annotations

import dataclasses

from softsort_tf.ops.family import Family, Settings, get_family


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

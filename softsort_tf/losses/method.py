"""The base class of the losses computed with any family of `FAMILIES`."""

from __future__ import annotations

from collections.abc import Callable

import keras

from softsort_tf import _keras
from softsort_tf.losses.base import LossFunctionWrapper


class MethodLoss(LossFunctionWrapper):
    """A `LossFunctionWrapper` whose `fn` runs a front-door operation of any family.

    Args:
      fn: the functional form; it receives `method`, `temperature` and the family's
        arguments as keywords.
      fn_kwargs: its other (validated) keyword arguments.
      method, temperature, method_kwargs, **kwargs: see `softsort_tf._keras` (`kwargs`:
        the family's settings when they are arguments of their own, e.g. Sinkhorn's
        `options`, `squash`, `targets`, `epsilon`, ...; another name raises a
        `TypeError`).
      reduction, name, dtype: as in `LossFunctionWrapper`.

    The arguments are validated once (`_keras.MethodArguments`; the temperature in
    the range of the compute dtype, `Family.temperature_range`); `method`, `temperature`
    and the family's settings (e.g. `options`) are attributes. The config holds
    `fn_kwargs`, `method`, `temperature`, `method_kwargs` and the family's settings (for
    'sinkhorn': the fields of the options, `squash`, `targets`; ε held as `epsilon`).

    Example (`SpearmanLoss` is a `MethodLoss`):
    >>> from softsort_tf.losses.spearman import SpearmanLoss
    >>> SpearmanLoss(method="permutahedron", method_kwargs={"regularization": "kl"},
    ...              temperature=0.1).get_config()["method_kwargs"]
    {'regularization': 'kl'}
    >>> SpearmanLoss(temperature=1e-3).get_config()["epsilon"]
    0.001
    """

    def __init__(self, fn: Callable, fn_kwargs: dict, *, method: str = "sinkhorn",
                 temperature=None, method_kwargs: dict | None = None,
                 reduction="sum_over_batch_size", name=None, dtype=None, **kwargs):
        arguments, rest = _keras.MethodArguments.create(method, temperature, method_kwargs,
                                                          kwargs)
        if rest:
            raise TypeError(f"{type(self).__name__} got unexpected keyword arguments "
                            f"{sorted(rest)}.")
        arguments.check_dtype(_keras.compute_dtype(dtype))
        super().__init__(fn, reduction=reduction, name=name, dtype=dtype, **fn_kwargs,
                         **arguments.operator_kwargs())
        self._arguments = arguments
        self._own_kwargs = tuple(fn_kwargs)

    @property
    def method_kwargs(self) -> dict:
        return dict(self._arguments.settings.method_kwargs)

    def get_config(self) -> dict:
        config = keras.losses.Loss.get_config(self)
        config.update({key: self.fn_kwargs[key] for key in self._own_kwargs})
        config.update(self._arguments.get_config())
        return config

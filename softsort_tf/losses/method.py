"""The base class of the losses computed with any family of `METHODS`.

`MethodLoss` takes `method`, `temperature`, `method_kwargs` and the Sinkhorn settings
by the rule of `softsort_tf._methods` (stated there once), validates them at
construction, and hands the functional form `method`, `temperature` and the family's
arguments (Sinkhorn's `options`, `squash`, `targets`, or the entries of
`method_kwargs`), which it forwards to the front door (`softsort_tf.ops.soft`).
"""

from __future__ import annotations

from collections.abc import Callable

from softsort_tf import _keras, _methods
from softsort_tf.losses.base import LossFunctionWrapper, SinkhornLoss
from softsort_tf.options import SinkhornOptions


class MethodLoss(SinkhornLoss):
    """A `LossFunctionWrapper` whose `fn` runs a front-door operation of any family.

    Args:
      fn: the functional form; it receives `method`, `temperature` and the family's
        arguments as keywords.
      fn_kwargs: its other (validated) keyword arguments.
      method, temperature, method_kwargs, options, squash, targets, **option_kwargs:
        see `softsort_tf._methods`.
      reduction, name, dtype: as in `LossFunctionWrapper`.

    The config holds `fn_kwargs`, `method`, `temperature`, `method_kwargs` and, for
    'sinkhorn', the fields of the options, `squash` and `targets` (`temperature` is
    then held as `epsilon`). The temperature (Sinkhorn's ε, however given) must be one
    the loss's compute dtype holds (`_methods.temperature_range`: at least 3.8e-6 for
    Sinkhorn in float32), checked here.

    Example (`SpearmanLoss` is a `MethodLoss`):
    >>> from softsort_tf.losses.spearman import SpearmanLoss
    >>> SpearmanLoss(method="permutahedron", method_kwargs={"regularization": "kl"},
    ...              temperature=0.1).get_config()["method_kwargs"]
    {'regularization': 'kl'}
    >>> SpearmanLoss(temperature=1e-3).get_config()["epsilon"]
    0.001
    """

    def __init__(self, fn: Callable, fn_kwargs: dict, *, method: str = "sinkhorn",
                 temperature: float | None = None, method_kwargs: dict | None = None,
                 options: SinkhornOptions | dict | None = None, squash="logistic",
                 targets: str = "regular", reduction="sum_over_batch_size", name=None,
                 dtype=None, **option_kwargs):
        compute_dtype = _keras.compute_dtype(dtype)
        temperature = _methods.check_temperature(method, temperature, compute_dtype)
        self.method_kwargs = _methods.check_method_kwargs(method, method_kwargs)
        _methods.check_sinkhorn_settings(method, options, squash, targets, option_kwargs)
        if method == "sinkhorn":
            super().__init__(fn, {**fn_kwargs, "method": method, "temperature": None},
                             options=options, squash=squash, targets=targets,
                             reduction=reduction, name=name, dtype=dtype,
                             **_methods.sinkhorn_option_kwargs(temperature, option_kwargs))
            if temperature is None:  # ε from `options` or `epsilon`
                _methods.check_temperature(method, self.options.solver_epsilon,
                                           compute_dtype, name="epsilon")
            return
        LossFunctionWrapper.__init__(self, fn, reduction=reduction, name=name, dtype=dtype,
                                     **fn_kwargs, method=method, temperature=temperature,
                                     **self.method_kwargs)

    @property
    def method(self) -> str:
        return self.fn_kwargs["method"]

    def get_config(self) -> dict:
        config = super().get_config()
        for key in self.method_kwargs:
            del config[key]
        config["method_kwargs"] = dict(self.method_kwargs)
        return config

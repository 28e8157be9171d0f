"""The base class of the Sinkhorn losses: validates, stores and serialises their options."""

from __future__ import annotations

import keras
import numpy as np

from softsort_tf import _checks
from softsort_tf.ops.squash import check_squash

SOLVER_OPTIONS = ("warm_start", "epsilon_start", "epsilon_decay", "check_every",
                  "implicit_solver", "implicit_max_iterations")


def _check_solver_options(solver_options) -> dict:
    if solver_options is None:
        return {}
    if not isinstance(solver_options, dict):
        raise ValueError(f"`solver_options` must be a dict with keys among {SOLVER_OPTIONS}, "
                         f"got {solver_options!r}.")
    unknown = sorted(set(solver_options) - set(SOLVER_OPTIONS))
    if unknown:
        raise ValueError(f"Unknown `solver_options` {unknown}; allowed: {SOLVER_OPTIONS}.")
    return dict(solver_options)


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False, got {value!r}.")
    return bool(value)


class _SinkhornLoss(keras.losses.Loss):
    """Validates, stores and serialises the Sinkhorn arguments of a loss.

    Args:
      epsilon: ε > 0 (None allowed where the subclass documents a default rule).
      cost_power: exponent p of the transport cost |x̃ − y|^p (operators' `power`).
      threshold: L1 marginal error at which the Sinkhorn loop stops.
      max_iterations: bound on Sinkhorn iterations.
      implicit: implicit differentiation (default) or unrolled backpropagation.
      squash: 'logistic', 'atan' or None.
      solver_options: dict of advanced `sinkhorn_solver.solve` options.
      reduction, name, dtype: as in `keras.losses.Loss`.
    """

    def __init__(self, *, epsilon, cost_power, threshold, max_iterations, implicit, squash,
                 solver_options, reduction, name, dtype, allow_none_epsilon=False):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.epsilon = _checks.check_positive("epsilon", epsilon,
                                              allow_none=allow_none_epsilon)
        self.cost_power = _checks.check_positive("cost_power", cost_power)
        self.threshold = _checks.check_positive("threshold", threshold)
        self.max_iterations = _checks.check_positive_int("max_iterations", max_iterations)
        self.implicit = _check_bool("implicit", implicit)
        self.squash = check_squash(squash)
        self.solver_options = _check_solver_options(solver_options)

    def _sinkhorn_kwargs(self) -> dict:
        return dict(epsilon=self.epsilon, power=self.cost_power, threshold=self.threshold,
                    max_iterations=self.max_iterations, implicit=self.implicit,
                    squash=self.squash, **self.solver_options)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(epsilon=self.epsilon, cost_power=self.cost_power,
                      threshold=self.threshold, max_iterations=self.max_iterations,
                      implicit=self.implicit, squash=self.squash,
                      solver_options=dict(self.solver_options) or None)
        return config

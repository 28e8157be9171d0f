"""`SinkhornOptions`: the settings of the Sinkhorn solver, one frozen value validated
when it is built (the loop's fields, an `ImplicitDiff`, the initializer). Operators,
layers and losses take it as `options=` or as keywords of the same names, which override
its fields; `squash` and `targets` are the operators' own. Reference: docs/options.md.

Example:
>>> options = SinkhornOptions(epsilon=1e-3, implicit_diff=ImplicitDiff(solver="cg"))
>>> options.replace(threshold=1e-6).threshold
1e-06
>>> SinkhornOptions.from_config(options.get_config()) == options
True
>>> SinkhornOptions(implicit_diff=None).initializer_for_loop()
'zeros'
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import numpy as np

from softsort_tf import _checks

DEFAULT_EPSILON = 1e-2
IMPLICIT_SOLVERS = ("auto", "cg", "dense")
FLOAT64_SOLVE_MAX_TARGETS = 64
CHOLESKY_MAX_TARGETS = 16
# Where the loop starts: 'sorted' is the exact (ε = 0) dual potential, by sorting;
# 'zeros' is g = 0; 'auto' is 'sorted' with implicit differentiation, else 'zeros' (the
# unrolled gradient through the few iterations left would not approach the true one).
INITIALIZERS = ("auto", "sorted", "zeros")
# p = 1: many optimal plans; p < 1: the optimum is not the sort.
MIN_POWER = 1.0


def _real(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"`{name}` must be a real number, got {value!r}.")
    return float(value)


@dataclasses.dataclass(frozen=True)
class ImplicitDiff:
    """Gradients of the Sinkhorn solution by implicit differentiation (the linear system
    of the optimality conditions; memory independent of the iterations).

    Args:
      solver: 'auto' (default): float64 Cholesky up to 16 targets (up to 64 when the
        number is unknown at trace time), float64 conjugate gradients up to 64, and
        conjugate gradients in the input dtype above. 'dense': float64 Cholesky always;
        'cg': conjugate gradients in the input dtype always.
      max_iterations: bound on the conjugate-gradient iterations (default 200).

    Example:
    >>> import softsort_tf as ss
    >>> x = tf.constant([[0.3, -1.0, 2.0]])
    >>> with tf.GradientTape() as tape:
    ...     tape.watch(x)
    ...     first = ss.sinkhorn_rank(x, implicit_diff=ImplicitDiff(solver="dense"))[0, 0]
    >>> tape.gradient(first, x).shape
    TensorShape([1, 3])
    """

    solver: str = "auto"
    max_iterations: int = 200

    def __post_init__(self):
        _checks.check_choice("ImplicitDiff.solver", self.solver, IMPLICIT_SOLVERS)
        object.__setattr__(self, "max_iterations", _checks.check_positive_int(
            "ImplicitDiff.max_iterations", self.max_iterations))


@dataclasses.dataclass(frozen=True)
class SinkhornOptions:
    """The settings of the Sinkhorn solver, shared by its operators, layers and losses.

    Args:
      epsilon: entropic regularisation ε > 0 in units of the cost on [0, 1] (default
        1e-2; a soft rank blurs over about n·√(ε/2) neighbours at p = 2; see
        docs/options.md). None: the caller's default (`SoftTopKLoss`: 0.3/L²).
      power: exponent p > 1 of the transport cost |x̃ − y|^p (default 2, the paper's).
      threshold: a row stops when the L1 error of its input marginal is below it
        (default 1e-3; finite-difference checks need e.g. 1e-8 in float64).
      max_iterations: bound on the iterations of a row (default 1000, rounded up to a
        multiple of `check_every`); unconverged rows are reported (`return_info=True`,
        a `SinkhornConvergenceWarning` in eager mode).
      check_every: iterations between two stopping decisions (default 1).
      epsilon_start: if set above ε, ε is annealed as ε_t = max(ε, ε_start · decay^t)
        (default None: no annealing).
      epsilon_decay: annealing factor in (0, 1) (default 0.9).
      implicit_diff: an `ImplicitDiff` (default `ImplicitDiff()`) for gradients by
        implicit differentiation, or None to backpropagate through the unrolled loop.
      initializer: 'auto' (default), 'sorted' or 'zeros': where the loop starts (see
        `INITIALIZERS`).

    Example:
    >>> options = SinkhornOptions(epsilon=0.1, max_iterations=50)
    >>> options.replace(threshold=1e-6).max_iterations, options.implicit_diff.solver
    (50, 'auto')
    >>> SinkhornOptions(power=1.0)
    Traceback (most recent call last):
    ...
    ValueError: `power` (the cost exponent p) must be a finite number > 1, got 1.0: ...
    """

    epsilon: float | None = DEFAULT_EPSILON
    power: float = 2.0
    threshold: float = 1e-3
    max_iterations: int = 1000
    check_every: int = 1
    epsilon_start: float | None = None
    epsilon_decay: float = 0.9
    implicit_diff: ImplicitDiff | None = ImplicitDiff()
    initializer: str = "auto"

    def __post_init__(self):
        def set_(name, value):
            object.__setattr__(self, name, value)  # frozen

        for name in ("epsilon", "threshold", "epsilon_start"):  # ε and ε_start may be None
            if getattr(self, name) is not None or name == "threshold":
                set_(name, _checks.check_positive(name, _real(name, getattr(self, name))))
        for name in ("max_iterations", "check_every"):
            set_(name, _checks.check_positive_int(name, getattr(self, name)))
        power = _real("power", self.power)
        if not power > MIN_POWER or not np.isfinite(power):
            raise ValueError(f"`power` (the cost exponent p) must be a finite number > "
                             f"{MIN_POWER:g}, got {self.power!r}: for p <= 1 the ε → 0 limit "
                             "of the transport is not the sort.")
        set_("power", power)
        set_("epsilon_decay", _checks.check_in_open_interval(
            "epsilon_decay", _real("epsilon_decay", self.epsilon_decay), 0.0, 1.0))
        if isinstance(self.implicit_diff, dict):
            set_("implicit_diff", ImplicitDiff(**self.implicit_diff))
        if self.implicit_diff is not None and not isinstance(self.implicit_diff, ImplicitDiff):
            raise ValueError(f"`implicit_diff` must be an ImplicitDiff or None (unrolled "
                             f"gradients), got {self.implicit_diff!r}.")
        _checks.check_choice("initializer", self.initializer, INITIALIZERS)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def _check_names(cls, names) -> None:
        unknown = sorted(set(names) - set(cls.field_names()))
        if unknown:
            raise TypeError(f"Unknown Sinkhorn option(s) {unknown}; the options are "
                            f"{list(cls.field_names())}.")

    @classmethod
    def resolve(cls, options: SinkhornOptions | dict | None = None,
                **overrides) -> SinkhornOptions:
        """`options` (an instance, a config dict or None for the defaults) with the given
        fields replaced. Unknown names raise a `TypeError` listing the fields."""
        if options is None:
            base = cls()
        elif isinstance(options, cls):
            base = options
        elif isinstance(options, dict):
            base = cls.from_config(options)
        else:
            raise ValueError(f"`options` must be a SinkhornOptions, a dict or None, "
                             f"got {options!r}.")
        return base.replace(**overrides) if overrides else base

    def replace(self, **changes) -> SinkhornOptions:
        self._check_names(changes)
        return dataclasses.replace(self, **changes)

    def get_config(self) -> dict[str, Any]:
        """A JSON-friendly dict (`implicit_diff` as a dict or None)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SinkhornOptions:
        cls._check_names(config)
        return cls(**config)

    @property
    def solver_epsilon(self) -> float:
        """ε for the solver: `epsilon`, or the default 1e-2 when it is None."""
        return DEFAULT_EPSILON if self.epsilon is None else self.epsilon

    def initializer_for_loop(self) -> str:
        """'sorted' or 'zeros': the initializer with 'auto' resolved."""
        if self.initializer != "auto":
            return self.initializer
        return "sorted" if self.implicit_diff is not None else "zeros"


"""`SinkhornOptions`: the configuration of the Sinkhorn solver, built by composition.

One frozen value holds every setting of the solver and is validated once, when it is
built; operators, layers and losses carry it unchanged to the solver. It is composed
of the loop settings (its own fields), an `ImplicitDiff` (how gradients are computed;
None backpropagates through the unrolled loop) and an initializer (where the loop
starts). Settings of an *operator* — how inputs are squashed (`squash`) and where the
targets sit (`targets`) — are arguments of the operators, layers and losses, not
options of the solver.

Operators, layers and losses take the options as `options=SinkhornOptions(...)` or as
keyword arguments with the same names (`epsilon=1e-3`); keywords override the fields of
`options`. The full reference, with what each default means for a user, is
docs/options.md.

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
# How the backward pass solves the implicit linear system (`ImplicitDiff.solver`, whose
# docstring says what each value does; the choice is `solvers.implicit.backward_method`).
IMPLICIT_SOLVERS = ("auto", "cg", "dense")
FLOAT64_SOLVE_MAX_TARGETS = 64
CHOLESKY_MAX_TARGETS = 16
# Where the Sinkhorn loop starts (`SinkhornOptions.initializer`): 'sorted' is the exact
# (ε = 0) dual potential of the 1-D problem, computed by sorting; 'zeros' is g = 0;
# 'auto' is 'sorted' with implicit differentiation and 'zeros' with unrolled gradients
# (the sorted start is a constant for autodiff, so the unrolled gradient through the
# few iterations it leaves would not approach the true one).
INITIALIZERS = ("auto", "sorted", "zeros")
# Cost exponents p <= 1 make the 1-D transport degenerate (p = 1: many optimal plans;
# p < 1: the optimum is not the sort): only p > 1 is accepted.
MIN_POWER = 1.0


def _real(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"`{name}` must be a real number, got {value!r}.")
    return float(value)


@dataclasses.dataclass(frozen=True)
class ImplicitDiff:
    """Gradients of the Sinkhorn solution by implicit differentiation.

    The backward pass solves the linear system of the optimality conditions at the
    solution, so its memory does not grow with the number of iterations.

    Args:
      solver: 'auto' (default): for at most 64 targets the solve runs in float64, by
        a dense Cholesky factorisation up to 16 targets and by conjugate gradients
        above (faster under XLA, agreeing with Cholesky to ~1e-6 of the gradient's
        scale; Cholesky up to 64 when the number of targets is unknown at trace
        time); for more targets, conjugate gradients in the input dtype. 'dense':
        float64 Cholesky always; 'cg': conjugate gradients in the input dtype always.
      max_iterations: bound on the conjugate-gradient iterations (default 200).
    """

    solver: str = "auto"
    max_iterations: int = 200

    def __post_init__(self):
        if self.solver not in IMPLICIT_SOLVERS:
            raise ValueError(f"`ImplicitDiff.solver` must be one of {IMPLICIT_SOLVERS}, "
                             f"got {self.solver!r}.")
        object.__setattr__(self, "max_iterations", _checks.check_positive_int(
            "ImplicitDiff.max_iterations", self.max_iterations))


@dataclasses.dataclass(frozen=True)
class SinkhornOptions:
    """Configuration of the Sinkhorn solver shared by every Sinkhorn operator, layer and
    loss.

    Args:
      epsilon: entropic regularisation ε > 0, in units of the cost on [0, 1] (inputs
        are squashed into [0, 1]). Default 1e-2. With p = 2 and n inputs spread over
        [0, 1], a soft rank blurs over about n·√(ε/2) neighbours: smaller is sharper,
        but needs more iterations and gives smaller gradients. None means the
        default of the caller (1e-2 for every operator; `SoftTopKLoss` uses
        0.3/L² for L classes).
      power: exponent p > 1 of the transport cost |x̃ − y|^p (default 2, the paper's).
      threshold: a row stops when the L1 error of its input marginal is below it
        (default 1e-3). Gradient checks against finite differences need a tighter
        threshold (e.g. 1e-8 in float64).
      max_iterations: bound on the iterations of a row (default 1000, rounded up to a
        multiple of `check_every`). Rows that reach it unconverged are reported by
        `return_info=True` and, in eager mode, by a `SinkhornConvergenceWarning`.
      check_every: iterations between two stopping decisions (default 1).
      epsilon_start: if set above ε, ε is annealed as ε_t = max(ε, ε_start · decay^t)
        (default None: no annealing).
      epsilon_decay: annealing factor in (0, 1) (default 0.9).
      implicit_diff: an `ImplicitDiff` (default `ImplicitDiff()`) for gradients by
        implicit differentiation, or None to backpropagate through the unrolled loop.
      initializer: 'auto' (default), 'sorted' or 'zeros': where the loop starts (see
        `INITIALIZERS`).
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

        if self.epsilon is not None:
            set_("epsilon", _checks.check_positive("epsilon", _real("epsilon", self.epsilon)))
        power = _real("power", self.power)
        if not power > MIN_POWER or not np.isfinite(power):
            raise ValueError(f"`power` (the cost exponent p) must be a finite number > "
                             f"{MIN_POWER:g}, got {self.power!r}: for p <= 1 the ε → 0 limit "
                             "of the transport is not the sort.")
        set_("power", power)
        set_("threshold", _checks.check_positive("threshold", _real("threshold", self.threshold)))
        set_("max_iterations", _checks.check_positive_int("max_iterations", self.max_iterations))
        set_("check_every", _checks.check_positive_int("check_every", self.check_every))
        if self.epsilon_start is not None:
            set_("epsilon_start", _checks.check_positive(
                "epsilon_start", _real("epsilon_start", self.epsilon_start)))
        set_("epsilon_decay", _checks.check_in_open_interval(
            "epsilon_decay", _real("epsilon_decay", self.epsilon_decay), 0.0, 1.0))
        if isinstance(self.implicit_diff, dict):
            set_("implicit_diff", ImplicitDiff(**self.implicit_diff))
        if self.implicit_diff is not None and not isinstance(self.implicit_diff, ImplicitDiff):
            raise ValueError(f"`implicit_diff` must be an ImplicitDiff or None (unrolled "
                             f"gradients), got {self.implicit_diff!r}.")
        if self.initializer not in INITIALIZERS:
            raise ValueError(f"`initializer` must be one of {INITIALIZERS}, "
                             f"got {self.initializer!r}.")

    # -- construction -------------------------------------------------------------
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

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

    @classmethod
    def split_kwargs(cls, kwargs: dict[str, Any],
                     options: SinkhornOptions | dict | None = None
                     ) -> tuple[SinkhornOptions, dict[str, Any]]:
        """Splits `kwargs` into the options they set (over `options`) and the rest."""
        names = set(cls.field_names())
        overrides = {k: v for k, v in kwargs.items() if k in names}
        rest = {k: v for k, v in kwargs.items() if k not in names}
        return cls.resolve(options, **overrides), rest

    def replace(self, **changes) -> SinkhornOptions:
        unknown = sorted(set(changes) - set(self.field_names()))
        if unknown:
            raise TypeError(f"Unknown Sinkhorn option(s) {unknown}; the options are "
                            f"{list(self.field_names())}.")
        return dataclasses.replace(self, **changes)

    # -- serialisation ------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        """A JSON-friendly dict (`implicit_diff` as a dict or None)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SinkhornOptions:
        unknown = sorted(set(config) - set(cls.field_names()))
        if unknown:
            raise TypeError(f"Unknown Sinkhorn option(s) {unknown}; the options are "
                            f"{list(cls.field_names())}.")
        return cls(**config)

    # -- use ----------------------------------------------------------------------
    @property
    def solver_epsilon(self) -> float:
        """ε for the solver: `epsilon`, or the default 1e-2 when it is None."""
        return DEFAULT_EPSILON if self.epsilon is None else self.epsilon

    def initializer_for_loop(self) -> str:
        """'sorted' or 'zeros': the initializer with 'auto' resolved."""
        if self.initializer != "auto":
            return self.initializer
        return "sorted" if self.implicit_diff is not None else "zeros"


"""`SinkhornOptions`: the settings of the Sinkhorn solver, validated once.

Every Sinkhorn operator, layer and loss takes the same solver settings. They are
held by one frozen `SinkhornOptions` value, built and validated once and carried
unchanged from a layer or loss to the solver; its `get_config()` is the part of the
layers' and losses' config that describes the solver.

The operators, layers and losses accept the options either as an object
(`options=SinkhornOptions(epsilon=1e-3)`) or as keyword arguments with the same names
(`epsilon=1e-3`); keywords override the fields of `options`.

Defaults and what they mean for the user:

- `epsilon` = 1e-2: entropic regularisation ε, in units of the cost on [0, 1] (the
  inputs are squashed into [0, 1]). With p = 2 and n inputs spread over [0, 1], a soft
  rank blurs over about n·√(ε/2) neighbours (≈ 21 for n = 300; 0.35 for n = 5).
  Smaller is sharper but needs more iterations and gives smaller gradients.
  One fixed ε serves quantiles at any n (on the default grid, ε = 1e-2 is within
  0.01–0.03 standard deviations of the hard quantiles of normal values from n = 10 to
  10⁵), but not top-k: the k largest of n values are packed ever closer near 1 after
  squashing (at ε = 1e-2 the top-10 mask keeps 94 % of its mass on the true top 10 at
  n = 100 and 3 % at n = 10⁵). For top-k (masks and values) pass ε ≈ 0.1·k/n: it kept
  94–100 % from n = 10 to 10⁵ (docs/benchmarks.md, "Target grid"); in float32 that is
  above the smallest accepted ε (3.8e-6) up to n ≈ 2.6·10⁴·k.
- `power` = 2: exponent p of the transport cost |x̃ − y|^p. p = 2 is the paper's
  choice; powers ≤ 1 are rejected (their ε → 0 limit is not the sort, see
  `MIN_POWER`).
- `threshold` = 1e-3: a row of the batch stops when the L1 error of its input marginal
  is below it. Gradient checks against finite differences need a tighter threshold
  (e.g. 1e-8 in float64): at 1e-3 the forward values are only converged to that level,
  and a finite difference of them is not the derivative of the converged map (measured
  on `sinkhorn_sort`, ε = 1e-3, n = 10, float64, 5 random rows, central differences
  with h = 1e-5: up to 0.74 from the implicit gradient at 1e-3, 2.9e-4 at 1e-8).
- `max_iterations` = 1000: bound on the Sinkhorn iterations of a row, rounded up to a
  multiple of `check_every`. A row that reaches it unconverged is reported by
  `return_info=True` (its `error` is above `threshold`) and, in eager mode, by a
  `SinkhornConvergenceWarning` (not inside `tf.function`/XLA, where checking would
  need a host round-trip: read `return_info` there).
- `implicit` = True: gradients by implicit differentiation (memory independent of the
  iterations); False backpropagates through the unrolled loop.
- `implicit_solver` = 'auto': the backward linear solve, dense Cholesky for at most 64
  targets, conjugate gradients above; `implicit_max_iterations` = 200 bounds CG.
- `warm_start` = None: start from the exact (ε = 0) 1-D dual potential; None means on
  with implicit gradients and off with unrolled ones.
- `epsilon_start` = None, `epsilon_decay` = 0.9: optional ε annealing
  ε_t = max(ε, ε_start · decay^t).
- `check_every` = 1: iterations between two stopping decisions.
- `squash` = 'logistic': maps the (weighted-)standardised inputs into [0, 1]; 'atan',
  'robust' (median/MAD, for rows with outliers or mixed scales) or None (inputs
  already in [0, 1]).
- `targets` = 'regular': where the m targets sit on [0, 1]. 'regular': the paper's
  regular grid y_j = (j − 1)/(m − 1) (Fig. 2, eq. 4; 0.5 for m = 1), whatever the bin
  masses, as in the reference implementations (with it the operators reproduce
  ott-jax's `soft_sort`); 'centres' (the only placement before 0.2.0): at the centres of
  the target bins in mass, y_j = b̄_j − b_j/2 ((j − 1/2)/m for uniform bins). Both
  give the same hard (ε → 0) limits and read-outs. With bins of equal mass (ranks,
  sorts, CDFs with m = n) they agree within 1 % at any ε from n = 100 (for n = 3–10
  the regular grid, 1/(n − 1) apart, is 1.04–8.6× sharper); with unequal bins the
  regular grid is much sharper at the same ε and iterations (measured: quantiles
  4–67×, top-k masks 1.1–8×, top-10 values of 100 inputs 2.7–4.5× closer to the hard
  statistic; only quantiles of n ≤ 5 are slightly blurrier, by ≤ 0.02 standard
  deviations; docs/benchmarks.md, "Target grid"). The results in docs/RESULTS.md were
  measured on 'centres': pass `targets='centres'` to reproduce them.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import numpy as np

from softsort_tf import _checks
from softsort_tf.ops.squash import check_squash
from softsort_tf.solvers.implicit import IMPLICIT_SOLVERS

DEFAULT_EPSILON = 1e-2
DEFAULT_POWER = 2.0
DEFAULT_THRESHOLD = 1e-3
DEFAULT_MAX_ITERATIONS = 1000
# Placements of the targets on [0, 1] (`SinkhornOptions.targets`).
TARGET_GRIDS = ("centres", "regular")
DEFAULT_TARGETS = "regular"
# Cost exponents p ≤ 1 make the 1-D transport degenerate (p = 1: every monotone and
# many non-monotone plans are optimal; p < 1: the optimum is not the sort), so their
# ε → 0 limit is not the sort: only p > 1 is accepted.
MIN_POWER = 1.0


def _check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False, got {value!r}.")
    return bool(value)


def _check_real(name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"`{name}` must be a real number, got {value!r}.")
    return float(value)


@dataclasses.dataclass(frozen=True)
class SinkhornOptions:
    """Settings of the Sinkhorn solver shared by every Sinkhorn operator, layer and loss.

    Args:
      epsilon: entropic regularisation ε > 0 (default 1e-2), in units of the cost on
        [0, 1]. None means "the default rule of the operator or loss" (1e-2 for the
        operators; an n-aware rule for `SoftTopKLoss`).
      power: exponent p > 1 of the transport cost |x̃ − y|^p (default 2).
      threshold: L1 marginal error at which a row stops (default 1e-3).
      max_iterations: bound on Sinkhorn iterations (default 1000; rounded up to a
        multiple of `check_every`).
      implicit: implicit differentiation (default) or backpropagation through the
        unrolled loop.
      implicit_solver: 'auto' (default), 'cg' or 'dense': the backward linear solve.
      implicit_max_iterations: bound on CG iterations in the backward pass (200).
      warm_start: start from the exact 1-D dual potential; None (default): on with
        implicit gradients, off with unrolled ones.
      epsilon_start: if set above ε, anneal ε_t = max(ε, ε_start · decay^t).
      epsilon_decay: annealing factor in (0, 1) (default 0.9).
      check_every: iterations between two stopping decisions (default 1).
      squash: 'logistic' (default), 'atan', 'robust' (rows with outliers or mixed
        scales, see `softsort_tf.ops.squash`) or None.
      targets: 'regular' (default): the paper's regular grid y_j = (j − 1)/(m − 1);
        'centres': targets at the centres of the target bins in mass, y_j = b̄_j − b_j/2.

    Example:
    >>> options = SinkhornOptions(epsilon=1e-3)
    >>> options.replace(threshold=1e-6).threshold
    1e-06
    >>> SinkhornOptions.from_config(options.get_config()) == options
    True
    """

    epsilon: float | None = DEFAULT_EPSILON
    power: float = DEFAULT_POWER
    threshold: float = DEFAULT_THRESHOLD
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    implicit: bool = True
    implicit_solver: str = "auto"
    implicit_max_iterations: int = 200
    warm_start: bool | None = None
    epsilon_start: float | None = None
    epsilon_decay: float = 0.9
    check_every: int = 1
    squash: str | None = "logistic"
    targets: str = DEFAULT_TARGETS

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # frozen
        if self.epsilon is not None:  # None: the operator's default rule (see `resolved_epsilon`)
            set_("epsilon", _checks.check_positive("epsilon", _check_real("epsilon", self.epsilon)))
        power = _check_real("power", self.power)
        if not power > MIN_POWER or not np.isfinite(power):
            raise ValueError(f"`power` (the cost exponent p) must be a finite number > "
                             f"{MIN_POWER:g}, got {self.power!r}: for p <= 1 the ε → 0 limit "
                             "of the transport is not the sort.")
        set_("power", power)
        set_("threshold",
             _checks.check_positive("threshold", _check_real("threshold", self.threshold)))
        set_("max_iterations", _checks.check_positive_int("max_iterations", self.max_iterations))
        set_("implicit", _check_bool("implicit", self.implicit))
        if self.implicit_solver not in IMPLICIT_SOLVERS:
            raise ValueError(f"`implicit_solver` must be one of {IMPLICIT_SOLVERS}, "
                             f"got {self.implicit_solver!r}.")
        set_("implicit_max_iterations", _checks.check_positive_int(
            "implicit_max_iterations", self.implicit_max_iterations))
        if self.warm_start is not None:
            set_("warm_start", _check_bool("warm_start", self.warm_start))
        if self.epsilon_start is not None:
            set_("epsilon_start", _checks.check_positive(
                "epsilon_start", _check_real("epsilon_start", self.epsilon_start)))
        set_("epsilon_decay", _checks.check_in_open_interval(
            "epsilon_decay", _check_real("epsilon_decay", self.epsilon_decay), 0.0, 1.0))
        set_("check_every", _checks.check_positive_int("check_every", self.check_every))
        set_("squash", check_squash(self.squash))
        if self.targets not in TARGET_GRIDS:
            raise ValueError(f"`targets` must be one of {TARGET_GRIDS}, got {self.targets!r}.")

    # -- construction -------------------------------------------------------------
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def resolve(cls, options: SinkhornOptions | dict | None = None,
                **overrides) -> SinkhornOptions:
        """`options` (an instance, a config dict or None for the defaults) with the
        given fields replaced. Unknown names raise a `TypeError` listing the fields."""
        if options is None:
            base = cls()
        elif isinstance(options, cls):
            base = options
        elif isinstance(options, dict):
            base = cls.from_config(options)
        else:
            raise ValueError(f"`options` must be a SinkhornOptions, a dict or None, "
                             f"got {options!r}.")
        if not overrides:
            return base
        return base.replace(**overrides)

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
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SinkhornOptions:
        unknown = sorted(set(config) - set(cls.field_names()))
        if unknown:
            raise TypeError(f"Unknown Sinkhorn option(s) {unknown}; the options are "
                            f"{list(cls.field_names())}.")
        return cls(**config)

    # -- use ----------------------------------------------------------------------
    def solver_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of `softsort_tf.solvers.sinkhorn.solve` (ε = None becomes
        the default 1e-2)."""
        config = self.get_config()
        config.pop("squash")
        config.pop("targets")
        if config["epsilon"] is None:
            config["epsilon"] = DEFAULT_EPSILON
        return config


class OptionFieldsMixin:
    """Reads the fields of `self.options` as attributes (`layer.epsilon`, `loss.power`)."""

    def __getattr__(self, name):
        # Called only when normal lookup fails; `options` itself is never delegated.
        if name != "options" and name in SinkhornOptions.field_names():
            return getattr(self.options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

"""The solved transport problem shared by every Sinkhorn operator, and its read-outs.

`Transport` brings x `[..., n, ...]` to `[batch, n]`, squashes it into [0, 1], solves
the entropic transport onto a target measure (y, b) with `solvers.sinkhorn.solve`, and
reads out CDFs, sorted values and pushed-forward target values (see
`softsort_tf.ops.sinkhorn` for the operators and their conventions).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import warnings

import keras
import numpy as np
import tensorflow as tf

from softsort_tf import _checks
from softsort_tf.ops.squash import check_squash, squash_values
from softsort_tf.ops.wrapper import Lists, list_operator
from softsort_tf.options import SinkhornOptions
from softsort_tf.solvers import sinkhorn as solver_lib

SinkhornInfo = collections.namedtuple("SinkhornInfo", ["num_iterations", "error"])
SinkhornInfo.__doc__ = """Convergence report of a Sinkhorn operator.

Attributes:
  num_iterations: int32 tensor of the input's shape without `axis`: Sinkhorn
    iterations used by each row.
  error: final L1 marginal error of each row (compare with `threshold`).
"""



class SinkhornConvergenceWarning(UserWarning):
    """Issued in eager mode when a Sinkhorn operator returns rows that stopped at
    `max_iterations` with a marginal error above `threshold` (not converged).

    Inside `tf.function`/XLA nothing is checked (that would need a host round-trip):
    use `return_info=True` and read `SinkhornInfo.error` there. Silence it with
    `warnings.simplefilter("ignore", SinkhornConvergenceWarning)`.
    """


def warn_if_unconverged(result, threshold: float) -> None:
    """In eager mode, issues a `SinkhornConvergenceWarning` if any row of the solver
    `result` ended with a finite error above `threshold` (it then stopped at
    `max_iterations`; rows with NaN/Inf inputs are not counted). No-op in graph mode."""
    if not tf.executing_eagerly():
        return
    error = result.error.numpy()
    unconverged = np.isfinite(error) & (error > threshold)
    if unconverged.any():
        iterations = int(np.max(result.num_iterations.numpy()[unconverged]))
        warnings.warn(
            f"Sinkhorn did not converge on {int(unconverged.sum())} of {error.size} rows: they "
            f"stopped after {iterations} iterations (`max_iterations`) with an L1 marginal "
            f"error up to {float(error[unconverged].max()):.3g} > `threshold` = {threshold:g}. "
            "Raise `max_iterations` or `epsilon` (`return_info=True` reports every row).",
            SinkhornConvergenceWarning, stacklevel=_user_stacklevel())


# Frames of these packages are skipped when a warning points at the user's call.
_INTERNAL_DIRS = tuple(os.path.dirname(os.path.abspath(path)) + os.sep for path in (
    os.path.dirname(os.path.abspath(__file__)),  # softsort_tf/ops → softsort_tf/
    tf.__file__, keras.__file__))


def _user_stacklevel() -> int:
    """The `stacklevel` of the first frame outside softsort_tf, TensorFlow and Keras (so
    a warning points at the user's call through operators, layers, losses and the
    AutoGraph wrappers alike)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL_DIRS):
        frame, level = frame.f_back, level + 1
    return level


# The potentials are of the order of the costs over ε (costs in [0, 1] after squashing),
# so their rounding, machine-ε / ε relative to the plan's log, must stay small: below
# this many machine epsilons the marginal error cannot reach the default threshold and
# the read-outs degrade, then explode (the float32 sort returned 1e9 at ε = 1e-10 and
# inf from 1e-11).
MIN_EPSILON_ULPS = 32


def min_epsilon(dtype) -> float:
    """Smallest ε a Sinkhorn operator accepts in `dtype` (3.8e-6 in float32, 7.1e-15 in
    float64): `MIN_EPSILON_ULPS` machine epsilons."""
    return MIN_EPSILON_ULPS * float(np.finfo(tf.as_dtype(dtype).as_numpy_dtype).eps)


def check_epsilon_for_dtype(epsilon: float, dtype) -> None:
    """Raises a `ValueError` if ε is below `min_epsilon(dtype)`."""
    smallest = min_epsilon(dtype)
    if epsilon < smallest:
        raise ValueError(
            f"`epsilon` = {epsilon:g} is below the smallest ε that {tf.as_dtype(dtype).name} "
            f"can resolve, {smallest:.3g} ({MIN_EPSILON_ULPS} machine epsilons; the potentials "
            "are rounded to about machine-ε / ε and the solver cannot converge). Use a "
            "larger `epsilon` or compute in float64 (cast `x`).")


def bin_centres(b):
    """Centres y_j = b̄_j − b_j / 2 of the target bins on [0, 1] for weights b `[..., m]`."""
    return tf.cumsum(b, axis=-1) - 0.5 * b


def regular_grid(b, real_bins=None):
    """The paper's regular grid y_j = (j − 1)/(m − 1) on [0, 1] (Fig. 2, eq. 4) for
    target weights b `[..., m]`, whatever their masses; 0.5 for m = 1.

    With `real_bins` (`[batch]`, for b `[batch, m]`): row r is the grid of its first
    `real_bins[r]` bins alone, y_j = (j − 1)/(real_bins[r] − 1), and its surplus bins
    (the negligible-mass bins of a padded list, see `softsort_tf._masking`) sit at
    `PADDING_POSITION`.
    """
    m = tf.shape(b)[-1]
    steps = tf.cast(tf.range(m), b.dtype)
    if real_bins is None:
        offset = tf.cast(tf.where(m > 1, 0.0, 0.5), b.dtype)
        y = steps / tf.cast(tf.maximum(m - 1, 1), b.dtype) + offset
        return tf.broadcast_to(y, tf.shape(b))
    real = tf.cast(real_bins, b.dtype)[:, None]
    y = steps[None, :] / tf.maximum(real - 1.0, 1.0)
    y = tf.where(real > 1.0, y, 0.5 * tf.ones_like(y))
    return tf.where(steps[None, :] < real, y, PADDING_POSITION * tf.ones_like(y))


# Mass of a padded entry and of a surplus target bin of a padded list, relative to one
# valid entry (or bin): far below every rounding and `threshold`, so the valid entries
# are transported as if alone, yet far above the solver's trusted-sum floor (1e-30), so
# the single-pass updates stay on their fast path.
NEGLIGIBLE_MASS = 1e-20

# Where padded entries and surplus bins sit: outside [0, 1], one unit of cost away from
# every valid entry and target, so that the valid entries' problem is decoupled from
# them (plan entries between the two below exp(−1/ε)) and the Sinkhorn iterations of a
# padded list follow those of the unpadded one, converged or not.
PADDING_POSITION = 2.0

# Where the m targets sit on [0, 1] (the operators' `targets` argument). 'regular': the
# paper's regular grid y_j = (j − 1)/(m − 1) (Fig. 2, eq. 4), whatever the bin masses,
# as in the reference implementations; 'centres': the centres of the bins in mass,
# y_j = b̄_j − b_j/2. Both give the same hard limits and read-outs.
TARGET_GRIDS = ("regular", "centres")


def check_targets(targets: str) -> str:
    """Validates the `targets` argument (a placement of `TARGET_GRIDS`)."""
    if targets not in TARGET_GRIDS:
        raise ValueError(f"`targets` must be one of {TARGET_GRIDS}, got {targets!r}.")
    return targets


def _normalised(b):
    return b / tf.reduce_sum(b, axis=-1, keepdims=True)


@dataclasses.dataclass(frozen=True)
class TargetMeasure:
    """The masses b of the target bins of a transport (their positions y follow from
    the masses and the `targets` grid).

    Build it with one of the constructors:

    - `TargetMeasure.one_per_entry()`: m = n bins of equal mass (per list, the n_valid
      bins of its valid entries with a mask): ranks, CDFs, sorts, permutation matrices;
    - `TargetMeasure.bins(m, weights)`: m bins of equal mass, or the given positive
      masses `[m]` or `[batch, m]`;
    - `TargetMeasure.per_list(fn)`: masses that depend on the number of valid entries:
      `fn(count)` with `count` `[batch]` (float) returns `(b, real_bins)`, b `[m]` or
      `[batch, m]` positive and unnormalised, and `real_bins` `[batch]` the number of
      bins that are not surplus bins of a padded list (None: all).
    """

    num_bins: int | None = None
    weights: object = None
    fn: object = None

    @classmethod
    def one_per_entry(cls) -> TargetMeasure:
        return cls()

    @classmethod
    def bins(cls, m: int | None = None, weights=None) -> TargetMeasure:
        if m is None and weights is None:
            return cls()
        if m is not None:
            m = _checks.check_positive_int("num_targets", m)
        return cls(num_bins=m, weights=weights)

    @classmethod
    def per_list(cls, fn) -> TargetMeasure:
        return cls(fn=fn)

    def build(self, count, n, mask, dtype):
        """`(b, real_bins)` for lists of `count` valid entries of (padded) length n."""
        if self.fn is not None:
            b, real_bins = self.fn(count)
            return _normalised(self._checked(b, None, dtype)), real_bins
        if self.weights is not None:
            return _normalised(self._checked(self.weights, self.num_bins, dtype)), None
        if self.num_bins is not None:
            return tf.fill([self.num_bins], tf.constant(1.0 / self.num_bins, dtype)), None
        if mask is not None:  # one bin per valid entry, surplus bins of negligible mass
            return _normalised(padded_list_target(count, n, dtype)), count
        if isinstance(n, int):
            return tf.fill([n], tf.constant(1.0 / n, dtype)), None
        return tf.fill(tf.reshape(n, [1]), 1.0 / tf.cast(n, dtype)), None

    @staticmethod
    def _checked(b, m, dtype):
        # NumPy weights are checked as given and become a constant of `dtype` directly
        # (a float64 constant and a cast would put float64 in the graph).
        numpy = isinstance(b, (np.ndarray, list, tuple))
        b = np.asarray(b) if numpy else tf.convert_to_tensor(b)
        # A zero-mass bin would give 0/0 in the sort read-out: drop the bin instead.
        _checks.check_weight_values("target_weights", b, allow_zero=False)
        b = tf.constant(b, dtype) if numpy else tf.cast(b, dtype)
        if b.shape.rank not in (1, 2):
            raise ValueError("`target_weights` must have shape [m] or [batch, m].")
        if m is not None and b.shape[-1] is not None and b.shape[-1] != m:
            raise ValueError(f"`target_weights` must have length m = {m}, got {b.shape[-1]}.")
        return b


def padded_list_target(count, m, dtype):
    """Per-row target weights `[batch, m]` of a padded list: one bin of mass 1 per valid
    entry (the first `count[r]` bins), `NEGLIGIBLE_MASS` for the surplus bins.
    Unnormalised; `count`: `[batch]`."""
    bins = tf.cast(tf.range(m), dtype)[None, :]
    count = tf.cast(count, dtype)[:, None]
    return tf.where(bins < count, tf.ones_like(bins * count),
                    tf.fill(tf.shape(bins * count), tf.constant(NEGLIGIBLE_MASS, dtype)))


class Transport:
    """The solved transport problem of one operator call on a batch of `Lists`.

    Args:
      lists: the inputs (`softsort_tf.ops.wrapper.Lists`).
      target: the target measure (`TargetMeasure`).
      direction: 'ASCENDING' or 'DESCENDING': the order the targets are filled in.
      options: the solver configuration (`SinkhornOptions`).
      squash: how inputs are mapped into [0, 1] (see `softsort_tf.ops.squash`).
      targets: where the targets sit on [0, 1] (`TARGET_GRIDS`).
    """

    def __init__(self, lists: Lists, target: TargetMeasure, *, direction: str,
                 options: SinkhornOptions | None = None, squash="logistic",
                 targets: str = "regular"):
        options = SinkhornOptions() if options is None else options
        direction = _checks.check_direction(direction)
        squash = check_squash(squash)
        grid = check_targets(targets)
        x2d = lists.values
        self.lists = lists
        self.mask = lists.mask
        self.sign = -1.0 if direction == "DESCENDING" else 1.0
        # Sorted ascending == x sorted in `direction`. A negation, not a product with the
        # sign: products flush float32 subnormals to zero on CPU, negations keep them.
        self.values = -x2d if direction == "DESCENDING" else x2d
        self.dtype = x2d.dtype
        self.n = lists.n
        a = lists.weights
        self.uniform_a = a is None and self.mask is None
        self.count = lists.count()
        if self.mask is None:
            if a is None:
                inverse_n = (tf.constant(1.0 / self.n, self.dtype) if isinstance(self.n, int)
                             else 1.0 / tf.cast(self.n, self.dtype))
                a = tf.fill(tf.shape(x2d), inverse_n)
            solver_a = a
        else:
            # a: the measure of the valid entries (0 at padding), read by the read-outs;
            # the solver gives the padded entries a negligible mass instead of 0.
            a = tf.where(self.mask, tf.ones_like(x2d) if a is None else a, tf.zeros_like(x2d))
            total = tf.reduce_sum(a, axis=-1, keepdims=True)
            a = a / tf.where(total > 0, total, tf.ones_like(total))
            solver_a = _normalised(tf.where(
                self.mask, a, tf.fill(tf.shape(a), tf.constant(NEGLIGIBLE_MASS, self.dtype))
                / tf.maximum(self.count[:, None], 1.0)))
        self.a = a
        check_epsilon_for_dtype(options.solver_epsilon, self.dtype)
        self.b, real_bins = target.build(self.count, self.n, self.mask, self.dtype)
        self.real_bins = real_bins
        if grid == "regular":
            self.y = regular_grid(self.b, real_bins)
        else:
            self.y = bin_centres(self.b)
            if real_bins is not None:
                bins = tf.cast(tf.range(tf.shape(self.b)[-1]), self.dtype)[None, :]
                self.y = tf.where(bins < tf.cast(real_bins, self.dtype)[:, None], self.y,
                                  tf.constant(PADDING_POSITION, self.dtype))
        rows, b_rows = x2d.shape[0], (self.b.shape[0] if self.b.shape.rank == 2 else None)
        if rows is not None and b_rows is not None and b_rows != rows:
            raise ValueError(f"Per-row `target_weights` must have one row per row of x "
                             f"({rows}: the shape of x without `axis`, flattened), got "
                             f"{b_rows}.")
        squashed = squash_values(self.values, squash, weights=None if self.uniform_a else a)
        if self.mask is not None:
            # Padded entries sit with the surplus bins, away from the valid ones.
            squashed = tf.where(self.mask, squashed,
                                tf.fill(tf.shape(squashed),
                                        tf.constant(PADDING_POSITION, squashed.dtype)))
        self.result = solver_lib.solve(squashed, self.y, solver_a, self.b, options)
        warn_if_unconverged(self.result, options.threshold)
        self._plan = None
        self._row_plan = None

    @property
    def plan(self):
        """`[batch, n, m]` transport plan P: column sums b exactly, row sums a up to
        `threshold` (the solver ends on a column update)."""
        if self._plan is None:
            self._plan = self.result.plan()
        return self._plan

    @property
    def row_plan(self):
        """`[batch, n, m]` row-conditional plan a⁻¹ ∘ P from the target potential alone
        (`SinkhornResult.row_plan`): rows sum to 1 exactly, so read-outs such as the CDF
        stay in [0, 1] whatever the residual marginal error, and inputs of zero weight
        still get a well-defined row."""
        if self._row_plan is None:
            self._row_plan = self.result.row_plan()
        return self._row_plan

    def bcast_b(self):
        b = self.b
        return b if b.shape.rank == 2 else b[None, :]

    def cdf(self):
        """a⁻¹ ∘ (P c) + a/2, with c = b̄ − b/2 the centres of the target bins in mass:
        `[batch, n]`.

        Input i holds the mass interval [W_i − a_i, W_i] of the sorted sample (W_i the
        weight of the entries ≤ x_i); a⁻¹ ∘ (P c) is the centre of that interval as
        resolved by the target bins, so adding a_i/2 gives W_i. In the hard limit this
        is exact whenever every W_i is a bin boundary (e.g. uniform weights with m a
        multiple of n), and for any feasible plan it lies in [a_i, 1]. (For uniform
        weights and m = n it equals Definition 2's a⁻¹ ∘ (P b̄).) The bins are read in
        mass, so the read-out does not depend on where the targets y sit.
        """
        centres = bin_centres(self.bcast_b())
        return tf.reduce_sum(self.row_plan * centres[:, None, :], axis=-1) + 0.5 * self.a

    def sorted_values(self):
        """b⁻¹ ∘ (Pᵀ x) in the units of x, in `direction` order: `[batch, m]`."""
        # Computed on values centred on a median c of the row, v = c + u/q, and mapped
        # back: Pᵀ v / b = c + (Pᵀ u / b) / q because the columns of P sum to b. This
        # keeps the precision of values with a large common offset (1e7 + k in float32:
        # off by up to ~900 otherwise). c is one of the values and q = 1/4 or 1 (exact,
        # 1/4 keeps u finite when the values span more than half of the float range), so
        # u = v·q − c·q is the difference rounded once and (c·q + Pᵀ u / b)/q the result
        # rounded once, in the compute dtype (float32 too: no float64 in the graph).
        v = tf.stop_gradient(self.values)
        middle = (tf.shape(v)[-1] - 1) // 2
        centre = tf.sort(v, axis=-1)[:, middle][:, None]
        span = (0.25 * tf.reduce_max(v, axis=-1, keepdims=True)
                - 0.25 * tf.reduce_min(v, axis=-1, keepdims=True))
        q = tf.where(span > self.dtype.max / 8, tf.constant(0.25, self.dtype),
                     tf.constant(1.0, self.dtype))
        u = self.values * q - centre * q
        # Divided by the plan's own column sums (b up to rounding: in float32 at small ε
        # the potentials are ~1/ε, so P carries relative errors ~1e-5): each output is
        # then an exact convex combination of the inputs, within [min x, max x].
        columns = solver_lib.accurate_sum(self.plan, axis=1)
        b = tf.broadcast_to(self.bcast_b(), tf.shape(columns))
        columns = tf.where(columns > 0, columns, b)
        pushed = solver_lib.accurate_sum(self.plan * u[:, :, None], axis=1) / columns
        s = (centre * q + pushed) / q   # c + pushed/q would overflow where c·q + pushed does not
        return -s if self.sign < 0 else s

    def push(self, f):
        """a⁻¹ ∘ (P f) for f `[m]` or `[batch, m]`: `[batch, n]`."""
        f = tf.cast(f, self.dtype)
        f = f[None, :] if f.shape.rank == 1 else f
        return tf.reduce_sum(self.row_plan * f[:, None, :], axis=-1)

    def info(self) -> SinkhornInfo:
        """The per-row convergence report (`[batch]` tensors)."""
        return SinkhornInfo(self.result.num_iterations, self.result.error)


_COMMON_ARGS_DOC = """
      axis: the axis to operate along (any axis of an input of any rank >= 1).
      direction: 'ASCENDING' or 'DESCENDING', as in `tf.sort`.
      mask: optional boolean (or 0/1) `[n]` or the shape of x, False = padding: see
        `softsort_tf._masking` (padded entries get no mass and output 0). x may also be
        a `tf.RaggedTensor` ragged along its last axis (then `axis` must be the last).
      weights: non-negative input weights a, shape `[n]` or the shape of x (default
        uniform); they are the input measure and weight the squashing's mean and
        standard deviation.
      squash: how inputs are mapped into [0, 1] before the transport: 'logistic'
        (default), 'atan', 'robust' (median/MAD, for rows with outliers) or None
        (inputs already in [0, 1]); see `softsort_tf.ops.squash`.
      targets: where the targets sit on [0, 1]: 'regular' (default, the paper's grid
        y_j = (j − 1)/(m − 1)) or 'centres' (the centres of the target bins in mass).
      check_numerics: raise `InvalidArgumentError` on NaN/Inf in x instead of
        propagating NaN to the affected rows (padded entries are not checked).
      return_info: also return a `SinkhornInfo(num_iterations, error)`.
      options: a `SinkhornOptions` (or its config dict), the solver configuration;
        default `SinkhornOptions()`: ε = 1e-2, p = 2, threshold 1e-3, 1000
        iterations, implicit differentiation.
      **option_kwargs: fields of `SinkhornOptions` (`epsilon`, `power`, `threshold`,
        `max_iterations`, `implicit_diff`, `initializer`, ...) overriding those of
        `options`."""


def sinkhorn_operator(body):
    """Fills in the shared argument documentation of a Sinkhorn operator body and wraps
    it with `softsort_tf.ops.wrapper.list_operator`."""
    body.__doc__ = body.__doc__.replace("{common}", _COMMON_ARGS_DOC.strip("\n"))
    return list_operator(body)

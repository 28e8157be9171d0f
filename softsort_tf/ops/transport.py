"""The solved transport problem shared by every Sinkhorn operator (`Transport`: squash,
solve onto a target measure, read out CDFs, sorted values and pushed-forward values),
its target measures and its convergence report (`softsort_tf.ops.sinkhorn` holds the
operators)."""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import sys
import warnings

import keras
import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _docs, _masking
from softsort_tf.ops.squash import check_squash, squash_values, weighted_median
from softsort_tf.ops.wrapper import Lists, list_operator
from softsort_tf.options import SinkhornOptions
from softsort_tf.solvers import sinkhorn as solver_lib

SinkhornInfo = collections.namedtuple("SinkhornInfo", ["num_iterations", "error"])
SinkhornInfo.__doc__ = """Convergence report of a Sinkhorn operator (`return_info=True`).

Attributes:
  num_iterations: int32 per row (the input's shape without `axis`): the iterations run.
  error: per row, the final L1 error of the input marginal (converged: ≤ `threshold`).

Example:
>>> import softsort_tf as ss
>>> ranks, info = ss.sinkhorn_rank([[0.3, -1.0, 2.0]], return_info=True)
>>> info.num_iterations.shape, bool(info.error[0] <= 1e-3)
(TensorShape([1]), True)
"""


class SinkhornConvergenceWarning(UserWarning):
    """Issued in eager mode when a Sinkhorn operator returns rows that stopped at
    `max_iterations` with a marginal error above `threshold`. Nothing is checked inside
    `tf.function`/XLA: read `SinkhornInfo.error` (`return_info=True`) there.

    Example:
    >>> import softsort_tf as ss
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = ss.sinkhorn_rank([[0.3, -1.0, 2.0]], epsilon=1.0, max_iterations=1,
    ...                          threshold=1e-9, initializer="zeros")
    >>> [w.category.__name__ for w in caught]
    ['SinkhornConvergenceWarning']
    """


def warn_if_unconverged(result, threshold: float) -> None:
    """In eager mode, issues a `SinkhornConvergenceWarning` if a row of the solver
    `result` ended with a finite error above `threshold`."""
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
    """The `stacklevel` of the first frame outside softsort_tf, TensorFlow and Keras (a
    warning points at the user's call)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL_DIRS):
        frame, level = frame.f_back, level + 1
    return level


# The potentials (≈ cost / ε) are rounded to about machine-ε / ε: below this many
# machine epsilons the solver cannot reach the default threshold.
MIN_EPSILON_ULPS = 32


def min_epsilon(dtype) -> float:
    """Smallest ε accepted in `dtype`, `MIN_EPSILON_ULPS` machine epsilons (3.8e-6 in float32)."""
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
    target weights b `[..., m]`, whatever their masses; 0.5 for m = 1. With `real_bins`
    (`[batch]`, b `[batch, m]`): the grid of each row's first `real_bins` bins alone."""
    m = tf.shape(b)[-1]
    steps = tf.cast(tf.range(m), b.dtype)
    if real_bins is None:
        offset = tf.cast(tf.where(m > 1, 0.0, 0.5), b.dtype)
        y = steps / tf.cast(tf.maximum(m - 1, 1), b.dtype) + offset
        return tf.broadcast_to(y, tf.shape(b))
    real = tf.cast(real_bins, b.dtype)[:, None]
    y = steps[None, :] / tf.maximum(real - 1.0, 1.0)
    return tf.where(real > 1.0, y, 0.5 * tf.ones_like(y))


def _past_count(values, count, fill):
    """`values` `[batch, m]` with the entries past each row's first `count` set to
    `fill` (unchanged for `count` None)."""
    if count is None:
        return values
    bins = tf.cast(tf.range(tf.shape(values)[-1]), values.dtype)[None, :]
    return tf.where(bins < tf.cast(count, values.dtype)[:, None], values,
                    tf.fill(tf.shape(values), tf.constant(fill, values.dtype)))


# Mass of a padded entry and of a surplus target bin, relative to a valid one: below
# every rounding and `threshold`, above the solver's trusted-sum floor (1e-30).
NEGLIGIBLE_MASS = 1e-20

# Where padded entries and surplus bins sit: one unit of cost away from [0, 1], so the
# iterations of a padded list follow those of the unpadded one.
PADDING_POSITION = 2.0
TARGETS_MIDPOINT = 0.5  # the real targets span [0, 1] (both grids)

TARGET_GRIDS = ("regular", "centres")  # the paper's grid, or the bins' centres in mass


def check_targets(targets: str) -> str:
    """Validates the `targets` argument (a placement of `TARGET_GRIDS`)."""
    if targets not in TARGET_GRIDS:
        raise ValueError(f"`targets` must be one of {TARGET_GRIDS}, got {targets!r}.")
    return targets


def _normalised(b):
    return b / tf.reduce_sum(b, axis=-1, keepdims=True)


@dataclasses.dataclass(frozen=True)
class TargetMeasure:
    """The masses b of the target bins of a transport, from a constructor:

    - `one_per_entry()`: m = n bins of equal mass (with a mask, n_valid per list);
    - `bins(m, weights)`: m bins of equal mass, or the positive masses `[m]`/`[batch, m]`;
    - `per_list(fn)`: `fn(count)` (`count` `[batch]` float) returns `(b, real_bins)`, b
      `[m]` or `[batch, m]` positive unnormalised, `real_bins` `[batch]` the bins that
      are not surplus bins of a padded list (None: all).
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
            ones = tf.ones(tf.stack([tf.shape(count)[0], n]), dtype)
            return _normalised(_past_count(ones, count, NEGLIGIBLE_MASS)), count
        if isinstance(n, int):
            return tf.fill([n], tf.constant(1.0 / n, dtype)), None
        return tf.fill(tf.reshape(n, [1]), 1.0 / tf.cast(n, dtype)), None

    @staticmethod
    def _checked(b, m, dtype):
        # NumPy weights become a constant of `dtype` directly (no float64 in the graph).
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


def on_the_targets(values, mask=None):
    """`values` `[batch, n]` moved by a constant c per row so that a median of the row's
    finite (and, with a `[batch, n]` `mask`, valid) values sits at the midpoint of the
    targets' span [0, 1]; unmoved in a row without such a value.

    For the cost |x − y|² the plan and the read-outs are unchanged: (x_i − c − y_j)² =
    (x_i − y_j)² − 2c·x_i + 2c·y_j + c², a term per input and one per target, which the
    potentials f, g absorb. The cost is then computed from numbers of the size of the
    row's spread about its median instead of its offset, so rounding does not grow with
    the offset (values as they are, `squash=None`: 1e4 + x in float32 is as exact as x),
    nor with one far entry (the median stays with the bulk of the row, where a midpoint
    would follow the far entry), and a row already on [0, 1] barely moves (the 'zeros'
    initializer starts where it did). In a row spanning more than the float range's
    half, the midpoint of its ends instead (every moved value stays finite).
    c is a constant for autodiff; the gradient is unchanged for the same reason.
    """
    big = tf.constant(values.dtype.max, values.dtype)
    # Finite (NaN compares false), with TFLite builtins alone; and valid.
    valid = _masking.combine(tf.abs(values) <= big, mask)
    inf = tf.constant(np.inf, values.dtype)
    high = tf.reduce_max(tf.where(valid, values, -inf), axis=-1, keepdims=True)
    low = tf.reduce_min(tf.where(valid, values, inf), axis=-1, keepdims=True)
    median = weighted_median(tf.where(valid, values, inf), tf.cast(valid, values.dtype), -1)
    # The halves first: no overflow at the ends of the float range.
    narrow = 0.5 * high - 0.5 * low <= 0.5 * big
    centre = tf.where(narrow, median, 0.5 * high + 0.5 * low)
    c = centre - TARGETS_MIDPOINT
    c = tf.stop_gradient(tf.where(tf.abs(c) <= big, c, tf.zeros_like(c)))
    return values - c


class Transport:
    """The solved transport problem of one operator call on a batch of `Lists` onto a
    `TargetMeasure`, filled in `direction` order, with the operators' `options`,
    `squash` and `targets`."""

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
        self.y = _past_count(regular_grid(self.b, real_bins) if grid == "regular"
                             else bin_centres(self.b), real_bins, PADDING_POSITION)
        rows, b_rows = x2d.shape[0], (self.b.shape[0] if self.b.shape.rank == 2 else None)
        if rows is not None and b_rows is not None and b_rows != rows:
            raise ValueError(f"Per-row `target_weights` must have one row per row of x "
                             f"({rows}: the shape of x without `axis`, flattened), got "
                             f"{b_rows}.")
        squashed = squash_values(self.values, squash, weights=None if self.uniform_a else a)
        if squash is None and options.power == 2.0:
            squashed = on_the_targets(squashed, self.mask)
        if self.mask is not None:
            # Padded entries sit with the surplus bins, away from the valid ones.
            squashed = tf.where(self.mask, squashed,
                                tf.fill(tf.shape(squashed),
                                        tf.constant(PADDING_POSITION, squashed.dtype)))
        self.result = solver_lib.solve(squashed, self.y, solver_a, self.b, options)
        warn_if_unconverged(self.result, options.threshold)

    @functools.cached_property
    def plan(self):
        """`[batch, n, m]` transport plan P: column sums b exactly, row sums a up to
        `threshold`."""
        return self.result.plan()

    @functools.cached_property
    def row_plan(self):
        """`[batch, n, m]` row-conditional plan a⁻¹ ∘ P (`SinkhornResult.row_plan`): rows
        sum to 1 exactly, also for inputs of zero weight."""
        return self.result.row_plan()

    def bcast_b(self):
        b = self.b
        return b if b.shape.rank == 2 else b[None, :]

    def cdf(self):
        """a⁻¹ ∘ (P c) + a/2 `[batch, n]`, c = b̄ − b/2 the centres of the target bins in
        mass (hard limits: `softsort_tf.ops.sinkhorn`)."""
        centres = bin_centres(self.bcast_b())
        return tf.reduce_sum(self.row_plan * centres[:, None, :], axis=-1) + 0.5 * self.a

    def sorted_values(self):
        """b⁻¹ ∘ (Pᵀ x) in the units of x, in `direction` order: `[batch, m]`."""
        # On values centred on a median c of the row, v = c + u/q, mapped back (the
        # columns of P sum to b): keeps the precision of values with a large common
        # offset. q = 1/4 (exact) keeps u finite for values spanning the float range.
        v = tf.stop_gradient(self.values)
        middle = (tf.shape(v)[-1] - 1) // 2
        centre = tf.sort(v, axis=-1)[:, middle][:, None]
        span = (0.25 * tf.reduce_max(v, axis=-1, keepdims=True)
                - 0.25 * tf.reduce_min(v, axis=-1, keepdims=True))
        q = tf.where(span > self.dtype.max / 8, tf.constant(0.25, self.dtype),
                     tf.constant(1.0, self.dtype))
        u = self.values * q - centre * q
        # Divided by the plan's own column sums (b up to rounding): each output is a
        # convex combination of the inputs.
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
      {axis}
      {direction}
      {mask}
      weights: non-negative input weights a, `[n]` or the shape of x (default uniform):
        the input measure, also weighting the squashing's standardisation.
      squash: how inputs are mapped into [0, 1]: 'logistic' (default), 'atan', 'robust'
        or None (the values as they are, ε in their units; for p = 2 the cost is formed
        from the values moved onto the targets per list, less a term per input, so
        neither an offset nor a wide spread costs float32 precision (docs/options.md);
        for other p float32 rounds C/ε by ≈ 1e-7·|x|^p/ε); see
        `softsort_tf.ops.squash`.
      targets: where the targets sit on [0, 1]: 'regular' (default, y_j = (j − 1)/(m − 1))
        or 'centres' (the centres of the target bins in mass).
      check_numerics: raise `InvalidArgumentError` on NaN/Inf in x instead of
        propagating NaN to the affected rows.
      return_info: also return a `SinkhornInfo(num_iterations, error)`.
      options: a `SinkhornOptions` (or its config dict), the solver configuration
        (docs/options.md); default `SinkhornOptions()`.
      **option_kwargs: fields of `SinkhornOptions` (`epsilon`, `threshold`, ...)
        overriding those of `options`."""


def sinkhorn_operator(body):
    """Fills in the shared argument documentation of a Sinkhorn operator body and wraps
    it with `softsort_tf.ops.wrapper.list_operator`."""
    body.__doc__ = body.__doc__.replace("{common}", _COMMON_ARGS_DOC.strip("\n"))
    return list_operator(_docs.fill(body))

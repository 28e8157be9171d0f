"""The solved transport problem shared by every Sinkhorn operator, and its read-outs.

`Transport` brings x `[..., n, ...]` to `[batch, n]`, squashes it into [0, 1], solves
the entropic transport onto a target measure (y, b) with `solvers.sinkhorn.solve`, and
reads out CDFs, sorted values and pushed-forward target values (see
`softsort_tf.ops.sinkhorn` for the operators and their conventions).
"""

from __future__ import annotations

import collections
import os
import sys
import warnings

import keras
import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _masking, _shapes
from softsort_tf.ops.squash import exact_float64, squash_values
from softsort_tf.options import (  # noqa: F401 (re-exported defaults)
    DEFAULT_EPSILON,
    DEFAULT_MAX_ITERATIONS,
    DEFAULT_POWER,
    DEFAULT_THRESHOLD,
    SinkhornOptions,
)
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

# `targets=(LIST_LENGTH, None)`: m = n bins (per list: n_valid bins with a mask).
LIST_LENGTH = "n"


def _is_static_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _normalised(b):
    return b / tf.reduce_sum(b, axis=-1, keepdims=True)


def _target_measure(m, target_weights, dtype, grid: str = "centres", real_bins=None):
    """Returns (y, b) for a target of m uniform bins or the given (positive) weights,
    with y on `grid` ('centres': `bin_centres(b)`; 'regular': `regular_grid(b)`, per row
    on its first `real_bins` bins when given). m may be a scalar tensor (unknown n)."""
    if target_weights is None:
        if tf.is_tensor(m):  # the list length n, unknown at trace time
            b = tf.fill(tf.reshape(m, [1]), 1.0 / tf.cast(m, dtype))
        else:
            m = _checks.check_positive_int("num_targets", m)
            b = tf.fill([m], tf.constant(1.0 / m, dtype))
    else:
        if m is not None and not tf.is_tensor(m):
            m = _checks.check_positive_int("num_targets", m)
        b = tf.convert_to_tensor(target_weights)
        # A zero-mass bin would give 0/0 in the sort read-out: drop the bin instead.
        _checks.check_weight_values("target_weights", b, allow_zero=False)
        b = tf.cast(b, dtype)
        if b.shape.rank not in (1, 2):
            raise ValueError("`target_weights` must have shape [m] or [batch, m].")
        if _is_static_int(m) and b.shape[-1] is not None and b.shape[-1] != m:
            raise ValueError(f"`target_weights` must have length m = {m}, got {b.shape[-1]}.")
        b = _normalised(b)
    y = regular_grid(b, real_bins) if grid == "regular" else bin_centres(b)
    return y, b


def padded_list_target(count, m, dtype):
    """Per-row target weights `[batch, m]` of a padded list: one bin of mass 1 per valid
    entry (the first `count[r]` bins), `NEGLIGIBLE_MASS` for the surplus bins.
    Unnormalised; `count`: `[batch]`."""
    bins = tf.cast(tf.range(m), dtype)[None, :]
    count = tf.cast(count, dtype)[:, None]
    return tf.where(bins < count, tf.ones_like(bins * count),
                    tf.fill(tf.shape(bins * count), tf.constant(NEGLIGIBLE_MASS, dtype)))


class Transport:
    """The solved transport problem of one operator call, in `[batch, ·]` layout."""

    def __init__(self, x, *, axis, direction, weights, targets, options: SinkhornOptions,
                 check_numerics, mask=None):
        """Sets up and solves the transport of x.

        Args:
          targets: `(m, target_weights)`: m bins (`LIST_LENGTH`: m = n, per list the
            n_valid bins of its valid entries with a mask) or the given weights; or a
            callable `targets(count) -> (b, real_bins)` of the number of valid entries
            `count` (`[batch]`, float; n for every row without a mask) returning target
            weights b `[m]` or `[batch, m]` (positive, unnormalised) and the number of
            non-surplus bins of each row (`[batch]`, or None: all).
          mask: padding mask (see `softsort_tf._masking`).
        """
        direction = _checks.check_direction(direction)
        x2d, self.view = _shapes.to_batch(x, axis)
        self.mask = _masking.mask_to_batch(mask, self.view)
        # Padded values are replaced before any arithmetic (NaN/inf padding is harmless).
        x2d = _masking.replace_padded(x2d, self.mask)
        if check_numerics:
            x2d = tf.debugging.check_numerics(x2d, "softsort_tf: `x` has NaN or Inf")
        self.sign = -1.0 if direction == "DESCENDING" else 1.0
        # Sorted ascending == x sorted in `direction`. A negation, not a product with the
        # sign: products flush float32 subnormals to zero on CPU, negations keep them.
        self.values = -x2d if direction == "DESCENDING" else x2d
        self.dtype = x2d.dtype
        self.n = self.view.n
        a = _shapes.weights_to_batch(weights, self.view, self.dtype)
        self.uniform_a = a is None and self.mask is None
        if self.mask is None:
            if a is None:
                inverse_n = (tf.constant(1.0 / self.n, self.dtype) if _is_static_int(self.n)
                             else 1.0 / tf.cast(self.n, self.dtype))
                a = tf.fill(tf.shape(x2d), inverse_n)
            self.count = tf.fill(tf.shape(x2d)[:1], tf.cast(self.n, self.dtype))
            solver_a = a
        else:
            # a: the measure of the valid entries (0 at padding), read by the read-outs;
            # the solver gives the padded entries a negligible mass instead of 0.
            self.count = _masking.n_valid(self.mask, self.dtype)
            a = tf.where(self.mask, tf.ones_like(x2d) if a is None else a, tf.zeros_like(x2d))
            total = tf.reduce_sum(a, axis=-1, keepdims=True)
            a = a / tf.where(total > 0, total, tf.ones_like(total))
            solver_a = _normalised(tf.where(
                self.mask, a, tf.fill(tf.shape(a), tf.constant(NEGLIGIBLE_MASS, self.dtype))
                / tf.maximum(self.count[:, None], 1.0)))
        self.a = a
        check_epsilon_for_dtype(options.solver_kwargs()["epsilon"], self.dtype)
        real_bins = None
        if callable(targets):
            b, real_bins = targets(self.count)
            self.y, self.b = _target_measure(None, b, self.dtype, options.targets, real_bins)
        else:
            m, target_weights = targets
            if m is LIST_LENGTH and target_weights is None and self.mask is not None:
                real_bins = self.count
                target_weights = padded_list_target(self.count, self.n, self.dtype)
                m = None
            elif m is LIST_LENGTH:
                m = self.n if target_weights is None else None
            self.y, self.b = _target_measure(m, target_weights, self.dtype, options.targets,
                                             real_bins)
        self.real_bins = real_bins
        if real_bins is not None and options.targets != "regular":
            bins = tf.cast(tf.range(tf.shape(self.b)[-1]), self.dtype)[None, :]
            self.y = tf.where(bins < tf.cast(real_bins, self.dtype)[:, None], self.y,
                              tf.constant(PADDING_POSITION, self.dtype))
        rows, b_rows = x2d.shape[0], (self.b.shape[0] if self.b.shape.rank == 2 else None)
        if rows is not None and b_rows is not None and b_rows != rows:
            raise ValueError(f"Per-row `target_weights` must have one row per row of x "
                             f"({rows}: the shape of x without `axis`, flattened), got "
                             f"{b_rows}.")
        squashed = squash_values(self.values, options.squash,
                                 weights=None if self.uniform_a else a)
        if self.mask is not None:
            # Padded entries sit with the surplus bins, away from the valid ones.
            squashed = tf.where(self.mask, squashed,
                                tf.fill(tf.shape(squashed),
                                        tf.constant(PADDING_POSITION, squashed.dtype)))
        self.result = solver_lib.solve(squashed, self.y, solver_a, self.b,
                                       **options.solver_kwargs())
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
        """`[batch, n, m]` row-conditional plan a⁻¹ ∘ P, with rows summing to 1 exactly.

        Computed from the target potential alone, Q_ij = exp((g_j − C_ij)/ε) / Σ_k
        exp((g_k − C_ik)/ε) (the row update of eq. 3 divided by a_i), so readouts such
        as the CDF stay in [0, 1] whatever the residual marginal error, and inputs of
        zero weight still get a well-defined row.
        """
        if self._row_plan is None:
            r = self.result
            logits = (r.g[:, None, :] - r.cost) / tf.cast(r.epsilon, r.cost.dtype)
            self._row_plan = tf.nn.softmax(logits, axis=-1)
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
        # off by up to ~900 otherwise). c comes from float64 (float32 inputs are read
        # exactly, see `squash.exact_float64`); q = 1/4 (exact) keeps u finite when the
        # values span more than half of the float range.
        v64 = exact_float64(tf.stop_gradient(self.values))
        middle = (tf.shape(v64)[-1] - 1) // 2
        centre = tf.sort(v64, axis=-1)[:, middle][:, None]
        span = (0.25 * tf.reduce_max(v64, axis=-1, keepdims=True)
                - 0.25 * tf.reduce_min(v64, axis=-1, keepdims=True))
        q = tf.where(span > self.dtype.max / 8, tf.constant(0.25, tf.float64),
                     tf.constant(1.0, tf.float64))
        if self.dtype == tf.float64:
            u = self.values * q - centre * q
        else:
            u = tf.cast(exact_float64(self.values) * q - centre * q, self.dtype)
        # Divided by the plan's own column sums (b up to rounding: in float32 at small ε
        # the potentials are ~1/ε, so P carries relative errors ~1e-5): each output is
        # then an exact convex combination of the inputs, within [min x, max x].
        columns = solver_lib.accurate_sum(self.plan, axis=1)
        b = tf.broadcast_to(self.bcast_b(), tf.shape(columns))
        columns = tf.where(columns > 0, columns, b)
        pushed = solver_lib.accurate_sum(self.plan * u[:, :, None], axis=1) / columns
        s = tf.cast(centre + tf.cast(pushed, tf.float64) / q, self.dtype)
        return -s if self.sign < 0 else s

    def push(self, f):
        """a⁻¹ ∘ (P f) for f `[m]` or `[batch, m]`: `[batch, n]`."""
        f = tf.cast(f, self.dtype)
        f = f[None, :] if f.shape.rank == 1 else f
        return tf.reduce_sum(self.row_plan * f[:, None, :], axis=-1)

    def output(self, y2d, keep_axis=True):
        return _shapes.from_batch(y2d, self.view, keep_axis=keep_axis)

    def output_elementwise(self, y2d):
        """An elementwise `[batch, n]` result, 0 at padded entries, in the input layout."""
        return self.output(_masking.fill_padded(y2d, self.mask))

    def output_sorted(self, s2d):
        """A sorted `[batch, m]` result; with a mask, the positions past the row's
        number of non-surplus bins (its valid sorted values) are 0."""
        if self.mask is not None:
            if self.real_bins is not None:
                keep = _masking.valid_prefix(tf.cast(self.real_bins, tf.int32),
                                             tf.shape(s2d)[-1])
            else:
                keep = tf.broadcast_to((self.count > 0)[:, None], tf.shape(s2d))
            s2d = _masking.fill_padded(s2d, keep)
        return self.output(s2d)

    def output_per_list(self, q2d, keep_axis=True):
        """A result without the list axis (`[batch, q]` or `[batch]`), 0 for rows without
        a valid entry."""
        if self.mask is not None:
            has_valid = self.count > 0
            q2d = _masking.fill_padded(q2d, has_valid[:, None] if keep_axis else has_valid)
        return self.output(q2d, keep_axis=keep_axis)

    def info(self):
        view = self.view
        lead = view.moved_shape[:-1]
        return SinkhornInfo(tf.reshape(self.result.num_iterations, lead),
                            tf.reshape(self.result.error, lead))


def finish(out, transport: Transport, return_info: bool):
    return (out, transport.info()) if return_info else out


_COMMON_ARGS_DOC = """
      axis: the axis to operate along (any axis of an input of any rank >= 1).
      direction: 'ASCENDING' or 'DESCENDING', as in `tf.sort`.
      weights: non-negative input weights a, shape `[n]` or the shape of x (default
        uniform); they are the input measure and weight the squashing's mean and
        standard deviation (a zero-weight outlier does not compress the others).
      check_numerics: raise `InvalidArgumentError` on NaN/Inf in x instead of
        propagating NaN (padded entries are not checked).
      mask: optional boolean (or 0/1) `[n]` or the shape of x, False = padding: see
        `softsort_tf._masking` (padded entries get no mass and output 0). x may also be
        a `tf.RaggedTensor` ragged along its last axis (then `axis` must be the last).
      return_info: also return a `SinkhornInfo(num_iterations, error)`.
      options: a `SinkhornOptions` (or its config dict) with the solver settings;
        default `SinkhornOptions()`: ε = 1e-2, p = 2, threshold 1e-3, 1000
        iterations, implicit gradients, logistic squashing.
      **option_kwargs: fields of `SinkhornOptions` (`epsilon`, `power`, `threshold`,
        `max_iterations`, `implicit`, `squash`, `implicit_solver`, `warm_start`,
        `epsilon_start`, ...) overriding those of `options`."""


def with_common_args_doc(f):
    """Fills in the shared argument documentation of a Sinkhorn operator and marks it
    for AutoGraph as not to be converted: the operators have no tensor-dependent Python
    control flow, and converting their nested target builders broke their closures."""
    f.__doc__ = f.__doc__.replace("{common}", _COMMON_ARGS_DOC.strip("\n"))
    return tf.autograph.experimental.do_not_convert(f)


def static_n(x, axis):
    """The static length of `axis` of x (None when unknown); rejects n = 0."""
    if isinstance(x, tf.RaggedTensor):
        return None
    shape = tf.convert_to_tensor(x).shape
    _checks.check_axis(axis, shape.rank)
    n = shape[axis]
    if n == 0:
        raise ValueError("`x` must have at least one element along `axis` (n >= 1), got n = 0.")
    return n

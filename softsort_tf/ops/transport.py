"""The solved transport problem shared by every Sinkhorn operator, and its read-outs.

`Transport` brings x `[..., n, ...]` to `[batch, n]`, squashes it into [0, 1], solves
the entropic transport onto a target measure (y, b) with `solvers.sinkhorn.solve`, and
reads out CDFs, sorted values and pushed-forward target values (see
`softsort_tf.ops.sinkhorn` for the operators and their conventions).
"""

from __future__ import annotations

import collections
import warnings

import numpy as np
import tensorflow as tf

from softsort_tf import _checks, _shapes
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
            SinkhornConvergenceWarning, stacklevel=4)


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


def regular_grid(b):
    """The paper's regular grid y_j = (j − 1)/(m − 1) on [0, 1] (Fig. 2, eq. 4) for
    target weights b `[..., m]`, whatever their masses; 0.5 for m = 1."""
    m = tf.shape(b)[-1]
    steps = tf.cast(tf.range(m), b.dtype)
    offset = tf.cast(tf.where(m > 1, 0.0, 0.5), b.dtype)
    y = steps / tf.cast(tf.maximum(m - 1, 1), b.dtype) + offset
    return tf.broadcast_to(y, tf.shape(b))


def _target_measure(m: int | None, target_weights, dtype, grid: str = "centres"):
    """Returns (y, b) for a target of m uniform bins or the given (positive) weights,
    with y on `grid` ('centres': `bin_centres(b)`; 'regular': `regular_grid(b)`)."""
    if target_weights is None:
        m = _checks.check_positive_int("num_targets", m)
        b = tf.fill([m], tf.constant(1.0 / m, dtype))
    else:
        if m is not None:
            m = _checks.check_positive_int("num_targets", m)
        b = tf.convert_to_tensor(target_weights)
        # A zero-mass bin would give 0/0 in the sort read-out: drop the bin instead.
        _checks.check_weight_values("target_weights", b, allow_zero=False)
        b = tf.cast(b, dtype)
        if b.shape.rank not in (1, 2):
            raise ValueError("`target_weights` must have shape [m] or [batch, m].")
        if m is not None and b.shape[-1] is not None and b.shape[-1] != m:
            raise ValueError(f"`target_weights` must have length m = {m}, got {b.shape[-1]}.")
        b = b / tf.reduce_sum(b, axis=-1, keepdims=True)
    return (regular_grid(b) if grid == "regular" else bin_centres(b)), b


class Transport:
    """The solved transport problem of one operator call, in `[batch, ·]` layout."""

    def __init__(self, x, *, axis, direction, weights, targets, options: SinkhornOptions,
                 check_numerics):
        direction = _checks.check_direction(direction)
        x2d, self.view = _shapes.to_batch(x, axis)
        if check_numerics:
            x2d = tf.debugging.check_numerics(x2d, "softsort_tf: `x` has NaN or Inf")
        self.sign = -1.0 if direction == "DESCENDING" else 1.0
        # Sorted ascending == x sorted in `direction`. A negation, not a product with the
        # sign: products flush float32 subnormals to zero on CPU, negations keep them.
        self.values = -x2d if direction == "DESCENDING" else x2d
        self.dtype = x2d.dtype
        self.n = self.view.n
        a = _shapes.weights_to_batch(weights, self.view, self.dtype)
        self.uniform_a = a is None
        if a is None:
            a = tf.fill(tf.shape(x2d), tf.constant(1.0 / self.n, self.dtype))
        self.a = a
        check_epsilon_for_dtype(options.solver_kwargs()["epsilon"], self.dtype)
        m, target_weights = targets
        self.y, self.b = _target_measure(m, target_weights, self.dtype, options.targets)
        rows, b_rows = x2d.shape[0], (self.b.shape[0] if self.b.shape.rank == 2 else None)
        if rows is not None and b_rows is not None and b_rows != rows:
            raise ValueError(f"Per-row `target_weights` must have one row per row of x "
                             f"({rows}: the shape of x without `axis`, flattened), got "
                             f"{b_rows}.")
        squashed = squash_values(self.values, options.squash,
                                 weights=None if self.uniform_a else a)
        self.result = solver_lib.solve(squashed, self.y, a, self.b, **options.solver_kwargs())
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
        propagating NaN.
      return_info: also return a `SinkhornInfo(num_iterations, error)`.
      options: a `SinkhornOptions` (or its config dict) with the solver settings;
        default `SinkhornOptions()`: ε = 1e-2, p = 2, threshold 1e-3, 1000
        iterations, implicit gradients, logistic squashing.
      **option_kwargs: fields of `SinkhornOptions` (`epsilon`, `power`, `threshold`,
        `max_iterations`, `implicit`, `squash`, `implicit_solver`, `warm_start`,
        `epsilon_start`, ...) overriding those of `options`."""


def with_common_args_doc(f):
    f.__doc__ = f.__doc__.replace("{common}", _COMMON_ARGS_DOC.strip("\n"))
    return f


def static_n(x, axis):
    shape = tf.convert_to_tensor(x).shape
    _checks.check_axis(axis, shape.rank)
    n = shape[axis]
    if n == 0:
        raise ValueError("`x` must have at least one element along `axis` (n >= 1), got n = 0.")
    return n

"""±inf scores of SoftSort and NeuralSort as the limits of scores growing without bound
(`softsort_tf.ops.permutation.centred_with_stand_ins`): each ±inf is replaced by a
finite stand-in so far beyond the finite scores that the weights across the gap are
exactly 0 in the compute dtype (NeuralSort: with A_s·1 summed over the finite entries
and the rows' coefficients of the finite list alone).

- P̂ of a list with ±inf puts the infinities at the ends (ties share their rows
  evenly) around P̂ of the finite entries alone, and equals P̂ with large finite scores
  in their place (the limit), for both directions, distance powers, dtypes, `log=True`
  and masks;
- rank, sort and top-k of the front door are read off that matrix; sorted values hold
  ±inf at the ends (no 0·inf = NaN), `permute_values` included;
- `hard=True` is the exact permutation forward; gradients are finite, 0 at the
  infinities, and those of the large finite scores elsewhere;
- XLA (n static or unknown at trace time) gives the eager results.
"""

import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss

inf = np.inf
ROWS = np.array([[0.3, -1.2, inf, 0.7, -0.1, 1.1],
                 [inf, -1.2, -inf, 0.7, inf, 1.1],
                 [-inf, -inf, 0.5, -inf, 2.0, 0.25],
                 [inf, inf, -inf, inf, -inf, inf],
                 [0.3, -1.2, 2.0, 0.7, -0.1, 1.1]])
TAU = 0.3
METHODS = ["softsort", "neuralsort"]
# (method, distance power, a finite stand-in for ±inf far enough out that the weights
# across the gap are 0 in float64: SoftSort's exp(−d^p/τ) beyond d^p/τ ≈ 745).
LIMIT_CASES = [("softsort", 1.0, 1e4), ("softsort", 2.0, 1e2), ("softsort", 0.5, 1e9),
               ("neuralsort", None, 1e4)]


def _stand_in(rows, big):
    """`rows` with +inf → +big, −inf → −big."""
    return np.where(np.isposinf(rows), big, np.where(np.isneginf(rows), -big, rows))


def _finite(a):
    a = np.asarray(a)
    assert np.all(np.isfinite(a)), a
    return a


def _blocks(row, alone, first):
    """The `[n, n]` matrix of a row with ±inf from the matrix `alone` of its finite
    entries: the `first` infinities' rows (1/count on each), then `alone`, then the
    others'."""
    n = len(row)
    head, fin = row == first, np.isfinite(row)
    tail = np.isinf(row) & ~head
    out = np.zeros([n, n])
    h, f = head.sum(), fin.sum()
    out[:h][:, head] = 1.0 / max(h, 1)
    out[h:h + f][:, fin] = alone
    out[h + f:][:, tail] = 1.0 / max(tail.sum(), 1)
    return out


def _matrix(x, method="softsort", power=None, **kwargs):
    if method == "softsort":
        return ss.softsort_permutation_matrix(x, tau=TAU, distance_power=power or 1.0,
                                              **kwargs)
    return ss.neuralsort_permutation_matrix(x, tau=TAU, **kwargs)


def _ops(method):
    return dict(temperature=TAU, method=method)


@pytest.mark.parametrize("direction", ["DESCENDING", "ASCENDING"])
@pytest.mark.parametrize("method, power, big", LIMIT_CASES)
def test_matrix_is_the_limit(method, power, big, direction):
    """P̂ with ±inf: the infinities' shared rows around P̂ of the finite entries alone,
    and P̂ of large finite scores in their place (float64)."""
    got = _finite(_matrix(tf.constant(ROWS), method, power, direction=direction).numpy())
    first = inf if direction == "DESCENDING" else -inf
    for row, perm in zip(ROWS, got, strict=True):
        fin = np.isfinite(row)
        alone = (_matrix(tf.constant(row[fin][None]), method, power,
                         direction=direction).numpy()[0] if fin.any() else np.zeros([0, 0]))
        np.testing.assert_allclose(perm, _blocks(row, alone, first), rtol=0, atol=1e-12)
    want = _matrix(tf.constant(_stand_in(ROWS, big)), method, power, direction=direction)
    # The reference rounds its scores by ulp(big/2) among ±big (NeuralSort: times n/τ).
    atol = max(1e-12, 1e3 * np.spacing(big / 2)) * (100 if method == "neuralsort" else 1)
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=atol)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
@pytest.mark.parametrize("tau", [1e-3, 1.0])
def test_lists_without_spread(method, dtype, tau):
    """One finite entry, or several equal ones, among infinities (no spread to measure
    the gap by): the infinities' rows and the finite block exactly, at a small τ too."""
    rows = np.array([[inf, 0.7, -inf, inf, -inf, -inf], [-inf, 2.0, 2.0, inf, 2.0, -inf]])
    got = _finite(tf.cast(_matrix_at(tf.constant(rows, dtype), method, tau),
                          tf.float64).numpy())
    for row, perm in zip(rows, got, strict=True):
        fin = np.isfinite(row)
        alone = _matrix_at(tf.constant(row[fin][None], dtype), method, tau).numpy()[0]
        np.testing.assert_allclose(perm, _blocks(row, alone, inf), rtol=0, atol=1e-6)


def _matrix_at(x, method, tau):
    fn = (ss.softsort_permutation_matrix if method == "softsort"
          else ss.neuralsort_permutation_matrix)
    return fn(x, tau=tau)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32])
def test_reduced_precision_matches_float64(dtype, method):
    """float16/bfloat16/float32 scores with ±inf: the float64 matrix to the dtype's
    precision, finite, with exact zeros across the gap."""
    x = ROWS.astype(np.float32)
    got = _finite(tf.cast(_matrix(tf.cast(tf.constant(x), dtype), method), tf.float64).numpy())
    want = _matrix(tf.constant(x.astype(np.float64)), method).numpy()
    np.testing.assert_allclose(got, want, atol=1e-2 if dtype != tf.float32 else 1e-6)
    assert np.all(got[want == 0] == 0)  # the limit's zeros stay exact


@pytest.mark.parametrize("method", METHODS)
def test_log_matrix(method):
    """log=True: log P̂ whose exp is P̂; finite entries of log P̂ where P̂ > 0."""
    x = tf.constant(ROWS)
    perm = _matrix(x, method).numpy()
    log_perm = _matrix(x, method, log=True).numpy()
    assert not np.any(np.isnan(log_perm))
    np.testing.assert_allclose(np.exp(log_perm), perm, rtol=1e-12, atol=1e-300)
    assert np.all(np.isfinite(log_perm[perm > 0]))


@pytest.mark.parametrize("method", METHODS)
def test_operations_are_read_off_the_limit(method):
    """rank = P̂ᵀ(1..n), top-k = the first k rows of P̂ (Σ = k), sort = P̂ @ x with ±inf
    at the ends and the large finite scores' sorted values elsewhere."""
    x = tf.constant(ROWS)
    ascending = _matrix(x, method, direction="ASCENDING").numpy()
    descending = _matrix(x, method).numpy()
    ranks = ss.soft_rank(x, **_ops(method)).numpy()
    np.testing.assert_allclose(_finite(ranks),
                               np.einsum("bij,i->bj", ascending, np.arange(1, 7)), atol=1e-12)
    topk = ss.soft_topk(x, 3, **_ops(method)).numpy()
    np.testing.assert_allclose(_finite(topk), descending[:, :3].sum(axis=1), atol=1e-12)
    np.testing.assert_allclose(topk.sum(axis=-1), 3.0, atol=1e-12)
    values = ss.soft_sort(x, **_ops(method)).numpy()
    hard = np.sort(ROWS, axis=-1)
    assert not np.any(np.isnan(values)), values
    np.testing.assert_array_equal(values[np.isinf(hard)], hard[np.isinf(hard)])
    stand_in = ss.soft_sort(tf.constant(_stand_in(ROWS, 1e4)), **_ops(method)).numpy()
    np.testing.assert_allclose(values[np.isfinite(hard)], stand_in[np.isfinite(hard)],
                               atol=1e-9)


@pytest.mark.parametrize("method", METHODS)
def test_gradients_are_those_of_the_limit(method):
    """Gradients of finite functionals of rank, top-k, sort and P̂: finite, 0 at the
    infinities, and those of the large finite scores at the finite entries."""
    weights = np.random.default_rng(0).normal(size=[5, 6, 6])

    def grads(rows):
        x = tf.constant(rows)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            outs = [ss.soft_rank(x, **_ops(method)), ss.soft_topk(x, 2, **_ops(method)),
                    ss.soft_sort(x, **_ops(method)), _matrix(x, method)]
            losses = [tf.reduce_sum(tf.where(tf.math.is_finite(o), o, 0.0)
                                    * (weights if o.shape.rank == 3 else weights[..., 0]))
                      for o in outs]
        return [tape.gradient(loss, x).numpy() for loss in losses]

    for got, want in zip(grads(ROWS), grads(_stand_in(ROWS, 1e4)), strict=True):
        _finite(got)
        assert np.all(got[np.isinf(ROWS)] == 0), got
        np.testing.assert_allclose(got[np.isfinite(ROWS)], want[np.isfinite(ROWS)],
                                   atol=1e-7)


@pytest.mark.parametrize("method", METHODS)
def test_hard_is_the_exact_permutation(method):
    """hard=True: the exact (stable) permutation of the list with its infinities."""
    x = tf.constant(ROWS)
    np.testing.assert_array_equal(_matrix(x, method, hard=True).numpy(),
                                  ss.hard_permutation_matrix(x).numpy())


@pytest.mark.parametrize("method", METHODS)
def test_masked_infinities(method):
    """Padded entries (±inf or NaN among them) are not infinities of the list: the
    valid block is P̂ of the valid entries alone, with their infinities."""
    rows = np.array([[inf, 0.3, np.nan, -1.2, -inf, 2.0], [1.0, -inf, 0.5, inf, 0.0, 0.1]])
    mask = np.array([[1, 1, 0, 1, 1, 1], [1, 0, 1, 0, 1, 1]], bool)
    got = _matrix(tf.constant(rows), method, mask=tf.constant(mask)).numpy()
    for r in range(2):
        alone = _matrix(tf.constant(rows[r][mask[r]][None]), method).numpy()[0]
        nv = mask[r].sum()
        np.testing.assert_allclose(_finite(got[r][:nv][:, mask[r]]), alone, atol=1e-12)
        assert np.all(got[r][nv:] == 0) and np.all(got[r][:, ~mask[r]] == 0)


@pytest.mark.parametrize("method", METHODS)
def test_temperature_beyond_the_reach_of_the_dtype_stays_finite(method):
    """A temperature so large that no float32 gap zeroes the weights: the stand-ins
    are capped (no overflow, no NaN); rows still sum to 1."""
    x = tf.constant(ROWS.astype(np.float32))
    fn = (ss.softsort_permutation_matrix if method == "softsort"
          else ss.neuralsort_permutation_matrix)
    for tau in (3e38, 1e-30):
        perm = _finite(fn(x, tau=tau).numpy())
        np.testing.assert_allclose(perm.sum(axis=-1), 1.0, atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("unknown_n", [False, True])
def test_xla_matches_eager(unknown_n, method):
    """`jit_compile=True` (n static or unknown at trace time) gives the eager matrix,
    sort and gradient, on lists with infinities and on a batch without any (of the same
    shape: one XLA compilation)."""
    spec = tf.TensorSpec([None, None if unknown_n else 6], tf.float64)

    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            perm = _matrix(x, method)
            values = ss.soft_sort(x, **_ops(method))
            loss = tf.reduce_sum(perm[:, :2]) + tf.reduce_sum(
                tf.where(tf.math.is_finite(values), values, 0.0) ** 2)
        return perm, values, tape.gradient(loss, x)

    compiled = tf.function(run, jit_compile=True, input_signature=[spec])
    finite = np.stack([np.roll(ROWS[-1], k) for k in range(len(ROWS))])
    for rows in (ROWS, finite):
        x = tf.constant(rows)
        for got, want in zip(compiled(x), run(x), strict=True):
            np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-12)
            assert not np.any(np.isnan(got.numpy()))


def test_permute_values_with_infinite_values():
    """P @ x for a hard P and values with ±inf is the sort (not 0·inf = NaN); a soft
    row with mass on +inf and −inf gives NaN, with mass on one of them that one."""
    x = tf.constant([[2.0, -inf, 0.5, inf, 1.0]])
    perm = ss.hard_permutation_matrix(x, direction="ASCENDING")
    np.testing.assert_array_equal(ss.permute_values(perm, x).numpy(),
                                  np.sort(x.numpy(), axis=-1))
    soft = tf.constant([[[0.5, 0.0, 0.0, 0.5, 0.0], [0.0, 0.5, 0.0, 0.5, 0.0],
                         [0.25, 0.0, 0.75, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0],
                         [0.0, 1.0, 0.0, 0.0, 0.0]]])
    got = ss.permute_values(soft, x)
    np.testing.assert_array_equal(got.numpy()[0], [inf, np.nan, 0.875, 1.0, -inf])

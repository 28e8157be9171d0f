"""Tests of `softsort_tf.ops.squash`: the weighted standardisation and the 'robust'
squash (median and MAD), its weights, gradients and documented limit."""

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from operator_cases import batched_jacobians

import softsort_tf as ss
from softsort_tf.ops import squash as squash_lib

SETTINGS = settings(max_examples=15, deadline=None)


seeds = st.integers(0, 10_000)


@SETTINGS
@given(st.integers(2, 12), seeds, st.floats(1e-20, 1e20))
def test_weighted_standardisation(n, seed, scale):
    """Weighted mean 0 and weighted variance 1; zero-weight entries change nothing."""
    rng = np.random.RandomState(seed)
    x = rng.randn(3, n) * scale
    w = rng.uniform(0.1, 1.0, (3, n))
    z = squash_lib.standardize(x, weights=w).numpy()
    wn = w / w.sum(1, keepdims=True)
    np.testing.assert_allclose((wn * z).sum(1), 0.0, atol=1e-9)
    np.testing.assert_allclose((wn * z * z).sum(1), 1.0, rtol=1e-9)
    expected = (x - (wn * x).sum(1, keepdims=True))
    expected /= np.sqrt((wn * expected**2).sum(1, keepdims=True))
    np.testing.assert_allclose(z, expected, rtol=1e-7, atol=1e-9)
    # Uniform weights give the unweighted standardisation.
    np.testing.assert_allclose(squash_lib.standardize(x, weights=np.ones_like(x)).numpy(),
                               squash_lib.standardize(x).numpy(), rtol=1e-9, atol=1e-12)
    # A zero-weight outlier, however large, leaves the squashed values of the others alone.
    outlier = np.concatenate([x, np.full((3, 1), 1e30 * np.sign(scale))], axis=1)
    w0 = np.concatenate([w, np.zeros((3, 1))], axis=1)
    s = squash_lib.squash_values(outlier, weights=w0).numpy()
    np.testing.assert_allclose(s[:, :n], squash_lib.squash_values(x, weights=w).numpy(),
                               rtol=1e-9, atol=1e-12)
    assert np.all(np.isfinite(s)) and np.all(s[:, n] > 0.99)


@SETTINGS
@given(st.integers(1, 40), seeds, st.sampled_from([0, 1]),
       st.sampled_from([np.float16, np.float32, np.float64]))
def test_weighted_median_of_0_1_weights_is_the_lower_median_of_the_selected(n, seed, axis,
                                                                           dtype):
    """0/1 weights select entries; the median is the lower median of those, along either
    axis and in every float dtype, and unselected ±inf entries never become it."""
    rng = np.random.RandomState(seed)
    x = rng.randint(-5, 6, (n, 4)).astype(dtype)  # ties included
    keep = rng.rand(n, 4) < 0.6
    keep[rng.randint(n) if axis == 0 else 0, :] = True
    keep[:, rng.randint(4)] = True
    x = np.where(keep, x, np.where(rng.rand(n, 4) < 0.5, np.inf, -np.inf)).astype(dtype)
    got = squash_lib.weighted_median(tf.constant(x), tf.constant(keep.astype(dtype)), axis)
    got = got.numpy()
    assert got.shape == (1, 4) if axis == 0 else got.shape == (n, 1)
    assert np.all(np.isfinite(got))
    for j in range(x.shape[1 - axis]):
        line, selected = (x[:, j], keep[:, j]) if axis == 0 else (x[j], keep[j])
        values = np.sort(line[selected])
        assert got.flat[j] == values[(len(values) - 1) // 2]


def test_robust_squash_is_weighted_and_differentiable():
    x = tf.constant([[0.3, -1.0, 2.0, 5.0, 1e6]], tf.float64)
    w = tf.constant([[1.0, 1.0, 1.0, 1.0, 0.0]], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x)
        r = ss.sinkhorn_rank(x, weights=w, squash="robust", epsilon=1e-2)
        loss = tf.reduce_sum(r * tf.constant([[1.0, 2.0, 3.0, 4.0, 5.0]], tf.float64))
    g = tape.gradient(loss, x).numpy()
    assert np.all(np.isfinite(g)) and np.any(g != 0)
    with pytest.raises(ValueError, match="`squash`"):
        ss.sinkhorn_rank(x, squash="median")


@pytest.mark.parametrize("weights", [None, [1.0, 2.0, 1.0, 0.5, 1.0, 1.5]])
def test_robust_squash_gradients_match_finite_differences(weights):
    # The median and the MAD move with the entries they are read from: their
    # derivatives are part of the gradient (a stopped gradient fails here).
    x = np.array([[0.3, -1.2, 2.0, 0.9, -0.1, 5.0]])
    kwargs = dict(squash="robust", epsilon=0.05, threshold=1e-12, max_iterations=20000)
    args = [x] if weights is None else [x, np.array([weights])]
    for op in (ss.sinkhorn_rank, ss.sinkhorn_sort):
        fn = lambda v, w=None, op=op: op(v, weights=w, **kwargs)  # noqa: E731
        theoretical, numerical = batched_jacobians(fn, args, delta=1e-6)
        assert np.abs(theoretical).max() > 1e-3
        np.testing.assert_allclose(theoretical, numerical, atol=1e-5, rtol=1e-3,
                                   err_msg=op.__name__)
    squashed = lambda v: ss.squash_values(v, "robust")  # noqa: E731
    theoretical, numerical = batched_jacobians(squashed, [x], delta=1e-6)
    np.testing.assert_allclose(theoretical, numerical, atol=1e-6, rtol=1e-4)


def test_robust_squash_limit_on_rows_mostly_of_huge_values_and_the_remedy():
    """The documented limit of squash='robust': when most of a row is orders of
    magnitude larger than the rest, the small entries tie; LapSum (no squashing)
    resolves them."""
    x = np.array([[3.0e38, 3.1e38, 3.2e38, 1.0, -5.0, 2.5e38, 0.5]], np.float32)
    hard = scipy.stats.rankdata(x, axis=-1)
    robust = ss.sinkhorn_rank(x, squash="robust", epsilon=1e-4).numpy()
    small = robust[0, [3, 4, 6]]
    assert small.max() - small.min() < 0.5  # the small entries tie (the limit)
    lapsum = ss.soft_rank(x, "lapsum", temperature=0.01).numpy()
    assert np.all(np.isfinite(lapsum))
    np.testing.assert_allclose(lapsum, hard, atol=0.05)


@pytest.mark.parametrize("squash", ["logistic", "atan", "robust"])
def test_ragged_lists_are_squashed_each_on_its_own(squash):
    """A ragged x: each list squashed as alone (float64), empty lists kept, outer ragged
    axes kept; the padding gets no gradient and moves none."""
    rng = np.random.default_rng(3)
    lists = [list(rng.normal(size=n) * 10.0 ** rng.integers(-3, 4)) for n in (4, 1, 0, 6, 2)]
    lists[3][2] = 1e30  # an outlier in one list leaves the other lists alone
    ragged = tf.ragged.constant(lists, tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(ragged.flat_values)
        out = ss.squash_values(ragged, squash)
        total = tf.reduce_sum(out.flat_values * tf.range(1.0, 14.0, dtype=tf.float64))
    assert isinstance(out, tf.RaggedTensor) and out.dtype == tf.float64
    assert [len(row) for row in out.to_list()] == [len(row) for row in lists]
    grad = tf.convert_to_tensor(tape.gradient(total, ragged.flat_values)).numpy()
    start = 0
    for row, squashed in zip(lists, out.to_list(), strict=True):
        if row:
            x = tf.constant([row], tf.float64)
            with tf.GradientTape() as tape:
                tape.watch(x)
                alone = ss.squash_values(x, squash)
                value = tf.reduce_sum(alone[0] * tf.range(start + 1.0, start + len(row) + 1.0,
                                                          dtype=tf.float64))
            np.testing.assert_allclose(squashed, alone.numpy()[0], rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(grad[start:start + len(row)],
                                       tape.gradient(value, x).numpy()[0], rtol=1e-9,
                                       atol=1e-15)
        start += len(row)
    assert np.all(np.isfinite(out.flat_values.numpy())) and np.all(np.isfinite(grad))
    nested = ss.squash_values(tf.RaggedTensor.from_row_lengths(ragged, [2, 3]), squash)
    np.testing.assert_array_equal(nested.flat_values.numpy(), out.flat_values.numpy())


def test_ragged_squash_takes_no_weights_and_only_the_list_axis():
    ragged = tf.ragged.constant([[1.0, 2.0], [3.0]])
    with pytest.raises(ValueError, match=r"`weights`.*ragged `x`.*pad it"):
        ss.squash_values(ragged, weights=tf.ragged.constant([[1.0, 1.0], [1.0]]))
    with pytest.raises(ValueError, match=r"ragged `x`.*`axis` must be -1"):
        ss.squash_values(ragged, axis=0)
    assert ss.squash_values(ragged, None) is ragged


def test_float32_standardisation_keeps_subnormal_rows_without_float64():
    """float32 rows are standardised in float32 (no float64 op in the graph: TFLite and
    GPUs), rows of subnormals first scaled up exactly from their bits (TensorFlow's CPU
    kernels flush them to zero): the result equals the standardisation of the same row
    scaled by 2¹⁰⁰ computed in float64, eagerly and under XLA; the gradients of the
    normal rows are finite."""
    rows = np.array([[6e-40, -1e-40, 3e-40, 2e-40, 1e-45, 0.0],
                     [3.0e38, -1.0e38, 2.5, 0.0, -3.4e38, 1e37],
                     [1e-30, 3e-31, -2e-30, 5e-32, 0.0, 1e-31]], np.float32)
    exact = np.array([[float(np.float64(v)) for v in row] for row in rows])
    want = squash_lib.standardize(tf.constant(exact * np.array([[2.0 ** 100], [1.0], [1.0]])))
    fn = squash_lib.standardize
    for run in (fn, tf.function(fn, jit_compile=True)):
        got = run(tf.constant(rows)).numpy()
        assert got.dtype == np.float32 and np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want.numpy(), rtol=2e-6, atol=2e-6)
    assert np.all(np.diff(got[0][np.argsort(rows[0])]) > 0)  # order kept, 1e-45 included
    x = tf.constant(rows)
    with tf.GradientTape() as tape:
        tape.watch(x)
        total = tf.reduce_sum(squash_lib.standardize(x) * np.arange(6.0, dtype=np.float32))
    # (The subnormal row's gradient, ~1/1e-40, is beyond float32: not checked.)
    assert np.all(np.isfinite(tape.gradient(total, x).numpy()[1:]))
    graph = tf.function(fn).get_concrete_function(tf.TensorSpec([3, 6], tf.float32))
    assert not any(op.outputs and op.outputs[0].dtype == tf.float64
                   for op in graph.graph.get_operations())

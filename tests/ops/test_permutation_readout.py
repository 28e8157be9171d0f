"""Tests of `softsort_tf.ops.permutation_readout`: sorted values and ranks read out of
exact and relaxed permutation matrices, broadcast over samples, on padded and ragged
lists (and through the permutation layers' `output_mode`)."""

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy_references import np_perm_matrix
from operator_cases import TAU, padded_batches

import softsort_tf as ss
from softsort_tf import _masking

SETTINGS = settings(max_examples=10, deadline=None)


directions = st.sampled_from(["ASCENDING", "DESCENDING"])


seeds = st.integers(0, 10_000)


leading_shapes = st.sampled_from([(), (3,), (2, 2)])


@SETTINGS
@given(leading_shapes, st.integers(1, 8), directions, seeds)
def test_permute_values_and_ranks_of_exact_permutations(lead, n, direction, seed):
    rng = np.random.RandomState(seed)
    s = rng.randn(*lead, n)
    values = rng.randn(*lead, n)
    perm = ss.hard_permutation_matrix(s, direction)
    np.testing.assert_array_equal(perm.numpy(), np_perm_matrix(s, direction))
    order = np.argsort(-s if direction == "DESCENDING" else s, axis=-1)
    np.testing.assert_allclose(ss.permute_values(perm, values).numpy(),
                               np.take_along_axis(values, order, -1))
    sign = -1 if direction == "DESCENDING" else 1
    expected_ranks = scipy.stats.rankdata(sign * s, axis=-1)
    np.testing.assert_allclose(ss.ranks_from_permutation(perm).numpy(), expected_ranks)
    np.testing.assert_allclose(ss.ranks_from_permutation(perm, zero_based=True).numpy(),
                               expected_ranks - 1)


def test_soft_helpers_are_weighted_averages_and_broadcast_over_samples():
    s = tf.constant(np.random.RandomState(13).randn(2, 5))
    values = tf.constant(np.random.RandomState(14).randn(2, 5))
    perm = ss.softsort_permutation_matrix(s, tau=1.0)
    np.testing.assert_allclose(ss.permute_values(perm, values).numpy(),
                               np.einsum("bij,bj->bi", perm.numpy(), values.numpy()))
    np.testing.assert_allclose(ss.ranks_from_permutation(perm).numpy(),
                               np.einsum("bij,i->bj", perm.numpy(), np.arange(1, 6)))
    sinkhorn = ss.sinkhorn_permutation_matrix(s, epsilon=0.5)
    ranks = ss.ranks_from_permutation(sinkhorn).numpy()
    assert ranks.min() >= 1 - 1e-6 and ranks.max() <= 5 + 1e-6
    np.testing.assert_allclose(ranks.sum(-1), 15.0, rtol=1e-4)
    stochastic = ss.stochastic_softsort_permutation_matrix(s, 3, seed=1)
    out = ss.permute_values(stochastic, values)  # [2, 5] values vs [2, 3, 5, 5] matrices
    assert out.shape == (2, 3, 5)
    np.testing.assert_allclose(out.numpy()[:, 1], ss.permute_values(stochastic[:, 1],
                                                                    values).numpy())
    assert ss.permute_values(perm, tf.constant([1, 2, 3, 4, 5])).dtype == tf.float64


READOUTS = {
    # name: f(scores, values, mask) → [..., n]; kind of output.
    "permute_values_softsort": (lambda s, v, mask: ss.permute_values(
        ss.softsort_permutation_matrix(s, tau=TAU, mask=mask), v, mask=mask), "sorted"),
    "permute_values_neuralsort": (lambda s, v, mask: ss.permute_values(
        ss.neuralsort_permutation_matrix(s, tau=TAU, mask=mask), v, mask=mask), "sorted"),
    "ranks_softsort": (lambda s, v, mask: ss.ranks_from_permutation(
        ss.softsort_permutation_matrix(s, tau=TAU, mask=mask)), "elementwise"),
    "ranks_neuralsort_zero_based": (lambda s, v, mask: ss.ranks_from_permutation(
        ss.neuralsort_permutation_matrix(s, tau=TAU, mask=mask), zero_based=True, mask=mask),
        "elementwise"),
    "layer_softsort_sorted": (lambda s, v, mask: ss.SoftSort(
        tau=TAU, output_mode="sorted", dtype="float64")([s, v], mask=mask), "sorted"),
    "layer_neuralsort_ranks": (lambda s, v, mask: ss.NeuralSort(
        tau=TAU, output_mode="ranks", dtype="float64")(s, mask=mask), "elementwise"),
}


def _readout_and_gradients(fn, x, values, mask, weights):
    x, values = tf.constant(x), tf.constant(values)
    with tf.GradientTape() as tape:
        tape.watch([x, values])
        out = fn(x, values, mask)
        total = tf.reduce_sum(tf.constant(weights) * out)
    grads = tape.gradient(total, [x, values])  # one backward pass for both
    return out.numpy(), [np.zeros(x.shape) if g is None else g.numpy() for g in grads]


@pytest.mark.parametrize("name", sorted(READOUTS))
@settings(max_examples=15, deadline=None)
@given(batch=padded_batches())
def test_padded_readouts_equal_unpadded_readouts(name, batch):
    fn, kind = READOUTS[name]
    x, mask, seed = batch
    rng = np.random.RandomState(seed)
    values = np.where(mask, rng.randn(*x.shape), np.nan)  # padded values: NaN too
    weights = rng.randn(*x.shape)
    out, (grad_x, grad_v) = _readout_and_gradients(fn, x, values, mask, weights)
    assert np.all(np.isfinite(out))
    for r in range(2):
        valid = mask[r]
        nv = valid.sum()
        positions = np.arange(nv) if kind == "sorted" else np.flatnonzero(valid)
        ref, (ref_gx, ref_gv) = _readout_and_gradients(
            fn, x[r, valid][None], values[r, valid][None], None, weights[r, positions][None])
        np.testing.assert_allclose(out[r, positions], ref[0], rtol=1e-12, atol=1e-12)
        fill = np.setdiff1d(np.arange(x.shape[1]), positions)
        assert np.all(out[r, fill] == 0)
        for grad, ref_grad in ((grad_x, ref_gx), (grad_v, ref_gv)):
            assert np.all(np.isfinite(grad[r]))
            np.testing.assert_allclose(grad[r, valid], ref_grad[0], rtol=1e-9, atol=1e-11)
            assert np.all(grad[r, ~valid] == 0)


def test_ragged_readouts_and_rankdata():
    lists = [[3.0, 1.0, 2.0], [5.0], [0.0, -1.0]]
    r = tf.ragged.constant(lists)
    perm = ss.softsort_permutation_matrix(r, tau=0.01)
    assert ss.permute_values(perm, r).to_list() == [[3.0, 2.0, 1.0], [5.0], [0.0, -1.0]]
    assert ss.ranks_from_permutation(perm).to_list() == [[1.0, 3.0, 2.0], [1.0], [1.0, 2.0]]
    assert ss.rankdata(r).to_list() == [[3.0, 1.0, 2.0], [1.0], [2.0, 1.0]]


@pytest.mark.parametrize("buckets", [1, 4])
def test_ragged_readouts_of_sampled_matrices(buckets, monkeypatch):
    """Ragged `[lists, (S), (n), (n)]` matrices (one per sample) with values `[lists, (n)]`:
    ragged `[lists, (S), (n)]` readouts, each that of its dense matrix; an empty list and a
    group of empty lists only included."""
    monkeypatch.setattr(_masking, "RAGGED_BUCKETS", buckets)
    lists = [[0.3, 2.0, 1.0], [1.5], [], [4.0, -1.0]]
    values = tf.ragged.constant(lists, tf.float64)
    perm = ss.stochastic_softsort_permutation_matrix(values, 2, (1, 2))
    sorted_values = ss.permute_values(perm, values).to_list()
    ranks = ss.ranks_from_permutation(perm).to_list()
    for row, matrices, sorted_row, rank_row in zip(lists, perm.to_list(), sorted_values, ranks,
                                                   strict=True):
        assert len(matrices) == len(sorted_row) == len(rank_row) == 2
        for matrix, got_sorted, got_ranks in zip(matrices, sorted_row, rank_row, strict=True):
            assert len(got_sorted) == len(got_ranks) == len(row)
            if row:
                matrix = np.asarray(matrix)
                assert np.all(np.isfinite(got_sorted)) and np.all(np.isfinite(got_ranks))
                np.testing.assert_allclose(got_sorted, matrix @ row, rtol=1e-12)
                np.testing.assert_allclose(got_ranks, np.arange(1, len(row) + 1) @ matrix,
                                           rtol=1e-12)

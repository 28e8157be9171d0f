"""Ragged inputs are computed in groups of lists of similar length
(`softsort_tf._masking.map_lists`, `RAGGED_BUCKETS` groups): the grouping must not
change any list's result or gradient, nor the order of the lists, in eager mode and in
graphs with an unknown number of lists (fewer lists than groups included)."""

import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss
from softsort_tf import _masking

TIGHT = dict(epsilon=0.05, threshold=1e-6, max_iterations=3000)
LENGTHS = [7, 1, 12, 3, 3, 9, 2, 5, 11]  # unsorted, with a tie and a singleton
OPERATORS = {
    "rank": lambda x, **kw: ss.sinkhorn_rank(x, **TIGHT, **kw),
    "sort_topk": lambda x, **kw: ss.sinkhorn_sort(x, topk=2, **TIGHT, **kw),
    "quantile": lambda x, **kw: ss.sinkhorn_quantile(x, [0.25, 0.5], **TIGHT, **kw),
    "topk_mask": lambda x, **kw: ss.sinkhorn_topk_mask(x, 2, **TIGHT, **kw),
    "sinkhorn_matrix": lambda x, **kw: ss.permutation_matrix(x, "sinkhorn", **TIGHT, **kw),
    "softsort_matrix": lambda x, **kw: ss.soft_sort_matrix(x, tau=0.3, **kw),
    "neuralsort_hard": lambda x, **kw: ss.neural_sort_matrix(x, tau=0.3, hard=True, **kw),
    "rankdata": lambda x, **kw: ss.rankdata(x, **kw),
}


def _ragged(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return tf.ragged.constant([rng.normal(size=n).tolist() for n in lengths],
                              dtype=tf.float64)


def _value_and_gradient(op, x, **kw):
    with tf.GradientTape() as tape:
        tape.watch(x.flat_values)
        out = op(x, **kw)
        flat = out.flat_values if isinstance(out, tf.RaggedTensor) else out
        weights = tf.cos(tf.range(tf.size(flat), dtype=flat.dtype))
        loss = tf.reduce_sum(tf.reshape(flat, [-1]) * weights)
    grad = tape.gradient(loss, x.flat_values)
    grad = np.zeros(x.flat_values.shape) if grad is None else tf.convert_to_tensor(grad)
    return out, np.asarray(grad)


def _as_lists(out):
    return out.to_list() if isinstance(out, tf.RaggedTensor) else out.numpy().tolist()


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_groups_give_the_results_and_gradients_of_one_padded_batch(name, monkeypatch):
    op, x = OPERATORS[name], _ragged(LENGTHS)
    grouped, grouped_grad = _value_and_gradient(op, x)
    monkeypatch.setattr(_masking, "RAGGED_BUCKETS", 1)
    padded, padded_grad = _value_and_gradient(op, x)
    if isinstance(padded, tf.RaggedTensor):
        np.testing.assert_array_equal(grouped.nested_row_lengths()[0],
                                      padded.nested_row_lengths()[0])
        grouped, padded = grouped.flat_values, padded.flat_values
    assert np.all(np.isfinite(grouped.numpy())) and np.all(np.isfinite(grouped_grad)), name
    np.testing.assert_allclose(grouped.numpy(), padded.numpy(), atol=1e-5, err_msg=name)
    np.testing.assert_allclose(grouped_grad, padded_grad, atol=1e-5, err_msg=name)
    assert np.any(padded_grad != 0) or name in ("rankdata", "neuralsort_hard", "topk_mask")


@pytest.mark.parametrize("name", ["rank", "quantile", "softsort_matrix"])
@pytest.mark.parametrize("lengths", [[4, 2], LENGTHS])
def test_unknown_number_of_lists_in_a_graph(name, lengths):
    """One trace for any number of lists: 2 lists leave groups empty (they compute the
    shortest list, whose result is dropped)."""
    op = OPERATORS[name]
    traced = tf.function(op, input_signature=[tf.RaggedTensorSpec([None, None], tf.float64)])
    x = _ragged(lengths, seed=1)
    got = traced(x)
    for row, values in zip(_as_lists(got), x.to_list(), strict=True):
        expected = op(tf.constant([values], tf.float64)).numpy()[0]
        np.testing.assert_allclose(np.array(row), expected, atol=1e-5, err_msg=name)


def test_outer_partitions_and_a_dense_mask_of_the_padded_shape():
    x = _ragged(LENGTHS, seed=2)
    nested = tf.RaggedTensor.from_row_lengths(x, [4, 0, 5])  # [3, (lists), (n)]
    mask = tf.sequence_mask(x.row_lengths(), max(LENGTHS)) & (
        tf.range(max(LENGTHS))[tf.newaxis, :] != 1)
    ranks = ss.sinkhorn_rank(nested, mask=tf.reshape(mask, [4 + 5, -1]), **TIGHT)
    assert ranks.shape.rank == 3
    np.testing.assert_array_equal(ranks.row_lengths().numpy(), [4, 0, 5])
    for row, values in zip(ranks.values.to_list(), x.to_list(), strict=True):
        valid = np.arange(len(values)) != 1
        expected = np.zeros(len(values))
        if valid.any():
            expected[valid] = ss.sinkhorn_rank(
                tf.constant([np.array(values)[valid]], tf.float64), **TIGHT).numpy()[0]
        np.testing.assert_allclose(row, expected, atol=1e-5)


def test_lists_in_different_groups_get_independent_noise():
    """Four equal lists land in four groups; with one seed for all groups they would get
    the same Gumbel noise and the same samples."""
    x = tf.ragged.constant([[0.0, 0.1, 0.2, 0.3, 0.4]] * 4)
    out = ss.stochastic_permutation_matrix(x, 3, seed=7, tau=0.1).to_tensor().numpy()
    for i in range(1, 4):
        assert not np.allclose(out[0], out[i])
    again = ss.stochastic_permutation_matrix(x, 3, seed=7, tau=0.1).to_tensor().numpy()
    np.testing.assert_array_equal(out, again)


LIST_FUNCTIONS = {
    "soft_ndcg": lambda t, p: ss.soft_ndcg(t, p, temperature=0.1),
    "listwise_permutation_loss": lambda t, p: ss.listwise_permutation_loss(
        t, p, temperature=0.3),
    "ndcg": lambda t, p: ss.ndcg(t, p, k=3)[0],
    "reciprocal_rank": lambda t, p: ss.reciprocal_rank(t, p)[0],
    "soft_spearman": lambda t, p: ss.soft_spearman_correlation(t, p, epsilon=0.05),
}


@pytest.mark.parametrize("name", sorted(LIST_FUNCTIONS))
def test_ranking_losses_and_metrics_on_groups_of_ragged_lists(name, monkeypatch):
    """Ragged labels and scores: each list's value (and gradient) in groups equals its
    value with every list padded to the longest; the lists keep their order."""
    fn = LIST_FUNCTIONS[name]
    rng = np.random.default_rng(3)
    lengths = [6, 2, 9, 4, 4, 7, 3]
    labels = tf.ragged.constant([rng.integers(0, 3, n).astype(float).tolist()
                                 for n in lengths], dtype=tf.float64)
    scores = _ragged(lengths, seed=4)

    def run():
        with tf.GradientTape() as tape:
            tape.watch(scores.flat_values)
            values = fn(labels, scores)
            loss = tf.reduce_sum(values * tf.range(1.0, 8.0, dtype=values.dtype))
        grad = tape.gradient(loss, scores.flat_values)
        return values.numpy(), (None if grad is None else tf.convert_to_tensor(grad).numpy())

    grouped, grouped_grad = run()
    monkeypatch.setattr(_masking, "RAGGED_BUCKETS", 1)
    padded, padded_grad = run()
    assert grouped.shape == (len(lengths),) and np.all(np.isfinite(grouped))
    assert grouped_grad is None or np.all(np.isfinite(grouped_grad))
    np.testing.assert_allclose(grouped, padded, atol=1e-5, err_msg=name)
    if padded_grad is not None:
        np.testing.assert_allclose(grouped_grad, padded_grad, atol=1e-5, err_msg=name)


def test_ranking_losses_on_eager_ragged_batches_with_groups_of_empty_lists():
    """A length group made only of empty lists (eager mode) gives those lists loss 0;
    the other lists' losses are those of the batch without the empty lists."""
    y = tf.ragged.constant([[], [1.0, 0.0, 2.0], [], [0.0, 1.0]])
    s = tf.ragged.constant([[], [0.1, 0.2, 0.3], [], [0.5, 0.4]])
    y_full = tf.ragged.constant([[1.0, 0.0, 2.0], [0.0, 1.0]])
    s_full = tf.ragged.constant([[0.1, 0.2, 0.3], [0.5, 0.4]])
    for loss in (ss.SoftNDCGLoss(reduction="none"),
                 ss.ListwisePermutationLoss(reduction="none")):
        got = loss(y, s).numpy()
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got[[0, 2]], 0.0)
        np.testing.assert_allclose(got[[1, 3]], loss(y_full, s_full).numpy(), rtol=1e-6)


def test_listwise_loss_of_an_empty_ragged_list_inside_tf_function_is_zero():
    spec = tf.RaggedTensorSpec([None, None], tf.float32, 1)
    loss = tf.function(lambda a, b: ss.ListwisePermutationLoss(reduction="none")(a, b),
                       input_signature=[spec, spec])
    y = tf.ragged.constant([[], [1.0, 0.0, 2.0], [0.0, 1.0]])
    s = tf.ragged.constant([[], [0.1, 0.2, 0.3], [0.5, 0.4]])
    got = loss(y, s).numpy()
    assert np.all(np.isfinite(got)) and got[0] == 0.0
    full = ss.ListwisePermutationLoss(reduction="none")(y[1:], s[1:]).numpy()
    np.testing.assert_allclose(got[1:], full, rtol=1e-6)

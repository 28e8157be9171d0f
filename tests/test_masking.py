"""Tests of `softsort_tf._masking`, the padding convention and its helpers, and of
ragged inputs computed in groups of lists of similar length (`map_lists`,
`RAGGED_BUCKETS` groups): the grouping must not change any list's result or gradient,
nor the order of the lists, in eager mode and in graphs with an unknown number of lists
(fewer lists than groups, and groups made only of empty lists, included)."""

import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss
from softsort_tf import _masking


def test_masking_helpers():
    x = tf.constant([[1.0, np.nan, 3.0], [np.inf, np.nan, -np.inf]])
    mask = tf.constant([[True, False, True], [False, False, False]])
    np.testing.assert_array_equal(_masking.replace_padded(x, mask).numpy(),
                                  [[1.0, 3.0, 3.0], [0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(_masking.n_valid(mask).numpy(), [2, 0])
    np.testing.assert_array_equal(_masking.valid_prefix(tf.constant([2, 0]), 3).numpy(),
                                  [[True, True, False], [False, False, False]])
    assert _masking.combine(None, None) is None


TIGHT = dict(epsilon=0.05, threshold=1e-6, max_iterations=3000)


LENGTHS = [7, 1, 12, 3, 3, 9, 2, 5, 11]  # unsorted, with a tie and a singleton


OPERATORS = {
    "rank": lambda x, **kw: ss.sinkhorn_rank(x, **TIGHT, **kw),
    "sort_topk": lambda x, **kw: ss.sinkhorn_sort(x, topk=2, **TIGHT, **kw),
    "quantile": lambda x, **kw: ss.sinkhorn_quantile(x, [0.25, 0.5], **TIGHT, **kw),
    "topk_mask": lambda x, **kw: ss.sinkhorn_topk(x, 2, **TIGHT, **kw),
    "sinkhorn_matrix": lambda x, **kw: ss.permutation_matrix(x, "sinkhorn", **TIGHT, **kw),
    "softsort_matrix": lambda x, **kw: ss.softsort_permutation_matrix(x, tau=0.3, **kw),
    "neuralsort_hard": lambda x, **kw: ss.neuralsort_permutation_matrix(x, tau=0.3, hard=True,
                                                                         **kw),
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


def test_unknown_number_of_lists_in_a_graph():
    """One trace for any number of lists: 2 lists leave groups empty (they compute the
    shortest list, whose result is dropped). The three operators share one graph, called
    with 2 and with 9 lists."""
    names = ["rank", "quantile", "softsort_matrix"]
    traced = tf.function(lambda x: {name: OPERATORS[name](x) for name in names},
                         input_signature=[tf.RaggedTensorSpec([None, None], tf.float64)])
    many = _ragged(LENGTHS, seed=1)
    # Each list's result alone (eager, static n), computed once: the 2 lists are lists
    # 3 (length 3) and 0 (length 7) of the 9.
    expected = {name: [OPERATORS[name](tf.constant([values], tf.float64)).numpy()[0]
                       for values in many.to_list()] for name in names}
    for rows in ([3, 0], list(range(len(LENGTHS)))):
        x = tf.gather(many, rows)
        got = traced(x)
        for name in names:
            for row, r in zip(_as_lists(got[name]), rows, strict=True):
                np.testing.assert_allclose(np.array(row), expected[name][r], atol=1e-5,
                                           err_msg=f"{name}, {len(rows)} lists, list {r}")
    assert traced.experimental_get_tracing_count() == 1


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


EMPTY_ROW_OPS = {
    "rank": ss.sinkhorn_rank,
    "sort": ss.sinkhorn_sort,
    "topk_sort": lambda v: ss.sinkhorn_sort(v, topk=1),
    "quantile": lambda v: ss.sinkhorn_quantile(v, 0.5),
    "topk_mask": lambda v: ss.sinkhorn_topk(v, 1),
    "sinkhorn_matrix": ss.sinkhorn_permutation_matrix,
    "softsort_matrix": ss.softsort_permutation_matrix,
    "hard_matrix": ss.hard_permutation_matrix,
}


@pytest.mark.parametrize("name", sorted(EMPTY_ROW_OPS))
def test_eager_ragged_batches_with_empty_lists(name):
    """A length group made only of empty lists (eager mode) gives empty rows (0 for
    per-list outputs); the other lists are those of the batch without the empty ones."""
    op = EMPTY_ROW_OPS[name]
    x = tf.ragged.constant([[], [2.0, 1.0, 3.0], [], [5.0, 4.0]])
    out = op(x)
    without = op(tf.ragged.constant([[2.0, 1.0, 3.0], [5.0, 4.0]]))
    if isinstance(out, tf.RaggedTensor):
        assert out[0].shape[0] == 0 and out[2].shape[0] == 0
        np.testing.assert_allclose(out[1].numpy(), without[0].numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(out[3].numpy(), without[1].numpy(), rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_allclose(out.numpy()[[0, 2]], 0.0)
        np.testing.assert_allclose(out.numpy()[[1, 3]], without.numpy(), rtol=1e-6)


def test_string_and_complex_masks_are_rejected_by_the_operators():
    x = np.array([[0.3, 0.1, 0.2], [0.5, 0.4, 0.9]], np.float32)
    with pytest.raises(ValueError, match=r"`mask`.*string"):
        ss.sinkhorn_rank(x, mask=tf.constant([["1", "0", "1"], ["1", "1", "1"]]))
    with pytest.raises(ValueError, match=r"`mask`.*complex"):
        ss.soft_rank(x, "lapsum", mask=tf.complex(x, x))
    with pytest.raises(ValueError, match=r"`mask`.*0/1"):
        ss.soft_rank(x, "lapsum", mask=np.full(x.shape, 0.5))

"""Tests of `softsort_tf.metrics.ranking`: NDCG@k and MRR against numpy with padding and
ties, streaming with sample weights, Keras masks, empty and ragged lists, serialisation."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from numpy_references import np_ndcg
from operator_cases import masked_label_batch, random_padded

import softsort_tf as ss
from softsort_tf.metrics.ranking import MRRMetric, NDCGMetric, ndcg, reciprocal_rank


def np_mrr(labels, scores, k=None):
    labels, scores = np.asarray(labels, np.float64), np.asarray(scores, np.float64)
    keep = labels >= 0
    labels, scores = labels[keep], scores[keep]
    if not (labels > 0).any():
        return 0.0, 0.0
    first = int(np.argmax(labels[np.argsort(-scores, kind="stable")] > 0)) + 1
    return (1.0 / first if k is None or first <= k else 0.0), 1.0


@pytest.mark.parametrize("k", [None, 1, 3, 10])
def test_ndcg_and_mrr_match_numpy_with_padding_and_ties(k):
    rng = np.random.default_rng(0)
    labels, scores = random_padded(rng, 40, 12)
    labels[0, :] = 0.0  # a list without a relevant item: weight 0
    for fn, ref in ((ndcg, np_ndcg), (reciprocal_rank, np_mrr)):
        values, weights = fn(labels, scores, k=k)
        expected = np.array([ref(lab, s, k) for lab, s in zip(labels, scores, strict=True)])
        np.testing.assert_allclose(values.numpy(), expected[:, 0], rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(weights.numpy(), expected[:, 1])
    assert weights.numpy()[0] == 0.0


def test_metrics_stream_with_sample_weights_and_ignore_padded_scores():
    rng = np.random.default_rng(1)
    labels, scores = random_padded(rng, 30, 9, ties=False)
    scores[labels < 0] = 1e6  # padded scores would be ranked first if they counted
    sw = rng.uniform(0.5, 2.0, size=30)
    for metric, ref in ((NDCGMetric(k=5), np_ndcg), (MRRMetric(), np_mrr)):
        metric.update_state(labels[:10], scores[:10], sample_weight=sw[:10])
        metric.update_state(labels[10:], scores[10:], sample_weight=sw[10:])
        k = metric.fn_kwargs["k"]
        ref_vals = np.array([ref(lab, s, k) for lab, s in zip(labels, scores, strict=True)])
        w = ref_vals[:, 1] * sw
        np.testing.assert_allclose(float(metric.result()), (ref_vals[:, 0] @ w) / w.sum(),
                                   rtol=1e-6)
        metric.reset_state()
        assert float(metric.result()) == 0.0


def test_per_list_metrics_read_the_keras_mask_and_skip_empty_lists():
    """A Keras mask of the scores (one flag per item) is the padding of the lists; an
    empty list has weight 0 and leaves the streams finite."""
    from keras.src.backend import set_keras_mask

    rng = np.random.default_rng(11)
    labels, scores = random_padded(rng, 4, 7, np.float32, ties=False)
    labels[:, 0] = 2.0
    valid = labels >= 0
    unpadded = rng.integers(0, 3, size=labels.shape).astype(np.float32)
    unpadded[:, 0] = 2.0
    labels_in_mask = np.where(valid, labels, unpadded)  # padding only in the Keras mask
    for make in (lambda: NDCGMetric(k=3), MRRMetric,
                 lambda: ss.KendallTau(negative_labels_are_padding=True)):
        by_mask, by_labels = make(), make()
        masked_scores = tf.constant(scores)
        set_keras_mask(masked_scores, tf.constant(valid))
        by_mask.update_state(labels_in_mask, masked_scores)
        by_labels.update_state(labels, scores)
        assert float(by_mask.result()) == pytest.approx(float(by_labels.result()), rel=1e-6)
        if isinstance(by_mask, ss.KendallTau):
            continue  # kendall_tau takes lists of n >= 1
        by_mask.update_state(np.zeros((2, 0), np.float32), np.zeros((2, 0), np.float32))
        by_mask.update_state(tf.ragged.constant([[], [1.0, 0.0]]),
                             tf.ragged.constant([[], [0.2, 0.1]]))
        assert np.isfinite(float(by_mask.result()))
    for empty in (np.zeros((2, 0), np.float32), tf.ragged.constant([[], []], tf.float32)):
        for fn in (ndcg, reciprocal_rank):
            values, weights = fn(empty, empty)
            np.testing.assert_array_equal(values.numpy(), 0.0)
            np.testing.assert_array_equal(weights.numpy(), 0.0)


def test_metrics_serialize_and_take_ragged_lists():
    labels = tf.ragged.constant([[3.0, 0.0, 1.0], [0.0, 2.0]])
    scores = tf.ragged.constant([[0.1, 0.5, 0.2], [1.0, 0.0]])
    expected = np.mean([np_ndcg([3, 0, 1], [0.1, 0.5, 0.2], 2)[0],
                        np_ndcg([0, 2], [1.0, 0.0], 2)[0]])
    for metric in (NDCGMetric(k=2), MRRMetric(k=2)):
        clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(metric))
        assert type(clone) is type(metric) and clone.get_config() == metric.get_config()
        clone.update_state(labels, scores)
        if isinstance(metric, NDCGMetric):
            np.testing.assert_allclose(float(clone.result()), expected, rtol=1e-6)
        else:
            assert float(clone.result()) == pytest.approx((0.5 + 0.5) / 2)
    assert NDCGMetric(k=10).name == "ndcg_at_10"
    with pytest.raises(ValueError, match="`k`"):
        NDCGMetric(k=0)


# ---------------------------------------------------------------------------------
# Parity with keras_rs.metrics (Keras-RS's y_true = {"labels", "mask"}).
# ---------------------------------------------------------------------------------
def _relevant(labels, mask):
    return ((labels > 0) & mask).any(axis=-1)


@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("ours,theirs", [(NDCGMetric, "NDCG"),
                                         (MRRMetric, "MeanReciprocalRank")])
def test_ndcg_and_mrr_equal_keras_rs(ours, theirs, k):
    """On masked batches with tied labels, tied scores of equal labels, an empty list
    and lists without relevant items, in Keras-RS's convention and in ours."""
    keras_rs = pytest.importorskip("keras_rs")
    batches = [masked_label_batch(seed) for seed in (7, 8, 9)]
    # Keras-RS's convention: a list without relevant items counts, with value 0.
    mine = ours(k=k, lists_without_relevant="zero")
    reference = getattr(keras_rs.metrics, theirs)(k=k, shuffle_ties=False, seed=0)
    for labels, mask, scores in batches:
        y_true = {"labels": labels, "mask": mask}
        mine.update_state(y_true, scores)
        reference.update_state(y_true, scores)
    assert np.isfinite(float(mine.result()))
    np.testing.assert_allclose(float(mine.result()), float(reference.result()), rtol=1e-6)
    # Ours (default): lists without relevant items are left out.
    mine = ours(k=k)
    reference = getattr(keras_rs.metrics, theirs)(k=k, shuffle_ties=False, seed=0)
    for labels, mask, scores in batches:
        keep = _relevant(labels, mask)
        mine.update_state({"labels": labels, "mask": mask}, scores)
        reference.update_state({"labels": labels[keep], "mask": mask[keep]}, scores[keep])
    np.testing.assert_allclose(float(mine.result()), float(reference.result()), rtol=1e-6)
    # Labels with −1 (read as padding by both), and per-list sample weights where every
    # list has a relevant item (both then weigh each list by its sample weight).
    labels, mask, scores = batches[0]
    keep = _relevant(labels, mask)
    padded = np.where(mask, labels, -1.0)[keep]
    weights = np.random.default_rng(0).uniform(0.5, 2.0, size=int(keep.sum()))
    for convention in ("skip", "zero"):
        mine = ours(k=k, lists_without_relevant=convention)
        reference = getattr(keras_rs.metrics, theirs)(k=k, shuffle_ties=False)
        mine.update_state(padded, scores[keep], sample_weight=weights)
        reference.update_state(padded, scores[keep], sample_weight=weights)
        np.testing.assert_allclose(float(mine.result()), float(reference.result()),
                                   rtol=1e-6)


def test_lists_without_relevant_is_validated_and_serialized():
    with pytest.raises(ValueError, match=r"`lists_without_relevant`.*'skip'.*'zero'"):
        NDCGMetric(lists_without_relevant="one")
    metric = MRRMetric(k=2, lists_without_relevant="zero")
    restored = MRRMetric.from_config(metric.get_config())
    assert restored.fn_kwargs == metric.fn_kwargs
    values, weights = reciprocal_rank([[0.0, 0.0], [1.0, 0.0]], [[0.1, 0.2], [0.1, 0.2]],
                                      lists_without_relevant="zero")
    np.testing.assert_array_equal(values.numpy(), [0.0, 0.5])
    np.testing.assert_array_equal(weights.numpy(), [1.0, 1.0])

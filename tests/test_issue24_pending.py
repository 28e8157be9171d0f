"""Bad input to the ranking losses and metrics, large labels, lists without an order,
and Keras-RS's `y_true = {"labels", "mask"}` form (parity with keras_rs.metrics)."""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss
from softsort_tf.losses.ranking import listwise_permutation_loss, soft_ndcg
from softsort_tf.metrics.ranking import MRRMetric, NDCGMetric, ndcg, reciprocal_rank


def _metric_result(metric):
    def run(y_true, y_pred, **kwargs):
        metric.reset_state()
        metric.update_state(y_true, y_pred, **kwargs)
        return metric.result()
    return run


# Every ranking loss and metric as `f(y_true, y_pred)`; metrics are built once, outside
# any tf.function (they hold variables).
def _ranking_callables():
    return {
        "SoftNDCGLoss": ss.SoftNDCGLoss(method="lapsum", temperature=0.1),
        "SoftNDCGLoss_sinkhorn": ss.SoftNDCGLoss(),
        "SpearmanLoss": ss.SpearmanLoss(),
        "ListwisePermutationLoss": ss.ListwisePermutationLoss(),
        "KendallTauLoss": ss.KendallTauLoss(),
        "soft_ndcg": lambda a, b: soft_ndcg(a, b, method="lapsum"),
        "listwise_permutation_loss": listwise_permutation_loss,
        "ndcg": lambda a, b: ndcg(a, b)[0],
        "reciprocal_rank": lambda a, b: reciprocal_rank(a, b)[0],
        "NDCGMetric": _metric_result(NDCGMetric(k=2)),
        "MRRMetric": _metric_result(MRRMetric()),
        "SpearmanCorrelation": _metric_result(ss.SpearmanCorrelation()),
        "KendallTau": _metric_result(ss.KendallTau()),
        "spearman_correlation": ss.spearman_correlation,
        "soft_spearman_correlation": ss.soft_spearman_correlation,
        "kendall_tau": ss.kendall_tau,
        "soft_kendall_tau": ss.soft_kendall_tau,
    }


RANKING = tuple(_ranking_callables())
LABELS = np.array([[2.0, 0.0, 1.0], [0.0, 1.0, 3.0]], np.float32)
SCORES = np.array([[0.3, 0.1, 0.2], [0.5, 0.4, 0.9]], np.float32)


# ---------------------------------------------------------------------------------
# 2.5: clear errors.
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", RANKING)
def test_shape_mismatch_names_y_true_y_pred_and_both_shapes(name):
    fn = _ranking_callables()[name]
    labels = tf.constant(LABELS)
    scores = tf.constant(np.concatenate([SCORES, SCORES[:, :1]], axis=1))  # [2, 4]
    message = r"`y_true`.*`y_pred`.*\(2, 3\).*\(2, 4\)"
    with pytest.raises(ValueError, match=message):
        fn(labels, scores)
    with pytest.raises(ValueError, match=message):
        tf.function(fn)(labels, scores)
    spec = tf.TensorSpec([None, None], tf.float32)
    traced = tf.function(fn, input_signature=[spec, spec])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`y_true`.*`y_pred`.*2 3.*2 4"):
        traced(labels, scores)
    # Ragged lists of other lengths.
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                       match=r"`y_true`.*`y_pred`"):
        fn(tf.ragged.constant([[2.0, 0.0], [1.0]]), tf.ragged.constant([[0.1], [0.2, 0.3]]))


@pytest.mark.parametrize("name", RANKING)
def test_string_labels_and_masks_are_named(name):
    fn = _ranking_callables()[name]
    with pytest.raises(ValueError, match=r"`y_true`.*string"):
        fn(tf.constant([["a", "b", "c"]]), tf.constant(SCORES[:1]))
    with pytest.raises(ValueError, match=r"`mask`.*string"):
        fn({"labels": LABELS, "mask": tf.constant([["1", "0", "1"], ["1", "1", "1"]])},
           SCORES)


@pytest.mark.parametrize("name", RANKING)
@pytest.mark.parametrize("dtype", [tf.complex64, tf.bool])
def test_complex_or_bool_scores_raise_like_the_operators(name, dtype):
    fn = _ranking_callables()[name]
    scores = tf.cast(tf.constant(SCORES) > 0.25, tf.bool) if dtype == tf.bool else \
        tf.complex(tf.constant(SCORES), tf.constant(SCORES))
    with pytest.raises(ValueError, match=rf"`y_pred` must be a real tensor.*{dtype.name}"):
        fn(tf.constant(LABELS), scores)


@pytest.mark.parametrize("fn", [lambda x: ss.soft_rank(x, "lapsum"),
                                lambda x: ss.soft_sort(x, "softsort"),
                                lambda x: ss.soft_topk(x, 1, "neuralsort")])
def test_front_door_rejects_complex_and_bool_inputs(fn):
    for x in (tf.complex(tf.constant(SCORES), 1.0 + tf.constant(SCORES)),
              tf.constant(SCORES) > 0.25):
        with pytest.raises(ValueError, match=r"`x` must be a real tensor"):
            fn(x)


def test_string_mask_is_rejected_by_the_operators():
    with pytest.raises(ValueError, match=r"`mask`.*string"):
        ss.sinkhorn_rank(SCORES, mask=tf.constant([["1", "0", "1"], ["1", "1", "1"]]))
    with pytest.raises(ValueError, match=r"`mask`.*complex"):
        ss.soft_rank(SCORES, "lapsum", mask=tf.complex(SCORES, SCORES))


@pytest.mark.parametrize("method", ["sinkhorn", "lapsum", "softsort", "neuralsort", "diffsort"])
@pytest.mark.parametrize("op", ["rank", "sort", "topk", "quantile"])
def test_front_door_takes_ragged_lists(method, op):
    family = ss.get_method(method)
    if op not in family.operations:
        pytest.skip(f"{method} has no {op}")
    rows = [[3.0, 1.0, 2.5, 0.5], [5.0, 4.0], [7.0]]
    x = tf.ragged.constant(rows)
    call = {"rank": lambda v: ss.soft_rank(v, method, temperature=0.3),
            "sort": lambda v: ss.soft_sort(v, method, temperature=0.3),
            "topk": lambda v: ss.soft_topk(v, 1, method, temperature=0.3),
            "quantile": lambda v: ss.soft_quantile(v, 0.5, method, temperature=0.3)}[op]
    out = call(x)
    for i, row in enumerate(rows):
        if op == "topk" and len(row) == 1:  # a dense list needs k < n
            continue
        expected = call(tf.constant([row]))[0].numpy()
        got = out[i].numpy()
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, expected, atol=2e-4 if method == "sinkhorn" else 1e-5)


def test_front_door_on_ragged_lists_without_masks_says_so():
    x = tf.ragged.constant([[3.0, 1.0, 2.0], [5.0, 4.0]])
    with pytest.raises(ValueError, match=r"permutahedron.*ragged `x`"):
        ss.soft_rank(x, "permutahedron")


@pytest.mark.parametrize("make", [
    lambda t: ss.SoftNDCGLoss(method="sinkhorn", temperature=t),
    lambda t: ss.SpearmanLoss(temperature=t),
    lambda t: ss.SoftTopKLoss(k=1, temperature=t),
])
def test_sinkhorn_temperature_below_the_dtype_is_rejected_at_construction(make):
    with pytest.raises(ValueError, match=r"`temperature`.*float32.*\[3\.81e-06, 3\.4"):
        make(1e-8)
    make(1e-5)  # within float32's range


def test_sinkhorn_temperature_range_follows_the_loss_dtype():
    ss.SoftNDCGLoss(method="sinkhorn", temperature=1e-8, dtype="float64")
    with pytest.raises(ValueError, match=r"`epsilon`.*float32"):
        ss.SoftNDCGLoss(method="sinkhorn", epsilon=1e-8)
    with pytest.raises(ValueError, match=r"`temperature`.*float64"):
        ss.SoftNDCGLoss(method="sinkhorn", temperature=1e-20, dtype="float64")


@pytest.mark.parametrize("method,temperature", [("lapsum", 1e-50), ("softsort", 1e39),
                                                ("neuralsort", 1e-46), ("diffsort", 1e39)])
def test_temperatures_float32_cannot_hold_are_rejected_at_construction(method, temperature):
    with pytest.raises(ValueError, match=rf"`temperature`.*{method}.*float32"):
        ss.SoftNDCGLoss(method=method, temperature=temperature)
    if method in ("softsort", "neuralsort"):
        with pytest.raises(ValueError, match=r"`temperature`.*float32"):
            ss.ListwisePermutationLoss(method, temperature=temperature)


# ---------------------------------------------------------------------------------
# 2.6: labels of 128 and more.
# ---------------------------------------------------------------------------------
def _np_ndcg(labels, order):
    """NDCG in exact integer arithmetic of the gains (labels are integers)."""
    gains = np.array([2 ** int(v) - 1 for v in labels], dtype=object)
    discounts = 1.0 / np.log2(np.arange(2, len(labels) + 2))

    def dcg(g):
        return sum(float(x / top) * d for x, d in zip(g, discounts, strict=True))

    top = max(gains) if max(gains) > 0 else 1
    return dcg(gains[list(order)]) / dcg(sorted(gains, reverse=True))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_labels_of_128_and_more_give_finite_exact_ndcg(dtype):
    labels = np.array([[200.0, 130.0, 0.0, 129.0, 128.0], [1.0, 3000.0, 2999.0, 0.0, 5.0]],
                      dtype)
    scores = np.array([[0.1, 0.9, 0.3, 0.5, 0.2], [0.3, 0.2, 0.9, 0.1, 0.0]], dtype)
    values, weights = ndcg(labels, scores)
    expected = [_np_ndcg(lab, np.argsort(-s, kind="stable"))
                for lab, s in zip(labels, scores, strict=True)]
    assert np.all(np.isfinite(values.numpy()))
    np.testing.assert_allclose(values.numpy(), expected, rtol=1e-6)
    np.testing.assert_array_equal(weights.numpy(), 1.0)
    s = tf.constant(scores)
    with tf.GradientTape() as tape:
        tape.watch(s)
        soft = soft_ndcg(labels, s, method="neuralsort", temperature=1e-3)
    assert np.all(np.isfinite(soft.numpy()))
    np.testing.assert_allclose(soft.numpy(), expected, rtol=1e-4)
    assert np.all(np.isfinite(tape.gradient(soft, s).numpy()))
    loss = ss.SoftNDCGLoss(method="lapsum", temperature=1e-3, reduction="none")(labels, s)
    np.testing.assert_allclose(loss.numpy(), 1.0 - np.array(expected), atol=1e-4)


# ---------------------------------------------------------------------------------
# 2.7: a list without an order gives the listwise loss nothing to learn.
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["neuralsort", "softsort"])
def test_listwise_loss_of_lists_without_an_order_is_zero_with_zero_gradient(method):
    labels = tf.constant([[0.0, 0.0, 0.0, 0.0],     # no relevant item
                          [2.0, 2.0, 2.0, -1.0],    # all valid labels equal
                          [1.0, -1.0, -1.0, -1.0],  # one item
                          [2.0, 0.0, 1.0, 0.0]])    # an order: a positive loss
    scores = tf.constant([[0.3, 0.1, 0.2, 0.0], [1.0, 0.5, 0.2, 4.0],
                          [0.1, 0.2, 0.3, 0.4], [0.1, 0.4, 0.3, 0.2]])
    loss = ss.ListwisePermutationLoss(method, reduction="none")
    for f in (loss, tf.function(loss)):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            values = f(labels, scores)
        grad = tape.gradient(values, scores).numpy()
        assert np.all(np.isfinite(grad))
        np.testing.assert_array_equal(values.numpy()[:3], 0.0)
        np.testing.assert_array_equal(grad[:3], 0.0)
        assert values.numpy()[3] > 0.1 and np.any(grad[3] != 0.0)


# ---------------------------------------------------------------------------------
# Part 3: Keras-RS's y_true form, and NDCG/MRR parity with keras_rs.metrics.
# ---------------------------------------------------------------------------------
def _weighted_mean(values, weights):
    return float(np.sum(values.numpy() * weights.numpy()) / np.sum(weights.numpy()))


def _masked_batch(seed, batch=12, n=6):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=(batch, n)).astype(np.float32)
    mask = rng.random((batch, n)) > 0.25
    labels[0] = 0.0                          # no relevant item
    labels[1] = np.where(mask[1], 0.0, 3.0)  # relevant items only where masked
    mask[2] = False                          # an empty list
    scores = rng.normal(size=(batch, n)).astype(np.float32)
    for b in range(batch):                   # tied scores of equal labels
        same = np.flatnonzero(labels[b] == labels[b, 0])
        scores[b, same[:2]] = scores[b, same[0]]
    return labels, mask, scores


@pytest.mark.parametrize("name", RANKING)
def test_keras_rs_dict_form_equals_the_padded_labels(name):
    fn = _ranking_callables()[name]
    labels, mask, scores = _masked_batch(3)
    keras_rs_form = {"labels": tf.constant(labels), "mask": tf.constant(mask)}
    correlations = {  # the mask as the functional forms' mask=
        "SpearmanLoss": lambda: np.mean(1.0 - ss.soft_spearman_correlation(
            labels, scores, mask=mask).numpy()),
        "KendallTauLoss": lambda: np.mean(1.0 - ss.soft_kendall_tau(
            labels, scores, mask=mask).numpy()),
        "SpearmanCorrelation": lambda: np.mean(ss.spearman_correlation(
            labels, scores, mask=mask).numpy()),
        "KendallTau": lambda: _weighted_mean(*ss.kendall_tau(labels, scores, mask=mask,
                                                               return_weights=True)),
    }
    for f in (ss.spearman_correlation, ss.soft_spearman_correlation, ss.kendall_tau,
              ss.soft_kendall_tau):
        correlations[f.__name__] = functools.partial(f, labels, scores, mask=mask)
    if name in correlations:
        reference = correlations[name]()
    else:
        reference = fn(tf.constant(np.where(mask, labels, -1.0)), tf.constant(scores))
    got = fn(keras_rs_form, tf.constant(scores))
    graph = tf.function(fn)(keras_rs_form, tf.constant(scores))
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(np.asarray(graph), np.asarray(got), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got), np.asarray(reference), rtol=1e-5, atol=1e-6)
    # Ragged labels and mask in the dict.
    ragged = {"labels": tf.RaggedTensor.from_tensor(labels, lengths=[6] * len(labels)),
              "mask": tf.RaggedTensor.from_tensor(mask, lengths=[6] * len(labels))}
    np.testing.assert_allclose(
        np.asarray(fn(ragged, tf.RaggedTensor.from_tensor(scores, lengths=[6] * len(labels)))),
        np.asarray(got), rtol=1e-4, atol=1e-5)


def test_dict_form_mask_is_combined_with_the_keras_mask_and_mask_argument():
    labels, mask, scores = _masked_batch(4)
    other = np.random.default_rng(5).random(labels.shape) > 0.2
    both = np.where(mask & other, labels, -1.0)
    np.testing.assert_allclose(
        ndcg({"labels": labels, "mask": mask}, scores, mask=other)[0].numpy(),
        ndcg(both, scores)[0].numpy(), rtol=1e-6)
    s = tf.constant(scores)
    from keras.src.backend import set_keras_mask
    set_keras_mask(s, tf.constant(other))
    loss = ss.SoftNDCGLoss(method="lapsum", temperature=0.1, reduction="none")
    np.testing.assert_allclose(loss({"labels": labels, "mask": mask}, s).numpy(),
                               loss(both, scores).numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match=r"`y_true`.*'labels'"):
        ndcg({"label": labels}, scores)


def _keras_rs():
    return pytest.importorskip("keras_rs")


def _relevant(labels, mask):
    return ((labels > 0) & mask).any(axis=-1)


@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("ours,theirs", [("NDCGMetric", "NDCG"),
                                         ("MRRMetric", "MeanReciprocalRank")])
def test_ndcg_and_mrr_equal_keras_rs(ours, theirs, k):
    keras_rs = _keras_rs()
    ours_cls = {"NDCGMetric": NDCGMetric, "MRRMetric": MRRMetric}[ours]
    batches = [_masked_batch(seed) for seed in (7, 8, 9)]
    # Keras-RS's convention: a list without relevant items counts, with value 0.
    mine = ours_cls(k=k, lists_without_relevant="zero")
    reference = getattr(keras_rs.metrics, theirs)(k=k, shuffle_ties=False, seed=0)
    for labels, mask, scores in batches:
        y_true = {"labels": labels, "mask": mask}
        mine.update_state(y_true, scores)
        reference.update_state(y_true, scores)
    assert np.isfinite(float(mine.result()))
    np.testing.assert_allclose(float(mine.result()), float(reference.result()), rtol=1e-6)
    # Ours (default): lists without relevant items are left out.
    mine = ours_cls(k=k)
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
        mine = ours_cls(k=k, lists_without_relevant=convention)
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


def test_dict_form_through_keras_loss_in_a_training_step():
    """The dict form reaches the loss and the metrics in a custom training step, in a
    tf.function (Keras' `fit` matches `y` to the model's outputs, see the README)."""
    labels, mask, scores = _masked_batch(10, batch=8, n=5)
    features = np.random.default_rng(0).normal(size=(8, 5, 3)).astype(np.float32)
    model = keras.Sequential([keras.Input((None, 3)), keras.layers.Dense(1),
                              keras.layers.Reshape((-1,))])
    loss = ss.SoftNDCGLoss(method="lapsum", temperature=0.1)
    metric = NDCGMetric()
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, model(x))
        grads = tape.gradient(value, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        metric.update_state(y, model(x))
        return value

    y = {"labels": tf.constant(labels), "mask": tf.constant(mask)}
    first = float(step(features, y))
    assert np.isfinite(first) and np.isfinite(float(metric.result()))

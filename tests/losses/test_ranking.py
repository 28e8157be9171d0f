"""Tests of `softsort_tf.losses.ranking`: the soft NDCG loss and the listwise
permutation loss (limits, numpy references, empty and ragged lists, Keras models,
serialisation, the Sinkhorn settings, and training a scorer). The padding and
unknown-length properties shared by every list loss are in `tests/ops/test_ranking.py`."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras_test_layers import unknown_length_batches
from numpy_references import np_ndcg
from operator_cases import masked_label_batch, random_padded

import softsort_tf as ss
from softsort_tf.losses.ranking import (
    ListwisePermutationLoss,
    SoftNDCGLoss,
    listwise_permutation_loss,
    soft_ndcg,
)
from softsort_tf.losses.spearman import SpearmanLoss
from softsort_tf.metrics.ranking import MRRMetric, NDCGMetric, ndcg

# Temperatures near the hard limit: small (1e-3 unless listed) or, for the steepness of
# 'sorting_network', large.
NEAR_HARD = {"sinkhorn": 1e-4, "sorting_network": 1e5}


@pytest.mark.parametrize("method", [m for m in ss.FAMILIES if m != "permutahedron"])
def test_soft_ndcg_tends_to_hard_ndcg(method):
    rng = np.random.default_rng(3)
    labels, _ = random_padded(rng, 6, 10)
    labels[:, 0] = 2.0
    scores = rng.permuted(np.tile(np.arange(10.0), (6, 1)), axis=1)  # gaps of 1
    temperature = NEAR_HARD.get(method, 1e-3)
    soft = soft_ndcg(labels, scores, method=method, temperature=temperature).numpy()
    hard = [np_ndcg(lab, s)[0] for lab, s in zip(labels, scores, strict=True)]
    np.testing.assert_allclose(soft, hard, atol=2e-3)


def test_soft_ndcg_of_a_list_without_relevant_item_is_one_without_gradient():
    s = tf.constant([[0.3, 0.1, 0.2]])
    with tf.GradientTape() as tape:
        tape.watch(s)
        v = soft_ndcg([[0.0, 0.0, -1.0]], s, method="softsort")
    assert float(v[0]) == 1.0
    np.testing.assert_array_equal(tape.gradient(v, s).numpy(), 0.0)


def test_listwise_permutation_loss_matches_numpy_cross_entropy_with_ties():
    labels = np.array([[2.0, 0.0, 2.0, 1.0, -1.0]])
    scores = np.array([[0.4, -0.3, 1.1, 0.2, 7.0]])
    tau, floor = 0.5, 1e-7
    loss = listwise_permutation_loss(labels, scores, temperature=tau,
                                     probability_floor=floor).numpy()[0]
    # NeuralSort on the 4 valid scores, numpy float64 (Grover et al., eq. 3).
    s = scores[0, :4]
    n = 4
    a = np.abs(s[:, None] - s[None, :]).sum(axis=1)
    logits = ((n + 1 - 2 * np.arange(1, n + 1))[:, None] * s[None, :] - a[None, :]) / tau
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    # Rows 1–2: the two items with label 2 share the mass; row 3: label 1; row 4: label 0.
    y = np.array([[0.5, 0, 0.5, 0], [0.5, 0, 0.5, 0], [0, 0, 0, 1.0], [0, 1.0, 0, 0]])
    expected = -(y * np.log(floor + (1 - floor) * p)).sum(axis=1).mean()
    assert loss == pytest.approx(expected, rel=1e-10)


def test_keras_model_fed_two_list_lengths():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, 3))
    scores = keras.layers.Reshape((-1,))(keras.layers.Dense(1)(inputs))
    model = keras.Model(inputs, scores)
    model.compile(optimizer="adam", loss=SoftNDCGLoss(method="neuralsort"),
                  metrics=[NDCGMetric(k=5), MRRMetric()])
    rng = np.random.default_rng(6)
    for n in (5, 12, 7):
        x = rng.normal(size=(8, n, 3)).astype(np.float32)
        y = np.clip(np.round(x[..., 0] + 1.0), 0, 4).astype(np.float32)
        # Batches of no static length: every length runs the one train (and evaluate)
        # graph of unknown length (not a trace for the first length, a retrace after).
        batches = unknown_length_batches((x, y), 4)
        history = model.fit(batches, epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        logs = model.evaluate(batches, verbose=0, return_dict=True)
        pred = model(x).numpy()  # eager: predict's traces would only repeat evaluate's
        ref = np.mean([np_ndcg(lab, s, 5)[0] for lab, s in zip(y, pred, strict=True)])
        assert logs["ndcg_at_5"] == pytest.approx(ref, abs=1e-5)


def test_losses_serialize_and_reject_bad_arguments():
    for loss in (SoftNDCGLoss(method="softsort", temperature=0.5),
                 SoftNDCGLoss(epsilon=5e-2, threshold=1e-5, squash="atan", targets="centres"),
                 ListwisePermutationLoss(method="softsort", probability_floor=1e-5),
                 SpearmanLoss(negative_labels_are_padding=True)):
        clone = keras.losses.deserialize(keras.losses.serialize(loss))
        assert type(clone) is type(loss) and clone.get_config() == loss.get_config()
    with pytest.raises(ValueError, match="`method`"):
        SoftNDCGLoss(method="bubble")
    with pytest.raises(ValueError, match="`method`"):
        ListwisePermutationLoss(method="sinkhorn")
    with pytest.raises(ValueError, match="`temperature`"):
        SoftNDCGLoss(temperature=-1.0)
    with pytest.raises(ValueError, match="method='sinkhorn'"):
        SoftNDCGLoss(method="softsort", epsilon=1e-3)
    with pytest.raises(ValueError, match="method='sinkhorn'"):
        SoftNDCGLoss(method="neuralsort", squash="atan")
    with pytest.raises(ValueError, match="`squash`"):
        SoftNDCGLoss(squash="tanh")
    with pytest.raises(ValueError, match="`temperature` and `epsilon`"):
        SoftNDCGLoss(temperature=1e-2, epsilon=1e-3)
    with pytest.raises(TypeError, match="tolerance"):
        SoftNDCGLoss(tolerance=1e-3)


def test_sinkhorn_ndcg_loss_takes_the_sinkhorn_options():
    """`SoftNDCGLoss(method='sinkhorn')` takes the settings of every Sinkhorn loss and
    hands them to its ranks; `temperature` is its ε."""
    rng = np.random.default_rng(3)
    labels, scores = random_padded(rng, 3, 7, ties=False)
    settings = dict(threshold=1e-5, max_iterations=3000, squash="atan", targets="centres")
    loss = SoftNDCGLoss(epsilon=3e-2, reduction="none", dtype="float64", **settings)
    assert loss.options.epsilon == 3e-2 and loss.options.threshold == 1e-5
    expected = 1.0 - soft_ndcg(labels, scores, method="sinkhorn", epsilon=3e-2, **settings)
    np.testing.assert_allclose(loss(labels, scores), expected, rtol=1e-12)
    by_temperature = SoftNDCGLoss(temperature=3e-2, reduction="none", dtype="float64",
                                  **settings)
    np.testing.assert_allclose(by_temperature(labels, scores), expected, rtol=1e-12)
    other = SoftNDCGLoss(epsilon=3e-2, reduction="none", dtype="float64", threshold=1e-5,
                         max_iterations=3000)
    assert np.abs(other(labels, scores).numpy() - expected.numpy()).max() > 1e-6
    with pytest.raises(ValueError, match="negative_labels_are_padding"):
        SpearmanLoss(negative_labels_are_padding="yes")


@pytest.mark.keras_default_build
def test_losses_train_a_linear_scorer_to_a_better_ndcg():
    """A gradient step on each loss raises the hard NDCG of a bad linear scorer."""
    rng = np.random.default_rng(7)
    feats = rng.normal(size=(16, 10, 4))
    labels = np.clip(np.round(feats @ np.array([1.0, -0.5, 0.0, 0.3]) + 2), 0, 4)
    labels[:, 8:] = -1.0
    for loss in (SoftNDCGLoss(), SoftNDCGLoss(method="softsort"), ListwisePermutationLoss()):
        w = tf.Variable([-1.0, 0.5, 0.0, -0.3], dtype=tf.float64)
        before = float(np.mean(ndcg(labels, feats @ w.numpy())[0]))
        opt = keras.optimizers.Adam(0.1)

        @tf.function  # one trace per loss for its 20 steps (eagerly: 20 times its ops)
        def gradient(w=w, loss=loss):
            with tf.GradientTape() as tape:
                value = loss(labels, tf.linalg.matvec(tf.constant(feats), w))
            return tape.gradient(value, w)

        for _ in range(20):
            opt.apply_gradients([(gradient(), w)])
        assert gradient.experimental_get_tracing_count() == 1
        after = float(np.mean(ndcg(labels, feats @ w.numpy())[0]))
        assert after > before + 0.1, (loss.name, before, after)


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


def test_keras_rs_dict_form_in_a_training_step():
    """The dict form reaches the loss and the metrics in a custom training step, in a
    tf.function (Keras' `fit` matches `y` to the model's outputs, see the README)."""
    labels, mask, _ = masked_label_batch(10, batch=8, n=5)
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
    assert np.isfinite(float(step(features, y))) and np.isfinite(float(metric.result()))

"""Ranking losses and metrics over padded, ragged and variable-length lists."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import softsort_tf as ss
from softsort_tf._keras import get_keras_mask
from softsort_tf.losses.ranking import (
    ListwisePermutationLoss,
    SoftNDCGLoss,
    listwise_permutation_loss,
    soft_ndcg,
)
from softsort_tf.losses.spearman import SpearmanLoss, soft_spearman_correlation
from softsort_tf.metrics.ranking import MRRMetric, NDCGMetric, ndcg, reciprocal_rank
from softsort_tf.metrics.spearman import SpearmanCorrelation, spearman_correlation
from softsort_tf.ops.registry import METHODS
from softsort_tf.ops.sinkhorn import sinkhorn_rank
from softsort_tf.ops.soft import soft_rank

# Sinkhorn runs to a tight marginal error so that padded and unpadded problems, which
# stop at different iterations, agree to far below the loss scale.
TIGHT = {"threshold": 1e-9, "max_iterations": 5000}
# Temperatures near the hard limit: small (1e-3 unless listed) or, for the steepness of
# 'diffsort', large.
SHARP = {"sinkhorn": 1e-4, "diffsort": 1e5}


# ---------------------------------------------------------------------------------
# numpy references (float64), one list at a time.
# ---------------------------------------------------------------------------------
def np_dcg(labels_in_order, k=None):
    g = 2.0 ** np.asarray(labels_in_order, np.float64) - 1.0
    disc = 1.0 / np.log2(np.arange(2, g.size + 2))
    if k is not None:
        disc[k:] = 0.0
    return float(g @ disc)


def np_ndcg(labels, scores, k=None):
    """(value, weight) of one list; labels < 0 are padding; stable order by -score."""
    labels, scores = np.asarray(labels, np.float64), np.asarray(scores, np.float64)
    keep = labels >= 0
    labels, scores = labels[keep], scores[keep]
    ideal = np_dcg(np.sort(labels)[::-1], k)
    if ideal == 0:
        return 0.0, 0.0
    order = np.argsort(-scores, kind="stable")
    return np_dcg(labels[order], k) / ideal, 1.0


def np_mrr(labels, scores, k=None):
    labels, scores = np.asarray(labels, np.float64), np.asarray(scores, np.float64)
    keep = labels >= 0
    labels, scores = labels[keep], scores[keep]
    if not (labels > 0).any():
        return 0.0, 0.0
    first = int(np.argmax(labels[np.argsort(-scores, kind="stable")] > 0)) + 1
    return (1.0 / first if k is None or first <= k else 0.0), 1.0


def random_padded(rng, batch, n, dtype=np.float64, ties=True):
    """Labels 0–4 (−1 on a random tail of each row), scores with ties if asked."""
    labels = rng.integers(0, 5, size=(batch, n)).astype(dtype)
    scores = (rng.integers(0, 6, size=(batch, n)) if ties else rng.normal(size=(batch, n)))
    lengths = rng.integers(1, n + 1, size=batch)
    for b, length in enumerate(lengths):
        labels[b, length:] = -1.0
    return labels, scores.astype(dtype)


# ---------------------------------------------------------------------------------
# Hard metrics against numpy.
# ---------------------------------------------------------------------------------
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
# Soft ranks of padded lists.
# ---------------------------------------------------------------------------------
def test_sinkhorn_rank_with_zero_weights_is_not_the_rank_of_the_valid_list():
    """What the op does with `weights=mask`: n·(weighted CDF) with n the padded length,
    on a grid of n bins, so rescaling by n_v/n is still off by up to half a bin;
    `soft_rank` passes the padding as the op's `mask` (the target grid of the valid
    entries) and matches."""
    x = np.array([[0.3, -1.2, 2.0, 0.7, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    mask = np.arange(10) < 4
    valid = sinkhorn_rank(x[:, :4], epsilon=1e-3, **TIGHT).numpy()[0]
    np.testing.assert_allclose(valid, [2, 1, 4, 3], atol=1e-3)
    weighted = sinkhorn_rank(x, weights=mask.astype(float), epsilon=1e-3, **TIGHT).numpy()[0]
    assert np.abs(weighted[:4] * 4 / 10 - valid).max() > 0.01
    ours = soft_rank(x, "sinkhorn", "DESCENDING", mask=mask[None], temperature=1e-3,
                     options=None, **TIGHT).numpy()[0]
    np.testing.assert_allclose(ours[:4], 5.0 - valid, atol=1e-6)  # descending


@pytest.mark.parametrize("method", METHODS)
def test_soft_ranks_hard_limit_are_descending_ranks_of_the_valid_entries(method):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 8))
    mask = np.arange(8)[None, :] < np.array([[8], [5], [1]])
    x[~mask] = np.nan  # padded values never matter
    temperature = SHARP.get(method, 1e-3)
    r = soft_rank(x, method, "DESCENDING", mask=mask, temperature=temperature).numpy()
    for b in range(3):
        v = x[b, mask[b]]
        np.testing.assert_allclose(r[b, mask[b]], stats.rankdata(-v), atol=1e-3)


@pytest.mark.parametrize("targets", ["centres", "regular"])
def test_sinkhorn_soft_ranks_of_padded_lists_on_either_target_grid(targets):
    # With the op's `mask` the target grid is that of the valid entries.
    x = np.array([[0.3, -1.2, 9.0, 2.0, 0.7, np.nan], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    mask = np.array([[1, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0]], bool)
    s = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(s)
        ranks = soft_rank(s, "sinkhorn", "DESCENDING", mask=mask, temperature=1e-2,
                          targets=targets, threshold=1e-6, max_iterations=5000)
        total = tf.reduce_sum(ranks * np.arange(1.0, 7.0))
    grad = tape.gradient(total, s).numpy()
    for b in range(2):
        alone = soft_rank(x[b:b + 1, mask[b]], "sinkhorn", "DESCENDING", temperature=1e-2,
                          targets=targets, threshold=1e-6, max_iterations=5000).numpy()[0]
        np.testing.assert_allclose(ranks.numpy()[b, mask[b]], alone, atol=1e-4)
    np.testing.assert_array_equal(ranks.numpy()[~mask], 0.0)  # the documented fill
    np.testing.assert_array_equal(grad[~mask], 0.0)
    assert np.isfinite(grad).all()


# ---------------------------------------------------------------------------------
# Property: padding changes neither values nor gradients of the valid entries.
# ---------------------------------------------------------------------------------
LOSSES = [
    ("ndcg-sinkhorn", lambda y, s: 1.0 - soft_ndcg(y, s, method="sinkhorn", temperature=0.05,
                                                   **TIGHT)),
    ("ndcg-softsort", lambda y, s: 1.0 - soft_ndcg(y, s, method="softsort", temperature=0.3)),
    ("ndcg-neuralsort", lambda y, s: 1.0 - soft_ndcg(y, s, method="neuralsort",
                                                     temperature=0.3)),
    ("perm-neuralsort", lambda y, s: listwise_permutation_loss(y, s, temperature=0.3)),
    ("perm-softsort", lambda y, s: listwise_permutation_loss(y, s, method="softsort",
                                                             temperature=0.3)),
    ("spearman", lambda y, s: 1.0 - soft_spearman_correlation(
        y, s, negative_labels_are_padding=True, epsilon=0.05, **TIGHT)),
    ("ndcg-lapsum", lambda y, s: 1.0 - soft_ndcg(y, s, method="lapsum", temperature=0.3)),
    ("spearman-lapsum", lambda y, s: 1.0 - soft_spearman_correlation(
        y, s, negative_labels_are_padding=True, method="lapsum", temperature=0.3)),
    ("spearman-softsort", lambda y, s: 1.0 - soft_spearman_correlation(
        y, s, negative_labels_are_padding=True, method="softsort", temperature=0.3)),
]


def _value_and_grad(fn, labels, scores):
    s = tf.constant(scores)
    with tf.GradientTape() as tape:
        tape.watch(s)
        value = fn(tf.constant(labels), s)
    return value.numpy(), tape.gradient(value, s).numpy()


@pytest.mark.parametrize("name,fn", LOSSES, ids=[n for n, _ in LOSSES])
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 9), extra=st.integers(1, 7))
def test_padding_changes_no_value_and_no_gradient(name, fn, seed, n, extra):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, size=(1, n)).astype(np.float64)
    labels[0, 0] = 3.0  # at least one relevant item
    scores = rng.normal(size=(1, n))
    pad_scores = rng.normal(scale=100.0, size=(1, extra))
    pad_scores[0, 0] = np.nan
    value, grad = _value_and_grad(fn, labels, scores)
    padded_labels = np.concatenate([labels, -np.ones((1, extra))], axis=1)
    padded_scores = np.concatenate([scores, pad_scores], axis=1)
    # Shuffle, so padding is not only a tail.
    perm = rng.permutation(n + extra)
    p_value, p_grad = _value_and_grad(fn, padded_labels[:, perm], padded_scores[:, perm])
    inverse = np.argsort(perm)
    p_grad = p_grad[:, inverse]
    tol = 1e-6 if "sinkhorn" in name or "lapsum" in name or name == "spearman" else 1e-10
    np.testing.assert_allclose(p_value, value, rtol=tol, atol=tol)
    np.testing.assert_allclose(p_grad[:, :n], grad, rtol=1e-4 if tol > 1e-9 else 1e-8,
                               atol=tol)
    np.testing.assert_array_equal(p_grad[:, n:], 0.0)


# ---------------------------------------------------------------------------------
# The losses.
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("method", [m for m in ss.METHODS if m != "permutahedron"])
def test_soft_ndcg_tends_to_hard_ndcg(method):
    rng = np.random.default_rng(3)
    labels, _ = random_padded(rng, 6, 10)
    labels[:, 0] = 2.0
    scores = rng.permuted(np.tile(np.arange(10.0), (6, 1)), axis=1)  # gaps of 1
    temperature = SHARP.get(method, 1e-3)
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


def test_ragged_inputs_equal_padded_inputs():
    labels = tf.ragged.constant([[2.0, 0.0, 1.0], [1.0, 3.0], [0.0, 1.0, 0.0, 2.0]],
                                dtype=tf.float64)
    scores = tf.ragged.constant([[0.5, 0.1, -0.2], [0.3, 0.9], [1.0, 0.0, 0.2, -1.0]],
                                dtype=tf.float64)
    dense_labels = labels.to_tensor(default_value=-1.0)
    dense_scores = scores.to_tensor(default_value=123.0)
    for loss in (SoftNDCGLoss(method="softsort"), ListwisePermutationLoss(),
                 SoftNDCGLoss(), SpearmanLoss(negative_labels_are_padding=True)):
        assert float(loss(labels, scores)) == pytest.approx(
            float(loss(dense_labels, dense_scores)), abs=1e-6)
    ragged_rho = spearman_correlation(labels, scores).numpy()
    for b in range(3):
        ref = stats.spearmanr(labels[b].numpy(), scores[b].numpy()).statistic
        assert ragged_rho[b] == pytest.approx(ref, abs=1e-12)


def test_masked_spearman_matches_scipy_on_the_valid_entries_and_keeps_old_behaviour():
    rng = np.random.default_rng(4)
    y, x = rng.normal(size=(5, 9)), rng.normal(size=(5, 9))
    mask = np.arange(9)[None, :] < np.array([[9], [7], [4], [2], [6]])
    x[~mask] = np.inf
    rho = spearman_correlation(y, x, mask=mask).numpy()
    soft = soft_spearman_correlation(y, x, mask=mask, epsilon=1e-4).numpy()
    for b in range(5):
        ref = stats.spearmanr(y[b, mask[b]], x[b, mask[b]]).statistic
        assert rho[b] == pytest.approx(ref, abs=1e-12)
        assert soft[b] == pytest.approx(ref, abs=5e-3)
    # Axis 0 with a mask: the same lists, transposed.
    np.testing.assert_allclose(spearman_correlation(y.T, x.T, axis=0, mask=mask.T), rho)
    # Without a mask nothing changed: NaN still propagates, unmasked results unchanged.
    with_nan = x[:2].copy()
    with_nan[0, 0] = np.nan
    np.testing.assert_array_equal(np.isnan(spearman_correlation(y[:2], with_nan)), [True, False])
    np.testing.assert_array_equal(np.isnan(spearman_correlation(y[:2], with_nan, mask=mask[:2])),
                                  [True, False])
    np.testing.assert_allclose(spearman_correlation(y[:1, :9], y[:1, :9]).numpy(), 1.0)
    metric = SpearmanCorrelation(negative_labels_are_padding=True)
    clone = SpearmanCorrelation.from_config(metric.get_config())
    assert clone.negative_labels_are_padding
    clone.update_state(np.where(mask, np.abs(y), -1.0), x)
    refs = [stats.spearmanr(np.abs(y[b, mask[b]]), x[b, mask[b]]).statistic for b in range(5)]
    assert float(clone.result()) == pytest.approx(np.mean(refs), abs=1e-6)


# ---------------------------------------------------------------------------------
# Dynamic list length.
# ---------------------------------------------------------------------------------
DYNAMIC_LOSSES = {
    "ndcg-sinkhorn": lambda: SoftNDCGLoss(temperature=0.05),
    "ndcg-softsort": lambda: SoftNDCGLoss(method="softsort"),
    "ndcg-neuralsort": lambda: SoftNDCGLoss(method="neuralsort"),
    "perm-neuralsort": lambda: ListwisePermutationLoss(),
    "perm-softsort": lambda: ListwisePermutationLoss(method="softsort"),
    "spearman": lambda: SpearmanLoss(negative_labels_are_padding=True, threshold=1e-7),
    "ndcg-lapsum": lambda: SoftNDCGLoss(method="lapsum", temperature=0.1),
    "spearman-neuralsort": lambda: SpearmanLoss(method="neuralsort",
                                                negative_labels_are_padding=True),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC_LOSSES))
def test_unknown_list_length_in_tf_function(name):
    # The list axis may be unknown (`None`) when the graph is built.
    spec = [tf.TensorSpec([None, None], tf.float32)] * 2
    loss = DYNAMIC_LOSSES[name]()
    metric = NDCGMetric(k=3)

    @tf.function(input_signature=spec)
    def step(labels, scores):
        metric.update_state(labels, scores)
        return loss(labels, scores)

    rng = np.random.default_rng(5)
    for n in (4, 11):
        labels, scores = random_padded(rng, 3, n, np.float32, ties=False)
        labels[:, 0] = 1.0
        np.testing.assert_allclose(step(labels, scores), loss(labels, scores), rtol=1e-5,
                                   atol=1e-6)
    assert step.experimental_get_tracing_count() == 1


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
        history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
        assert np.isfinite(history.history["loss"]).all()
        logs = model.evaluate(x, y, verbose=0, return_dict=True)
        pred = model.predict(x, verbose=0)
        ref = np.mean([np_ndcg(lab, s, 5)[0] for lab, s in zip(y, pred, strict=True)])
        assert logs["ndcg_at_5"] == pytest.approx(ref, abs=1e-5)


class _SqueezeKeepingMask(keras.layers.Layer):
    """`[batch, n, 1]` → `[batch, n]`, passing the items' Keras mask on."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, x, mask=None):
        return keras.ops.squeeze(x, -1)

    def compute_mask(self, x, mask=None):
        return mask


def test_keras_item_masks_are_the_padding_of_the_list_losses():
    # A Keras mask of the scores [batch, n] (e.g. `Masking` on the documents) is the
    # padding of the lists, not a mask of the per-list losses [batch].
    inputs = keras.Input((None, 2))
    h = keras.layers.Masking(0.0)(inputs)
    model = keras.Model(inputs, _SqueezeKeepingMask()(keras.layers.Dense(1)(h)))
    rng = np.random.default_rng(9)
    x = rng.normal(size=(3, 6, 2)).astype(np.float32)
    lengths = np.array([6, 4, 2])
    valid = np.arange(6)[None, :] < lengths[:, None]
    x[~valid] = 0.0
    labels = rng.integers(0, 4, size=(3, 6)).astype(np.float32)
    labels[:, 0] = 3.0
    scores = model(x)
    assert get_keras_mask(scores) is not None
    padded_labels = np.where(valid, labels, -1.0).astype(np.float32)
    plain = tf.constant(scores.numpy())
    for loss, reference in (
            (SoftNDCGLoss(method="softsort"), lambda: SoftNDCGLoss(method="softsort")(
                padded_labels, plain)),
            (ListwisePermutationLoss(), lambda: ListwisePermutationLoss()(padded_labels, plain)),
            (SpearmanLoss(epsilon=1e-2), lambda: tf.reduce_mean(
                1.0 - soft_spearman_correlation(labels, plain, mask=valid, epsilon=1e-2)))):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            value = loss(labels, scores)
        assert float(value) == pytest.approx(float(reference()), rel=1e-5)
        grad = tape.gradient(value, scores).numpy()
        np.testing.assert_array_equal(grad[~valid], 0.0)
        assert np.abs(grad[valid]).max() > 0
        model.compile(loss=loss)
        assert model.evaluate(x, labels, verbose=0) == pytest.approx(float(reference()),
                                                                     rel=1e-5)


# ---------------------------------------------------------------------------------
# Any family of the front door (`method=`).
# ---------------------------------------------------------------------------------
FAMILY_ARGUMENTS = {  # (temperature, method_kwargs) of each family in these tests
    "sinkhorn": (0.05, None), "lapsum": (0.3, None),
    "permutahedron": (0.3, {"regularization": "kl"}),
    "softsort": (0.3, {"distance_power": 2.0}), "neuralsort": (0.3, None),
    "diffsort": (5.0, {"network": "bitonic"})}
assert set(FAMILY_ARGUMENTS) == set(ss.METHODS)  # a new family gets these tests


def _np_pearson(u, v):
    u, v = u - u.mean(axis=-1, keepdims=True), v - v.mean(axis=-1, keepdims=True)
    return (u * v).sum(-1) / np.sqrt((u * u).sum(-1) * (v * v).sum(-1))


@pytest.mark.parametrize("method", sorted(FAMILY_ARGUMENTS))
def test_rank_losses_of_every_family_are_their_front_door_ranks(method):
    """Each loss equals its formula (float64 numpy) on the ranks `soft_rank(method)`
    returns; gradients are finite; the config round trip gives the same loss."""
    temperature, method_kwargs = FAMILY_ARGUMENTS[method]
    front = dict(temperature=temperature, **(method_kwargs or {}))
    args = dict(method=method, temperature=temperature, method_kwargs=method_kwargs,
                reduction="none", dtype="float64")
    rng = np.random.default_rng(21)
    targets, scores = rng.normal(size=(4, 7)), rng.normal(size=(4, 7))
    labels = rng.integers(0, 4, size=(4, 7)).astype(np.float64)
    labels[:, 0] = 3.0
    classes = np.array([0, 3, 6, 2])
    ascending = soft_rank(scores, method, **front).numpy()
    descending = soft_rank(scores, method, "DESCENDING", **front).numpy()
    gains = 2.0 ** labels - 1.0
    ideal = np.array([np_dcg(np.sort(lab)[::-1]) for lab in labels])
    picked = ascending[np.arange(4), classes]
    losses = {
        "spearman": (SpearmanLoss(**args), targets, 1.0 - _np_pearson(
            ascending, stats.rankdata(targets, axis=-1))),
        "ndcg": (SoftNDCGLoss(negative_labels_are_padding=False, **args), labels,
                 1.0 - (gains / np.log2(1.0 + descending)).sum(-1) / ideal),
        "top_k_rank": (ss.SoftTopKLoss(2, from_sparse=True, **args), classes,
                       np.maximum(0.0, 7 - 2 + 1 - picked)),
        "top_k_cdf": (ss.SoftTopKLoss(2, "cdf", True, **args), classes,
                      np.maximum(0.0, 1.0 - 2 / 7 - picked / 7)),
    }
    x = tf.constant(scores)
    for name, (loss, y, expected) in losses.items():
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = loss(y, x)
        assert np.all(np.isfinite(value.numpy())), name
        np.testing.assert_allclose(value.numpy(), expected, rtol=1e-6, atol=1e-9,
                                   err_msg=name)
        assert np.all(np.isfinite(tape.gradient(value, x).numpy())), name
        config = loss.get_config()
        assert config["method"] == method
        clone = keras.losses.deserialize(keras.losses.serialize(loss))
        assert type(clone) is type(loss) and clone.get_config() == config
        np.testing.assert_allclose(clone(y, x).numpy(), value.numpy(), atol=1e-5)  # float32


@pytest.mark.parametrize("method", ["lapsum", "softsort"])
def test_rank_losses_of_other_families_take_masks_keras_masks_and_ragged_lists(method):
    rng = np.random.default_rng(22)
    labels, scores = random_padded(rng, 3, 6, np.float32, ties=False)
    labels[:, 0] = 2.0
    valid = labels >= 0
    lengths = valid.sum(-1)
    ragged_labels = tf.RaggedTensor.from_tensor(labels, lengths=lengths)
    ragged_scores = tf.RaggedTensor.from_tensor(scores, lengths=lengths)
    for loss in (SoftNDCGLoss(method, 0.3), SpearmanLoss(method=method, temperature=0.3),
                 ss.SoftTopKLoss(1, from_sparse=True, method=method, temperature=0.3)):
        if isinstance(loss, ss.SoftTopKLoss):
            classes = np.zeros(3, np.int64)
            expected = ss.soft_top_k_loss(classes, scores, 1, from_sparse=True, mask=valid,
                                          method=method, temperature=0.3)
            y = classes
        else:
            y = labels
            expected = loss.fn(labels, scores, mask=valid, **loss.fn_kwargs)
            np.testing.assert_allclose(float(loss(ragged_labels, ragged_scores)),
                                       float(tf.reduce_mean(expected)), rtol=1e-5)
        masked = keras.layers.Masking(-99.0)(np.where(valid, scores, -99.0)[..., None])
        masked_scores = _SqueezeKeepingMask()(masked)
        value = loss(y, masked_scores)
        assert np.isfinite(float(value))
        np.testing.assert_allclose(float(value), float(tf.reduce_mean(expected)), rtol=1e-5)


def test_permutahedron_takes_no_padding_and_says_so():
    labels = np.array([[2.0, 0.0, 1.0, -1.0]])
    scores = np.array([[0.3, 0.1, 0.2, 0.0]])
    for make in (lambda: SoftNDCGLoss("permutahedron"),
                 lambda: SpearmanLoss(method="permutahedron", negative_labels_are_padding=True)):
        with pytest.raises(ValueError, match="negative_labels_are_padding"):
            make()
    loss = SpearmanLoss(method="permutahedron")
    with pytest.raises(ValueError, match="mask"):
        soft_spearman_correlation(labels, scores, mask=labels >= 0, method="permutahedron")
    with pytest.raises(ValueError, match="mask"):
        loss(tf.ragged.constant([[1.0, 2.0], [3.0]]), tf.ragged.constant([[0.1, 0.2], [0.3]]))
    with pytest.raises(ValueError, match="mask"):
        ss.soft_top_k_loss([0], scores, 1, from_sparse=True, mask=labels >= 0,
                           method="permutahedron")
    unpadded = SoftNDCGLoss("permutahedron", 1e-3, negative_labels_are_padding=False)
    assert float(unpadded(labels[:, :3], scores[:, :3])) == pytest.approx(0.0, abs=1e-6)


def test_method_arguments_are_validated_at_construction():
    cases = [
        (lambda: SpearmanLoss(method="bubble"), "`method`"),
        (lambda: SpearmanLoss(method="lapsum", temperature=0.0), "`temperature`"),
        (lambda: SpearmanLoss(method="lapsum", epsilon=1e-3), "method='sinkhorn'"),
        (lambda: ss.SoftTopKLoss(method="softsort", options=ss.SinkhornOptions()),
         "method='sinkhorn'"),
        (lambda: SoftNDCGLoss("neuralsort", targets="centres"), "method='sinkhorn'"),
        (lambda: SpearmanLoss(method_kwargs={"squash": "atan"}), "`method_kwargs`"),
        (lambda: SpearmanLoss(method="permutahedron", method_kwargs={"regularization": "l1"}),
         "`regularization`"),
        (lambda: SpearmanLoss(method="softsort", method_kwargs={"power": 2}),
         "`method_kwargs`"),
        (lambda: SpearmanLoss(method="softsort", method_kwargs={"tau": 2.0}), "`tau`"),
        (lambda: SoftNDCGLoss("lapsum", method_kwargs={"direction": "ASCENDING"}),
         "`direction`"),
        (lambda: SoftNDCGLoss("lapsum", method_kwargs=["alpha"]), "`method_kwargs`"),
        (lambda: ss.SoftTopKLoss(temperature=1e-2, epsilon=1e-3), "`temperature` and"),
        (lambda: SoftNDCGLoss("softsort", negative_labels_are_padding="yes"),
         "negative_labels_are_padding"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError, match=message):
            make()


# ---------------------------------------------------------------------------------
# The padding rule: relevance labels < 0 are padding, correlation targets are values.
# ---------------------------------------------------------------------------------
def test_padding_rule_of_the_ranking_losses_and_metrics():
    rng = np.random.default_rng(23)
    labels = rng.integers(0, 4, size=(3, 6)).astype(np.float32)
    labels[:, 0] = 3.0
    labels[:, -2:] = -1.0  # padding for relevance labels, a value for correlations
    scores = rng.normal(size=(3, 6)).astype(np.float32)
    truncated = (labels[:, :4], scores[:, :4])
    for padded, plain in (
            (SoftNDCGLoss("softsort"), lambda y, s: SoftNDCGLoss("softsort")(y, s)),
            (ListwisePermutationLoss(), lambda y, s: ListwisePermutationLoss()(y, s))):
        assert float(padded(labels, scores)) == pytest.approx(float(plain(*truncated)),
                                                              rel=1e-6)
    for metric_type in (NDCGMetric, MRRMetric):
        whole, cut = metric_type(), metric_type()
        whole.update_state(labels, scores)
        cut.update_state(*truncated)
        assert float(whole.result()) == pytest.approx(float(cut.result()), rel=1e-6)
    # Correlations: a negative target is a value (equal to an explicit all-valid list).
    for loss, kendall in ((SpearmanLoss(method="lapsum"), False),
                          (ss.KendallTauLoss(), True)):
        assert not loss.get_config()["negative_labels_are_padding"]
        expected = (1.0 - ss.soft_kendall_tau(labels, scores) if kendall else
                    1.0 - soft_spearman_correlation(labels, scores, method="lapsum"))
        assert float(loss(labels, scores)) == pytest.approx(
            float(tf.reduce_mean(expected)), rel=1e-6)
        masked = type(loss).from_config({**loss.get_config(),
                                         "negative_labels_are_padding": True})
        assert float(masked(labels, scores)) != pytest.approx(float(loss(labels, scores)))
    for metric, reference in ((SpearmanCorrelation(), spearman_correlation),
                              (ss.KendallTau(), ss.kendall_tau)):
        assert not metric.get_config()["negative_labels_are_padding"]
        metric.update_state(labels, scores)
        assert float(metric.result()) == pytest.approx(
            float(tf.reduce_mean(reference(labels, scores))), rel=1e-6)


# ---------------------------------------------------------------------------------
# Arguments and serialisation.
# ---------------------------------------------------------------------------------
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
        for _ in range(20):
            with tf.GradientTape() as tape:
                value = loss(labels, tf.linalg.matvec(tf.constant(feats), w))
            opt.apply_gradients([(tape.gradient(value, w), w)])
        after = float(np.mean(ndcg(labels, feats @ w.numpy())[0]))
        assert after > before + 0.1, (loss.name, before, after)

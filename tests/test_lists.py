"""Tests of `softsort_tf._lists`, the maths of ranked lists shared by the ranking
losses and metrics, on every list loss and metric: the padding convention (labels < 0,
masks, ragged lists) changes no value and no gradient, and list lengths unknown at trace
time (graph, XLA, Keras models fed two lengths) give the values of static shapes."""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from keras_test_layers import unknown_length_batches
from operator_cases import masked_label_batch, random_padded
from scipy import stats

import softsort_tf as ss
from softsort_tf.losses.ranking import (
    ListwisePermutationLoss,
    SoftNDCGLoss,
    listwise_permutation_loss,
    soft_ndcg,
)
from softsort_tf.losses.spearman import SpearmanLoss, soft_spearman_correlation
from softsort_tf.metrics.ranking import MRRMetric, NDCGMetric, ndcg, reciprocal_rank
from softsort_tf.metrics.spearman import SpearmanCorrelation, spearman_correlation


def padded_lists(rng, batch, n):
    """Graded labels 0–3 with a padded tail (−1) per list, Gaussian scores."""
    labels = rng.randint(0, 4, (batch, n)).astype(np.float32)
    labels[:, 0] = 2.0
    for b, length in enumerate(rng.randint(2, n + 1, batch)):
        labels[b, length:] = -1.0
    return labels, rng.randn(batch, n).astype(np.float32)


def _metric_value(metric):
    def value(y_true, y_pred):
        metric.reset_state()
        metric.update_state(y_true, y_pred)
        return metric.result()
    return value


LIST_FUNCTIONS = {
    "spearman_loss": lambda: ss.SpearmanLoss(),
    "spearman_loss_padded": lambda: ss.SpearmanLoss(negative_labels_are_padding=True),
    "spearman_loss_axis0": lambda: (lambda y, p: ss.SpearmanLoss(
        axis=0, negative_labels_are_padding=True)(tf.transpose(y), tf.transpose(p))),
    "soft_spearman": lambda: (lambda y, p: ss.losses.spearman.soft_spearman_correlation(
        y, p, mask=y >= 0)),
    "spearman_metric": lambda: _metric_value(
        ss.SpearmanCorrelation(negative_labels_are_padding=True)),
    "ndcg_sinkhorn": lambda: ss.losses.ranking.SoftNDCGLoss(),
    "ndcg_softsort": lambda: ss.losses.ranking.SoftNDCGLoss("softsort"),
    "ndcg_neuralsort": lambda: ss.losses.ranking.SoftNDCGLoss("neuralsort"),
    "listwise_neuralsort": lambda: ss.losses.ranking.ListwisePermutationLoss(),
    "listwise_softsort": lambda: ss.losses.ranking.ListwisePermutationLoss("softsort"),
    "ndcg_metric": lambda: _metric_value(ss.metrics.ranking.NDCGMetric(k=3)),
    "mrr_metric": lambda: _metric_value(ss.metrics.ranking.MRRMetric()),
    "top_k_rank": lambda: (lambda y, p: ss.SoftTopKLoss(2, epsilon=1e-2)(
        tf.one_hot(tf.argmax(y, axis=-1), tf.shape(y)[-1]), p)),
    "top_k_cdf_sparse": lambda: (lambda y, p: ss.SoftTopKLoss(
        1, form="cdf", from_sparse=True, epsilon=1e-2)(tf.argmax(y, axis=-1), p)),
}


# The losses of the former test_unknown_list_length_in_tf_function (its values on
# `random_padded` lists, without ties, at n = 4 and 11, to rtol 1e-5): in the one graph
# below. Its ndcg-softsort, ndcg-neuralsort, perm-neuralsort and perm-softsort were the
# very losses (same class and arguments) of LIST_FUNCTIONS named here, and its
# NDCGMetric(k=3) update is LIST_FUNCTIONS' ndcg_metric; the others are added to the graph.
DYNAMIC_ALIASES = {"ndcg-softsort": "ndcg_softsort", "ndcg-neuralsort": "ndcg_neuralsort",
                   "perm-neuralsort": "listwise_neuralsort",
                   "perm-softsort": "listwise_softsort"}
DYNAMIC_EXTRA = {
    "ndcg-sinkhorn": lambda: SoftNDCGLoss(temperature=0.05),
    "spearman": lambda: SpearmanLoss(negative_labels_are_padding=True, threshold=1e-7),
    "ndcg-lapsum": lambda: SoftNDCGLoss(method="lapsum", temperature=0.1),
    "spearman-neuralsort": lambda: SpearmanLoss(method="neuralsort",
                                                negative_labels_are_padding=True),
}
DYNAMIC_NAMES = set(DYNAMIC_ALIASES.values()) | set(DYNAMIC_EXTRA)


def _dynamic_lists(rng, n):
    labels, scores = random_padded(rng, 3, n, np.float32, ties=False)
    labels[:, 0] = 1.0
    return labels, scores


def test_list_losses_and_metrics_with_an_unknown_list_length():
    """The list axis may be unknown (`None`) when the graph is built: every list function
    in one tf.function of unknown list length, built twice (a graph and an XLA program:
    one trace and one compilation each, not one per function), against the eager values
    (computed once for both) at two lengths; the graph also at two lengths of
    `random_padded` lists (with the losses of DYNAMIC_EXTRA, to rtol 1e-5 there)."""
    rng = np.random.RandomState(4)
    data = [padded_lists(rng, 3, n) for n in (7, 4)]
    dynamic_rng = np.random.default_rng(5)
    dynamic_data = [_dynamic_lists(dynamic_rng, n) for n in (4, 11)]
    makers = {**LIST_FUNCTIONS, **DYNAMIC_EXTRA}
    eager = {name: make() for name, make in makers.items()}
    wants = [{name: fn(tf.constant(labels), tf.constant(scores)).numpy()
              for name, fn in eager.items()} for labels, scores in data + dynamic_data]
    spec = tf.TensorSpec([None, None], tf.float32)
    for jit in (False, True):
        fns = {name: make() for name, make in (LIST_FUNCTIONS if jit else makers).items()}
        traced = tf.function(lambda y, p, fns=fns: {name: fn(y, p) for name, fn in fns.items()},
                             input_signature=[spec, spec], jit_compile=jit)
        cases = [(d, w, False) for d, w in zip(data, wants[:2], strict=True)]
        if not jit:  # XLA: the LIST_FUNCTIONS on `data` only, as before
            cases += [(d, w, True) for d, w in zip(dynamic_data, wants[2:], strict=True)]
        for (labels, scores), want, dynamic in cases:
            got = traced(labels, scores)
            for name in sorted(fns):
                label = (f"{name} {'xla' if jit else 'graph'} n={labels.shape[1]}"
                         f"{' random_padded' if dynamic else ''}")
                value = got[name].numpy()
                assert np.isfinite(value).all(), label
                tight = dynamic and name in DYNAMIC_NAMES
                np.testing.assert_allclose(value, want[name], rtol=1e-5 if tight else 2e-4,
                                           atol=1e-6 if tight else 2e-5, err_msg=label)
        assert traced.experimental_get_tracing_count() == 1


LIST_LOSSES = {name: LIST_FUNCTIONS[name] for name in (
    "spearman_loss_padded", "ndcg_sinkhorn", "ndcg_softsort", "ndcg_neuralsort",
    "listwise_neuralsort", "listwise_softsort")}


def test_keras_model_fed_two_list_lengths():
    """Every list loss on its own head (Dense scorer) of ONE model, so that one train and
    one evaluate graph (each traced once, of unknown list length) serve all the losses at
    both lengths; the heads share no weight, so each trains as it would alone."""
    keras.utils.set_random_seed(1)
    names = sorted(LIST_LOSSES)
    inputs = keras.Input((None, 2))
    outputs = {name: keras.layers.Reshape((-1,), name=name)(
        keras.layers.Dense(1, name=f"{name}_scorer")(inputs)) for name in names}
    model = keras.Model(inputs, outputs)
    losses = {name: LIST_LOSSES[name]() for name in names}
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=losses,
                  metrics={name: [ss.metrics.ranking.NDCGMetric(k=3)] for name in names})
    rng = np.random.RandomState(5)
    for n in (5, 9):
        labels, _ = padded_lists(rng, 8, n)
        x = rng.randn(8, n, 2).astype(np.float32)
        y = {name: labels for name in names}
        # Batches of no static length: both lengths run the one train (and evaluate) graph
        # of unknown list length (not a static trace for n = 5 and a retrace for n = 9).
        history = model.fit(unknown_length_batches((x, y), 4), epochs=1, verbose=0).history
        got = model.evaluate(unknown_length_batches((x, y), 8), verbose=0,
                             return_dict=True)
        pred = model(x)  # eager: predict's traces would only repeat evaluate's
        for name in names:
            assert np.isfinite(history[f"{name}_loss"]).all(), (name, n)
            assert np.isfinite(got[f"{name}_ndcg_at_3"]), (name, n)
            assert pred[name].shape == (8, n), name
            assert got[f"{name}_loss"] == pytest.approx(
                float(losses[name](labels, pred[name].numpy())), rel=1e-4, abs=1e-6), (name, n)
        assert np.isfinite(history["loss"]).all()


# Sinkhorn runs to a tight marginal error so that padded and unpadded problems, which
# stop at different iterations, agree to far below the loss scale.
TIGHT = {"threshold": 1e-9, "max_iterations": 5000}


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


@functools.cache
def _value_and_grad_graph(name):
    """The loss `name` of LOSSES and its gradient in the scores, as one graph of one list
    of any length (traced once for all the examples of the test)."""
    fn = dict(LOSSES)[name]
    spec = tf.TensorSpec([1, None], tf.float64)

    @tf.function(input_signature=[spec, spec])
    def value_and_grad(labels, scores):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            value = fn(labels, scores)
        return value, tape.gradient(value, scores)

    return value_and_grad


def _value_and_grad(name, labels, scores):
    value, grad = _value_and_grad_graph(name)(labels, scores)
    return value.numpy(), grad.numpy()


@pytest.mark.parametrize("name", [n for n, _ in LOSSES])
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(2, 9), extra=st.integers(1, 7))
def test_padding_changes_no_value_and_no_gradient(name, seed, n, extra):
    """Padding (labels −1, shuffled among the items, with a NaN and large scores) changes
    neither the loss nor the gradient of the real items, and the padding gets no gradient;
    in one graph per loss of a list of unknown length."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, size=(1, n)).astype(np.float64)
    labels[0, 0] = 3.0  # at least one relevant item
    scores = rng.normal(size=(1, n))
    pad_scores = rng.normal(scale=100.0, size=(1, extra))
    pad_scores[0, 0] = np.nan
    value, grad = _value_and_grad(name, labels, scores)
    padded_labels = np.concatenate([labels, -np.ones((1, extra))], axis=1)
    padded_scores = np.concatenate([scores, pad_scores], axis=1)
    # Shuffle, so padding is not only a tail.
    perm = rng.permutation(n + extra)
    p_value, p_grad = _value_and_grad(name, padded_labels[:, perm], padded_scores[:, perm])
    inverse = np.argsort(perm)
    p_grad = p_grad[:, inverse]
    tol = 1e-6 if "sinkhorn" in name or "lapsum" in name or name == "spearman" else 1e-10
    np.testing.assert_allclose(p_value, value, rtol=tol, atol=tol)
    np.testing.assert_allclose(p_grad[:, :n], grad, rtol=1e-4 if tol > 1e-9 else 1e-8,
                               atol=tol)
    np.testing.assert_array_equal(p_grad[:, n:], 0.0)


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
# Checked inputs (`check_lists`) and Keras-RS's y_true = {"labels", "mask"}.
# ---------------------------------------------------------------------------------
def _ranking_callables():
    """Every ranking loss and metric as `f(y_true, y_pred)`; metrics are built once,
    outside any tf.function (they hold variables)."""
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
        "NDCGMetric": _metric_value(NDCGMetric(k=2)),
        "MRRMetric": _metric_value(MRRMetric()),
        "SpearmanCorrelation": _metric_value(ss.SpearmanCorrelation()),
        "KendallTau": _metric_value(ss.KendallTau()),
        "spearman_correlation": ss.spearman_correlation,
        "soft_spearman_correlation": ss.soft_spearman_correlation,
        "kendall_tau": ss.kendall_tau,
        "soft_kendall_tau": ss.soft_kendall_tau,
    }


RANKING = tuple(_ranking_callables())
LABELS = np.array([[2.0, 0.0, 1.0], [0.0, 1.0, 3.0]], np.float32)
SCORES = np.array([[0.3, 0.1, 0.2], [0.5, 0.4, 0.9]], np.float32)


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


def _weighted_mean(values, weights):
    return float(np.sum(values.numpy() * weights.numpy()) / np.sum(weights.numpy()))


@pytest.fixture(scope="module")
def dict_form_in_a_graph():
    """Every ranking callable on the dict form {"labels", "mask"} of `masked_label_batch(3)`
    as one output of ONE tf.function (one trace for all, not one per callable)."""
    labels, mask, scores = masked_label_batch(3)
    fns = _ranking_callables()
    graph = tf.function(lambda y, s: {name: fn(y, s) for name, fn in fns.items()})
    values = graph({"labels": tf.constant(labels), "mask": tf.constant(mask)},
                   tf.constant(scores))
    return {name: np.asarray(value) for name, value in values.items()}


@pytest.mark.parametrize("name", RANKING)
def test_keras_rs_dict_form_equals_the_padded_labels(name, dict_form_in_a_graph):
    fn = _ranking_callables()[name]
    labels, mask, scores = masked_label_batch(3)
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
    assert np.all(np.isfinite(np.asarray(got)))
    np.testing.assert_allclose(dict_form_in_a_graph[name], np.asarray(got), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(got), np.asarray(reference), rtol=1e-5, atol=1e-6)
    # Ragged labels and mask in the dict.
    ragged = {"labels": tf.RaggedTensor.from_tensor(labels, lengths=[6] * len(labels)),
              "mask": tf.RaggedTensor.from_tensor(mask, lengths=[6] * len(labels))}
    np.testing.assert_allclose(
        np.asarray(fn(ragged, tf.RaggedTensor.from_tensor(scores, lengths=[6] * len(labels)))),
        np.asarray(got), rtol=1e-4, atol=1e-5)


def test_dict_form_mask_is_combined_with_the_keras_mask_and_mask_argument():
    labels, mask, scores = masked_label_batch(4)
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


def _exact_ndcg(labels, order):
    """NDCG with the gains 2^label − 1 as exact Python integers (integer labels)."""
    gains = np.array([2 ** int(v) - 1 for v in labels], dtype=object)
    discounts = 1.0 / np.log2(np.arange(2, len(labels) + 2))
    top = max(gains) if max(gains) > 0 else 1

    def dcg(g):
        return sum(float(x / top) * d for x, d in zip(g, discounts, strict=True))

    return dcg(gains[list(order)]) / dcg(sorted(gains, reverse=True))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_labels_of_128_and_more_give_finite_exact_ndcg(dtype):
    """2^label overflows float32 from 128 and float64 from 1024: the gains of each list
    are scaled by its largest (`gains`)."""
    labels = np.array([[200.0, 130.0, 0.0, 129.0, 128.0], [1.0, 3000.0, 2999.0, 0.0, 5.0]],
                      dtype)
    scores = np.array([[0.1, 0.9, 0.3, 0.5, 0.2], [0.3, 0.2, 0.9, 0.1, 0.0]], dtype)
    values, weights = ndcg(labels, scores)
    expected = [_exact_ndcg(lab, np.argsort(-s, kind="stable"))
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

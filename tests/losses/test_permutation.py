"""Tests of `softsort_tf.losses.permutation`: the permutation cross-entropy (hand-made
values, orderings and matrices, samples, reductions, log matrices, XLA, errors, padded
orderings) and learning to sort; with the permutation accuracies where a test uses both."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from operator_cases import (
    MATRIX_OPERATORS,
    TAU,
    hand_made_batch,
    matrix_and_gradient,
    padded_batches,
)

import softsort_tf as ss
from softsort_tf.experiments import training

EPS = 1e-7


P2 = np.array([[0.5, 0.5], [0.0, 1.0]], np.float32)  # row 0 split, row 1 certain


def test_cross_entropy_hand_made_values():
    # Perfect prediction: zero loss.
    assert float(ss.permutation_cross_entropy([[2, 0, 1]], np.eye(3)[[[2, 0, 1]]])[0]) == 0.0
    # Uniform rows: log n per row.
    np.testing.assert_allclose(ss.permutation_cross_entropy([[0, 1, 2]], np.full([1, 3, 3], 1 / 3)),
                               [np.log(3.0)], rtol=1e-6)
    # (−log 0.5 − log 1) / 2.
    np.testing.assert_allclose(ss.permutation_cross_entropy([[0, 1]], P2[None]),
                               [np.log(2.0) / 2], rtol=1e-6)
    # The true item of row 1 has probability 0: that row costs −log ε, not inf.
    loss = ss.permutation_cross_entropy([[1, 0]], P2[None]).numpy()
    np.testing.assert_allclose(loss, [(np.log(2.0) - np.log(EPS)) / 2], rtol=1e-5)
    loss = ss.permutation_cross_entropy([[1, 0]], P2[None], probability_floor=1e-3).numpy()
    np.testing.assert_allclose(loss, [(-np.log(1e-3 + (1 - 1e-3) * 0.5) - np.log(1e-3)) / 2],
                               rtol=1e-5)


def test_orderings_and_matrices_give_the_same_loss():
    rng = np.random.RandomState(0)
    logits = rng.randn(4, 5, 5)
    perm = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    order = np.stack([rng.permutation(5) for _ in range(4)])
    matrix = np.eye(5)[order]
    by_index = ss.permutation_cross_entropy(order, perm).numpy()
    expected = -np.log(EPS + (1 - EPS) * np.take_along_axis(perm, order[..., None], -1)[..., 0])
    np.testing.assert_allclose(by_index, expected.mean(-1), rtol=1e-6)
    np.testing.assert_allclose(ss.permutation_cross_entropy(matrix, perm).numpy(), by_index,
                               rtol=1e-6)
    # Keras casts y_true to float: float orderings are still orderings.
    np.testing.assert_allclose(
        ss.permutation_cross_entropy(order.astype(np.float32), perm).numpy(), by_index,
        rtol=1e-6)
    # Leading batch dims.
    np.testing.assert_allclose(
        ss.permutation_cross_entropy(order.reshape(2, 2, 5), perm.reshape(2, 2, 5, 5)).numpy(),
        by_index.reshape(2, 2), rtol=1e-6)


def test_soft_target_matrices_use_the_full_cross_entropy():
    target = np.array([[[0.75, 0.25], [0.25, 0.75]]])
    loss = ss.permutation_cross_entropy(target, P2[None], probability_floor=1e-6).numpy()
    log_p = np.log(1e-6 + (1 - 1e-6) * P2)
    np.testing.assert_allclose(loss, [-(target[0] * log_p).sum(-1).mean()], rtol=1e-6)


def test_sample_axes_are_averaged():
    # Two samples per example: one perfect (loss 0), one with uniform rows (log 3).
    perm = np.stack([np.eye(3), np.full([3, 3], 1 / 3)])[None]  # [1, S=2, 3, 3]
    np.testing.assert_allclose(ss.permutation_cross_entropy([[0, 1, 2]], perm),
                               [np.log(3) / 2], rtol=1e-6)
    with pytest.raises(ValueError, match="y_true_format"):  # auto: a float matrix of lower
        ss.permutation_cross_entropy(np.eye(3)[None], perm)  # rank is read as an ordering
    np.testing.assert_allclose(
        ss.permutation_cross_entropy(np.eye(3)[None], perm, y_true_format="matrix"),
        [np.log(3) / 2], rtol=1e-6)
    # The uniform sample's row-wise argmax is [0, 0, 0]: one of two samples is right.
    np.testing.assert_allclose(ss.exact_permutation_accuracy([[0, 1, 2]], perm), [0.5])
    stochastic = np.stack([np.eye(2), np.eye(2)[::-1]])[None]
    np.testing.assert_allclose(ss.exact_permutation_accuracy([[0, 1]], stochastic), [0.5])
    np.testing.assert_allclose(ss.elementwise_permutation_accuracy([[0, 1]], stochastic), [0.5])


def test_loss_class_reduction_and_sample_weight():
    order = np.array([[0, 1], [1, 0]])
    perm = np.stack([P2, P2])
    per_example = ss.permutation_cross_entropy(order, perm).numpy()
    assert per_example[1] > per_example[0] > 0
    loss = ss.PermutationCrossEntropy()
    np.testing.assert_allclose(float(loss(order, perm)), per_example.mean(), rtol=1e-6)
    np.testing.assert_allclose(float(loss(order, perm, sample_weight=[1.0, 0.0])),
                               per_example[0] / 2, rtol=1e-6)
    np.testing.assert_allclose(float(loss(order, perm, sample_weight=[0.5, 2.0])),
                               (0.5 * per_example[0] + 2.0 * per_example[1]) / 2, rtol=1e-6)
    total = ss.PermutationCrossEntropy(reduction="sum")
    np.testing.assert_allclose(float(total(order, perm)), per_example.sum(), rtol=1e-6)


def test_loss_gradient_is_finite_where_the_true_entry_is_zero():
    perm = tf.Variable(P2[None])
    with tf.GradientTape() as tape:
        loss = ss.PermutationCrossEntropy()([[1, 0]], perm)
    grad = tape.gradient(loss, perm).numpy()
    assert np.all(np.isfinite(grad))
    assert grad[0, 1, 0] < -1e3  # pushes the missing true entry up, strongly but finitely
    assert grad[0, 0, 0] == 0.0  # entries off the true item get no gradient


def test_loss_under_xla_matches_eager():
    order = tf.constant([[2, 0, 1, 3], [3, 2, 1, 0]])
    perm = ss.softsort_permutation_matrix(
        np.random.RandomState(0).randn(2, 4).astype(np.float32), tau=0.5)
    eager = ss.permutation_cross_entropy(order, perm)
    xla = tf.function(ss.permutation_cross_entropy, jit_compile=True)(order, perm)
    np.testing.assert_allclose(xla.numpy(), eager.numpy(), rtol=1e-6)


def test_float_matrix_against_samples_with_s_equal_n_is_never_read_as_orderings():
    # Bug: a float [B, n, n] matrix against a stochastic [B, S, n, n] prediction was read
    # as orderings when S == n (the binaries' defaults at n = 5): wrong values, silently.
    rng = np.random.RandomState(1)
    logits = rng.randn(2, 5, 5, 5)
    perm = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)
    order = np.stack([rng.permutation(5) for _ in range(2)])
    matrix = np.eye(5, dtype=np.float32)[order]  # what Keras passes: a float y_true
    for fn in (ss.permutation_cross_entropy, ss.exact_permutation_accuracy,
               ss.elementwise_permutation_accuracy):
        with pytest.raises(ValueError, match="y_true_format"):
            fn(matrix, perm)
        np.testing.assert_allclose(fn(matrix, perm, y_true_format="matrix").numpy(),
                                   fn(order, perm).numpy(), rtol=1e-6)
        np.testing.assert_allclose(fn(order.astype(np.float32), perm).numpy(),
                                   fn(order, perm).numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="y_true_format"):
        ss.PermutationCrossEntropy()(matrix, perm)


BAD_ORDERINGS = {
    "index n in the first row": [[0, 1, 3], [0, 1, 2]],
    "index n in the last row": [[0, 1, 2], [0, 1, 3]],
    "negative index": [[0, -1, 2], [0, 1, 2]],
    "repeated index": [[0, 0, 2], [0, 1, 2]],
    "non-integer float": [[0.0, 1.5, 2.0], [0.0, 1.0, 2.0]],
    "repeated index before padding": [[1, 1, -1], [0, 1, 2]],
    "index n before padding": [[3, 0, -1], [0, 1, 2]],
    "padding between indices (float)": [[0.0, -1.0, 1.0], [0.0, 1.0, 2.0]],
}


@pytest.mark.parametrize("case", sorted(BAD_ORDERINGS))
def test_orderings_that_are_not_permutations_raise_a_clear_error(case):
    # Bug: an index n in a row other than the last read the next row's probability
    # (loss 4.03, no error); in the last row it raised a raw GatherV2 error.
    order = np.array(BAD_ORDERINGS[case])
    order = order.astype(np.float32 if "float" in case else np.int32)
    perm = np.full([2, 3, 3], 1 / 3, np.float32)
    for fn in (ss.permutation_cross_entropy, ss.exact_permutation_accuracy,
               ss.PermutationCrossEntropy()):
        with pytest.raises(ValueError, match="permutation"):
            fn(order, perm)
    graph = tf.function(ss.permutation_cross_entropy)
    with pytest.raises(tf.errors.InvalidArgumentError, match="permutation"):
        graph(tf.constant(order), tf.constant(perm))


@pytest.mark.parametrize("call, match", [
    (lambda: ss.permutation_cross_entropy([[0, 1]], P2[None], y_true_format="csv"),
     "y_true_format"),
    (lambda: ss.permutation_cross_entropy([[0, 1, 2]], P2[None]), "n = 2"),
    (lambda: ss.permutation_cross_entropy([[0, 1]], P2[None], probability_floor=1.0),
     "probability_floor"),
    (lambda: ss.permutation_cross_entropy(np.zeros([1, 1, 2, 2]), P2[None]), "y_true"),
    (lambda: ss.permutation_cross_entropy([[0, 1]], np.zeros([1, 2, 3])), "y_pred"),
    (lambda: ss.PermutationCrossEntropy(probability_floor=0.0), "probability_floor"),
    (lambda: ss.ExactPermutationAccuracy(y_true_format="rows"), "y_true_format"),
])
def test_bad_arguments_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_loss_and_metrics_serialise():
    loss = ss.PermutationCrossEntropy(probability_floor=1e-4, y_true_format="indices", name="pce")
    restored = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(restored, ss.PermutationCrossEntropy)
    assert restored.get_config() == loss.get_config()
    for cls in (ss.ExactPermutationAccuracy, ss.ElementwisePermutationAccuracy):
        metric = cls(name="acc", y_true_format="matrix")
        restored = keras.metrics.deserialize(keras.metrics.serialize(metric))
        assert type(restored) is cls and restored.get_config() == metric.get_config()
        order, perm = hand_made_batch()
        restored.update_state(np.eye(3)[order], perm)
        metric.update_state(np.eye(3)[order], perm)
        assert float(restored.result()) == float(metric.result())


def sorting_data(seed, num, n=5, features=3):
    rng = np.random.RandomState(seed)
    x = rng.randn(num, n, features).astype(np.float32)
    values = x @ np.array([1.0, -2.0, 0.5], np.float32)
    return x, np.argsort(-values, axis=-1, kind="stable")


# Each layer is named by its key: Keras < 3.12 names a model's dict outputs by their
# layers, later Keras by the keys, and the losses, metrics and history are keyed by them.
SORTING_LAYERS = {
    "softsort": lambda name: ss.SoftSort(tau=0.3, name=name),
    "neuralsort": lambda name: ss.NeuralSort(tau=0.3, stochastic=True, num_samples=2, seed=3,
                                             name=name),
}


def test_model_fit_learns_to_sort():
    """A shared linear scorer learns from permutations alone to sort items whose
    hidden value is linear in their features: one tower (its own scorer and layer) per
    layer of SORTING_LAYERS in one model, fitted and evaluated once (one trace, not one
    per layer); the towers share no weight, so each learns from its own loss alone
    (Adam's steps are per variable), checked each. The loss trackers and the optimizer's
    slots are built from one batch first (`build_training_state`), so that the first
    `evaluate` traces its step once, not a second time for the variables it creates."""
    keras.utils.set_random_seed(0)
    x, order = sorting_data(0, 384)
    x_test, order_test = sorting_data(1, 256)
    items = keras.Input((5, 3))
    outputs = {name: make(name)(keras.layers.Reshape((5,))(
        keras.layers.Dense(1, use_bias=False)(items))) for name, make in SORTING_LAYERS.items()}
    model = keras.Model(items, outputs)
    names = sorted(SORTING_LAYERS)
    model.compile(keras.optimizers.Adam(0.05),
                  loss={name: ss.PermutationCrossEntropy() for name in names},
                  metrics={name: [ss.ExactPermutationAccuracy(),
                                  ss.ElementwisePermutationAccuracy()] for name in names})
    targets, test_targets = ({name: o for name in names} for o in (order, order_test))
    assert training.build_training_state(model, (x[:32], {name: order[:32] for name in names}))
    before = model.evaluate(x_test, test_targets, verbose=0, return_dict=True)
    history = model.fit(x, targets, batch_size=32, epochs=5, verbose=0).history
    after = model.evaluate(x_test, test_targets, verbose=0, return_dict=True)
    for name in names:
        assert history[f"{name}_loss"][-1] < 0.5 * history[f"{name}_loss"][0], name
        assert before[f"{name}_exact_permutation_accuracy"] < 0.2, name
        assert after[f"{name}_exact_permutation_accuracy"] > 0.9, name
        assert after[f"{name}_elementwise_permutation_accuracy"] > 0.95, name


def test_cross_entropy_from_log_is_exact_and_equals_the_floored_one_away_from_the_floor():
    rng = np.random.default_rng(4)
    s = rng.normal(size=(8, 5)).astype(np.float32)
    y = np.stack([rng.permutation(5) for _ in range(8)])
    log_p = ss.permutation_matrix(s, "softsort", tau=3.0, log=True)
    exact = -np.take_along_axis(log_p.numpy(), y[:, :, None], axis=-1)[..., 0].mean(-1)
    got = ss.permutation_cross_entropy(y, log_p, from_log=True).numpy()
    np.testing.assert_allclose(got, exact, rtol=1e-6)
    floored = ss.permutation_cross_entropy(y, tf.exp(log_p)).numpy()
    np.testing.assert_allclose(got, floored, rtol=1e-4)  # P̂ ≫ δ at τ = 3
    matrix = tf.one_hot(y, 5)
    np.testing.assert_allclose(ss.permutation_cross_entropy(matrix, log_p, from_log=True),
                               got, rtol=1e-6)
    loss = ss.PermutationCrossEntropy(from_log=True)
    assert ss.PermutationCrossEntropy.from_config(loss.get_config()).get_config() == \
        loss.get_config()
    # Padded orderings: the padded rows of log P̂ hold −inf; the loss stays finite.
    mask = np.ones((8, 5), bool)
    mask[0, 3:] = False
    y_pad = y.copy()
    y_pad[0] = [*np.argsort(-s[0, :3], kind="stable"), -1, -1]
    log_pad = ss.permutation_matrix(s, "softsort", tau=3.0, log=True, mask=mask)
    assert np.all(np.isfinite(ss.permutation_cross_entropy(y_pad, log_pad, from_log=True)))


def test_sinkhorn_cross_entropy_from_log_keeps_the_gradient_of_wrong_rows():
    """At ε = 0.005 the Sinkhorn plan of a few squashed scores is nearly hard: with the
    probability floor, most wrongly ordered rows of an untrained model get a gradient
    scaled by P̂/δ ≈ 0 and teach nothing; computed from log P̂ every wrong row keeps one."""
    rng = np.random.default_rng(0)
    s = tf.constant(rng.normal(size=(200, 3)).astype(np.float32) * 3)
    y = np.stack([rng.permutation(3) for _ in range(200)])
    wrong = np.any(np.argsort(-s.numpy(), axis=-1, kind="stable") != y, axis=-1)
    norms = {}
    for log in (False, True):
        with tf.GradientTape() as tape:
            tape.watch(s)
            p = ss.permutation_matrix(s, "sinkhorn", epsilon=0.005, log=log)
            loss = ss.permutation_cross_entropy(y, p, from_log=log)
        grad = tape.gradient(loss, s).numpy()
        assert np.all(np.isfinite(grad))
        norms[log] = np.linalg.norm(grad, axis=-1)[wrong]
    assert np.mean(norms[False] < 1e-4) > 0.3  # the floor's vanishing gradients
    assert np.mean(norms[True] < 1e-4) == 0.0


def _padded_ordering(x_row, mask_row):
    """The DESCENDING ordering of the valid entries (indices into the padded list),
    then −1 at the padded positions."""
    valid_idx = np.flatnonzero(mask_row)
    order = valid_idx[np.argsort(-x_row[valid_idx], kind="stable")]
    return np.concatenate([order, -np.ones(mask_row.size - order.size, int)])


@settings(max_examples=20, deadline=None)
@given(batch=padded_batches(), noise_seed=st.integers(0, 1000))
def test_loss_and_accuracies_on_padded_orderings_equal_unpadded(batch, noise_seed):
    x, mask, seed = batch
    rng = np.random.RandomState(noise_seed)
    # Targets from scores that differ from x: P̂ is not always right.
    truth = np.where(mask, rng.randn(*x.shape), 0.0)
    y = np.stack([_padded_ordering(truth[r], mask[r]) for r in range(2)]).astype(np.int32)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        perm = ss.neuralsort_permutation_matrix(xt, tau=TAU, mask=mask)
        loss = ss.permutation_cross_entropy(y, perm)
        total = tf.reduce_sum(loss)
    grad = tape.gradient(total, xt).numpy()
    exact = ss.exact_permutation_accuracy(y, perm).numpy()
    elementwise = ss.elementwise_permutation_accuracy(y, perm).numpy()
    # The same through an explicit mask (matrix targets, rows beyond n_valid ignored).
    y_matrix = np.stack([np.eye(x.shape[1])[np.maximum(y[r], 0)] * (y[r] >= 0)[:, None]
                         for r in range(2)])
    np.testing.assert_allclose(
        ss.permutation_cross_entropy(y_matrix, perm, mask=mask).numpy(), loss.numpy(),
        rtol=1e-12)
    for r in range(2):
        valid = mask[r]
        v = tf.constant(x[r, valid][None])
        y_ref = np.argsort(-truth[r, valid], kind="stable")[None].astype(np.int32)
        with tf.GradientTape() as tape:
            tape.watch(v)
            ref_perm = ss.neuralsort_permutation_matrix(v, tau=TAU)
            ref_loss = ss.permutation_cross_entropy(y_ref, ref_perm)
        ref_grad = tape.gradient(ref_loss, v).numpy()[0]
        np.testing.assert_allclose(loss[r], ref_loss[0], rtol=1e-12)
        np.testing.assert_allclose(grad[r, valid], ref_grad, rtol=1e-9, atol=1e-11)
        assert np.all(grad[r, ~valid] == 0) and np.all(np.isfinite(grad[r]))
        assert exact[r] == ss.exact_permutation_accuracy(y_ref, ref_perm).numpy()[0]
        assert elementwise[r] == pytest.approx(
            ss.elementwise_permutation_accuracy(y_ref, ref_perm).numpy()[0])


@pytest.mark.parametrize("name", sorted(MATRIX_OPERATORS))
def test_list_without_valid_entries_is_zero_with_zero_gradient(name):
    fn, has_gradient = MATRIX_OPERATORS[name]
    x = np.array([[np.nan, np.inf, 1.0], [1.0, 2.0, 3.0]])
    mask = np.array([[False] * 3, [True, False, True]])
    perm, grad = matrix_and_gradient(fn, x, mask, np.ones([2, 3, 3]), has_gradient)
    assert np.all(perm[0] == 0) and np.all(np.isfinite(perm))
    if has_gradient:
        assert np.all(grad[0] == 0) and np.all(np.isfinite(grad))
    y = np.array([[-1, -1, -1], [0, 2, -1] if "ascending" in name else [2, 0, -1]])
    assert ss.permutation_cross_entropy(y, perm).numpy()[0] == 0.0
    assert ss.exact_permutation_accuracy(y, perm).numpy().tolist() == [0.0, 1.0]
    assert ss.rankdata(x, mask=mask).numpy()[0].tolist() == [0.0, 0.0, 0.0]

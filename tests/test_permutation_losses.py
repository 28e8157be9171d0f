"""PermutationCrossEntropy and the permutation accuracy metrics on hand-made cases,
and a small learning-to-sort problem trained with model.fit."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss

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
    perm = ss.soft_sort_matrix(tf.random.normal([2, 4]), tau=0.5)
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


def hand_made_batch():
    """Three examples whose row-wise argmax gives [0, 1, 2] (right), [0, 2, 1] (two
    positions wrong) and [1, 1, 2] (not a permutation; one position wrong)."""
    argmax = np.array([[0, 1, 2], [0, 2, 1], [1, 1, 2]])
    perm = 0.1 + 0.7 * np.eye(3)[argmax]  # rows 0.8 / 0.1 / 0.1
    return np.array([[0, 1, 2]] * 3), perm.astype(np.float32)


def test_metrics_on_hand_made_cases():
    order, perm = hand_made_batch()
    np.testing.assert_allclose(ss.exact_permutation_accuracy(order, perm), [1, 0, 0])
    np.testing.assert_allclose(ss.elementwise_permutation_accuracy(order, perm),
                               [1, 1 / 3, 2 / 3], rtol=1e-6)
    for y_true in (order, np.eye(3)[order], order.astype(np.float32)):
        exact, elementwise = ss.ExactPermutationAccuracy(), ss.ElementwisePermutationAccuracy()
        exact.update_state(y_true, perm)
        elementwise.update_state(y_true, perm)
        np.testing.assert_allclose(float(exact.result()), 1 / 3, rtol=1e-6)
        np.testing.assert_allclose(float(elementwise.result()), 6 / 9, rtol=1e-6)
    exact, elementwise = ss.ExactPermutationAccuracy(), ss.ElementwisePermutationAccuracy()
    weights = np.array([1.0, 2.0, 0.0])
    exact.update_state(order, perm, sample_weight=weights)
    elementwise.update_state(order, perm, sample_weight=weights)
    np.testing.assert_allclose(float(exact.result()), 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(float(elementwise.result()), (1 + 2 / 3) / 3, rtol=1e-6)
    # States accumulate over batches and reset.
    exact.update_state(order[:1], perm[:1])
    np.testing.assert_allclose(float(exact.result()), 2 / 4, rtol=1e-6)
    exact.reset_state()
    exact.update_state(order[1:], perm[1:])
    assert float(exact.result()) == 0.0


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


@pytest.mark.parametrize("layer", [
    lambda: ss.SoftSort(tau=0.3),
    lambda: ss.NeuralSort(tau=0.3, stochastic=True, num_samples=2, seed=3),
])
def test_model_fit_learns_to_sort(layer):
    """A shared linear scorer learns from permutations alone to sort items whose
    hidden value is linear in their features."""
    keras.utils.set_random_seed(0)
    x, order = sorting_data(0, 384)
    x_test, order_test = sorting_data(1, 256)
    items = keras.Input((5, 3))
    scores = keras.layers.Reshape((5,))(keras.layers.Dense(1, use_bias=False)(items))
    model = keras.Model(items, layer()(scores))
    model.compile(keras.optimizers.Adam(0.05), loss=ss.PermutationCrossEntropy(),
                  metrics=[ss.ExactPermutationAccuracy(), ss.ElementwisePermutationAccuracy()])
    before = model.evaluate(x_test, order_test, verbose=0, return_dict=True)
    history = model.fit(x, order, batch_size=32, epochs=5, verbose=0)
    after = model.evaluate(x_test, order_test, verbose=0, return_dict=True)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert before["exact_permutation_accuracy"] < 0.2
    assert after["exact_permutation_accuracy"] > 0.9
    assert after["elementwise_permutation_accuracy"] > 0.95


@pytest.mark.parametrize("method", ["softsort", "neuralsort", "sinkhorn"])
def test_log_matrices_are_the_log_of_the_matrices_with_minus_inf_at_padding(method):
    rng = np.random.default_rng(3)
    s = rng.normal(size=(4, 6)).astype(np.float32)
    mask = np.ones((4, 6), bool)
    mask[1, 4:] = False
    p = ss.permutation_matrix(s, method, mask=mask).numpy()
    log_p = ss.permutation_matrix(s, method, mask=mask, log=True).numpy()
    np.testing.assert_allclose(np.exp(log_p), p, atol=1e-6)
    assert np.all(np.isneginf(log_p[1, 4:, :])) and np.all(np.isneginf(log_p[1, :, 4:]))
    assert np.all(np.isfinite(log_p[0]))
    xla = tf.function(lambda v: ss.permutation_matrix(v, method, log=True), jit_compile=True,
                      input_signature=[tf.TensorSpec([None, None])])
    np.testing.assert_allclose(xla(s).numpy(), ss.permutation_matrix(s, method, log=True),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="`log=True`"):
        ss.permutation_matrix(s, method, hard=True, log=True)


def test_log_matrix_is_refused_by_a_family_without_one():
    with pytest.raises(ValueError, match="no log-domain matrix"):
        ss.permutation_matrix([[1.0, 2.0]], "lapsum", log=True)


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

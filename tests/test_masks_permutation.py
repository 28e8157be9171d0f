"""The padding convention (`softsort_tf._masking`) on the permutation operators.

Property test: random lists (ties included) padded at random positions to a random
longer length with arbitrary padded values (NaN, ±inf, ±1e30, ...) give, on the valid
block, exactly the values and gradients of the operator on the unpadded list, the
documented fill (0) at padded rows/columns/positions, exactly zero gradient at padded
entries, and finite results everywhere. Also: ragged inputs, Keras masks, the loss
and the accuracies on padded orderings, and lists without any valid entry.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from keras_test_layers import Squeeze

import softsort_tf as ss
from softsort_tf.ops import hard_stats

PADDED_VALUES = [np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, 7.0, -1e-300]
TAU = 0.2  # small against the spacing 0.5 of the drawn values, but rows stay soft

# name: f(scores, mask=None) → P̂ [..., n, n]; whether it has a gradient.
MATRIX_OPERATORS = {
    "softsort": (lambda s, **kw: ss.soft_sort_matrix(s, tau=TAU, **kw), True),
    "softsort_p2": (lambda s, **kw: ss.soft_sort_matrix(s, tau=TAU, distance_power=2.0, **kw),
                    True),
    "softsort_p05_ascending": (lambda s, **kw: ss.soft_sort_matrix(
        s, tau=TAU, distance_power=0.5, direction="ASCENDING", **kw), True),
    "softsort_hard": (lambda s, **kw: ss.soft_sort_matrix(s, tau=TAU, hard=True, **kw), True),
    "neuralsort": (lambda s, **kw: ss.neural_sort_matrix(s, tau=TAU, **kw), True),
    "neuralsort_hard_ascending": (lambda s, **kw: ss.neural_sort_matrix(
        s, tau=TAU, hard=True, direction="ASCENDING", **kw), True),
    "registry_neuralsort": (lambda s, **kw: ss.permutation_matrix(s, "neuralsort", tau=TAU,
                                                                  **kw), True),
    "hard": (lambda s, **kw: ss.hard_permutation_matrix(s, **kw), False),
}


@st.composite
def padded_batches(draw, min_valid=1):
    """Two lists of `min_valid`..6 valid entries (halves in [−2, 2]: many ties), padded
    at random positions to one random longer length with arbitrary padded values, and
    a seed for the random linear functionals."""
    n_valid = [draw(st.integers(min_valid, 6)) for _ in range(2)]
    n = max(max(n_valid), 1) + draw(st.integers(0, 3))
    values = np.zeros([2, n])
    mask = np.zeros([2, n], bool)
    for r, nv in enumerate(n_valid):
        mask[r, draw(st.permutations(range(n)))[:nv]] = True
        for i in range(n):
            values[r, i] = (draw(st.integers(-4, 4)) / 2.0 if mask[r, i]
                            else draw(st.sampled_from(PADDED_VALUES)))
    return values, mask, draw(st.integers(0, 2**31 - 1))


def _matrix_and_gradient(fn, x, mask, weights, has_gradient):
    """P̂ of `fn`, and the gradient w.r.t. x of Σ weights ⊙ P̂ (None without gradient)."""
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        perm = fn(x) if mask is None else fn(x, mask=mask)
        total = tf.reduce_sum(tf.constant(weights) * perm)
    grad = tape.gradient(total, x) if has_gradient else None
    return perm.numpy(), None if grad is None else grad.numpy()


def _embed(block, mask_row):
    """An `[nv, nv]` block of the unpadded list as the `[n, n]` matrix of the padded
    one: rows = the first nv sorted positions, columns = the valid entries."""
    n = mask_row.size
    out = np.zeros([n, n])
    out[np.ix_(np.arange(block.shape[0]), np.flatnonzero(mask_row))] = block
    return out


@pytest.mark.parametrize("name", sorted(MATRIX_OPERATORS))
@settings(max_examples=20, deadline=None)
@given(batch=padded_batches())
def test_padded_matrix_equals_unpadded_matrix(name, batch):
    fn, has_gradient = MATRIX_OPERATORS[name]
    x, mask, seed = batch
    rng = np.random.RandomState(seed)
    n = x.shape[1]
    weights = rng.randn(2, n, n)
    perm, grad = _matrix_and_gradient(fn, x, mask, weights, has_gradient)
    assert np.all(np.isfinite(perm))
    for r in range(2):
        valid = mask[r]
        nv = valid.sum()
        block_weights = weights[r][:nv][:, valid]
        ref, ref_grad = _matrix_and_gradient(fn, x[r, valid][None], None, block_weights[None],
                                             has_gradient)
        # Valid block = the unpadded matrix; padded rows and columns exactly 0.
        np.testing.assert_allclose(perm[r], _embed(ref[0], valid), rtol=1e-12, atol=1e-14)
        assert np.all(perm[r][nv:] == 0) and np.all(perm[r][:, ~valid] == 0)
        if has_gradient:
            assert np.all(np.isfinite(grad[r]))
            np.testing.assert_allclose(grad[r][valid], ref_grad[0], rtol=1e-9, atol=1e-11)
            assert np.all(grad[r][~valid] == 0)


READOUTS = {
    # name: f(scores, values, mask) → [..., n]; kind of output.
    "permute_values_softsort": (lambda s, v, mask: ss.permute_values(
        ss.soft_sort_matrix(s, tau=TAU, mask=mask), v, mask=mask), "sorted"),
    "permute_values_neuralsort": (lambda s, v, mask: ss.permute_values(
        ss.neural_sort_matrix(s, tau=TAU, mask=mask), v, mask=mask), "sorted"),
    "ranks_softsort": (lambda s, v, mask: ss.ranks_from_permutation(
        ss.soft_sort_matrix(s, tau=TAU, mask=mask)), "elementwise"),
    "ranks_neuralsort_zero_based": (lambda s, v, mask: ss.ranks_from_permutation(
        ss.neural_sort_matrix(s, tau=TAU, mask=mask), zero_based=True, mask=mask),
        "elementwise"),
    "layer_softsort_sorted": (lambda s, v, mask: ss.SoftSort(
        tau=TAU, output_mode="sorted", dtype="float64")([s, v], mask=mask), "sorted"),
    "layer_neuralsort_ranks": (lambda s, v, mask: ss.NeuralSort(
        tau=TAU, output_mode="ranks", dtype="float64")(s, mask=mask), "elementwise"),
}


def _readout_and_gradients(fn, x, values, mask, weights):
    x, values = tf.constant(x), tf.constant(values)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, values])
        out = fn(x, values, mask)
        total = tf.reduce_sum(tf.constant(weights) * out)
    grads = [tape.gradient(total, t) for t in (x, values)]
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


@settings(max_examples=20, deadline=None)
@given(batch=padded_batches())
def test_padded_rankdata_equals_unpadded_rankdata(batch):
    x, mask, _ = batch
    ranks = ss.rankdata(x, mask=mask).numpy()
    for r in range(2):
        np.testing.assert_array_equal(ranks[r, mask[r]], ss.rankdata(x[r, mask[r]]).numpy())
        assert np.all(ranks[r, ~mask[r]] == 0)


@settings(max_examples=15, deadline=None)
@given(batch=padded_batches(), quantile=st.sampled_from([0.1, 0.5, 0.75]))
def test_padded_hard_quantile_and_interval_mean(batch, quantile):
    x, mask, _ = batch
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        q = hard_stats.weighted_quantile(xt, quantile, mask=mask)
        m = hard_stats.interval_mean(xt, 0.2, 0.8, mask=mask)
        total = tf.reduce_sum(q + m)
    grad = tape.gradient(total, xt).numpy()
    for r in range(2):
        v = x[r, mask[r]]
        np.testing.assert_allclose(q[r], hard_stats.weighted_quantile(v, quantile), rtol=1e-12)
        np.testing.assert_allclose(m[r], hard_stats.interval_mean(v, 0.2, 0.8), rtol=1e-12)
        assert np.all(grad[r, ~mask[r]] == 0) and np.all(np.isfinite(grad[r]))


@pytest.mark.parametrize("method", ["softsort", "neuralsort"])
@settings(max_examples=15, deadline=None)
@given(batch=padded_batches())
def test_stochastic_matrix_is_the_masked_matrix_of_the_perturbed_valid_scores(method, batch):
    # The noise depends on the padded shape (documented): the valid block of each
    # sample is the deterministic matrix of the perturbed valid scores.
    x, mask, seed = batch
    samples = 3
    perturbed = ss.gumbel_perturb(x, samples, seed, mask=mask).numpy()
    perm = ss.stochastic_permutation_matrix(x, samples, seed, method, tau=TAU,
                                            mask=mask).numpy()
    assert np.all(np.isfinite(perm)) and np.all(perturbed[:, :, ~mask[0]][0] == 0)
    for r in range(2):
        valid = mask[r]
        for k in range(samples):
            ref = ss.permutation_matrix(perturbed[r, k, valid][None], method, tau=TAU).numpy()
            np.testing.assert_allclose(perm[r, k], _embed(ref[0], valid), rtol=1e-12,
                                       atol=1e-14)


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
        perm = ss.neural_sort_matrix(xt, tau=TAU, mask=mask)
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
            ref_perm = ss.neural_sort_matrix(v, tau=TAU)
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
    perm, grad = _matrix_and_gradient(fn, x, mask, np.ones([2, 3, 3]), has_gradient)
    assert np.all(perm[0] == 0) and np.all(np.isfinite(perm))
    if has_gradient:
        assert np.all(grad[0] == 0) and np.all(np.isfinite(grad))
    y = np.array([[-1, -1, -1], [0, 2, -1] if "ascending" in name else [2, 0, -1]])
    assert ss.permutation_cross_entropy(y, perm).numpy()[0] == 0.0
    assert ss.exact_permutation_accuracy(y, perm).numpy().tolist() == [0.0, 1.0]
    assert ss.rankdata(x, mask=mask).numpy()[0].tolist() == [0.0, 0.0, 0.0]


def test_mask_of_rank_one_and_zero_one_values_broadcast():
    x = np.array([[3.0, np.nan, 1.0], [0.0, 5.0, 2.0]], np.float32)
    by_bool = ss.soft_sort_matrix(x, mask=np.array([[True, False, True]] * 2))
    np.testing.assert_array_equal(ss.soft_sort_matrix(x, mask=[1, 0, 1]).numpy(),
                                  by_bool.numpy())
    with pytest.raises(ValueError, match="mask"):
        ss.soft_sort_matrix(x, mask=[True, False])


@pytest.mark.parametrize("method", ["softsort", "neuralsort", "sinkhorn"])
def test_ragged_scores_give_ragged_matrices_of_each_list(method):
    lists = [[3.0, 1.0, 2.0, 0.5], [5.0], [0.0, -1.0]]
    kw = dict(epsilon=1e-3) if method == "sinkhorn" else dict(tau=0.3)
    out = ss.permutation_matrix(tf.ragged.constant(lists), method, **kw)
    assert isinstance(out, tf.RaggedTensor)
    assert out.shape.rank == 3
    for row, values in zip(out.to_list(), lists, strict=True):
        ref = ss.permutation_matrix([values], method, **kw).numpy()[0]
        np.testing.assert_allclose(np.array(row), ref, atol=1e-5)
    hard = ss.permutation_matrix(tf.ragged.constant(lists), method, hard=True, **kw)
    np.testing.assert_array_equal(hard.to_list()[0],
                                  ss.hard_permutation_matrix([lists[0]]).numpy()[0])
    stochastic = ss.stochastic_permutation_matrix(tf.ragged.constant(lists), 2, 0, method, **kw)
    assert [len(s[0]) for s in stochastic.to_list()] == [4, 1, 2]


def test_ragged_readouts_and_rankdata():
    lists = [[3.0, 1.0, 2.0], [5.0], [0.0, -1.0]]
    r = tf.ragged.constant(lists)
    perm = ss.soft_sort_matrix(r, tau=0.01)
    assert ss.permute_values(perm, r).to_list() == [[3.0, 2.0, 1.0], [5.0], [0.0, -1.0]]
    assert ss.ranks_from_permutation(perm).to_list() == [[1.0, 3.0, 2.0], [1.0], [1.0, 2.0]]
    assert ss.rankdata(r).to_list() == [[3.0, 1.0, 2.0], [1.0], [2.0, 1.0]]


@pytest.mark.parametrize("mode", ["matrix", "sorted", "ranks"])
@pytest.mark.parametrize("num_samples", [None, 2])
def test_layers_on_ragged_lists(mode, num_samples):
    lists = [[3.0, 1.0, 2.0], [5.0], [0.0, -1.0]]
    layer = ss.NeuralSort(tau=0.01, output_mode=mode, stochastic=num_samples is not None,
                          num_samples=num_samples)
    out = layer(tf.ragged.constant(lists))
    assert isinstance(out, tf.RaggedTensor)
    for row, values in zip(out.to_list(), lists, strict=True):
        ref = layer(np.array([values], np.float32)).numpy()[0]
        np.testing.assert_allclose(np.array(row), ref, atol=1e-6)


@pytest.mark.parametrize("mode", ["matrix", "sorted", "ranks"])
def test_layer_mask_argument_and_compute_mask(mode):
    x = np.array([[3.0, np.nan, 1.0, 2.0]], np.float32)
    mask = np.array([[True, False, True, True]])
    layer = ss.SoftSort(tau=0.01, output_mode=mode)
    out = layer(x, mask=mask).numpy()
    ref = layer(x[:, mask[0]]).numpy()
    assert np.all(np.isfinite(out))
    if mode == "matrix":
        np.testing.assert_allclose(out[0], _embed(ref[0], mask[0]), atol=1e-7)
        assert layer.compute_mask(x, mask) is None
    elif mode == "sorted":
        np.testing.assert_allclose(out[0], np.append(ref[0], 0.0), atol=1e-6)
        assert np.asarray(layer.compute_mask(x, mask)).tolist() == [[True, True, True, False]]
    else:
        np.testing.assert_allclose(out[0][mask[0]], ref[0], atol=1e-6)
        assert out[0][1] == 0
        assert np.asarray(layer.compute_mask(x, mask)).tolist() == mask.tolist()
    stochastic = ss.SoftSort(tau=0.01, output_mode=mode, stochastic=True, num_samples=3)
    if mode != "matrix":
        assert np.asarray(stochastic.compute_mask(x, mask)).shape == (1, 3, 4)


@pytest.mark.parametrize("mode", ["sorted", "ranks", "matrix"])
def test_keras_mask_from_embedding_is_honoured(mode):
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(10, 3, mask_zero=True)(tokens)
    scores = Squeeze()(keras.layers.Dense(1)(embedded))
    model = keras.Model(tokens, ss.SoftSort(tau=0.05, output_mode=mode)(scores))
    score_model = keras.Model(tokens, scores)
    ids = np.array([[3, 0, 5, 7, 0], [1, 2, 0, 0, 0]], np.int32)  # 0 = padding
    out = model.predict(ids, verbose=0)
    s = score_model.predict(ids, verbose=0)
    for r in range(2):
        valid = ids[r] > 0
        ref = ss.SoftSort(tau=0.05, output_mode=mode)(s[r, valid][None]).numpy()[0]
        if mode == "matrix":
            np.testing.assert_allclose(out[r], _embed(ref, valid), atol=1e-6)
        elif mode == "sorted":
            np.testing.assert_allclose(out[r][:valid.sum()], ref, atol=1e-6)
            assert np.all(out[r][valid.sum():] == 0)
        else:
            np.testing.assert_allclose(out[r][valid], ref, atol=1e-5)
            assert np.all(out[r][~valid] == 0)


@pytest.mark.filterwarnings("ignore::softsort_tf.SinkhornConvergenceWarning")
@pytest.mark.parametrize("hard", [False, True])
@settings(max_examples=10, deadline=None)
@given(batch=padded_batches())
def test_registry_sinkhorn_matrix_and_straight_through_on_padded_lists(hard, batch):
    # The Sinkhorn plan itself is tested with its operators; here the registry's
    # straight-through wrapper and mask plumbing: up to the solver's threshold.
    x, mask, seed = batch
    weights = np.random.RandomState(seed).randn(2, x.shape[1], x.shape[1])
    fn = lambda s, **kw: ss.permutation_matrix(  # noqa: E731
        s, "sinkhorn", hard=hard, epsilon=1e-2, threshold=1e-9, max_iterations=5000, **kw)
    perm, grad = _matrix_and_gradient(fn, x, mask, weights, True)
    assert np.all(np.isfinite(perm)) and np.all(np.isfinite(grad))
    for r in range(2):
        valid = mask[r]
        nv = valid.sum()
        ref, ref_grad = _matrix_and_gradient(fn, x[r, valid][None], None,
                                             weights[r][:nv][:, valid][None], True)
        np.testing.assert_allclose(perm[r], _embed(ref[0], valid), atol=1e-6)
        np.testing.assert_allclose(grad[r][valid], ref_grad[0], rtol=1e-4, atol=1e-5)
        assert np.all(grad[r][~valid] == 0)


def test_sinkhorn_layer_takes_the_mask():
    x = np.array([[3.0, np.nan, 1.0, 2.0]], np.float32)
    mask = np.array([[True, False, True, True]])
    layer = ss.SinkhornPermutation(epsilon=1e-3, output_mode="ranks")
    out = layer(x, mask=mask).numpy()[0]
    np.testing.assert_allclose(out, [1.0, 0.0, 3.0, 2.0], atol=1e-3)


def test_keras_mask_without_the_list_axis_masks_whole_lists():
    # `Masking` on `[batch, n]` scores masks per example (its feature axis is n): the
    # mask `[batch]` is broadcast along the list.
    x = np.array([[3.0, 0.0, 1.0], [0.0, 0.0, 0.0]], np.float32)
    inputs = keras.Input((None,))
    layer = ss.SoftSort(tau=0.01, output_mode="ranks")
    model = keras.Model(inputs, layer(keras.layers.Masking(0.0)(inputs)))
    np.testing.assert_allclose(model.predict(x, verbose=0), [[1.0, 3.0, 2.0], [0.0] * 3],
                               atol=1e-6)
    assert np.asarray(layer.compute_mask(x, np.array([True, False]))).tolist() == [
        [True] * 3, [False] * 3]

"""Tests of `softsort_tf.ops.sinkhorn` on padded and ragged lists (the padding
convention of `softsort_tf._masking`).

Property test: random lists (ties included) padded at random positions to a random
longer length with arbitrary padded values (NaN, ±inf, ±1e30, ...) give, on the valid
entries, the values and gradients of the operator on the unpadded list (up to the
solver's threshold), the documented fill at padded positions, exactly zero gradient
at padded entries, and finite results everywhere. The layers' masks are tested in
`tests/layers/test_sinkhorn.py`."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import softsort_tf as ss

# Rows with ties converge slowly at a threshold this tight; a row that stops at
# `max_iterations` is as (un)converged padded as unpadded (the tolerances allow it).
pytestmark = pytest.mark.filterwarnings("ignore::softsort_tf.SinkhornConvergenceWarning")


# Small temperature, tight threshold, float64. (Padded entries and surplus bins are
# decoupled from the valid ones, so a padded list follows the iterations of the
# unpadded one: rows with ties that stop at `max_iterations` agree as well.)
TIGHT = dict(epsilon=1e-2, threshold=1e-8, max_iterations=500)


PADDED_VALUES = [np.nan, np.inf, -np.inf, 1e30, -1e30, 0.0, 7.0, -1e-300]


K = 2


def _topk_sort(x, **kw):
    return ss.sinkhorn_sort(x, topk=K, direction="DESCENDING", **kw)


def _full_sort_desc(x, **kw):
    return ss.sinkhorn_sort(x, direction="DESCENDING", **kw)


# name: (operator, kind of output, reference for lists of at most K valid entries)
OPERATORS = {
    "rank": (lambda x, **kw: ss.sinkhorn_rank(x, direction="DESCENDING", **kw),
             "elementwise", None),
    "rank_zero_based": (lambda x, **kw: ss.sinkhorn_rank(x, zero_based=True, **kw),
                        "elementwise", None),
    "cdf": (lambda x, **kw: ss.sinkhorn_cdf(x, **kw), "elementwise", None),
    "cdf_num_targets": (lambda x, **kw: ss.sinkhorn_cdf(x, num_targets=7, **kw),
                        "elementwise", None),
    "sort": (lambda x, **kw: ss.sinkhorn_sort(x, **kw), "sorted", None),
    "sort_num_targets": (lambda x, **kw: ss.sinkhorn_sort(x, num_targets=3, **kw),
                         "per_list", None),
    "sort_topk": (_topk_sort, "topk", _full_sort_desc),
    "quantile": (lambda x, **kw: ss.sinkhorn_quantile(x, [0.25, 0.5, 0.9], **kw),
                 "per_list", None),
    "quantile_scalar": (lambda x, **kw: ss.sinkhorn_quantile(x, 0.5, **kw), "per_list", None),
    "quantile_normalization": (
        lambda x, **kw: ss.sinkhorn_quantile_normalization(x, [-1.0, 0.5, 2.0], **kw),
        "elementwise", None),
    "topk_mask": (lambda x, **kw: ss.sinkhorn_topk(x, K, **kw), "topk_mask", None),
    "permutation_matrix": (lambda x, **kw: ss.sinkhorn_permutation_matrix(x, **kw),
                           "matrix", None),
}


@st.composite
def padded_batches(draw):
    """Two lists of 1..6 valid entries (small integers and halves: many ties), padded at
    random positions to one random longer length with arbitrary padded values."""
    n_valid = [draw(st.integers(1, 6)) for _ in range(2)]
    n = max(n_valid) + draw(st.integers(0, 3))
    values = np.zeros([2, n])
    mask = np.zeros([2, n], bool)
    for r, nv in enumerate(n_valid):
        positions = draw(st.permutations(range(n)))[:nv]
        mask[r, positions] = True
        for i in range(n):
            if mask[r, i]:
                values[r, i] = draw(st.integers(-4, 4)) / 2.0
            else:
                values[r, i] = draw(st.sampled_from(PADDED_VALUES))
    return values, mask, draw(st.integers(0, 2**31 - 1))


def _split(kind, out, mask_row, n_valid):
    """(index of the valid part, fill part) of one row's output."""
    valid_idx = np.flatnonzero(mask_row)
    if kind in ("elementwise", "topk_mask"):
        index = valid_idx
    elif kind == "sorted":
        index = slice(0, n_valid)
    elif kind == "topk":
        index = slice(0, min(K, n_valid))
    elif kind == "per_list":
        index = Ellipsis
    else:  # matrix
        index = np.ix_(np.arange(n_valid), valid_idx)
    rest = np.array(out, copy=True)
    rest[index] = 0.0
    return index, rest


def _check_operator(name, targets, batch):
    op, kind, short_reference = OPERATORS[name]
    values, mask, seed = batch
    rng = np.random.RandomState(seed)
    kw = dict(TIGHT, targets=targets)
    n_valid = mask.sum(axis=1)
    # The unpadded lists: values and gradients of a random linear functional Σ W ⊙ out.
    references = []
    for r in range(2):
        nv = int(n_valid[r])
        reference = op
        if kind in ("topk", "topk_mask") and nv <= K:
            reference = short_reference
        if reference is None:  # top-k mask of a list of at most K entries: all selected
            references.append((np.ones(nv), None, np.zeros(nv)))
            continue
        xv = tf.constant(values[r][mask[r]][None, :])
        with tf.GradientTape() as tape:
            tape.watch(xv)
            out_r = reference(xv, **kw)[0]
            w_r = rng.randn(*out_r.shape)
            loss = tf.reduce_sum(out_r * w_r)
        references.append((out_r.numpy(), w_r, tape.gradient(loss, xv).numpy()[0]))
    # The padded lists: the same functional on the valid outputs, random weights on the
    # padded outputs (which must pass no gradient).
    x = tf.constant(values)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = op(x, mask=mask, **kw)
        weights = rng.randn(*out.shape)
        for r in range(2):
            if references[r][1] is not None:
                if kind == "per_list":  # (a scalar per row for a scalar quantile)
                    weights[r] = references[r][1]
                else:
                    index, _ = _split(kind, out[r].numpy(), mask[r], int(n_valid[r]))
                    weights[r][index] = references[r][1]
        loss = tf.reduce_sum(out * weights)
    grad = tape.gradient(loss, x).numpy()
    out = out.numpy()
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(grad))
    assert np.all(grad[~mask] == 0.0), "padded entries must get exactly zero gradient"
    for r in range(2):
        expected, _, expected_grad = references[r]
        index, fill = _split(kind, out[r], mask[r], int(n_valid[r]))
        np.testing.assert_allclose(out[r][index], np.reshape(expected, out[r][index].shape),
                                   atol=2e-6, rtol=1e-6, err_msg=f"{name} values, row {r}")
        assert np.all(fill == 0.0), f"{name}: padded outputs must be 0"
        np.testing.assert_allclose(grad[r][mask[r]], expected_grad, atol=2e-5, rtol=1e-5,
                                   err_msg=f"{name} gradients, row {r}")


PROPERTY = settings(max_examples=8, deadline=None, derandomize=True)


@pytest.mark.parametrize("name", sorted(OPERATORS))
@PROPERTY
@given(batch=padded_batches(), targets=st.sampled_from(["centres", "regular"]))
def test_padded_equals_unpadded(name, batch, targets):
    """Both target grids: on the regular grid a padded list's targets are those of its
    n_valid entries, y_j = (j − 1)/(n_valid − 1)."""
    _check_operator(name, targets, batch)


_UNPADDED = {}


def _unpadded(name, row):
    """The operator `name` (TIGHT) on the single list `row`, as numpy: the reference of
    the valid lists below, computed once per (operator, list) and shared by the tests of
    all-padding rows and of ragged lists (the same eager call on the same list)."""
    op, kind, short = OPERATORS[name]
    key = (name, tuple(row))
    if key not in _UNPADDED:
        reference = short if (kind in ("topk", "topk_mask") and len(row) <= K) else op
        _UNPADDED[key] = (np.ones(len(row)) if reference is None
                          else reference(np.array([row]), **TIGHT).numpy()[0])
    return _UNPADDED[key]


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_all_padding_row_is_zero_finite_and_has_zero_gradient(name):
    op, kind, _ = OPERATORS[name]
    values = np.array([[np.nan, np.inf, 1.0, 2.0], [0.3, -1.0, 2.0, 1.0]])
    mask = np.array([[False] * 4, [True] * 4])
    x = tf.constant(values)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = op(x, mask=mask, **TIGHT)
        loss = tf.reduce_sum(out * out)
    grad = tape.gradient(loss, x).numpy()
    out = out.numpy()
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(grad))
    assert np.all(out[0] == 0.0)
    assert np.all(grad[0] == 0.0)
    np.testing.assert_allclose(out[1], _unpadded(name, values[1]), atol=1e-6)


def test_mask_broadcasts_from_n_and_accepts_0_1_and_other_axes():
    x = np.random.RandomState(1).randn(3, 5, 2)
    mask = np.array([1, 0, 1, 1, 0])
    full = ss.sinkhorn_rank(x, axis=1, mask=np.broadcast_to(mask[None, :, None] > 0, x.shape),
                            **TIGHT)
    np.testing.assert_array_equal(ss.sinkhorn_rank(x, axis=1, mask=mask, **TIGHT).numpy(),
                                  full.numpy())
    expected = ss.sinkhorn_rank(x[:, mask > 0], axis=1, **TIGHT).numpy()
    np.testing.assert_allclose(full.numpy()[:, mask > 0], expected, atol=1e-6)
    with pytest.raises(ValueError, match="`mask`"):
        ss.sinkhorn_rank(x, axis=1, mask=np.ones(4))


def test_weights_and_mask_combine():
    """The mask is applied on top of weights: a padded entry's weight is ignored."""
    x = np.array([[0.3, 5.0, -1.0, 2.0]])
    w = np.array([[1.0, 9.0, 3.0, 1.0]])
    mask = np.array([[True, False, True, True]])
    got = ss.sinkhorn_cdf(x, weights=w, mask=mask, **TIGHT).numpy()
    expected = ss.sinkhorn_cdf(x[:, [0, 2, 3]], weights=w[:, [0, 2, 3]], num_targets=20,
                               **TIGHT).numpy()
    got20 = ss.sinkhorn_cdf(x, weights=w, mask=mask, num_targets=20, **TIGHT).numpy()
    np.testing.assert_allclose(got20[:, [0, 2, 3]], expected, atol=1e-6)
    assert got[0, 1] == 0.0 and got20[0, 1] == 0.0


def test_explicit_num_targets_with_mask_is_the_target_of_the_valid_entries():
    """Ranks with an explicit grid are n_valid · CDF on that grid."""
    x = np.array([[0.3, np.nan, -1.0, 2.0, 1.0]])
    mask = np.array([[True, False, True, True, True]])
    got = ss.sinkhorn_rank(x, mask=mask, num_targets=8, **TIGHT).numpy()
    expected = ss.sinkhorn_rank(x[:, mask[0]], num_targets=8, **TIGHT).numpy()
    np.testing.assert_allclose(got[:, mask[0]], expected, atol=1e-6)
    np.testing.assert_allclose(np.sort(got[0, mask[0]]), [1, 2, 3, 4], atol=0.02)


def test_topk_longer_than_some_lists():
    x = np.array([[3.0, 1.0, np.nan, 2.0], [0.5, 4.0, -1.0, 2.5]])
    mask = np.array([[True, True, False, False], [True] * 4])
    hard = dict(epsilon=1e-4, threshold=1e-8, max_iterations=20_000)
    s = ss.sinkhorn_sort(x, topk=3, direction="DESCENDING", mask=mask, **hard).numpy()
    np.testing.assert_allclose(s, [[3.0, 1.0, 0.0], [4.0, 2.5, 0.5]], atol=1e-3)
    m = ss.sinkhorn_topk(x, 3, mask=mask, **hard).numpy()
    np.testing.assert_allclose(m, [[1, 1, 0, 0], [1, 1, 0, 1]], atol=1e-3)
    assert m[0, 0] == 1.0 and m[0, 1] == 1.0  # exactly: every valid entry is selected


def test_padding_trick_of_huge_scores_no_longer_needed():
    """The issue's symptom: −1e9 padding scores squash the valid ones together through
    the logistic squash; with `mask=` the valid ranks are those of the valid list."""
    x = np.array([[0.1, 0.3, 0.2, -1e9, -1e9]], np.float32)
    mask = x > -1e8
    r = ss.sinkhorn_rank(x, mask=mask, direction="DESCENDING", epsilon=1e-3).numpy()
    np.testing.assert_allclose(r, [[3, 1, 2, 0, 0]], atol=0.02)


# The first list is the valid row of test_all_padding_row_is_zero_finite_and_has_zero_gradient
# (its reference is computed once for both tests).
RAGGED = tf.ragged.constant([[0.3, -1.0, 2.0, 1.0], [5.0], [1.0, 4.0, -2.0, 0.5, 3.0]],
                            dtype=tf.float64)


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_ragged_input_gives_ragged_output_of_the_lists(name):
    op, kind, _ = OPERATORS[name]
    out = op(RAGGED, **TIGHT)
    for r, row in enumerate(RAGGED.to_list()):
        expected = _unpadded(name, row)
        if kind == "topk":
            expected = expected[:min(K, len(row))]
        got = out[r]
        if isinstance(got, tf.RaggedTensor):
            got = got.to_tensor()
        np.testing.assert_allclose(np.asarray(got), expected, atol=1e-6, err_msg=name)
    if kind in ("elementwise", "sorted", "topk_mask"):
        assert isinstance(out, tf.RaggedTensor)
        np.testing.assert_array_equal(out.row_lengths().numpy(), [4, 1, 5])
    if kind == "matrix":
        assert isinstance(out, tf.RaggedTensor) and out.ragged_rank == 2


def test_ragged_nested_and_ragged_mask():
    x = tf.ragged.constant([[[1.0, 3.0, 2.0], [4.0]], [[0.5, -0.5]]], dtype=tf.float64)
    mask = tf.ragged.constant([[[True, False, True], [True]], [[True, True]]])
    r = ss.sinkhorn_rank(x, mask=mask, **TIGHT)
    assert r.shape.rank == 3
    np.testing.assert_allclose(r.flat_values.numpy(), [1, 0, 2, 1, 2, 1], atol=1e-4)
    q = ss.sinkhorn_quantile(x, 0.5, **TIGHT)
    assert isinstance(q, tf.RaggedTensor)
    np.testing.assert_array_equal(q.row_lengths().numpy(), [2, 1])
    with pytest.raises(ValueError, match="axis"):
        ss.sinkhorn_rank(x, axis=1)


def test_ragged_gradients_reach_the_flat_values():
    x = tf.ragged.constant([[0.3, -1.0, 2.0], [5.0, 1.0]], dtype=tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(x.flat_values)
        y = ss.sinkhorn_sort(x, **TIGHT)
        loss = tf.reduce_sum(y.flat_values * tf.range(5, dtype=tf.float64))
    g = tf.convert_to_tensor(tape.gradient(loss, x.flat_values))
    assert np.all(np.isfinite(g.numpy())) and np.any(g.numpy() != 0)


@pytest.mark.parametrize("name", ["rank", "cdf", "sort", "quantile", "topk_mask"])
def test_float32_padded_equals_unpadded_to_rounding(name):
    """float32 at the default threshold: NaN padding, values and gradients within
    float32 rounding of the unpadded lists (measured ≤ 5e-7 and ≤ 4e-5)."""
    op, kind, _ = OPERATORS[name]
    rng = np.random.RandomState(0)
    x = rng.randn(3, 7).astype(np.float32)
    mask = rng.rand(3, 7) < 0.6
    mask[:, :3] = True
    xt = tf.constant(np.where(mask, x, np.float32(np.nan)))
    with tf.GradientTape() as tape:
        tape.watch(xt)
        out = op(xt, mask=mask)
        loss = tf.reduce_sum(tf.sin(out))
    grad = tape.gradient(loss, xt).numpy()
    assert np.all(grad[~mask] == 0.0) and np.all(np.isfinite(grad))
    for r in range(3):
        xv = tf.constant(x[r][mask[r]][None])
        with tf.GradientTape() as tape:
            tape.watch(xv)
            expected = op(xv)
            loss = tf.reduce_sum(tf.sin(expected))
        index, _ = _split(kind, out[r].numpy(), mask[r], int(mask[r].sum()))
        np.testing.assert_allclose(out[r].numpy()[index], expected.numpy()[0], atol=2e-6)
        np.testing.assert_allclose(grad[r][mask[r]], tape.gradient(loss, xv).numpy()[0],
                                   atol=2e-4, rtol=1e-3)

"""Tests of `softsort_tf.ops.soft`, the front door `soft_rank` / `soft_sort` /
`soft_topk` / `soft_quantile` and its table of methods: hard limits, axes, masks and
ragged lists, gradients and XLA, errors."""

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
from scipy import stats

import softsort_tf as ss
from softsort_tf.ops.sinkhorn import sinkhorn_rank
from softsort_tf.ops.soft import soft_rank

# A temperature at which every family is within 1e-3 of the hard operation on the data
# below (standard normal values, n = 7: neighbours at least 0.02 apart).
SHARP = {"sinkhorn": 1e-5, "lapsum": 1e-4, "permutahedron": 1e-4, "softsort": 1e-4,
         "neuralsort": 1e-4, "sorting_network": 1e12}  # the steepness sharpens as it grows


MASKABLE = [m for m in ss.FAMILIES if m != "permutahedron"]


def _data(shape=(3, 7), seed=0):
    rng = np.random.default_rng(seed)
    while True:
        x = rng.normal(size=shape)
        gaps = np.diff(np.sort(x, axis=-1), axis=-1)
        if gaps.min() > 0.02:
            return x.astype(np.float32)


def _hard_topk(x, k, direction):
    order = np.argsort(-x if direction == "DESCENDING" else x, axis=-1, kind="stable")
    out = np.zeros_like(x)
    np.put_along_axis(out, order[..., :k], 1.0, axis=-1)
    return out


def test_table_names_each_temperature_argument_of_its_operations():
    import inspect
    for name, family in ss.FAMILIES.items():
        assert family.name == name and family.default_temperature > 0 and family.meaning
        assert set(family.operations) <= {"rank", "sort", "topk", "quantile"}
        operator = {"sinkhorn": ss.sinkhorn_rank, "lapsum": ss.lapsum_rank,
                    "permutahedron": ss.permutahedron_rank,
                    "softsort": ss.softsort_permutation_matrix,
                    "neuralsort": ss.neuralsort_permutation_matrix,
                    "sorting_network": ss.sorting_network_permutation_matrix}[name]
        names = set(inspect.signature(operator).parameters)
        if name == "sinkhorn":
            names |= set(ss.SinkhornOptions.field_names())
        assert family.temperature in names


@pytest.mark.parametrize("direction", ["ASCENDING", "DESCENDING"])
@pytest.mark.parametrize("method", sorted(ss.FAMILIES))
def test_every_method_reaches_the_hard_operations(method, direction):
    x = _data()
    t = SHARP[method]
    ranks = scipy.stats.rankdata(-x if direction == "DESCENDING" else x, axis=-1)
    got = ss.soft_rank(x, method, direction, temperature=t).numpy()
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ranks, atol=1e-3)
    sort = np.sort(x, axis=-1)
    sort = sort[..., ::-1] if direction == "DESCENDING" else sort
    np.testing.assert_allclose(ss.soft_sort(x, method, direction, temperature=t).numpy(), sort,
                               atol=1e-3)
    family = ss.FAMILIES[method]
    if "topk" in family.operations:
        np.testing.assert_allclose(ss.soft_topk(x, 3, method, direction, temperature=t).numpy(),
                                   _hard_topk(x, 3, direction), atol=1e-3)
    if "quantile" in family.operations:
        levels = [0.2, 0.5, 0.9]
        source = -x if direction == "DESCENDING" else x
        expected = np.quantile(source, levels, axis=-1, method="averaged_inverted_cdf").T
        expected = -expected if direction == "DESCENDING" else expected
        got = ss.soft_quantile(x, levels, method, direction, temperature=t).numpy()
        np.testing.assert_allclose(got, expected, atol=1e-3)


@pytest.mark.parametrize("method", sorted(ss.FAMILIES))
def test_any_axis_equals_the_last_axis(method):
    x = _data((3, 7, 2))
    moved = np.moveaxis(x, 1, -1)
    kw = dict(temperature=0.3)
    np.testing.assert_allclose(ss.soft_rank(x, method, axis=1, **kw).numpy(),
                               np.moveaxis(ss.soft_rank(moved, method, **kw).numpy(), -1, 1),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ss.soft_sort(x, method, axis=1, **kw).numpy(),
                               np.moveaxis(ss.soft_sort(moved, method, **kw).numpy(), -1, 1),
                               rtol=1e-5, atol=1e-5)
    if "quantile" in ss.FAMILIES[method].operations:
        got = ss.soft_quantile(x, [0.3, 0.6], method, axis=1, **kw).numpy()
        ref = ss.soft_quantile(moved, [0.3, 0.6], method, **kw).numpy()
        np.testing.assert_allclose(got, np.moveaxis(ref, -1, 1), rtol=1e-5, atol=1e-5)
        assert ss.soft_quantile(x, 0.5, method, axis=1, **kw).shape == (3, 2)


@pytest.mark.parametrize("method", MASKABLE)
def test_masks_and_ragged_lists_equal_the_unpadded_lists(method):
    x = _data((2, 7))
    mask = np.array([[True] * 7, [True] * 4 + [False] * 3])
    kw = dict(temperature=0.3)
    padded = np.where(mask, x, np.nan).astype(np.float32)
    ranks = ss.soft_rank(padded, method, mask=mask, **kw).numpy()
    assert np.all(np.isfinite(ranks))
    alone = ss.soft_rank(x[1:, :4], method, **kw).numpy()
    np.testing.assert_allclose(ranks[1, :4], alone[0], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ranks[1, 4:], 0.0)
    ragged = tf.ragged.constant([x[0].tolist(), x[1, :4].tolist()])
    out = ss.soft_rank(ragged, method, **kw)
    assert isinstance(out, tf.RaggedTensor)
    np.testing.assert_allclose(out[1].numpy(), alone[0], rtol=1e-5, atol=1e-4)
    if "topk" in ss.FAMILIES[method].operations:
        top = ss.soft_topk(padded, 2, method, mask=mask, **kw).numpy()
        np.testing.assert_allclose(top[1, 4:], 0.0)
        np.testing.assert_allclose(top[1, :4], ss.soft_topk(x[1:, :4], 2, method, **kw)[0],
                                   rtol=1e-5, atol=1e-4)


def test_gradients_are_finite_and_xla_equals_eager_for_unknown_n():
    """Every method's soft-rank gradient is finite and non-zero, and its soft sort traced
    for an unknown shape and compiled by XLA equals the eager one (all methods in one
    XLA program: one compilation)."""
    x = tf.constant(_data((2, 7)))
    for method in sorted(ss.FAMILIES):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(ss.soft_rank(x, method, temperature=0.5) * tf.range(7.0))
        grad = tape.gradient(loss, x).numpy()
        assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 0, method
    fn = tf.function(lambda v: {m: ss.soft_sort(v, m, temperature=0.5) for m in ss.FAMILIES},
                     input_signature=[tf.TensorSpec([None, None])], jit_compile=True)
    got = fn(x)
    for method in sorted(ss.FAMILIES):
        np.testing.assert_allclose(got[method].numpy(),
                                   ss.soft_sort(x, method, temperature=0.5).numpy(),
                                   rtol=1e-5, atol=1e-5, err_msg=method)


def test_bad_calls_name_the_argument():
    x = _data()
    with pytest.raises(ValueError, match="`method` must be one of"):
        ss.soft_rank(x, "bubble")
    with pytest.raises(ValueError, match="does not define a soft quantile"):
        ss.soft_quantile(x, 0.5, "softsort")
    with pytest.raises(ValueError, match="does not define a soft topk"):
        ss.soft_topk(x, 2, "permutahedron")
    with pytest.raises(ValueError, match="set the same argument"):
        ss.soft_rank(x, "lapsum", temperature=0.1, alpha=0.2)
    with pytest.raises(ValueError, match="`temperature`"):
        ss.soft_rank(x, "sinkhorn", temperature=-1.0)
    with pytest.raises(ValueError, match="`mask`"):
        ss.soft_rank(x, "permutahedron", mask=np.ones_like(x, bool))


# Sinkhorn runs to a tight marginal error so that padded and unpadded problems, which
# stop at different iterations, agree to far below the loss scale.
TIGHT = {"threshold": 1e-9, "max_iterations": 5000}


# Temperatures near the hard limit: small (1e-3 unless listed) or, for the steepness of
# 'sorting_network', large.
NEAR_HARD = {"sinkhorn": 1e-4, "sorting_network": 1e5}


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


@pytest.mark.parametrize("method", [m for m, f in ss.FAMILIES.items() if f.has_matrix])
def test_soft_ranks_hard_limit_are_descending_ranks_of_the_valid_entries(method):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 8))
    mask = np.arange(8)[None, :] < np.array([[8], [5], [1]])
    x[~mask] = np.nan  # padded values never matter
    temperature = NEAR_HARD.get(method, 1e-3)
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
# Input dtypes and ragged lists at the front door.
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fn", [lambda x: ss.soft_rank(x, "lapsum"),
                                lambda x: ss.soft_sort(x, "softsort"),
                                lambda x: ss.soft_topk(x, 1, "neuralsort")])
def test_front_door_rejects_complex_and_bool_inputs(fn):
    x = tf.constant([[0.3, 0.1, 0.2], [0.5, 0.4, 0.9]])
    for bad in (tf.complex(x, 1.0 + x), x > 0.25):
        with pytest.raises(ValueError, match=r"`x` must be a real tensor"):
            fn(bad)


@pytest.mark.parametrize("method,op", [(m, op) for m in MASKABLE
                                       for op in ("rank", "sort", "topk", "quantile")
                                       if op in ss.get_family(m).operations])
def test_front_door_takes_ragged_lists(method, op):
    rows = [[3.0, 1.0, 2.5, 0.5], [5.0, 4.0], [7.0]]
    call = {"rank": lambda v: ss.soft_rank(v, method, temperature=0.3),
            "sort": lambda v: ss.soft_sort(v, method, temperature=0.3),
            "topk": lambda v: ss.soft_topk(v, 1, method, temperature=0.3),
            "quantile": lambda v: ss.soft_quantile(v, 0.5, method, temperature=0.3)}[op]
    out = call(tf.ragged.constant(rows))
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

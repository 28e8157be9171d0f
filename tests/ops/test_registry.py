"""Tests of the relaxed-permutation side of the family table (`ss.FAMILIES`, the families
with `has_matrix`): `permutation_matrix` and `get_family`, the layers that share the table,
log matrices, and the Sinkhorn entry on padded lists."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from operator_cases import embed_block, matrix_and_gradient, padded_batches

import softsort_tf as ss

MATRIX_FAMILIES = {name: family for name, family in ss.FAMILIES.items() if family.has_matrix}

def test_permutation_table_drives_permutation_matrix():
    scores = tf.constant([[0.2, 1.5, -0.3, 0.9]])
    names = {"softsort", "neuralsort", "sinkhorn", "lapsum", "sorting_network"}
    assert names <= set(MATRIX_FAMILIES)
    for name, op in MATRIX_FAMILIES.items():
        temperature = {op.temperature: op.default_temperature}
        np.testing.assert_allclose(
            ss.permutation_matrix(scores, name).numpy(),
            op.matrix(scores, **temperature).numpy(), atol=1e-6)
        perm = op.matrix(scores).numpy()[0]
        np.testing.assert_allclose(perm.sum(axis=1), 1.0, atol=1e-3)
        if op.doubly_stochastic:
            np.testing.assert_allclose(perm.sum(axis=0), 1.0, atol=1e-2)
    assert ss.get_family("sinkhorn").temperature == "epsilon"
    with pytest.raises(ValueError, match="softsort"):
        ss.get_family("bitonic")


def test_layers_share_the_table():
    for layer_cls in (ss.SoftSort, ss.NeuralSort, ss.SinkhornPermutation):
        assert layer_cls.method in MATRIX_FAMILIES
    layer = ss.SinkhornPermutation(epsilon=1e-3)
    keras.layers.deserialize(keras.layers.serialize(layer))


@pytest.mark.filterwarnings("ignore::softsort_tf.SinkhornConvergenceWarning")
@pytest.mark.parametrize("hard", [False, True])
@settings(max_examples=10, deadline=None)
@given(batch=padded_batches())
def test_registry_sinkhorn_matrix_and_straight_through_on_padded_lists(hard, batch):
    # The Sinkhorn plan itself is tested with its operators; here the registry's
    # straight-through wrapper and mask plumbing: up to the solver's threshold. ε = 0.1,
    # not 1e-2: the plumbing does not depend on ε, and on these tied values the loop at
    # ε = 1e-2 ran its 5000 iterations on most lists (10× the time; softer plans also
    # put weight on more entries, so a misplaced row or column shows more).
    x, mask, seed = batch
    weights = np.random.RandomState(seed).randn(2, x.shape[1], x.shape[1])
    fn = lambda s, **kw: ss.permutation_matrix(  # noqa: E731
        s, "sinkhorn", hard=hard, epsilon=0.1, threshold=1e-9, max_iterations=5000, **kw)
    perm, grad = matrix_and_gradient(fn, x, mask, weights, True)
    assert np.all(np.isfinite(perm)) and np.all(np.isfinite(grad))
    for r in range(2):
        valid = mask[r]
        nv = valid.sum()
        ref, ref_grad = matrix_and_gradient(fn, x[r, valid][None], None,
                                             weights[r][:nv][:, valid][None], True)
        np.testing.assert_allclose(perm[r], embed_block(ref[0], valid), atol=1e-6)
        np.testing.assert_allclose(grad[r][valid], ref_grad[0], rtol=1e-4, atol=1e-5)
        assert np.all(grad[r][~valid] == 0)


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


# Names that only duplicated another route before 0.2.0 (CHANGELOG, "Renamed"): the
# public API has one name per concept (docs/api.md, "Naming scheme").
REMOVED = ("METHODS", "Method", "get_method", "PERMUTATION_OPERATORS", "PermutationOperator",
           "get_permutation_operator", "SoftRankLayer", "SoftSortLayer", "SoftTopKLayer",
           "SoftQuantileLayer", "soft_sort_matrix", "neural_sort_matrix",
           "stochastic_soft_sort_matrix", "stochastic_neural_sort_matrix",
           "sorting_network_matrix", "sinkhorn_topk_mask", "lapsum_topk_mask",
           "soft_top_k_loss")


def test_one_public_name_per_concept():
    assert not set(REMOVED) & set(ss.__all__)
    assert not [name for name in REMOVED if hasattr(ss, name)]
    assert "diffsort" not in ss.FAMILIES and "sorting_network" in ss.FAMILIES
    with pytest.raises(ValueError, match="sorting_network"):
        ss.soft_rank([[1.0, 2.0]], "diffsort")

"""Tests of `softsort_tf._checks`: a ragged input to every public operator of lists.

Each operator that takes a tensor of lists (`x`, `scores`, `hard`, `perm`) either
computes a `tf.RaggedTensor` (the package's ragged convention, `softsort_tf._masking`:
the lists computed one by one, the output ragged or one value per list) or refuses it
at the entry with a `ValueError` that names the argument and says what to pass instead
(`_checks.check_dense`): never a raw conversion error.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss
from softsort_tf import _checks, _masking

LISTS = [[0.3, 2.0, 1.0], [1.5], [], [4.0, -1.0]]
RAGGED = tf.ragged.constant(LISTS, tf.float64)
# The argument names of a tensor of lists, as the first parameter of an operator.
LIST_ARGUMENTS = ("x", "scores", "hard", "perm")
SEED = (1, 2)


def _dense_instead(argument: str, mask: str | None = "mask") -> str:
    """The message of `check_dense`: the argument, a dense tensor, and the mask."""
    message = (rf"`{argument}` must be a dense tensor, got a tf\.RaggedTensor: pad its lists "
               rf"\(`{argument}\.to_tensor\(\)`\)")
    if mask is not None:
        message += rf" and pass `{mask}=tf\.ones_like\({argument}, tf\.bool\)"
    return message


# name: (call on RAGGED, the message of the refusal)
REFUSED = {
    "kendall_embedding": (lambda r: ss.kendall_embedding(r), _dense_instead("x")),
    "kendall_kernel": (lambda r: ss.kendall_kernel(r), _dense_instead("x", "x_mask")),
    "discordant_pairs": (lambda r: ss.discordant_pairs(r), _dense_instead("x", "x_mask")),
    "mallows_kernel": (lambda r: ss.mallows_kernel(r), _dense_instead("x", "x_mask")),
    "weighted_kendall_kernel": (
        lambda r: ss.weighted_kendall_kernel(r, rank_weights=[1.0, 1.0, 1.0]),
        _dense_instead("x", "x_mask")),
    "gumbel_perturb": (lambda r: ss.gumbel_perturb(r, 2, SEED), _dense_instead("scores")),
    "permutahedron_rank": (lambda r: ss.permutahedron_rank(r),
                           r"a ragged `x`.*not supported by the permutahedron.*LapSum"),
    "permutahedron_sort": (lambda r: ss.permutahedron_sort(r),
                           r"a ragged `x`.*not supported by the permutahedron.*LapSum"),
}

# The losses and metrics of permutations and of top-k classes, which take dense tensors
# only: name: (call with RAGGED as one argument, the message of the refusal).
ORDERINGS = tf.ragged.constant([[1, 2, 0], [0], [], [0, 1]])
DENSE = RAGGED.to_tensor()
REFUSED_TARGETS = {
    "soft_topk_loss(logits)": (lambda r: ss.soft_topk_loss([0, 0, 0, 0], r, from_sparse=True),
                                _dense_instead("logits")),
    "soft_topk_loss(y_true)": (lambda r: ss.soft_topk_loss(r, DENSE),
                                _dense_instead("y_true", None)),
    "SoftTopKLoss": (lambda r: ss.SoftTopKLoss(from_sparse=True)([0, 0, 0, 0], r),
                     _dense_instead("logits")),
    "permutation_cross_entropy(y_true)": (
        lambda r: ss.permutation_cross_entropy(ORDERINGS, ss.softsort_permutation_matrix(r)),
        _dense_instead("y_true")),
    "permutation_cross_entropy(y_pred)": (
        lambda r: ss.permutation_cross_entropy(ORDERINGS.to_tensor(-1),
                                               ss.softsort_permutation_matrix(r)),
        _dense_instead("y_pred", None)),
    "PermutationCrossEntropy": (
        lambda r: ss.PermutationCrossEntropy()(ORDERINGS, ss.softsort_permutation_matrix(r)),
        _dense_instead("y_true")),
    "exact_permutation_accuracy": (
        lambda r: ss.exact_permutation_accuracy(ORDERINGS, ss.softsort_permutation_matrix(r)),
        _dense_instead("y_true")),
    "elementwise_permutation_accuracy(mask)": (
        lambda r: ss.elementwise_permutation_accuracy(
            ORDERINGS.to_tensor(-1), ss.softsort_permutation_matrix(DENSE), mask=r > 0),
        _dense_instead("mask", None)),
    "ExactPermutationAccuracy": (
        lambda r: ss.ExactPermutationAccuracy()(ORDERINGS, ss.softsort_permutation_matrix(r)),
        _dense_instead("y_true")),
    "ElementwisePermutationAccuracy": (
        lambda r: ss.ElementwisePermutationAccuracy()(ORDERINGS.to_tensor(-1),
                                                      ss.softsort_permutation_matrix(r)),
        _dense_instead("y_pred", None)),
}

# name: call on RAGGED, whose result is ragged with one row per list (or one value per
# list); `test_ragged_lists_are_computed` checks the row lengths.
COMPUTED = {
    "rankdata": lambda r: ss.rankdata(r),
    "soft_rank": lambda r: ss.soft_rank(r, "lapsum"),
    "soft_sort": lambda r: ss.soft_sort(r, "lapsum"),
    "soft_topk": lambda r: ss.soft_topk(r, 1, "lapsum"),
    "soft_quantile": lambda r: ss.soft_quantile(r, 0.5, "lapsum"),
    "lapsum_rank": lambda r: ss.lapsum_rank(r),
    "lapsum_sort": lambda r: ss.lapsum_sort(r),
    "lapsum_topk": lambda r: ss.lapsum_topk(r, 1),
    "lapsum_quantile": lambda r: ss.lapsum_quantile(r, 0.5),
    "lapsum_permutation_matrix": lambda r: ss.lapsum_permutation_matrix(r),
    "sinkhorn_rank": lambda r: ss.sinkhorn_rank(r),
    "sinkhorn_cdf": lambda r: ss.sinkhorn_cdf(r),
    "sinkhorn_sort": lambda r: ss.sinkhorn_sort(r),
    "sinkhorn_topk": lambda r: ss.sinkhorn_topk(r, 1),
    "sinkhorn_quantile": lambda r: ss.sinkhorn_quantile(r, 0.5),
    "sinkhorn_quantile_normalization": lambda r: ss.sinkhorn_quantile_normalization(
        r, [0.0, 1.0]),
    "sinkhorn_permutation_matrix": lambda r: ss.sinkhorn_permutation_matrix(r),
    "sinkhorn_trimmed_mean": lambda r: ss.sinkhorn_trimmed_mean(r, 0.2, 0.8),
    "sorting_network_sort": lambda r: ss.sorting_network_sort(r),
    "sorting_network_permutation_matrix": lambda r: ss.sorting_network_permutation_matrix(r),
    "hard_permutation_matrix": lambda r: ss.hard_permutation_matrix(r),
    "neuralsort_permutation_matrix": lambda r: ss.neuralsort_permutation_matrix(r),
    "softsort_permutation_matrix": lambda r: ss.softsort_permutation_matrix(r),
    "permutation_matrix": lambda r: ss.permutation_matrix(r),
    "stochastic_permutation_matrix": lambda r: ss.stochastic_permutation_matrix(r, 2, SEED),
    "stochastic_neuralsort_permutation_matrix":
        lambda r: ss.stochastic_neuralsort_permutation_matrix(r, 2, SEED),
    "stochastic_softsort_permutation_matrix":
        lambda r: ss.stochastic_softsort_permutation_matrix(r, 2, SEED),
    "stochastic_sinkhorn_permutation_matrix": (
        lambda r: ss.stochastic_sinkhorn_permutation_matrix(r, 2, SEED)),
    "squash_values": lambda r: ss.squash_values(r),
    "straight_through": lambda r: ss.straight_through(ss.hard_permutation_matrix(r),
                                                      ss.softsort_permutation_matrix(r)),
    "permute_values": lambda r: ss.permute_values(ss.softsort_permutation_matrix(r), r),
    "ranks_from_permutation":
        lambda r: ss.ranks_from_permutation(ss.softsort_permutation_matrix(r)),
}
PER_LIST = ("soft_quantile", "lapsum_quantile", "sinkhorn_quantile", "sinkhorn_trimmed_mean")
SAMPLED = ("stochastic_permutation_matrix", "stochastic_neuralsort_permutation_matrix",
           "stochastic_softsort_permutation_matrix", "stochastic_sinkhorn_permutation_matrix")


def _list_operators():
    return sorted(name for name in ss.__all__
                  if inspect.isfunction(getattr(ss, name))
                  and next(iter(inspect.signature(getattr(ss, name)).parameters), None)
                  in LIST_ARGUMENTS)


def test_every_operator_of_lists_is_covered():
    """Every exported operator whose first argument is a tensor of lists is in one of
    the two tables (so a new operator cannot skip the ragged contract)."""
    assert _list_operators() == sorted([*REFUSED, *COMPUTED])


@pytest.mark.parametrize("name", sorted({**REFUSED, **REFUSED_TARGETS}))
def test_ragged_input_refused_at_the_entry(name):
    """The `ValueError` names the argument and says what to pass instead."""
    call, message = {**REFUSED, **REFUSED_TARGETS}[name]
    with pytest.raises(ValueError, match=message):
        call(RAGGED)


@pytest.mark.parametrize("name", sorted(COMPUTED))
def test_ragged_lists_are_computed(name, monkeypatch):
    """A ragged input gives one result per list: ragged rows of each list's length
    (sorted, elementwise, one matrix or sample block per list), or one value per list.
    Computed in one group of lengths (the groups are tested in tests/test_masking.py)."""
    monkeypatch.setattr(_masking, "RAGGED_BUCKETS", 1)
    out = COMPUTED[name](RAGGED)
    lengths = [len(row) for row in LISTS]
    if name in PER_LIST:
        values = np.asarray(out)
        assert values.shape == (len(LISTS),)
        assert np.all(np.isfinite(values)) and values[2] == 0.0  # 0 for the empty list
        return
    assert isinstance(out, tf.RaggedTensor)
    rows = out.to_list()
    if name in SAMPLED:  # [lists, (S), (n), (n)]: S = 2 matrices per list
        assert [len(row) for row in rows] == [2] * len(LISTS)
        rows = [block for row in rows for block in row]
        lengths = [length for length in lengths for _ in range(2)]
    assert [len(row) for row in rows] == lengths
    assert np.all(np.isfinite(out.flat_values.numpy()))
    if name == "straight_through":  # the value of `hard`
        np.testing.assert_array_equal(out.flat_values.numpy(),
                                      ss.hard_permutation_matrix(RAGGED).flat_values.numpy())


def test_check_dense_names_the_mask_argument():
    _checks.check_dense("x", tf.constant([1.0]))  # a dense tensor passes
    _checks.check_dense("x", [[1.0, 2.0]])
    with pytest.raises(ValueError, match=_dense_instead("y", "y_mask")):
        _checks.check_dense("y", RAGGED, mask="y_mask")
    with pytest.raises(ValueError, match=r"`hard`.*`hard\.to_tensor\(\)`\)\.$"):
        _checks.check_dense("hard", RAGGED, mask=None)


def test_ragged_and_dense_mixed_in_straight_through():
    with pytest.raises(ValueError, match=_dense_instead("hard", None)):
        ss.straight_through(ss.hard_permutation_matrix(RAGGED), tf.zeros([4, 3, 3]))


@pytest.mark.parametrize("buckets", [1, 4])
def test_permute_values_of_a_group_of_empty_lists(buckets, monkeypatch):
    """The empty list alone in its length group (4 groups) or every list empty: the
    matrices of the group are padded like its values (`RaggedLists.pad_matrices`); each
    list's result is that of its dense matrix."""
    monkeypatch.setattr(_masking, "RAGGED_BUCKETS", buckets)
    perm = ss.softsort_permutation_matrix(RAGGED)
    out = ss.permute_values(perm, RAGGED)
    assert [len(row) for row in out.to_list()] == [len(row) for row in LISTS]
    for row, values, matrix in zip(out.to_list(), LISTS, perm.to_list(), strict=True):
        if values:
            np.testing.assert_allclose(row, np.asarray(matrix) @ values, rtol=1e-12)
    for fn in (ss.permute_values, lambda p, v: ss.soft_sort(v, "softsort")):
        empty = tf.ragged.constant([[], []], tf.float64)
        assert fn(ss.softsort_permutation_matrix(empty), empty).to_list() == [[], []]
    spec = tf.RaggedTensorSpec([None, None], tf.float64, 1)
    graph = tf.function(lambda v: ss.permute_values(ss.softsort_permutation_matrix(v), v),
                        input_signature=[spec])
    np.testing.assert_allclose(graph(RAGGED).flat_values, out.flat_values, rtol=1e-12)
    assert graph(tf.ragged.constant([[]], tf.float64)).to_list() == [[]]

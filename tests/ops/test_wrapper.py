"""Tests of `softsort_tf.ops.wrapper`, the one operator wrapper, across operators: a list
length and batch size unknown at trace time (`tf.function` with an `input_signature` of
`None` dimensions, graph and XLA, with and without masks) for the permutation operators,
their read-outs, the hard statistics, the permutation loss and accuracies."""

import functools

import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss
from softsort_tf.ops import hard_stats

DYNAMIC = [tf.TensorSpec([None, None], tf.float32)]


DYNAMIC_MASKED = DYNAMIC + [tf.TensorSpec([None, None], tf.bool)]


LENGTHS = (3, 6)


def _descending_order(s):
    return tf.argsort(s, axis=-1, direction="DESCENDING", stable=True)


# name: f(scores, mask) → a tensor (mask None or a bool [batch, n]).
OPERATORS = {
    "softsort": lambda s, m: ss.softsort_permutation_matrix(s, tau=0.3, mask=m),
    "softsort_p2_hard": lambda s, m: ss.softsort_permutation_matrix(s, tau=0.3, distance_power=2.0,
                                                         hard=True, mask=m),
    "neuralsort": lambda s, m: ss.neuralsort_permutation_matrix(s, tau=0.3, mask=m),
    "neuralsort_hard_ascending": lambda s, m: ss.neuralsort_permutation_matrix(
        s, tau=0.3, hard=True, direction="ASCENDING", mask=m),
    "hard": lambda s, m: ss.hard_permutation_matrix(s, mask=m),
    "stochastic_softsort": lambda s, m: ss.stochastic_softsort_permutation_matrix(
        s, 2, seed=3, tau=0.3,
                                                                       mask=m),
    "stochastic_neuralsort_hard": lambda s, m: ss.stochastic_neuralsort_permutation_matrix(
        s, 2, seed=[1, 2], tau=0.3, hard=True, mask=m),
    "gumbel_perturb": lambda s, m: ss.gumbel_perturb(s, 2, 5, mask=m),
    "permute_values": lambda s, m: ss.permute_values(
        ss.softsort_permutation_matrix(s, tau=0.3, mask=m), 2.0 * s, mask=m),
    "ranks_from_permutation": lambda s, m: ss.ranks_from_permutation(
        ss.neuralsort_permutation_matrix(s, tau=0.3, mask=m), mask=m),
    "rankdata": lambda s, m: ss.rankdata(s, mask=m),
    "weighted_quantile": lambda s, m: hard_stats.weighted_quantile(s, 0.3, mask=m),
    "interval_mean": lambda s, m: hard_stats.interval_mean(s, 0.1, 0.7, mask=m),
    "cross_entropy": lambda s, m: ss.permutation_cross_entropy(
        _descending_order(s), ss.softsort_permutation_matrix(s * 1.5, tau=0.3), mask=m),
    "cross_entropy_float_orderings": lambda s, m: ss.permutation_cross_entropy(
        tf.cast(_descending_order(s), tf.float32), ss.neuralsort_permutation_matrix(s, tau=0.3)),
    "exact_accuracy": lambda s, m: ss.exact_permutation_accuracy(
        _descending_order(s), ss.softsort_permutation_matrix(s * 0.5, tau=0.3), mask=m),
    "elementwise_accuracy": lambda s, m: ss.elementwise_permutation_accuracy(
        _descending_order(s), ss.softsort_permutation_matrix(-s, tau=0.3), mask=m),
}


def _inputs(n, batch=2, seed=0):
    rng = np.random.RandomState(seed + n)
    x = rng.randn(batch, n).astype(np.float32)
    mask = rng.rand(batch, n) < 0.7
    mask[:, 0] = True
    return x, mask


def _all_operators(names):
    """One function of (scores, mask) evaluating the operators `names`, each without and
    with the mask: {(name, masked): tensor}. Traced once for all of them (one graph, or
    one XLA program per input shape, instead of one per operator)."""
    def evaluate(s, m):
        return {f"{name}|{masked}": OPERATORS[name](s, m if masked else None)
                for name in names for masked in (False, True)}
    return evaluate


@functools.cache
def _eager_values(n, batch):
    """The eager values of every operator on `_inputs(n, batch)`, computed once for the
    graph and the XLA test (the same eager reference for both)."""
    x, mask = _inputs(n, batch)
    return {key: value.numpy() for key, value in _all_operators(sorted(OPERATORS))(
        x, mask).items()}


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_unknown_list_length_and_batch(jit):
    """Every operator, in one `tf.function` whose list length and batch size are unknown
    at trace time (its values, with and without a mask, are those of eager mode)."""
    names = sorted(OPERATORS)
    evaluate = _all_operators(names)
    traced = tf.function(evaluate, input_signature=DYNAMIC_MASKED, jit_compile=jit)
    for n, batch in zip(LENGTHS, (2, 3), strict=True):
        x, mask = _inputs(n, batch)
        got = traced(x, mask)
        want = _eager_values(n, batch)
        assert sorted(got) == sorted(want)
        for key in sorted(want):
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{key} (name|masked), n = {n}")
    # One trace for the signature: the lengths did not retrace.
    assert traced.experimental_get_tracing_count() == 1


GRADIENT_OPERATORS = ["softsort", "neuralsort", "stochastic_softsort", "cross_entropy",
                      "permute_values"]


def test_gradients_with_unknown_list_length_under_xla():
    def gradients(s, m):
        out = {}
        for name in GRADIENT_OPERATORS:
            with tf.GradientTape() as tape:
                tape.watch(s)
                total = tf.reduce_sum(tf.sin(3.0 * OPERATORS[name](s, m)))
            out[name] = tape.gradient(total, s)
        return out

    xla = tf.function(gradients, input_signature=DYNAMIC_MASKED, jit_compile=True)
    for n in LENGTHS:
        x, mask = _inputs(n)
        got, want = xla(x, mask), gradients(tf.constant(x), mask)
        for name in GRADIENT_OPERATORS:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5,
                                       err_msg=f"{name}, n = {n}")

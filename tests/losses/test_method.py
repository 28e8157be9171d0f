"""Tests of `softsort_tf.losses.method`, the losses computed with any family of
`FAMILIES`: each rank loss is its formula on the front door's ranks, takes masks, Keras
masks and ragged lists, and validates its method arguments at construction."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras_test_layers import SqueezeKeepingMask
from numpy_references import np_dcg
from operator_cases import random_padded
from scipy import stats

import softsort_tf as ss
from softsort_tf.losses.ranking import (
    SoftNDCGLoss,
)
from softsort_tf.losses.spearman import SpearmanLoss, soft_spearman_correlation
from softsort_tf.ops.soft import soft_rank

FAMILY_ARGUMENTS = {  # (temperature, method_kwargs) of each family in these tests
    "sinkhorn": (0.05, None), "lapsum": (0.3, None),
    "permutahedron": (0.3, {"regularization": "kl"}),
    "softsort": (0.3, {"distance_power": 2.0}), "neuralsort": (0.3, None),
    "sorting_network": (5.0, {"network": "bitonic"})}


assert set(FAMILY_ARGUMENTS) == set(ss.FAMILIES)  # a new family gets these tests


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
            expected = ss.soft_topk_loss(classes, scores, 1, from_sparse=True, mask=valid,
                                          method=method, temperature=0.3)
            y = classes
        else:
            y = labels
            expected = loss.fn(labels, scores, mask=valid, **loss.fn_kwargs)
            np.testing.assert_allclose(float(loss(ragged_labels, ragged_scores)),
                                       float(tf.reduce_mean(expected)), rtol=1e-5)
        masked = keras.layers.Masking(-99.0)(np.where(valid, scores, -99.0)[..., None])
        masked_scores = SqueezeKeepingMask()(masked)
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
        ss.soft_topk_loss([0], scores, 1, from_sparse=True, mask=labels >= 0,
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


@pytest.mark.parametrize("make", [
    lambda t: ss.SoftNDCGLoss(method="sinkhorn", temperature=t),
    lambda t: ss.SpearmanLoss(temperature=t),
    lambda t: ss.SoftTopKLoss(k=1, temperature=t),
])
def test_sinkhorn_temperature_below_the_dtype_is_rejected_at_construction(make):
    with pytest.raises(ValueError, match=r"`temperature`.*float32.*\[3\.81e-06, 3\.4"):
        make(1e-8)
    make(1e-5)  # within float32's range


def test_sinkhorn_temperature_range_follows_the_loss_dtype():
    ss.SoftNDCGLoss(method="sinkhorn", temperature=1e-8, dtype="float64")
    with pytest.raises(ValueError, match=r"`epsilon`.*float32"):
        ss.SoftNDCGLoss(method="sinkhorn", epsilon=1e-8)
    with pytest.raises(ValueError, match=r"`temperature`.*float64"):
        ss.SoftNDCGLoss(method="sinkhorn", temperature=1e-20, dtype="float64")


@pytest.mark.parametrize("method,temperature", [("lapsum", 1e-50), ("softsort", 1e39),
                                                ("neuralsort", 1e-46), ("sorting_network", 1e39)])
def test_temperatures_float32_cannot_hold_are_rejected_at_construction(method, temperature):
    with pytest.raises(ValueError, match=rf"`temperature`.*{method}.*float32"):
        ss.SoftNDCGLoss(method=method, temperature=temperature)
    if method in ("softsort", "neuralsort"):
        with pytest.raises(ValueError, match=r"`temperature`.*float32"):
            ss.ListwisePermutationLoss(method, temperature=temperature)

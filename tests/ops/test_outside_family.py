"""A family defined outside the package, registered with one public call, works through
every entry point that takes `method=` with no other file changed (docs/adding_a_family.md
is written from this module).

The family: Gaussian-smoothed ranks, r_i = ½ + Σ_j Φ((x_i − x_j)/σ) over the valid
entries (the j = i term is ½, so the hard limit σ → 0 is the 1-based rank, ties
averaged), and a sort that reads the values off those ranks with a Gaussian kernel
around each position. Only the public API is used here.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import softsort_tf as ss

NAME = "gaussian_rank_test"


def _descending(x, direction):
    return -x if direction == "DESCENDING" else x


def gaussian_rank(x, *, direction="ASCENDING", mask=None, sigma=0.5):
    """`[..., n]` scores → `[..., n]` soft ranks (0 at padded entries)."""
    x = _descending(tf.convert_to_tensor(x), direction)
    valid = tf.ones_like(x) if mask is None else tf.cast(tf.broadcast_to(mask, tf.shape(x)),
                                                         x.dtype)
    z = (x[..., :, None] - x[..., None, :]) / (sigma * math.sqrt(2.0))
    ranks = tf.reduce_sum(0.5 * tf.math.erfc(-z) * valid[..., None, :], axis=-1)
    return (ranks + 0.5) * valid  # the j = i term is ½: ranks from 1


def gaussian_sort(x, *, direction="ASCENDING", mask=None, sigma=0.5):
    """`[..., n]` values → soft-sorted values: position k takes the values whose soft rank
    is near k (a softmax over the valid entries of −(r_j − k)²/0.01); padded positions 0."""
    x = tf.convert_to_tensor(x)
    ranks = gaussian_rank(x, direction=direction, mask=mask, sigma=sigma)
    valid = tf.ones_like(x, tf.bool) if mask is None else tf.broadcast_to(
        tf.cast(mask, tf.bool), tf.shape(x))
    positions = tf.range(1, tf.shape(x)[-1] + 1, dtype=x.dtype)
    logits = -((ranks[..., None, :] - positions[:, None]) ** 2) / 0.01
    logits = tf.where(valid[..., None, :], logits, tf.constant(-np.inf, x.dtype))
    weights = tf.nn.softmax(logits, axis=-1)
    count = tf.reduce_sum(tf.cast(valid, x.dtype), axis=-1, keepdims=True)
    return tf.where(positions <= count, tf.reduce_sum(weights * x[..., None, :], -1), 0.0)


FAMILY = ss.Family(
    NAME, "sigma", 0.5, "scale σ of the Gaussian smoothing, in the units of the scores",
    "this test", operations=dict(rank=gaussian_rank, sort=gaussian_sort))


@pytest.fixture(autouse=True)
def registered():
    ss.register_family(FAMILY)
    yield
    ss.unregister_family(NAME)


def _reference_ranks(x, sigma, valid=None):
    valid = np.ones_like(x, bool) if valid is None else valid
    z = (x[:, :, None] - x[:, None, :]) / sigma
    return np.where(valid, 0.5 + np.sum(stats.norm.cdf(z) * valid[:, None, :], -1), 0.0)


X = np.random.default_rng(0).normal(size=(3, 6)).astype(np.float64)


def test_front_door():
    assert NAME in ss.FAMILIES and ss.FAMILIES[NAME].temperature == "sigma"
    valid = np.arange(6)[None, :] < np.array([[6], [4], [2]])
    np.testing.assert_allclose(ss.soft_rank(X, NAME, temperature=0.3).numpy(),
                               _reference_ranks(X, 0.3), rtol=1e-10)
    np.testing.assert_allclose(ss.soft_rank(X, NAME, mask=valid, sigma=0.3).numpy(),
                               _reference_ranks(X, 0.3, valid), rtol=1e-10)
    descending = ss.soft_rank(X, NAME, "DESCENDING", temperature=0.3).numpy()
    np.testing.assert_allclose(descending, 7.0 - _reference_ranks(X, 0.3), rtol=1e-10)
    hard = ss.soft_sort(X, NAME, temperature=1e-4).numpy()
    np.testing.assert_allclose(hard, np.sort(X, -1), atol=1e-6)
    transposed = ss.soft_rank(X.T, NAME, axis=0, temperature=0.3).numpy()
    np.testing.assert_allclose(transposed.T, _reference_ranks(X, 0.3), rtol=1e-10)
    # The one rule of every family: keywords, temperatures, operations.
    with pytest.raises(ValueError, match=r"`alpha`.*method='lapsum'.*`sigma`"):
        ss.soft_rank(X, NAME, alpha=0.1)
    with pytest.raises(ValueError, match=r"`temperature`.*gaussian_rank.*float32"):
        ss.soft_rank(X.astype(np.float32), NAME, temperature=1e39)
    with pytest.raises(ValueError, match="does not define a soft topk"):
        ss.soft_topk(X, 2, NAME)
    with pytest.raises(ValueError, match="already"):
        ss.register_family(FAMILY)


def test_layers_serialise_and_reload(tmp_path):
    layer = ss.RankLayer(NAME, temperature=0.3, dtype="float64")
    np.testing.assert_allclose(layer(X).numpy(), _reference_ranks(X, 0.3), rtol=1e-10)
    config = layer.get_config()
    assert config["method"] == NAME and config["temperature"] == 0.3
    inputs = keras.Input((6,), dtype="float64")
    model = keras.Model(inputs, [ss.RankLayer.from_config(config)(inputs),
                                 ss.SortLayer(NAME, temperature=1e-4,
                                                  dtype="float64")(inputs)])
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    for got, want in zip(loaded(X), model(X), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
    with pytest.raises(ValueError, match="quantile"):
        ss.QuantileLayer(0.5, NAME)
    with pytest.raises(ValueError, match=r"`epsilon`.*method='sinkhorn'"):
        ss.RankLayer(NAME, epsilon=1e-3)


def test_rank_losses_train_with_it():
    y_true = np.array([[3.0, 1.0, 2.0, 0.0], [0.0, 2.0, 1.0, 3.0]], np.float32)
    y_pred = tf.Variable(np.zeros((2, 4), np.float32) + [[0.1, 0.2, 0.3, 0.4]])
    spearman = ss.SpearmanLoss(method=NAME, temperature=0.05)
    ndcg = ss.SoftNDCGLoss(method=NAME, temperature=0.05)
    for loss in (spearman, ndcg):
        assert type(loss).from_config(loss.get_config()).get_config() == loss.get_config()
        with tf.GradientTape() as tape:
            value = loss(y_true, y_pred)
        gradient = tape.gradient(value, y_pred)
        assert np.isfinite(value.numpy()) and np.all(np.isfinite(gradient.numpy()))
        assert np.any(gradient.numpy() != 0)
    # A few steps of gradient descent on the scores alone order them like the labels
    # (the step traced once, its graph run at every step).
    optimizer, smooth = keras.optimizers.SGD(1.0), ss.SpearmanLoss(method=NAME,
                                                                    temperature=0.2)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            value = smooth(y_true, y_pred)
        optimizer.apply_gradients([(tape.gradient(value, y_pred), y_pred)])

    for _ in range(100):
        step()
    for row in range(2):
        rho = stats.spearmanr(y_true[row], y_pred.numpy()[row]).statistic
        assert rho > 0.99, rho


def test_the_page_adding_a_family_runs(tmp_path):
    """docs/adding_a_family.md's code blocks, run in order (as a reader would)."""
    import pathlib
    import re

    page = pathlib.Path(__file__).resolve().parents[2] / "docs" / "adding_a_family.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 2
    namespace = {}
    try:
        for block in blocks:
            exec(compile(block, str(page), "exec"), namespace)
        np.testing.assert_allclose(namespace["r"].numpy(),
                                   _reference_ranks(np.array([[0.3, -1.0, 2.0]]), 0.1),
                                   rtol=1e-5)
        assert namespace["layer"].get_config()["method"] == "gaussian_rank"
    finally:
        if "gaussian_rank" in ss.FAMILIES:
            ss.unregister_family("gaussian_rank")

"""Training under Keras' mixed precision policies: every permutation layer with
`PermutationCrossEntropy`, and the batch-statistic regression losses.

Bug: under `mixed_float16`, P̂ came out in float16 and the cross-entropy's gradient
dL/dP̂ ≈ 1/P̂ (≈ 2.5e5 at the probability floor, times the loss scale) overflowed
float16: the loss scale collapsed and training silently stalled. The layers now compute
and return float32 under a mixed policy, and the losses compute in float32.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss

N = 5
LAYERS = {
    "softsort": lambda: ss.SoftSort(tau=0.3),
    "neuralsort": lambda: ss.NeuralSort(tau=0.3),
    "sinkhorn": lambda: ss.SinkhornPermutation(epsilon=0.05, max_iterations=200),
    "softsort_stochastic": lambda: ss.SoftSort(tau=0.3, stochastic=True, num_samples=2, seed=1),
}


@pytest.fixture
def policy(request):
    keras.mixed_precision.set_global_policy(request.param)
    keras.utils.set_random_seed(0)
    try:
        yield request.param
    finally:
        keras.mixed_precision.set_global_policy("float32")


def sorting_data(batch=64):
    rng = np.random.RandomState(0)
    x = rng.randn(batch, N).astype(np.float32)
    return x, np.argsort(-x, axis=-1).astype(np.int32)  # DESCENDING orderings


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"], indirect=True)
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_permutation_layers_train_under_mixed_precision(policy, name):
    x, order = sorting_data()
    inputs = keras.Input((N,))
    scores = keras.layers.Dense(N, kernel_initializer=keras.initializers.RandomNormal(
        stddev=0.3, seed=0))(inputs)
    assert scores.dtype == policy.removeprefix("mixed_")  # the model really is mixed
    perm = LAYERS[name]()(scores)
    assert perm.dtype == "float32"
    model = keras.Model(inputs, perm)
    model.compile(keras.optimizers.Adam(0.05), ss.PermutationCrossEntropy(),
                  metrics=[ss.ExactPermutationAccuracy()])
    before = model.evaluate(x, order, batch_size=16, verbose=0, return_dict=True)
    history = model.fit(x, order, batch_size=16, epochs=4, verbose=0).history
    after = model.evaluate(x, order, batch_size=16, verbose=0, return_dict=True)
    assert np.all(np.isfinite(history["loss"]))
    assert after["loss"] < 0.7 * before["loss"]
    assert after["exact_permutation_accuracy"] > before["exact_permutation_accuracy"]
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        # Dynamic loss scaling halves the scale at each overflow: it must not collapse.
        assert float(model.optimizer.dynamic_scale) >= 2.0**10


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"], indirect=True)
@pytest.mark.parametrize("make", [ss.SoftLeastQuantileRegressionLoss,
                                  ss.SoftTrimmedRegressionLoss])
def test_regression_losses_take_reduced_and_other_float_predictions(policy, make):
    # Bug: `tf.convert_to_tensor(y_pred, dtype=...)` raised for a float16/bfloat16 model
    # output, and for a float64 loss on a float32 model.
    y_true = np.linspace(0.0, 1.0, 8)
    y_pred = np.linspace(0.0, 1.0, 8) + np.array([0.1, -0.2, 0.05, 3.0, 0, 0.1, -0.1, 0.2])
    reference = float(make(dtype="float64")(y_true, y_pred))
    reduced = tf.constant(y_pred, policy.removeprefix("mixed_"))
    value = make()(y_true, reduced)
    assert value.dtype == tf.float32
    assert float(value) == pytest.approx(reference, abs=2e-2)
    value64 = make(dtype="float64")(y_true, tf.constant(y_pred, tf.float32))
    assert value64.dtype == tf.float64 and float(value64) == pytest.approx(reference, abs=1e-6)
    # A model under the mixed policy trains with the loss.
    inputs = keras.Input((1,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(keras.optimizers.SGD(0.05), make())
    history = model.fit(y_true[:, None], y_pred, batch_size=8, epochs=3, verbose=0).history
    assert np.all(np.isfinite(history["loss"]))


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"], indirect=True)
def test_losses_compute_in_float32_under_a_mixed_policy(policy):
    for loss in (ss.PermutationCrossEntropy(), ss.PermutationCrossEntropy(dtype=policy),
                 ss.SpearmanLoss(dtype=policy), ss.SoftTopKLoss(dtype=policy),
                 ss.SoftTrimmedRegressionLoss(dtype=policy)):
        assert loss.dtype == "float32"
    assert ss.PermutationCrossEntropy(dtype="float64").dtype == "float64"
    # The gradient of the cross-entropy at the probability floor is ≈ 1/(n·δ) = 2.5e6 for
    # n = 4: finite in float32, beyond float16's range (65504).
    perm = tf.Variable(tf.constant([[[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]]))
    with tf.GradientTape() as tape:
        value = ss.PermutationCrossEntropy(dtype=policy)([[1, 0, 2, 3]], perm)
    grad = tape.gradient(value, perm).numpy()
    assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 65504

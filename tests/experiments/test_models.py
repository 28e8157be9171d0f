"""The large-MNIST models (`softsort_tf.experiments.models`): the CNN and its dtype
policy, the median regressor's read-out, and the Gumbel noise of the replicas."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import softsort_tf
from softsort_tf.experiments import models, training
from softsort_tf.experiments.models import MedianRegressor, _per_image

_REPLICA_NOISE = """
import json
import tensorflow as tf
from softsort_tf.experiments import models, training

training.set_cpu_devices(2)
strategy = training.make_strategy("mirrored")
with strategy.scope():
    model = models.PermutationLearner("softsort", temperature=1.0, stochastic=True, num_samples=3,
                                      seed=7)
    model.build()
# Both replicas get the same sequences at the same step: only the replica id differs.
inputs = {"images": tf.random.stateless_uniform([2, 4, 112, 28, 1], seed=[0, 1]),
          "step": tf.fill([2], tf.constant(5, tf.int64))}
replicated = strategy.experimental_distribute_values_from_function(lambda ctx: inputs)
step = tf.function(lambda x: strategy.run(lambda b: model(b, training=True), args=(x,)))
draws = [[r.numpy() for r in strategy.experimental_local_results(step(replicated))]
         for _ in range(2)]
print(json.dumps({
    "replicas": len(draws[0]),
    "replicas_differ": bool(abs(draws[0][0] - draws[0][1]).max() > 1e-3),
    "repeatable": all(bool((a == b).all()) for a, b in zip(draws[0], draws[1])),
}))
"""


def test_mirrored_replicas_draw_different_gumbel_noise_deterministically(run_binaries):
    # Two logical CPUs need a fresh process (devices are configured before TF starts).
    (proc,) = run_binaries([{"code": _REPLICA_NOISE, "timeout": 300}])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"replicas": 2, "replicas_differ": True, "repeatable": True}


def test_median_prediction_is_the_middle_row_times_the_regressed_values():
    images = tf.random.stateless_uniform([2, 5, 112, 28, 1], seed=[0, 1])
    inputs = {"images": images, "step": tf.zeros([2], tf.int64)}
    for tau in (0.01, 1e-9):
        model = MedianRegressor("softsort", temperature=tau)
        pred = model(inputs).numpy()
        scores = _per_image(model.scorer, images, False)
        values = _per_image(model.regressor, images, False).numpy()
        middle = softsort_tf.softsort_permutation_matrix(scores, tau=tau).numpy()[:, 2, :]
        np.testing.assert_allclose(pred, np.sum(middle * values, axis=1), rtol=1e-5, atol=1e-7)
    # With a vanishing τ, the middle row is one-hot on the image with the median score.
    median_item = np.argsort(-scores.numpy(), axis=1, kind="stable")[:, 2]
    np.testing.assert_allclose(pred, values[np.arange(2), median_item], rtol=1e-5, atol=1e-7)


def test_bfloat16_cnn_gives_float32_scores_close_to_the_float32_cnn():
    full = models.build_cnn("a")
    half = models.build_cnn("b", "mixed_bfloat16")
    half.set_weights(full.get_weights())
    images = tf.random.stateless_uniform([6, 112, 28, 1], [0, 1])
    assert half.layers[0].compute_dtype == "bfloat16"
    assert half(images).dtype == tf.float32
    a, b = full(images).numpy(), half(images).numpy()
    # bfloat16 has an 8-bit significand: about 2-3 significant digits.
    np.testing.assert_allclose(b, a, atol=0.05 * np.abs(a).max() + 1e-3)


def test_keras_policy_is_left_alone():
    before = keras.config.dtype_policy().name
    models.build_cnn("c", "mixed_bfloat16")
    assert keras.config.dtype_policy().name == before
    assert training.TimeBudgetStop(1.0).seconds == 1.0



def test_method_kwargs_reach_the_relaxed_matrix():
    """`--method_kwargs` (a JSON object) are the family's own settings of the matrix, e.g.
    Sinkhorn on the raw scores; a keyword the family does not take is refused by name."""
    model = models.PermutationLearner("sinkhorn", temperature=100.0,
                                      method_kwargs='{"squash": null}')
    scores = tf.constant([[3.0, -20.0, 7.0]])
    inputs = {"step": tf.zeros([1], tf.int64)}
    np.testing.assert_allclose(
        model._permutation(scores, inputs, training=False).numpy(),
        softsort_tf.permutation_matrix(scores, "sinkhorn", temperature=100.0,
                                       squash=None).numpy(), rtol=1e-6)
    squashed = softsort_tf.permutation_matrix(scores, "sinkhorn", temperature=100.0).numpy()
    assert not np.allclose(squashed, model._permutation(scores, inputs, False).numpy())
    assert model.get_config()["method_kwargs"] == {"squash": None}
    with pytest.raises(ValueError, match=r"`tau`.*method_kwargs.*sinkhorn"):
        models.PermutationLearner("sinkhorn", method_kwargs={"tau": 1.0})
    with pytest.raises(ValueError, match="temperature"):
        models.PermutationLearner("softsort", method_kwargs={"tau": 1.0})

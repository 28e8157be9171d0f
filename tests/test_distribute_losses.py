"""The batch-statistic regression losses under `tf.distribute.MirroredStrategy`.

Logical CPU devices must be configured before TensorFlow initialises, so the mirrored
run happens in a fresh interpreter (the script below), which prints its numbers as JSON.

What Keras promises for every loss under R replicas: each replica reduces its own slice
of the global batch, the replica losses are scaled by 1/R and the gradients summed, so
one step applies the gradient of the mean of the per-replica losses. For a batch
statistic S that is the mean of S over the R per-replica batches (not S of the global
batch); the test compares the mirrored step with that reference computed on one device.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = r"""
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(2)])
import keras
import softsort_tf as ss

LR = 0.1
rng = np.random.RandomState(0)
x = rng.randn(8, 3).astype(np.float32)
y = (x @ np.array([1.0, -2.0, 0.5]) + rng.standard_cauchy(8)).astype(np.float32)
w0 = [rng.randn(3, 1).astype(np.float32), np.array([0.3], np.float32)]
LOSSES = {
    "least_quantile": lambda: ss.SoftLeastQuantileRegressionLoss(0.5, epsilon=1e-2),
    "trimmed": lambda: ss.SoftTrimmedRegressionLoss(0.0, 0.7, epsilon=1e-2),
}


def model():
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    m.set_weights(w0)
    return m


out = {"devices": len(tf.config.list_logical_devices("CPU"))}
for name, make in LOSSES.items():
    # Reference on one device: the gradient of the mean of the two half-batch losses.
    m = model()
    with tf.GradientTape() as tape:
        halves = [make()(y[i:i + 4], m(x[i:i + 4])) for i in (0, 4)]
        reference_loss = 0.5 * (halves[0] + halves[1])
    grads = tape.gradient(reference_loss, m.trainable_weights)
    expected = [w - LR * g.numpy() for w, g in zip(w0, grads)]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        mm = model()
        mm.compile(keras.optimizers.SGD(LR), loss=make())
    history = mm.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    out[name] = {
        "replicas": strategy.num_replicas_in_sync,
        "mirrored_weights": [w.ravel().tolist() for w in mm.get_weights()],
        "expected_weights": [w.ravel().tolist() for w in expected],
        "w0": [w.ravel().tolist() for w in w0],
        "mirrored_loss": history.history["loss"][0],
        "expected_loss": float(reference_loss),
    }
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def mirrored_run():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
        [ROOT] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["least_quantile", "trimmed"])
def test_mirrored_step_is_the_mean_of_the_replica_losses(mirrored_run, name):
    run = mirrored_run[name]
    assert mirrored_run["devices"] == 2 and run["replicas"] == 2
    for got, want, start in zip(run["mirrored_weights"], run["expected_weights"], run["w0"],
                                strict=True):
        # The step itself is not trivial (the loss has a gradient) ...
        assert np.abs(np.subtract(want, start)).max() > 1e-3
        # ... and equals one step on the mean of the per-replica losses, not R times it.
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert run["mirrored_loss"] == pytest.approx(run["expected_loss"], rel=1e-4)

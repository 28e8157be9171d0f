"""Shared pytest set-up: quiet TF logs, deterministic seeds, small thread pools, MNIST."""

import os
import sys

# The shared test helpers (numpy_references, keras_test_layers) live beside this file.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Compile time, not run time, dominates the suite (hundreds of small graphs and XLA
# programs, each run once or twice). XLA:CPU compiles its programs two to three times
# faster with LLVM's optimisation level 0 and its classic fusion code generator instead of
# the MLIR fusion emitters. The HLO (what is computed, fusions included) is the same and
# the values agree to rounding; the binaries and notebooks the tests fork inherit it.
# `tests/ops/test_xla_defaults.py` compiles every family with XLA's defaults, as users do.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 "
                      "--xla_cpu_use_fusion_emitters=false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

try:  # Under pytest-xdist two workers share 2 cores.
    tf.config.threading.set_inter_op_parallelism_threads(1)
except RuntimeError:
    pass
# Grappler rewrites each new graph before its first run; here every graph runs once or
# twice, so the rewrites cost more than they save. The rewrites keep what is computed (the
# values agree to rounding); the forked binaries and the notebooks keep TensorFlow's default.
tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


@pytest.fixture
def policy(request):
    """The Keras dtype policy `request.param` (e.g. 'mixed_float16') for the test, then
    'float32' again; use with `@pytest.mark.parametrize("policy", [...], indirect=True)`."""
    import keras

    keras.mixed_precision.set_global_policy(request.param)
    keras.utils.set_random_seed(0)
    try:
        yield request.param
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(autouse=True)
def _seed():
    np.random.seed(0)
    tf.random.set_seed(0)
    yield


SHARED_MNIST_NPZ = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "..", "shared", "data", "mnist.npz")


def write_standin_mnist_npz(path: str) -> str:
    """Writes an npz in MNIST's exact format (x_train [60000, 28, 28] uint8, y_train,
    x_test [10000, 28, 28], y_test) whose images are the embedded digits, cycled."""
    from softsort_tf.datasets import large_mnist

    images, labels = large_mnist.embedded_digit_images()
    idx = np.arange(70000) % len(images)
    np.savez(path, x_train=images[idx[:60000]], y_train=labels[idx[:60000]],
             x_test=images[idx[60000:]], y_test=labels[idx[60000:]])
    return path


@pytest.fixture(scope="session")
def mnist_npz(tmp_path_factory) -> str:
    """Path of an MNIST npz for the npz code paths: the real ../shared/data/mnist.npz
    beside the checkout, or, where it is absent, a stand-in of the same format built
    from the embedded digits, so that these tests run (never skip) on any machine."""
    if os.path.exists(SHARED_MNIST_NPZ):
        return SHARED_MNIST_NPZ
    return write_standin_mnist_npz(str(tmp_path_factory.mktemp("mnist") / "mnist.npz"))

"""Shared pytest set-up: quiet TF logs, deterministic seeds, small thread pools, MNIST."""

import collections
import gc
import json
import os
import random
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
# The XLA of TensorFlow < 2.20 has no fusion emitters and aborts the process on a flag it
# does not know, so the second flag is only set where the installed TensorFlow has it.


def _tensorflow_version():
    """(major, minor) of the installed TensorFlow, read without importing it (XLA_FLAGS
    must be set first); None if no distribution of it is found."""
    from importlib import metadata

    for name in ("tensorflow", "tensorflow-cpu", "tf-nightly", "tf-nightly-cpu"):
        try:
            major, minor = metadata.version(name).split(".")[:2]
            return int(major), int(minor)
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return None


os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0" + (
    " --xla_cpu_use_fusion_emitters=false" if (_tensorflow_version() or (0, 0)) >= (2, 20)
    else ""))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

try:  # Under pytest-xdist two workers share 2 cores.
    tf.config.threading.set_inter_op_parallelism_threads(1)
except RuntimeError:
    pass
# Grappler rewrites each new graph before its first run; here every graph runs once or
# twice, so the rewrites cost more than they save. The rewrites keep what is computed (the
# values agree to rounding). The notebooks' kernels do the same (`tests/colabs/warm_kernels.py`);
# the forked binaries keep TensorFlow's default, so Grappler still sees the package's graphs.
tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


# Under `make test` two pytest-xdist workers share the files (`--dist loadfile`: all the
# tests of a file run on one worker, so its module fixtures are built once). They finish
# together when the longest files start first and the short ones fill in at the end (xdist's
# own order, most tests first, left a 20 s one-test file for last). `file_durations.json`
# holds each file's seconds in a whole run; write it again after large changes with
# `--file-durations-out=tests/file_durations.json`. A file it does not list counts one second
# per test.
FILE_DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              "file_durations.json")
_seconds_per_file = collections.Counter()


def _file_of(nodeid):
    return nodeid.split("::")[0]


def pytest_addoption(parser):
    parser.addoption("--file-durations-out", default=None, metavar="PATH",
                     help="write each test file's summed test durations (seconds) to PATH")


def pytest_configure(config):
    config.option.loadscopereorder = False  # xdist: keep the order made below


def pytest_collection_modifyitems(config, items):
    with open(FILE_DURATIONS) as f:
        seconds = json.load(f)
    tests = collections.Counter(_file_of(item.nodeid) for item in items)
    weight = {name: seconds.get(name, count) for name, count in tests.items()}
    # Stable: a file's tests keep their order and stay together.
    items.sort(key=lambda item: (-weight[_file_of(item.nodeid)], _file_of(item.nodeid)))


def pytest_collection_finish(session):
    # The imported modules and collected tests live as long as the process: moved out of
    # the collector's reach, they are not scanned again by every full collection; and
    # graph building allocates many short-lived objects, so the youngest generation is
    # collected less often. The collector still runs (no cycle is kept for good).
    # Three ops test files run side by side with and without: 85 vs 95 CPU s.
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 10)


def pytest_runtest_logreport(report):
    _seconds_per_file[_file_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session):
    path = session.config.getoption("--file-durations-out")
    if path and not hasattr(session.config, "workerinput"):  # the xdist controller, or no xdist
        with open(path, "w") as f:
            json.dump({name: round(t, 1) for name, t in sorted(_seconds_per_file.items())},
                      f, indent=0)
            f.write("\n")


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


def _first_batch(x, y, sample_weight, batch_size):
    """What `build_training_state` takes for `fit`'s data: a `tf.data` dataset itself,
    the first batch `(x, y, sample_weight)` of arrays/tensors (nested), or None for
    other inputs (generators, PyDatasets)."""
    if isinstance(x, tf.data.Dataset):
        return x
    leaves = [v for v in tf.nest.flatten((x, y, sample_weight)) if v is not None]
    if not leaves or not all(isinstance(v, (np.ndarray, tf.Tensor)) for v in leaves):
        return None
    size = batch_size or 32
    return tf.nest.map_structure(lambda v: None if v is None else v[:size],
                                 (x, y, sample_weight))


@pytest.fixture(autouse=True)
def _fit_traces_once(request, monkeypatch):
    """`keras.Model.fit` first creates the optimizer's slots and the compiled loss' and
    metrics' variables from the first batch
    (`softsort_tf.experiments.training.build_training_state`, as the binaries do), then
    fits. Without a distribution strategy Keras otherwise creates them inside the first
    trace of the train step, and a `tf.function` whose first trace creates variables is
    traced a second time: with Sinkhorn layers each trace of a train step costs seconds.
    The train step run is the same. Tests marked `keras_default_build` keep Keras' own
    order (users' `fit`)."""
    if request.node.get_closest_marker("keras_default_build"):
        yield
        return
    import keras

    from softsort_tf.experiments import training

    fit = keras.Model.fit

    def fit_after_building(model, x=None, y=None, batch_size=None, *args, **kwargs):
        if model.optimizer is not None and not model.optimizer.built and not args:
            batch = _first_batch(x, y, kwargs.get("sample_weight"), batch_size)
            if batch is not None:
                training.build_training_state(model, batch)
        return fit(model, x, y, batch_size, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "fit", fit_after_building)
    yield


def _set_tf_global_seed(seed: int) -> None:
    """`tf.random.set_seed(seed)` in eager mode, without clearing the eager context's
    caches. `tf.random.set_seed` also drops every cached kernel and instantiated
    function (so that stateful random kernels restart their streams), and every test
    then instantiated its functions anew: 15–25 % of the CPU time of the ops tests.
    The tests draw their random inputs with numpy and the package uses stateless random
    ops, so no cached stateful kernel carries a stream from one test into the next; op
    seeds (`tf.data` shuffles, graph seeds) are derived from the reset seed as before."""
    ctx = context.context()
    if hasattr(ctx, "_seed") and hasattr(ctx, "_rng"):
        ctx._seed = seed
        ctx._rng = random.Random(seed)
    else:  # another TensorFlow: its own function
        tf.random.set_seed(seed)


@pytest.fixture(autouse=True)
def _seed():
    np.random.seed(0)
    _set_tf_global_seed(0)
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

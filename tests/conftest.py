"""Shared pytest set-up: quiet TF logs, deterministic seeds, small thread pools."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

try:  # Under pytest-xdist two workers share 2 cores.
    tf.config.threading.set_inter_op_parallelism_threads(1)
except RuntimeError:
    pass


@pytest.fixture(autouse=True)
def _seed():
    np.random.seed(0)
    tf.random.set_seed(0)
    yield

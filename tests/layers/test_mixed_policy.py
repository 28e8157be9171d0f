"""One dtype rule for every layer of the package: under a float16/bfloat16 policy (global
or the layer's `dtype`) a layer computes and returns float32, with the values it has
under the float32 policy (`softsort_tf._keras.full_precision_layer_kwargs`)."""

import keras
import numpy as np
import pytest
from test_tflite import layer_cases

# Every layer of `softsort_tf.__all__` with its defaults, and the smooth Kendall embedding
# (the families' variants of the front-door layers share the front-door layers' code).
CASES = {name: make for name, make in layer_cases().items()
         if "[" not in name or name == "KendallEmbedding[smooth]"}


@pytest.fixture
def policy(request):
    keras.config.set_dtype_policy(request.param)
    yield request.param
    keras.config.set_dtype_policy("float32")


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"], indirect=True)
def test_every_layer_returns_float32_under_a_mixed_policy(policy):
    x = np.random.default_rng(1).normal(size=(2, 5)).astype(np.float32)
    wrong = {}
    for name, make in CASES.items():
        keras.config.set_dtype_policy(policy)
        layer = make()
        out = np.asarray(layer(x))
        keras.config.set_dtype_policy("float32")
        want = np.asarray(make()(x))
        if layer.compute_dtype != "float32" or out.dtype != np.float32:
            wrong[name] = (layer.compute_dtype, out.dtype)
        assert np.all(np.isfinite(out)), name
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6, err_msg=name)
    assert wrong == {}  # KendallEmbedding returned float16/bfloat16 before


def test_a_layer_given_a_mixed_dtype_runs_in_float32():
    layer = CASES["KendallEmbedding[smooth]"]()
    layer = type(layer).from_config({**layer.get_config(), "dtype": "mixed_bfloat16"})
    out = layer(np.array([[0.3, -1.0, 2.0]], np.float32))
    assert layer.compute_dtype == "float32" and out.dtype == "float32"

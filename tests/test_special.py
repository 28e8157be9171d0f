"""Tests of `softsort_tf._special`: erf and erfc in TFLite's builtin ops for float32,
against scipy in float64 over the range the Kendall embedding and the sorting networks'
Gaussian sigmoid use (and the tails), with float64 unchanged."""

import numpy as np
import pytest
import scipy.special
import tensorflow as tf

from softsort_tf import _special

Z = np.concatenate([np.linspace(-12, 12, 48001), np.geomspace(1e-30, 1e30, 601),
                    -np.geomspace(1e-30, 1e30, 601), [0.0, -0.0, np.inf, -np.inf]])


@pytest.mark.parametrize("name", ["erf", "erfc"])
def test_float32_matches_scipy_to_float32_accuracy(name):
    z = Z.astype(np.float32)
    want = getattr(scipy.special, name)(z.astype(np.float64))
    fn = getattr(_special, name)
    for run in (fn, tf.function(fn), tf.function(fn, jit_compile=True)):
        got = run(tf.constant(z)).numpy()
        assert got.dtype == np.float32
        assert np.all(np.isfinite(got))
        got = got.astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=0, atol=2.5e-7)
        resolved = np.abs(want) >= 1e-37  # float32's normal numbers
        np.testing.assert_allclose(got[resolved], want[resolved], rtol=5e-7, atol=0)
    # TensorFlow's own float32 erfc is 10x less accurate in the tail (z = 8.8: 4e-6).
    tail = (z > 8) & (z < 9)
    if name == "erfc":
        np.testing.assert_allclose(fn(tf.constant(z[tail])).numpy(), want[tail], rtol=5e-7)


@pytest.mark.parametrize("name", ["erf", "erfc"])
def test_float64_is_tensorflow_s_kernel_and_nan_propagates(name):
    z = Z[::50]
    np.testing.assert_array_equal(getattr(_special, name)(tf.constant(z)).numpy(),
                                  getattr(tf.math, name)(tf.constant(z)).numpy())
    for dtype in (tf.float32, tf.float64, tf.float16):
        out = getattr(_special, name)(tf.constant([np.nan, 0.5], dtype)).numpy()
        assert out.dtype == dtype.as_numpy_dtype
        assert np.isnan(out[0]) and np.isfinite(out[1])


@pytest.mark.parametrize("name", ["erf", "erfc"])
def test_float32_gradient_is_the_derivative(name):
    z = tf.constant(np.linspace(-6, 6, 241), tf.float32)
    with tf.GradientTape() as tape:
        tape.watch(z)
        y = getattr(_special, name)(z)
    grad = tape.gradient(y, z).numpy().astype(np.float64)
    want = (2 / np.sqrt(np.pi)) * np.exp(-z.numpy().astype(np.float64) ** 2)
    want = want if name == "erf" else -want
    assert np.all(np.isfinite(grad))
    np.testing.assert_allclose(grad, want, rtol=2e-6, atol=1e-7)


def test_builtin_ops_only():
    """The float32 forms convert to TFLite with builtin ops (tf.math.erf does not)."""
    spec = tf.TensorSpec([7], tf.float32)
    fn = tf.function(lambda z: (_special.erf(z), _special.erfc(z))).get_concrete_function(spec)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([fn])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    interpreter = tf.lite.Interpreter(model_content=converter.convert())
    interpreter.allocate_tensors()
    z = np.array([-9.0, -2.0, -0.3, 0.0, 0.4, 1.5, 8.5], np.float32)
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], z)
    interpreter.invoke()
    out = [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]
    got = sorted(out, key=lambda v: float(v[-1]))  # erfc(8.5) < erf(8.5)
    np.testing.assert_allclose(got[0], scipy.special.erfc(z.astype(np.float64)), rtol=2e-6,
                               atol=2.5e-7)
    np.testing.assert_allclose(got[1], scipy.special.erf(z.astype(np.float64)), atol=2.5e-7)

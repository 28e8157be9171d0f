"""TFLite conversion of every layer of the package with TFLite's builtin ops.

One small model per layer of `softsort_tf.__all__` (every `keras.layers.Layer` there,
with its default settings, plus the smooth `KendallEmbedding` and each family of the
front-door layers `RankLayer`, `SortLayer`, `TopKLayer` and `QuantileLayer` that defines
the layer's operation) is converted with `tf.lite.OpsSet.TFLITE_BUILTINS` only, run by
`tf.lite.Interpreter` and compared with Keras to float32 accuracy. The models are
gathered into one Keras model with one output per layer, so the whole set costs one
conversion (a failure converts them one by one to name the layers that fail).

The Sinkhorn layers convert with builtins with the float32 backward solve
(`SINKHORN_FLOAT32`, the cases '<layer>[implicit cg]'). With their defaults they need
TensorFlow ops beyond the builtins and are listed in `FLEX_ONLY` with the reason
(docs/deploy.md, "TFLite"): they convert with `SELECT_TF_OPS` (and give the
Keras values where the interpreter has the flex delegate, which TensorFlow's pip wheel
does not ship), and each of them still holds a float64 op in its traced forward (the
reason), so the list cannot go stale unnoticed. The Sinkhorn conversions are `slow`
(~20 s of CPU each) but for one (`SinkhornRank` after traces at other shapes); the other
layers cost ~20 s of CPU (one conversion of 20 layers).

Shapes are static (batch 2, lists of 5): LapSum computes its sums in float32 only for a
list length known at trace time (`softsort_tf.ops.lapsum.FLOAT32_SUMS_UP_TO`).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

import softsort_tf
from softsort_tf.ops import family as family_module

BATCH, N = 2, 5
FRONT_DOOR = ("RankLayer", "SortLayer", "TopKLayer", "QuantileLayer")

#: Layers that do not convert with TFLite's builtin ops, and why (docs/deploy.md).
_SINKHORN = ("with the default implicit backward (float64 solve for m <= 64 targets) the "
             "read-outs are computed from float64 potentials in the forward (their "
             "gradients cancel against the implicit ones in float64); TFLite has no "
             "float64 kernels. The same layer with "
             "SinkhornOptions(implicit_diff=ImplicitDiff(solver='cg')) (or "
             "implicit_diff=None) converts with builtins (the forward values equal to "
             "float32 rounding)")
#: The Sinkhorn settings whose forward is float32 throughout.
SINKHORN_FLOAT32 = {"options": softsort_tf.SinkhornOptions(
    implicit_diff=softsort_tf.ImplicitDiff(solver="cg"))}
FLEX_ONLY = {
    "SinkhornCDF": _SINKHORN,
    "SinkhornPermutation": _SINKHORN,
    "SinkhornQuantile": _SINKHORN,
    "SinkhornQuantileNormalization": _SINKHORN,
    "SinkhornRank": _SINKHORN,
    "SinkhornSort": _SINKHORN,
    **{name: _SINKHORN + " (method='sinkhorn' is the default)" for name in FRONT_DOOR},
}


def _is_layer(obj) -> bool:
    return isinstance(obj, type) and issubclass(obj, keras.layers.Layer)


def layer_cases() -> dict[str, object]:
    """`{case name: a function making the layer}`: every layer of `__all__` with its
    defaults, the smooth Kendall embedding, and the front-door layers by family."""
    cases = {}
    for name in softsort_tf.__all__:
        obj = getattr(softsort_tf, name)
        if _is_layer(obj):
            cases[name] = lambda cls=obj: cls()
    for name in list(cases):
        if name in FLEX_ONLY:  # the Sinkhorn layers, with a float32 forward
            cases[f"{name}[implicit cg]"] = lambda name=name: getattr(softsort_tf, name)(
                **SINKHORN_FLOAT32)
    cases["KendallEmbedding[smooth]"] = lambda: softsort_tf.KendallEmbedding(smooth_scale=0.5)
    cases["KendallEmbedding[smooth, signed]"] = lambda: softsort_tf.KendallEmbedding(
        smooth_scale=0.5, signed=True)
    for name in FRONT_DOOR:
        cls = getattr(softsort_tf, name)
        for method, fam in family_module.FAMILIES.items():
            if cls.operation not in fam.operations or method == "sinkhorn":
                continue  # sinkhorn is the default: the case `name` itself
            kwargs = {"k": 2} if cls.operation == "topk" else {}
            if cls.operation == "quantile":
                kwargs = {"quantiles": [0.25, 0.5]}
            cases[f"{name}[{method}]"] = (
                lambda cls=cls, method=method, kwargs=kwargs: cls(method=method, **kwargs))
    return cases


def _model(cases: dict[str, object]) -> keras.Model:
    inp = keras.Input((N,), batch_size=BATCH)
    outputs = {}
    for i, make in enumerate(cases.values()):
        out = make()(inp)
        outputs[f"out_{i:03d}"] = out
    return keras.Model(inp, outputs)


def _convert(model: keras.Model, ops) -> bytes:
    """The TFLite flatbuffer of `model` on `[BATCH, N]` float32 inputs, from its concrete
    function with the variables frozen into constants (no SavedModel round trip; the
    interpreter would not initialise resource variables)."""
    spec = tf.TensorSpec([BATCH, N], tf.float32)
    fn = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [convert_variables_to_constants_v2(fn)])
    converter.target_spec.supported_ops = ops
    return converter.convert()


def _run(blob: bytes, x: np.ndarray) -> dict[str, np.ndarray]:
    """The outputs `{out_000: ..., ...}`: the model's dict flattened in key order."""
    interpreter = tf.lite.Interpreter(model_content=blob)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return {f"out_{i:03d}": interpreter.get_tensor(d["index"])
            for i, d in enumerate(interpreter.get_output_details())}


def _inputs() -> np.ndarray:
    x = np.random.default_rng(0).normal(size=(BATCH, N)).astype(np.float32)
    x[1, 3] = x[1, 1]  # a tie
    return x


def _compare(cases, model, outputs, x):
    want = model(x)
    assert sorted(outputs) == sorted(want)
    for key, name in zip(sorted(want), cases, strict=True):
        got, ref = np.asarray(outputs[key]), np.asarray(want[key])
        assert got.dtype == np.float32, name
        assert np.all(np.isfinite(got)) and np.all(np.isfinite(ref)), name
        scale = max(1.0, float(np.max(np.abs(ref))))
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=2e-6 * scale, err_msg=name)


def _failing(cases, ops) -> list[str]:
    failing = []
    for name, make in cases.items():
        try:
            _convert(_model({name: make}), ops)
        except Exception:  # noqa: BLE001 - the converter raises several types
            failing.append(name)
    return failing


def test_cases_cover_every_layer_and_family():
    cases = layer_cases()
    layers = [n for n in softsort_tf.__all__ if _is_layer(getattr(softsort_tf, n))]
    assert set(layers) <= set(cases)
    assert set(FLEX_ONLY) <= set(cases)
    for name in FRONT_DOOR:
        assert name in layers
    assert "RankLayer[lapsum]" in cases and "SortLayer[permutahedron]" in cases
    assert "SinkhornSort[implicit cg]" in cases and "QuantileLayer[implicit cg]" in cases


def _check_builtin_conversion(cases):
    x = _inputs()
    model = _model(cases)
    builtins = [tf.lite.OpsSet.TFLITE_BUILTINS]
    try:
        blob = _convert(model, builtins)
    except Exception:  # noqa: BLE001
        pytest.fail(f"no builtin conversion for {_failing(cases, builtins)}")
    _compare(cases, model, _run(blob, x), x)


def test_every_layer_converts_with_builtin_ops():
    """Every case but the Sinkhorn ones (the slow test below): ~20 s of CPU."""
    _check_builtin_conversion({k: v for k, v in layer_cases().items()
                               if k not in FLEX_ONLY and not k.endswith("[implicit cg]")})


@pytest.mark.slow  # ten Sinkhorn models in one conversion: ~20 s of CPU
def test_sinkhorn_layers_with_the_float32_backward_convert_with_builtin_ops():
    _check_builtin_conversion({k: v for k, v in layer_cases().items()
                               if k.endswith("[implicit cg]")})


def _float64_ops(layer) -> int:
    fn = tf.function(layer).get_concrete_function(tf.TensorSpec([BATCH, N], tf.float32))
    graph_def = fn.graph.as_graph_def()
    nodes = list(graph_def.node)
    for f in graph_def.library.function:
        nodes.extend(f.node_def)
    return sum(any(v.type == types_pb2.DT_DOUBLE or types_pb2.DT_DOUBLE in v.list.type
                   for v in node.attr.values()) for node in nodes)


@pytest.mark.slow  # one conversion of ten Sinkhorn models: ~15 s of CPU
def test_the_exceptions_convert_with_flex_ops_and_still_need_them():
    cases = {k: v for k, v in layer_cases().items() if k in FLEX_ONLY}
    for name, make in cases.items():
        assert _float64_ops(make()) > 0, f"{name} has no float64 op: drop it from FLEX_ONLY"
    x = _inputs()
    model = _model(cases)
    blob = _convert(model, [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS])
    assert b"Flex" in blob  # some float64 ops run as TensorFlow (flex) ops
    try:
        outputs = _run(blob, x)
    except RuntimeError as error:
        if "Flex delegate" not in str(error):
            raise
        # TensorFlow's pip wheel (2.21) ships no flex delegate for its Python
        # interpreter; the conversion above is what can be checked here.
        pytest.skip("this tf.lite.Interpreter has no flex delegate (the model converted)")
    _compare(cases, model, outputs, x)


def test_sinkhorn_converts_after_traces_at_other_shapes():
    """The Sinkhorn loop's graph function generalises to unknown shapes once it has seen
    a second batch size and list length (`reduce_retracing`); its new axes are taken
    with expand_dims, so the generalised loop still converts with builtins (a strided
    slice with a new axis on unknown shapes has no TFLite builtin: it failed before)."""
    for shape in ((3, 4), (4, 6), (7, 3)):
        tf.function(lambda v: softsort_tf.sinkhorn_rank(v, **SINKHORN_FLOAT32)
                    ).get_concrete_function(tf.TensorSpec(shape, tf.float32))
    cases = {"SinkhornRank[implicit cg]": lambda: softsort_tf.SinkhornRank(**SINKHORN_FLOAT32)}
    x = _inputs()
    model = _model(cases)
    _compare(cases, model, _run(_convert(model, [tf.lite.OpsSet.TFLITE_BUILTINS]), x), x)

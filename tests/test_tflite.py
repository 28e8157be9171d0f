"""TFLite conversion of every layer of the package with TFLite's builtin ops.

One small model per layer of `softsort_tf.__all__` (every `keras.layers.Layer` there,
with its default settings, plus the smooth `KendallEmbedding`, `SinkhornRank` on raw
values (`squash=None`) and each family of the
front-door layers `RankLayer`, `SortLayer`, `TopKLayer` and `QuantileLayer` that defines
the layer's operation) is converted with `tf.lite.OpsSet.TFLITE_BUILTINS` only, run by
`tf.lite.Interpreter` and compared with Keras to float32 accuracy. The models are
gathered into one Keras model with one output per layer, so the whole set costs one
conversion (a failure converts them one by one to name the layers that fail).

The Sinkhorn layers (and the front-door layers, whose default method is 'sinkhorn')
convert with their default settings, the float64 implicit backward included: its
forward is float32 (docs/deploy.md, "TFLite"). Their conversion is `slow` (~13 s of CPU)
but for one (`SinkhornRank` after traces at other shapes); the other layers cost ~14 s
of CPU (one conversion of 20 layers).

Shapes are static (batch 2, lists of 5): LapSum computes its sums in float32 only for a
list length known at trace time (`softsort_tf.ops.lapsum.FLOAT32_SUMS_UP_TO`).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import softsort_tf
from softsort_tf.ops import family as family_module

BATCH, N = 2, 5
FRONT_DOOR = ("RankLayer", "SortLayer", "TopKLayer", "QuantileLayer")


def _is_sinkhorn(case: str) -> bool:
    """Whether the case is a Sinkhorn layer (by name, or a front-door layer's default)."""
    return case.startswith("Sinkhorn") or case in FRONT_DOOR


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
    cases["KendallEmbedding[smooth]"] = lambda: softsort_tf.KendallEmbedding(smooth_scale=0.5)
    cases["KendallEmbedding[smooth, signed]"] = lambda: softsort_tf.KendallEmbedding(
        smooth_scale=0.5, signed=True)
    # Raw values (no squash): the cost is formed from the values moved onto the targets.
    cases["SinkhornRank[squash=None]"] = lambda: softsort_tf.SinkhornRank(squash=None,
                                                                          epsilon=0.1)
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
    function, whose variables the converter freezes into constants (no `trackable_obj`:
    no SavedModel round trip; the interpreter would not initialise resource variables).
    No conversion metadata is embedded (it is no op and no value of the model)."""
    spec = tf.TensorSpec([BATCH, N], tf.float32)
    fn = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([fn])
    converter.target_spec.supported_ops = ops
    converter.exclude_conversion_metadata = True
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
    for name in FRONT_DOOR:
        assert name in layers
    assert "RankLayer[lapsum]" in cases and "SortLayer[permutahedron]" in cases
    sinkhorn = {name for name in cases if _is_sinkhorn(name)}
    assert len(sinkhorn) == 11 and "SinkhornPermutation" in sinkhorn, sinkhorn


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
    """Every case but the Sinkhorn ones (the slow test below): ~14 s of CPU."""
    _check_builtin_conversion({k: v for k, v in layer_cases().items() if not _is_sinkhorn(k)})


@pytest.mark.slow  # eleven Sinkhorn models in one conversion: ~13 s of CPU
def test_sinkhorn_layers_with_their_defaults_convert_with_builtin_ops():
    _check_builtin_conversion({k: v for k, v in layer_cases().items() if _is_sinkhorn(k)})


def test_sinkhorn_converts_after_traces_at_other_shapes():
    """The Sinkhorn loop's graph function generalises to unknown shapes once it has seen
    a second batch size and list length (`reduce_retracing`); its new axes are taken
    with expand_dims, so the generalised loop still converts with builtins (a strided
    slice with a new axis on unknown shapes has no TFLite builtin). With the default
    settings: the float64 implicit backward leaves the forward in float32."""
    for shape in ((3, 4), (4, 6), (7, 3)):
        tf.function(softsort_tf.sinkhorn_rank).get_concrete_function(
            tf.TensorSpec(shape, tf.float32))
    cases = {"SinkhornRank": softsort_tf.SinkhornRank}
    x = _inputs()
    model = _model(cases)
    _compare(cases, model, _run(_convert(model, [tf.lite.OpsSet.TFLITE_BUILTINS]), x), x)

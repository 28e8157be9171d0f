"""Tests of `softsort_tf.layers.soft`, the front-door layers (`RankLayer`,
`SortLayer`, `TopKLayer`, `QuantileLayer`): the values and finite gradients
of the front door, Keras masking, mixed precision, config and `.keras` round trips,
dynamic shapes and XLA."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import softsort_tf as ss

# (temperature, method_kwargs) of each family in these tests.
FAMILIES = {
    "sinkhorn": (0.05, None), "lapsum": (0.3, None),
    "permutahedron": (0.3, {"regularization": "kl"}),
    "softsort": (0.3, {"distance_power": 2.0}), "neuralsort": (0.3, None),
    "sorting_network": (5.0, {"network": "bitonic"})}
assert set(FAMILIES) == set(ss.FAMILIES)  # a new family gets these tests
LAYERS = {  # layer class, its operation's front door, its leading arguments
    "rank": (ss.RankLayer, ss.soft_rank, ()),
    "sort": (ss.SortLayer, ss.soft_sort, ()),
    "topk": (ss.TopKLayer, ss.soft_topk, (2,)),
    "quantile": (ss.QuantileLayer, ss.soft_quantile, ([0.25, 0.5],)),
}
CASES = [(operation, method) for operation in LAYERS for method in FAMILIES
         if operation in ss.FAMILIES[method].operations]


def _layer(operation, method, **kwargs):
    cls, _, args = LAYERS[operation]
    temperature, method_kwargs = FAMILIES[method]
    return cls(*args, method=method, temperature=temperature, method_kwargs=method_kwargs,
               **kwargs)


def _front_door(operation, method, x, **kwargs):
    _, fn, args = LAYERS[operation]
    temperature, method_kwargs = FAMILIES[method]
    return fn(x, *args, method=method, temperature=temperature, **(method_kwargs or {}),
              **kwargs)


@pytest.mark.parametrize("operation,method", CASES)
def test_layer_is_the_front_door_with_its_config(operation, method):
    x = np.random.default_rng(1).normal(size=(3, 4, 6)).astype(np.float32)
    direction = "DESCENDING"
    layer = _layer(operation, method, direction=direction, axis=1)
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = layer(x)
        value = tf.reduce_sum(tf.square(out))
    assert np.all(np.isfinite(tape.gradient(value, x).numpy()))
    expected = _front_door(operation, method, x, direction=direction, axis=1)
    assert np.all(np.isfinite(out.numpy()))
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)
    assert tuple(layer.compute_output_shape(x.shape)) == tuple(out.shape)
    config = layer.get_config()
    assert config["method"] == method and config["direction"] == direction
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    np.testing.assert_array_equal(clone(x).numpy(), out.numpy())


def test_default_directions_and_sinkhorn_settings():
    assert ss.RankLayer().direction == "ASCENDING"
    assert ss.TopKLayer(1).direction == "DESCENDING"
    layer = ss.RankLayer(temperature=1e-3, squash="atan", threshold=1e-5)
    config = layer.get_config()
    assert (config["epsilon"], config["squash"], config["threshold"]) == (1e-3, "atan", 1e-5)
    x = np.random.default_rng(2).normal(size=(2, 5)).astype(np.float32)
    np.testing.assert_allclose(
        layer(x).numpy(),
        ss.sinkhorn_rank(x, epsilon=1e-3, squash="atan", threshold=1e-5).numpy(), rtol=1e-6)


def test_bad_arguments_raise_at_construction():
    cases = [
        (lambda: ss.RankLayer("bubble"), "`method`"),
        (lambda: ss.QuantileLayer(0.5, "softsort"), "quantile"),
        (lambda: ss.TopKLayer(1, "permutahedron"), "topk"),
        (lambda: ss.RankLayer("lapsum", temperature=-1.0), "`temperature`"),
        (lambda: ss.RankLayer("lapsum", epsilon=1e-3), "method='sinkhorn'"),
        (lambda: ss.SortLayer("softsort", squash="atan"), "method='sinkhorn'"),
        (lambda: ss.RankLayer(method_kwargs={"squash": "atan"}), "`method_kwargs`"),
        (lambda: ss.RankLayer("permutahedron", method_kwargs={"regularization": "x"}),
         "`regularization`"),
        (lambda: ss.RankLayer("neuralsort", method_kwargs={"tau": 1.0}), "`tau`"),
        (lambda: ss.RankLayer(temperature=1e-2, epsilon=1e-3), "`temperature` and"),
        (lambda: ss.TopKLayer(0, "softsort"), "`k`"),
        (lambda: ss.TopKLayer(1.5, "softsort"), "`k`"),
        (lambda: ss.QuantileLayer(1.5, "lapsum"), "`quantiles`"),
        (lambda: ss.RankLayer("lapsum", direction="UP"), "`direction`"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError, match=message):
            make()
    assert ss.TopKLayer(1.5, "lapsum").k == 1.5  # LapSum takes a real k


@pytest.mark.parametrize("method", ["sinkhorn", "lapsum", "softsort"])
def test_keras_mask_is_the_operator_mask(method):
    lengths = np.array([6, 4, 2])
    valid = np.arange(6)[None, :] < lengths[:, None]
    x = np.where(valid, np.random.default_rng(3).normal(size=(3, 6)), 0.0).astype(np.float32)
    inputs = keras.Input((None, 1))
    scores = keras.layers.Masking(0.0)(inputs)  # a [batch, n] mask of [batch, n, 1]
    for operation in ("rank", "sort", "topk"):
        layer = _layer(operation, method)
        out = layer(x, mask=valid)
        expected = _front_door(operation, method, x, mask=valid)
        np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)
        mask = layer.compute_mask(tf.constant(x), tf.constant(valid))
        expected_mask = valid if operation != "sort" else np.sort(valid, -1)[:, ::-1]
        np.testing.assert_array_equal(mask.numpy(), expected_mask)
        model = keras.Model(inputs, type(layer).from_config({**layer.get_config(),
                                                             "axis": 1})(scores))
        np.testing.assert_allclose(model(x[..., None]).numpy(), expected.numpy()[..., None],
                                   rtol=1e-6, atol=1e-6)
    quantile = _layer("quantile", "lapsum")
    assert quantile.compute_mask(tf.constant(x), tf.constant(valid)) is None
    np.testing.assert_allclose(
        quantile(x, mask=valid).numpy(), _front_door("quantile", "lapsum", x, mask=valid))


def test_permutahedron_layer_rejects_a_mask():
    layer = _layer("rank", "permutahedron")
    with pytest.raises(ValueError, match="mask"):
        layer(np.ones((1, 3), np.float32), mask=np.array([[True, True, False]]))


def test_mixed_precision_computes_in_float32():
    x = np.random.default_rng(4).normal(size=(2, 5)).astype(np.float32)
    policy = keras.config.dtype_policy()
    try:
        keras.config.set_dtype_policy("mixed_float16")
        for operation, method in (("rank", "lapsum"), ("sort", "softsort"),
                                  ("topk", "sinkhorn"), ("quantile", "lapsum")):
            layer = _layer(operation, method)
            out = layer(tf.constant(x, tf.float16))
            assert out.dtype == tf.float32 and np.all(np.isfinite(out.numpy()))
            np.testing.assert_allclose(
                out.numpy(), _front_door(operation, method, x.astype(np.float16)
                                         .astype(np.float32)).numpy(), rtol=1e-5, atol=1e-5)
    finally:
        keras.config.set_dtype_policy(policy)
    assert _layer("rank", "lapsum", dtype="float64")(x).dtype == tf.float64


def test_model_with_every_layer_saves_reloads_and_runs_under_xla(tmp_path):
    """Dynamic batch and n (`Input((None,))`), a `.keras` round trip, XLA = eager."""
    inputs = keras.Input((None,))
    h = keras.layers.Dense(1)(keras.layers.Reshape((-1, 1))(inputs))
    scores = keras.layers.Reshape((-1,))(h)
    outputs = {
        "rank": ss.RankLayer("sinkhorn", temperature=0.05, squash="atan")(scores),
        "sort": ss.SortLayer("neuralsort", temperature=0.3)(scores),
        "topk": ss.TopKLayer(2, "softsort", temperature=0.3,
                                 method_kwargs={"distance_power": 2.0})(scores),
        "quantile": ss.QuantileLayer([0.25, 0.75], "lapsum", temperature=0.3)(scores),
    }
    model = keras.Model(inputs, outputs)
    path = tmp_path / "soft_layers.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    xla = tf.function(loaded, jit_compile=True, reduce_retracing=True)
    rng = np.random.default_rng(5)
    for batch, n in ((3, 5), (2, 9)):
        x = rng.normal(size=(batch, n)).astype(np.float32)
        expected = model(x)
        for result in (loaded(x), xla(x)) if n == 5 else (loaded(x),):
            for name, value in expected.items():
                assert np.all(np.isfinite(result[name].numpy()))
                np.testing.assert_allclose(result[name].numpy(), value.numpy(), rtol=1e-5,
                                           atol=1e-5, err_msg=name)
        assert expected["quantile"].shape == (batch, 2)


# Every layer with a temperature: `make(value, **layer_kwargs)`, its family, the argument.
TEMPERATURE_LAYERS = {
    "RankLayer-epsilon": (lambda t, **kw: ss.RankLayer(epsilon=t, **kw),
                              "sinkhorn", "epsilon"),
    "RankLayer-temperature": (lambda t, **kw: ss.RankLayer(temperature=t, **kw),
                                  "sinkhorn", "temperature"),
    "SortLayer": (lambda t, **kw: ss.SortLayer("softsort", temperature=t, **kw),
                      "softsort", "temperature"),
    "TopKLayer": (lambda t, **kw: ss.TopKLayer(1, "neuralsort", temperature=t, **kw),
                      "neuralsort", "temperature"),
    "QuantileLayer": (lambda t, **kw: ss.QuantileLayer(0.5, "lapsum", temperature=t,
                                                               **kw),
                          "lapsum", "temperature"),
    "SinkhornRank": (lambda t, **kw: ss.SinkhornRank(epsilon=t, **kw), "sinkhorn", "epsilon"),
    "SinkhornCDF": (lambda t, **kw: ss.SinkhornCDF(options={"epsilon": t}, **kw), "sinkhorn",
                    "epsilon"),
    "SinkhornSort": (lambda t, **kw: ss.SinkhornSort(epsilon=t, **kw), "sinkhorn", "epsilon"),
    "SinkhornQuantile": (lambda t, **kw: ss.SinkhornQuantile(0.5, epsilon=t, **kw),
                         "sinkhorn", "epsilon"),
    "SinkhornQuantileNormalization": (
        lambda t, **kw: ss.SinkhornQuantileNormalization(4, epsilon=t, **kw), "sinkhorn",
        "epsilon"),
    "SinkhornPermutation": (lambda t, **kw: ss.SinkhornPermutation(epsilon=t, **kw),
                            "sinkhorn", "epsilon"),
    "SoftSort": (lambda t, **kw: ss.SoftSort(tau=t, **kw), "softsort", "tau"),
    "NeuralSort": (lambda t, **kw: ss.NeuralSort(tau=t, **kw), "neuralsort", "tau"),
}
def _too_small(family):
    """Below the family's float32 range (`Family.temperature_range`), within float64's:
    e.g. under Sinkhorn's smallest ε in float32 (3.8e-6) or float32's smallest normal
    number (1.2e-38)."""
    return ss.FAMILIES[family].temperature_range("float32")[0] / 10


def _in_range(family):
    return ss.FAMILIES[family].temperature_range("float32")[0] * 10


@pytest.mark.parametrize("name", sorted(TEMPERATURE_LAYERS))
def test_temperature_the_compute_dtype_cannot_hold_is_rejected_at_construction(name):
    """The message names the argument, the dtype and the range; float64 holds the same
    value, and the layer then computes finite values."""
    make, family, argument = TEMPERATURE_LAYERS[name]
    low, high = ss.FAMILIES[family].temperature_range("float32")
    with pytest.raises(ValueError, match=rf"`{argument}`.*float32 must be in "
                                         rf"\[{low:.3g}, {high:.3g}\]".replace("+", r"\+")):
        make(_too_small(family))
    if family != "sinkhorn":
        with pytest.raises(ValueError, match=rf"`{argument}`.*float32"):
            make(1e39)  # rounds to inf in float32
    layer = make(_too_small(family), dtype="float64")
    x = tf.constant([[0.3, -1.0, 2.0, 1.0]], tf.float64)
    out = layer(x)
    assert out.dtype == tf.float64 and np.all(np.isfinite(out.numpy()))


@pytest.mark.parametrize("policy", ["mixed_float16"], indirect=True)
def test_temperature_range_of_a_reduced_precision_layer_is_float32s(policy):
    """Under a float16 policy the layers compute in float32: float32's range applies,
    not float16's (whose smallest normal number is 6.1e-5)."""
    for make, family, argument in TEMPERATURE_LAYERS.values():
        with pytest.raises(ValueError, match=rf"`{argument}`.*float32"):
            make(_too_small(family))
        make(_in_range(family))  # in float32's range


def test_temperature_range_follows_a_float64_global_policy():
    policy = keras.config.dtype_policy()
    try:
        keras.config.set_dtype_policy("float64")
        for make, family, _ in TEMPERATURE_LAYERS.values():
            make(_too_small(family))
    finally:
        keras.config.set_dtype_policy(policy)

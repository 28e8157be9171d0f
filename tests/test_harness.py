"""The test harness itself (`tests/conftest.py`): `fit` on arrays builds the training
state from the first batch before Keras traces its step, so the step is traced once, with
or without sample weights; Keras' own order (marker `keras_default_build`) traces it twice."""

import keras
import numpy as np
import pytest


def _fit_tracing_count(sample_weight: bool) -> int:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    x = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    weights = np.linspace(0.5, 1.5, 8).astype(np.float32) if sample_weight else None
    traces = []
    train_step = model.train_step

    def counted(data):  # runs once per trace of the compiled step, not per step
        traces.append(1)
        return train_step(data)

    model.train_step = counted
    model.fit(x, y, sample_weight=weights, batch_size=4, epochs=1, verbose=0)
    return len(traces)


@pytest.mark.parametrize("sample_weight", [False, True])
def test_fit_on_arrays_traces_its_step_once(sample_weight):
    assert _fit_tracing_count(sample_weight) == 1


@pytest.mark.keras_default_build
def test_keras_own_order_traces_the_step_twice():
    assert _fit_tracing_count(False) == 2

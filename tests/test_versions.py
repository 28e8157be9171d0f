"""The versions the package declares are the versions its tests run on (issue 43).

- `setup.cfg`'s lower bounds of tensorflow, keras and numpy are the pins of
  `constraints/oldest.txt` (`make test-oldest`), and the pins of `constraints/newest.txt`
  (`make test`) lie within its bounds;
- the TensorFlow and Keras running these tests are within the declared range;
- `softsort_tf._keras` imports and reads a tensor's Keras mask on a Keras without the
  `get_keras_mask` accessor (before Keras 3.6 the mask is the `_keras_mask` attribute).
"""

from __future__ import annotations

import configparser
import importlib.util
import pathlib
import sys
from importlib import metadata

import keras
import numpy as np
import pytest
import tensorflow as tf
from packaging.requirements import Requirement
from packaging.version import Version

import softsort_tf._keras as keras_contracts

ROOT = pathlib.Path(__file__).resolve().parent.parent
PINNED = ("tensorflow", "keras", "numpy")


def _declared() -> dict[str, Requirement]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    requirements = [Requirement(line.split("#")[0].strip())
                    for line in config["options"]["install_requires"].splitlines()
                    if line.split("#")[0].strip()]
    return {r.name.lower(): r for r in requirements}


def _pins(name: str) -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints" / name).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            pins[requirement.name.lower()] = Version(spec.version)
    return pins


def _lower_bound(requirement: Requirement) -> Version:
    (bound,) = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    return bound


@pytest.mark.parametrize("name", PINNED)
def test_the_oldest_constraints_pin_the_declared_lower_bounds(name):
    declared, oldest = _declared()[name], _pins("oldest.txt")[name]
    assert oldest in declared.specifier, (name, str(oldest), str(declared))
    lower = _lower_bound(declared)
    assert oldest.release[:len(lower.release)] == lower.release, (name, str(oldest), str(lower))


@pytest.mark.parametrize("name", PINNED)
def test_the_newest_constraints_are_within_the_declared_range(name):
    declared, newest = _declared()[name], _pins("newest.txt")[name]
    assert newest in declared.specifier, (name, str(newest), str(declared))


@pytest.mark.parametrize("name", ["tensorflow", "keras"])
def test_the_installed_versions_are_within_the_declared_range(name):
    installed = Version(metadata.version(name))
    assert installed in _declared()[name].specifier, (name, str(installed))


def test_the_keras_mask_without_keras_accessor(monkeypatch):
    """`softsort_tf/_keras.py` loaded afresh where Keras has no `get_keras_mask` (as
    Keras < 3.6): it imports, and reads the mask from the tensor's `_keras_mask`."""
    import keras.src.backend

    monkeypatch.delattr(keras.backend, "get_keras_mask", raising=False)
    monkeypatch.delattr(keras.src.backend, "get_keras_mask", raising=False)
    spec = importlib.util.spec_from_file_location("keras_contracts_without_accessor",
                                                  keras_contracts.__file__)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # as an import registers it
    spec.loader.exec_module(module)
    x = tf.constant([[1.0, 2.0, 0.0]])
    assert module.get_keras_mask(x) is None
    x._keras_mask = tf.constant([[True, True, False]])
    np.testing.assert_array_equal(module.get_keras_mask(x), [[True, True, False]])


def test_the_keras_mask_of_a_masking_layer():
    masked = keras.layers.Masking(mask_value=0.0)(tf.constant([[[1.0], [2.0], [0.0]]]))
    np.testing.assert_array_equal(keras_contracts.get_keras_mask(masked), [[True, True, False]])

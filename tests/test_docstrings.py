"""Every module's docstring examples run as doctests, so that they cannot rot.

Each example may use `np`, `tf` and `keras` (imported as in the README) besides the
names of its own module.
"""

import doctest
import importlib
import pkgutil

import keras
import numpy as np
import pytest
import tensorflow as tf

import softsort_tf

MODULES = sorted(
    name for _, name, _ in pkgutil.walk_packages(softsort_tf.__path__, "softsort_tf."))
# Modules whose public classes or functions must carry at least one example.
MUST_HAVE_EXAMPLES = ("softsort_tf.layers.", "softsort_tf.losses.", "softsort_tf.metrics.",
                      "softsort_tf.ops.sinkhorn", "softsort_tf.ops.family",
                      "softsort_tf.options")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    globs = {**vars(module), "np": np, "tf": tf, "keras": keras}
    result = doctest.testmod(module, extraglobs=globs, optionflags=doctest.ELLIPSIS,
                             verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} doctest(s) of {name} failed"
    if name.startswith(MUST_HAVE_EXAMPLES) and not name.endswith(("__init__", ".base")):
        assert result.attempted > 0, f"{name} has no docstring example"


def test_every_public_layer_has_an_example():
    missing = [name for name in dir(softsort_tf)
               if isinstance(getattr(softsort_tf, name), type)
               and issubclass(getattr(softsort_tf, name), keras.layers.Layer)
               and ">>>" not in (getattr(softsort_tf, name).__doc__ or "")]
    assert not missing, f"public layers without a docstring example: {missing}"


def test_each_convention_is_written_once_and_filled_everywhere():
    """The shared argument conventions come from `softsort_tf._docs` (one text each):
    every public docstring has its placeholders filled, and the entry points that take
    `method=` state the method, temperature, direction, axis and mask the same way."""
    import re

    from softsort_tf import _docs

    placeholder = re.compile(r"^\s*\{[a-z_]+\}\s*$", re.MULTILINE)
    for name in softsort_tf.__all__:
        doc = getattr(getattr(softsort_tf, name), "__doc__", None) or ""
        assert not placeholder.search(doc), f"{name}: unfilled docstring fragment"

    def normalized(text):
        return " ".join(text.split())

    expected = {
        "soft_rank": ("method", "direction", "axis", "mask", "temperature"),
        "soft_sort": ("method", "direction", "axis", "mask", "temperature"),
        "soft_topk": ("method", "direction", "axis", "mask", "temperature"),
        "soft_quantile": ("method", "direction", "axis", "mask", "temperature"),
        "SpearmanLoss": ("method", "method_kwargs"),
        "SoftTopKLoss": ("method", "method_kwargs"),
    }
    for name, fragments in expected.items():
        doc = normalized(getattr(softsort_tf, name).__doc__)
        for fragment in fragments:
            assert normalized(_docs.FRAGMENTS[fragment]) in doc, (name, fragment)
    layer_doc = normalized(softsort_tf.layers.soft._SoftLayer.__doc__)
    for fragment in ("method", "temperature", "direction", "axis", "method_kwargs"):
        assert normalized(_docs.FRAGMENTS[fragment]) in layer_doc, fragment


def _template_gaps(name, obj):
    """What the public docstring of `obj` lacks from the template: an example, and an
    Args section (a function with parameters, a class that is not a warning: "Args:" or,
    for a record, "Attributes:"), and a Returns section (a function that returns)."""
    import inspect

    doc = inspect.getdoc(obj) or ""
    gaps = [] if ">>>" in doc else ["an example"]
    if inspect.isfunction(obj):
        signature = inspect.signature(obj)
        if signature.parameters and "Args:" not in doc:
            gaps.append("Args:")
        if signature.return_annotation not in (None, "None") and "Returns:" not in doc:
            gaps.append("Returns:")
    elif not issubclass(obj, Warning) and "Args:" not in doc and "Attributes:" not in doc:
        gaps.append("Args: or Attributes:")
    return gaps


def test_every_public_docstring_follows_the_template():
    """Each public function and class says what it takes, what it returns and shows it
    (docs/api.md: every docstring gives the arguments, shapes, defaults and an example)."""
    import inspect

    gaps = {}
    for name in softsort_tf.__all__:
        obj = getattr(softsort_tf, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            if missing := _template_gaps(name, obj):
                gaps[name] = missing
    assert not gaps, f"public docstrings short of the template: {gaps}"

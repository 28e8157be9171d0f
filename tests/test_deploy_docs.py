"""docs/deploy.md holds: its ```python blocks run, in order, in one namespace (the `.keras`
round trip, the SavedModel export and its gradients, TFLite with builtin ops, XLA), and
the SavedModel it exports is served by a process where `import softsort_tf` fails, with
the gradients and the custom-gradient warning the page describes."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "deploy.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """The namespace after every python block of docs/deploy.md, and the folder they ran
    in (it holds ranker.keras and ranker_savedmodel/)."""
    folder = tmp_path_factory.mktemp("deploy")
    namespace = {"__name__": "__deploy_md__"}
    here = os.getcwd()
    os.chdir(folder)
    try:
        for i, block in enumerate(python_blocks()):
            exec(compile(block, f"docs/deploy.md python block {i}", "exec"), namespace)  # noqa: S102
    finally:
        os.chdir(here)
    return namespace, folder


# TensorFlow's note that tf.lite.Interpreter moves to the ai_edge_litert package.
@pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated:UserWarning")
def test_deploy_examples_run(deployed):
    namespace, folder = deployed
    assert len(python_blocks()) >= 6
    assert (folder / "ranker.keras").is_file()
    assert (folder / "ranker_savedmodel" / "saved_model.pb").is_file()
    # The signature's input is named after the Keras input, as the TF Serving request uses.
    (spec,) = namespace["signature"].structured_input_signature[1].values()
    assert list(namespace["signature"].structured_input_signature[1]) == ["scores"]
    assert spec.shape.as_list() == [None, 8]
    assert np.isfinite(namespace["expected"]).all() and np.isfinite(namespace["tflite_ranks"]).all()


# Run in a fresh interpreter, in the folder of the export, where softsort_tf cannot be
# imported: serves the SavedModel, takes its gradient, tries a second-order gradient and
# the `.keras` file, and prints what happened as JSON on its last line.
_SERVE_WITHOUT_PACKAGE = textwrap.dedent("""
    import importlib.abc
    import json
    import sys

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "softsort_tf" or name.startswith("softsort_tf."):
                raise ImportError(f"{name} is blocked in this process")
            return None

    sys.meta_path.insert(0, Blocker())

    import keras
    import numpy as np
    import tensorflow as tf

    data = np.load("reference.npz")
    reloaded = tf.saved_model.load("ranker_savedmodel")
    x = tf.constant(data["x"])

    def loss_of(inputs):
        return tf.reduce_sum(reloaded.serve(inputs) * tf.range(1.0, 9.0))

    y = reloaded.serve(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = loss_of(x)
    gradient = tape.gradient(loss, x)
    try:  # a gradient penalty: the gradient taken under another tape
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                loss = loss_of(x)
            penalty = tf.reduce_sum(inner.gradient(loss, x) ** 2)
        outer.gradient(penalty, x)
        second_order = "ok"
    except LookupError as error:
        second_order = str(error)
    try:
        keras.models.load_model("ranker.keras")
        keras_file = "loaded"
    except Exception as error:
        keras_file = str(error)
    print(json.dumps({
        "softsort_tf_imported": any(m.startswith("softsort_tf") for m in sys.modules),
        "output_error": float(np.max(np.abs(y.numpy() - data["expected"]))),
        "gradient_error": float(np.max(np.abs(gradient.numpy() - data["gradient"]))),
        "gradient_finite": bool(np.isfinite(gradient.numpy()).all()),
        "second_order": second_order,
        "keras_file": keras_file,
    }))
""")


@pytest.mark.slow
def test_the_export_is_served_without_softsort_tf(deployed):
    """The LapSum model's SavedModel, in a process that cannot import softsort_tf: its
    outputs and first-order gradients are the live model's; loading prints TensorFlow's
    custom-gradient warning and a second-order gradient fails, as the page says; the
    `.keras` file cannot be loaded there (it needs the package)."""
    namespace, folder = deployed
    x = namespace["x"]
    np.savez(folder / "reference.npz", x=x, expected=namespace["expected"],
             gradient=namespace["input_gradient"](namespace["model"]))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", _SERVE_WITHOUT_PACKAGE], cwd=folder,
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["softsort_tf_imported"]
    assert result["output_error"] <= 1e-6, result
    assert result["gradient_finite"] and result["gradient_error"] <= 1e-5, result
    assert re.search(r"Importing a function \(__inference_internal_grad_fn_\d+\) with ops with "
                     r"unsaved custom gradients", proc.stderr)
    assert "No gradient defined for operation" in result["second_order"]
    assert "IdentityN" in result["second_order"]
    assert "Could not locate class 'RankLayer'" in result["keras_file"]

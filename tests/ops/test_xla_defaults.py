"""Every operator family compiled by XLA with XLA's default flags, against eager.

The test processes compile XLA programs with LLVM's optimisation level 0 and XLA:CPU's
classic fusion code generator (`tests/conftest.py`), which compile several times faster
than the defaults and run the same HLO. Users' programs are compiled with the defaults:
this test compiles the values and gradients of every method's ranks in a child process
without `XLA_FLAGS`, and compares them with eager ones.
"""

import json
import os
import subprocess
import sys

import numpy as np

CHILD = r'''
import json
import numpy as np
import tensorflow as tf
import softsort_tf as ss

x = tf.constant(np.random.RandomState(3).randn(2, 7), tf.float32)
weights = tf.constant(np.random.RandomState(4).randn(2, 7), tf.float32)
CALLS = {"rank": lambda v, m: ss.soft_rank(v, method=m)}
# Every method's ranks: each family's whole forward and backward (the other read-outs of
# a family are a few ops after the same solve, compiled under the test flags elsewhere).
CASES = [(m, "rank") for m in ss.METHODS]


def values_and_gradients(v):
    out = {}
    for method, op in CASES:
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = CALLS[op](v, method)
            loss = tf.reduce_sum(tf.sin(y) * tf.reduce_mean(weights))
        out[f"{method}/{op}"] = (y, tape.gradient(loss, v))
    return out


eager = values_and_gradients(x)
xla = tf.function(values_and_gradients, jit_compile=True)(x)
report = {}
for name, (value, grad) in eager.items():
    got_value, got_grad = (t.numpy() for t in xla[name])
    report[name] = {
        "finite": bool(np.all(np.isfinite(got_value)) and np.all(np.isfinite(got_grad))),
        "value": float(np.max(np.abs(got_value - value.numpy()))),
        "grad": float(np.max(np.abs(got_grad - grad.numpy()))),
        "grad_scale": float(np.max(np.abs(grad.numpy()))),
    }
print("REPORT " + json.dumps(report))
'''


def test_every_family_under_xla_with_the_default_flags_equals_eager():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [s for s in proc.stdout.splitlines() if s.startswith("REPORT ")][-1]
    report = json.loads(line[len("REPORT "):])
    methods = {name.split("/")[0] for name in report}
    assert {"sinkhorn", "lapsum", "permutahedron", "softsort", "neuralsort",
            "diffsort"} <= methods, sorted(methods)
    assert len(report) == len(methods), sorted(report)
    for name, r in report.items():
        assert r["finite"], name
        assert r["value"] <= 1e-4, (name, r)
        assert r["grad"] <= 1e-3 * max(1.0, r["grad_scale"]), (name, r)
        assert np.isfinite(r["grad_scale"]) and r["grad_scale"] > 0, (name, r)

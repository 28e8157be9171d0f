"""Every operator family compiled by XLA with XLA's default flags, against eager.

The test processes compile XLA programs with LLVM's optimisation level 0 and XLA:CPU's
classic fusion code generator (`tests/conftest.py`), which compile several times faster
than the defaults and run the same HLO. Users' programs are compiled with the defaults:
this test compiles the values and gradients of every method's ranks in a child process
without `XLA_FLAGS`. It compares them with eager ones and with central differences of
the compiled values, and the ranks of well separated values with the exact ranks.
"""

import json
import os
import subprocess
import sys

import numpy as np

CHILD = r'''
import json
import numpy as np
import scipy.stats
import tensorflow as tf
import softsort_tf as ss

rng = np.random.RandomState(3)
x = rng.randn(2, 7).astype(np.float32)
# Well separated values (gaps of 4 temperatures): every method's ranks are near the exact.
separated = (np.stack([rng.permutation(7) for _ in range(2)]) * 4.0
             + 0.5 * rng.rand(2, 7)).astype(np.float32)
direction = rng.randn(2, 7).astype(np.float32)
weight = 0.7  # loss = weight · Σ sin(ranks)


def values_and_gradients(v):
    out = {}
    for method in ss.FAMILIES:
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = ss.soft_rank(v, method=method)
            loss = weight * tf.reduce_sum(tf.sin(y))
        out[method] = (y, tape.gradient(loss, v))
    return out


xla = tf.function(values_and_gradients, jit_compile=True)
eager = values_and_gradients(tf.constant(x))
at_x, at_separated = xla(x), xla(separated)  # one compile: the same shape
# Central differences of the loss along `direction`, by the compiled program. Steps: the
# ranks read from SoftSort/NeuralSort matrices have kinks (1e-2 crosses one here), the
# Sinkhorn solve stops at its threshold (1e-3 is within its noise).
STEPS = {"sinkhorn": 1e-2}
shifted = {h: (xla(x + h * direction), xla(x - h * direction)) for h in (1e-2, 1e-3)}
report = {}
for name, (value, grad) in eager.items():
    got_value, got_grad = (t.numpy() for t in at_x[name])
    h = STEPS.get(name, 1e-3)
    plus, minus = (weight * float(np.sum(np.sin(out[name][0].numpy().astype(np.float64))))
                   for out in shifted[h])
    report[name] = {
        "finite": bool(np.all(np.isfinite(got_value)) and np.all(np.isfinite(got_grad))),
        "value": float(np.max(np.abs(got_value - value.numpy()))),
        "grad": float(np.max(np.abs(got_grad - grad.numpy()))),
        "grad_scale": float(np.max(np.abs(grad.numpy()))),
        "directional": float(np.sum(got_grad * direction)),
        "finite_difference": (plus - minus) / (2 * h),
        "separated_vs_exact": float(np.max(np.abs(
            at_separated[name][0].numpy() - scipy.stats.rankdata(separated, axis=-1)))),
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
    methods = set(report)
    assert {"sinkhorn", "lapsum", "permutahedron", "softsort", "neuralsort",
            "sorting_network"} <= methods, sorted(methods)
    assert len(report) == len(methods), sorted(report)
    for name, r in report.items():
        assert r["finite"], name
        # The compiled program: eager's values and gradients, ...
        assert r["value"] <= 1e-4, (name, r)
        assert r["grad"] <= 1e-3 * max(1.0, r["grad_scale"]), (name, r)
        assert np.isfinite(r["grad_scale"]) and r["grad_scale"] > 0, (name, r)
        # ... its gradient the derivative of its own values (a wrong sign, a transposed
        # Jacobian), and near-exact ranks of separated values (an off-by-one rank, a
        # reversed order).
        assert abs(r["directional"] - r["finite_difference"]) <= (
            2e-3 + 2e-2 * abs(r["directional"])), (name, r)
        assert r["separated_vs_exact"] <= 0.4, (name, r)  # Sinkhorn's blur: 0.23

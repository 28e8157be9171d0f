"""Time of the implicit backward's linear solve, per solver, with and without XLA.

Forward + backward of `softsort_tf.sinkhorn_rank` (batch `--batch`, float32, ε = 1e-2,
a fixed linear functional of the ranks) for each list length of `--n` and each
`ImplicitDiff.solver` ('dense': float64 Cholesky, 'cg': conjugate gradients in float32,
'auto': the default), compiled as a graph and with XLA. Median of `--repeats` calls
after two warm-up calls. The markdown table goes to stdout (docs/benchmarks.md,
"Implicit backward: Cholesky or conjugate gradients").

    python scripts/bench_implicit_solver.py --n=16,32,64
"""

from __future__ import annotations

import platform
import time

import numpy as np
import tensorflow as tf
from absl import app, flags

import softsort_tf as ss

_N = flags.DEFINE_list("n", ["16", "32", "64"], "List lengths (= numbers of targets).")
_BATCH = flags.DEFINE_integer("batch", 32, "Lists per call.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 7, "Timed calls per figure (median).",
                                lower_bound=1)
SOLVERS = ("dense", "cg", "auto")


def _median_ms(n: int, solver: str, jit: bool) -> float:
    rng = np.random.RandomState(n)
    x = tf.constant(rng.randn(_BATCH.value, n).astype(np.float32))
    w = tf.constant(rng.randn(_BATCH.value, n).astype(np.float32))

    @tf.function(jit_compile=jit)
    def forward_backward(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            ranks = ss.sinkhorn_rank(v, epsilon=1e-2, implicit_diff=ss.ImplicitDiff(solver))
            loss = tf.reduce_sum(ranks * w)
        return tape.gradient(loss, v)

    forward_backward(x).numpy()
    forward_backward(x).numpy()
    times = []
    for _ in range(_REPEATS.value):
        start = time.perf_counter()
        forward_backward(x).numpy()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main(argv):
    del argv
    print(f"sinkhorn_rank forward + backward, batch {_BATCH.value}, float32, ε = 1e-2; "
          f"{platform.machine()}, TF {tf.__version__}; median of {_REPEATS.value} calls\n")
    print("| n | mode | " + " | ".join(f"`{s}` ms" for s in SOLVERS)
          + " | `dense` / `auto` |")
    print("|---|---|" + "---|" * (len(SOLVERS) + 1))
    for n in (int(v) for v in _N.value):
        for jit in (False, True):
            ms = {s: _median_ms(n, s, jit) for s in SOLVERS}
            print(f"| {n} | {'XLA' if jit else 'graph'} | "
                  + " | ".join(f"{ms[s]:.1f}" for s in SOLVERS)
                  + f" | {ms['dense'] / ms['auto']:.1f}× |", flush=True)


if __name__ == "__main__":
    app.run(main)

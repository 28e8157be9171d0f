"""Time to build and first run a graph that calls a Sinkhorn operator (tracing cost).

For each case, `--repeats` new `tf.function`s are traced (a new caller each time, as a
new model, loss or test does) and called once: the CPU seconds of the trace
(`get_concrete_function`) and of the first call (graph instantiation, or the XLA
compile) are averaged. The cases: `sinkhorn_rank` forward on `[4, 9]` float32 with an
unknown list length, as a graph and under XLA, and forward + backward (implicit,
the default) as a graph. The markdown table goes to stdout (docs/benchmarks.md,
"Tracing a Sinkhorn operator"). Run it on two commits to compare them.

    python scripts/bench_trace_time.py --repeats=10
"""

from __future__ import annotations

import platform
import time

import numpy as np
import tensorflow as tf
from absl import app, flags

import softsort_tf as ss

_REPEATS = flags.DEFINE_integer("repeats", 10, "New callers traced per case (mean).",
                                lower_bound=1)
SPEC = tf.TensorSpec([None, None], tf.float32)


def _forward(v):
    return ss.sinkhorn_rank(v, epsilon=1e-2)


def _forward_backward(v):
    with tf.GradientTape() as tape:
        tape.watch(v)
        ranks = ss.sinkhorn_rank(v, epsilon=1e-2)
        loss = tf.reduce_sum(ranks * ranks)
    return tape.gradient(loss, v)


def _cpu_seconds(fn, jit: bool, x) -> tuple[float, float]:
    trace = first_call = 0.0
    for _ in range(_REPEATS.value):
        caller = tf.function(fn, input_signature=[SPEC], jit_compile=jit)
        start = time.process_time()
        caller.get_concrete_function()
        middle = time.process_time()
        caller(x).numpy()
        trace += middle - start
        first_call += time.process_time() - middle
    return trace / _REPEATS.value, first_call / _REPEATS.value


def main(argv):
    del argv
    x = tf.constant(np.random.RandomState(0).randn(4, 9).astype(np.float32))
    _cpu_seconds(_forward_backward, False, x)  # imports and one-time set-up
    print(f"TF {tf.__version__}, {platform.processor() or platform.machine()}, "
          f"mean of {_REPEATS.value} new callers, CPU seconds")
    print("| case | trace s | first call s | total s |")
    print("|---|---|---|---|")
    for name, fn, jit in (("forward, graph", _forward, False),
                          ("forward, XLA", _forward, True),
                          ("forward + backward, graph", _forward_backward, False)):
        trace, first = _cpu_seconds(fn, jit, x)
        print(f"| {name} | {trace:.3f} | {first:.3f} | {trace + first:.3f} |")


if __name__ == "__main__":
    app.run(main)

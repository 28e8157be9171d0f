"""XLA compile time of a Sinkhorn rank under several `XLA_FLAGS` settings.

For each setting a child process (with that `XLA_FLAGS`) compiles `sinkhorn_rank` of a
`[3, 9]` float32 batch with `jit_compile=True`: the forward alone, the forward with its
implicit gradient (the default) and with its unrolled gradient. The CPU seconds of each
function's first call (the XLA compile and one run) go to stdout as a markdown table
(docs/benchmarks.md, "The test suite's time", which explains the flags the tests use).

    python scripts/bench_xla_compile_flags.py
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

SETTINGS = {
    "defaults": "",
    "`-O0`": "--xla_backend_optimization_level=0",
    "`-O0`, classic fusion emitter": ("--xla_backend_optimization_level=0 "
                                      "--xla_cpu_use_fusion_emitters=false"),
}
CASES = ("forward", "implicit", "unrolled")


def _child() -> None:
    import time

    import numpy as np
    import tensorflow as tf

    import softsort_tf as ss

    x = tf.constant(np.random.RandomState(10).randn(3, 9), tf.float32)

    def make(case):
        options = {"implicit_diff": None} if case == "unrolled" else {}

        def f(v):
            with tf.GradientTape() as tape:
                tape.watch(v)
                out = ss.sinkhorn_rank(v, **options)
                loss = tf.reduce_sum(tf.sin(out))
            return out if case == "forward" else (out, tape.gradient(loss, v))
        return tf.function(f, jit_compile=True)

    seconds = {}
    for case in CASES:
        fn = make(case)
        fn.get_concrete_function(x)  # the trace, not timed
        start = time.process_time()
        fn(x)
        seconds[case] = time.process_time() - start
    print("RESULT " + json.dumps(seconds))


def main() -> None:
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print("| XLA flags | forward | forward + implicit gradient | forward + unrolled gradient |")
    print("|---|---|---|---|")
    for name, flags in SETTINGS.items():
        env = dict(os.environ, XLA_FLAGS=flags, TF_CPP_MIN_LOG_LEVEL="3")
        if not flags:
            env.pop("XLA_FLAGS")
        out = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True,
                             capture_output=True, text=True).stdout
        result = json.loads(out.split("RESULT ", 1)[1])
        print(f"| {name} | " + " | ".join(f"{result[c]:.2f}" for c in CASES) + " |")


if __name__ == "__main__":
    _child() if sys.argv[1:] == ["--child"] else main()

"""Large-n benchmark: Sinkhorn quantiles, top-k masks and ranks against `tf.sort`.

Each problem is one row of n standard normal float32 values. For each operator the
script times forward + backward (the gradient of a fixed linear functional of the
output w.r.t. x) eagerly and under XLA, next to `tf.sort` forward + backward of the
same vector in the same process, and prints the ratio operator / `tf.sort`. It also
records the Sinkhorn iterations and the final marginal error, so that eager and XLA
convergence can be compared.

Goal (issue "Accuracy at a given ε ... large n"): the m = 3 quantile of 10⁶ values
within 10x of `tf.sort`, with a cost linear in n (see the n sweep).

    python scripts/bench_large_n.py --markdown=/tmp/large_n.md

Timings are the median of `--repeats` calls after one untimed call (tracing,
compilation). No GPU was available to us: the recorded numbers are CPU numbers.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

_QUANTILE_NS = flags.DEFINE_list("quantile_ns", ["10000", "100000", "1000000"],
                                 "Sizes n of the m = 3 quantile (and top-k) problems.")
_RANK_NS = flags.DEFINE_list("rank_ns", ["2000", "20000"], "Sizes n of the rank problems.")
_TOPK = flags.DEFINE_integer("topk", 10, "k of the top-k mask.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per measurement (median).")
_MODES = flags.DEFINE_list("modes", ["eager", "xla"], "eager and/or xla.")
_MARKDOWN = flags.DEFINE_string("markdown", None, "Also write the table to this file.")


def _machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in out.splitlines()
                     if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        model = platform.processor() or "unknown CPU"
    return f"{model}, {os.cpu_count()} cores"


def _operators(k: int):
    import softsort_tf as ss

    return {
        "quantile m=3": lambda v: ss.sinkhorn_quantile(v, [0.1, 0.5, 0.9], return_info=True),
        f"top-{k} mask": lambda v: ss.sinkhorn_topk(v, k, return_info=True),
        "ranks": lambda v: ss.sinkhorn_rank(v, return_info=True),
        "tf.sort": lambda v: (__import__("tensorflow").sort(v), None),
    }


def _step(fn):
    import tensorflow as tf

    def step(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            out, info = fn(v)
            weights = tf.cast(tf.range(1, tf.size(out) + 1), out.dtype)
            value = tf.reduce_sum(tf.reshape(out, [-1]) * weights)
        return tape.gradient(value, v), info

    return step


def measure(name: str, fn, n: int, mode: str, repeats: int) -> dict:
    import tensorflow as tf

    x = tf.constant(np.random.default_rng(n).normal(size=(1, n)), tf.float32)
    step = _step(fn)
    if mode == "xla":
        step = tf.function(step, jit_compile=True)
    grad, info = step(x)  # untimed: tracing, compilation
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        grad, info = step(x)
        _ = grad.numpy()
        times.append(time.perf_counter() - start)
    row = dict(op=name, n=n, mode=mode, seconds=float(np.median(times)),
               finite=bool(np.all(np.isfinite(grad.numpy()))))
    if info is not None:
        row.update(iterations=int(info.num_iterations.numpy().max()),
                   error=float(info.error.numpy().max()))
    return row


def main(argv):
    del argv
    ops = _operators(_TOPK.value)
    plan = [(name, int(n)) for n in _QUANTILE_NS.value
            for name in ("quantile m=3", f"top-{_TOPK.value} mask", "tf.sort")]
    plan += [(name, int(n)) for n in _RANK_NS.value for name in ("ranks", "tf.sort")]
    rows, sort_time = [], {}
    for name, n in dict.fromkeys(plan):
        for mode in _MODES.value:
            row = measure(name, ops[name], n, mode, _REPEATS.value)
            rows.append(row)
            if name == "tf.sort":
                sort_time[(n, mode)] = row["seconds"]
            print(row, flush=True)
    lines = [f"Machine: {_machine()}; date {time.strftime('%Y-%m-%d')}; "
             f"TF {__import__('tensorflow').__version__}; median of {_REPEATS.value}.",
             "",
             "| operator | n | mode | fwd+bwd (s) | / tf.sort | iterations | error |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        if row["op"] == "tf.sort":
            continue
        ratio = row["seconds"] / sort_time[(row["n"], row["mode"])]
        lines.append(f"| {row['op']} | {row['n']:,} | {row['mode']} | {row['seconds']:.3f} | "
                     f"{ratio:.1f}x | {row.get('iterations', '')} | "
                     f"{row.get('error', float('nan')):.1e} |")
    for n in sorted({n for n, _ in sort_time}):
        for mode in _MODES.value:
            lines.append(f"| tf.sort | {n:,} | {mode} | {sort_time[(n, mode)]:.4f} | 1x | | |")
    table = "\n".join(lines)
    print(table)
    if _MARKDOWN.value:
        with open(_MARKDOWN.value, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    app.run(main)

"""Time one operator at two revisions of the package, side by side.

A forward + backward of `soft_rank(x, method)` (loss Σ rank², float32 scores `[batch,
n]`, standard normal, seed 0) under `tf.function`, without and with XLA, at each
revision: the checkout this script runs from ("new") and `--base` (a git revision,
checked out into a temporary worktree). Each revision runs in its own process (one
package per process); the processes alternate base, new, base, new ... for `--rounds`
rounds, and each round's new/base ratio is taken pair by pair, so that a drift of the
machine's speed falls on both. Per process and configuration: one untimed call
(tracing, XLA compilation), then the median of `--repeats` timings of 10 calls.

`--case=new_lengths` times instead what a caller of one list length at a time meets:
eager forward + backward calls on `[batch, n]` for each n of `--ns` in turn (each a new
shape: traces and XLA compiles included), the seconds of the whole sweep, then of the
same sweep again (every shape seen).

Usage:
  python scripts/bench_revisions.py --base=c44bce7~1 --methods=softsort,neuralsort \\
      --ns=8,64,512 --rounds=3
  python scripts/bench_revisions.py --base=HEAD~1 --case=new_lengths \\
      --methods=permutahedron --ns=20,23,26,29,32,40,50,60 --rounds=3

Prints a Markdown table: the median time of each revision (ms per call, or seconds per
sweep) and the median, min and max of the paired ratios new/base (> 1: the new revision
is slower).
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("base", "HEAD~1", "The git revision to compare with.")
flags.DEFINE_list("methods", ["softsort", "neuralsort"], "Families (`method=`).")
flags.DEFINE_list("ns", ["8", "64", "512"], "List lengths n.")
flags.DEFINE_integer("budget", 2048, "batch = max(1, budget // n) lists per call.")
flags.DEFINE_float("temperature", 0.1, "The families' temperature.")
flags.DEFINE_integer("rounds", 3, "Alternating rounds (pairs of processes).")
flags.DEFINE_integer("repeats", 15, "Timings of 10 calls per configuration.")
flags.DEFINE_enum("case", "steady", ["steady", "new_lengths"],
                  "'steady': ms per call of one compiled shape; 'new_lengths': seconds "
                  "of eager calls on each n of --ns in turn, then again.")
flags.DEFINE_string("child", None, "Internal: time the package at this root, print JSON.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _configs():
    return [(m, int(n), xla) for m in FLAGS.methods for n in FLAGS.ns for xla in (False, True)]


def _child(root: str) -> None:
    sys.path.insert(0, root)
    origin = importlib.util.find_spec("softsort_tf").origin
    assert os.path.abspath(origin).startswith(os.path.abspath(root)), origin
    import numpy as np
    import tensorflow as tf

    import softsort_tf as ss

    def forward_backward(x, method):
        with tf.GradientTape() as tape:
            tape.watch(x)
            r = ss.soft_rank(x, method, temperature=FLAGS.temperature)
            loss = tf.reduce_sum(r * r)
        return tape.gradient(loss, x)

    times = {}
    if FLAGS.case == "new_lengths":
        for method in FLAGS.methods:
            xs = [tf.constant(np.random.default_rng(int(n)).normal(
                size=[max(1, FLAGS.budget // int(n)), int(n)]).astype(np.float32))
                for n in FLAGS.ns]
            for sweep in ("first", "again"):
                start = time.perf_counter()
                for x in xs:
                    forward_backward(x, method).numpy()
                times[f"{method}|{sweep}"] = time.perf_counter() - start
        print("RESULT " + json.dumps(times))
        return
    for method, n, xla in _configs():
        batch = max(1, FLAGS.budget // n)
        x = tf.constant(np.random.default_rng(0).normal(size=[batch, n]).astype(np.float32))

        step = tf.function(lambda x, method=method: forward_backward(x, method),
                           jit_compile=xla)

        step(x).numpy()
        runs = []
        for _ in range(FLAGS.repeats):
            start = time.perf_counter()
            for _ in range(10):
                y = step(x)
            y.numpy()
            runs.append((time.perf_counter() - start) / 10)
        times[f"{method}|{n}|{int(xla)}"] = statistics.median(runs) * 1e3
    print("RESULT " + json.dumps(times))


def _run(root: str) -> dict:
    args = [sys.executable, os.path.abspath(__file__), f"--child={root}",
            f"--methods={','.join(FLAGS.methods)}", f"--ns={','.join(FLAGS.ns)}",
            f"--budget={FLAGS.budget}", f"--temperature={FLAGS.temperature}",
            f"--repeats={FLAGS.repeats}", f"--case={FLAGS.case}"]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout
    line = next(line for line in out.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _paired(rounds, key: str, digits: int) -> str:
    """The table cells of `key`: the median of each revision over the rounds, and the
    median, min and max of the rounds' ratios new/base."""
    base = [b[key] for b, _ in rounds]
    new = [nw[key] for _, nw in rounds]
    ratios = sorted(nw / b for b, nw in zip(base, new, strict=True))
    return (f"{statistics.median(base):.{digits}f} | {statistics.median(new):.{digits}f} "
            f"| {statistics.median(ratios):.2f} ({ratios[0]:.2f}–{ratios[-1]:.2f})")


def main(argv):
    del argv
    if FLAGS.child:
        _child(FLAGS.child)
        return
    base_rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", FLAGS.base],
                              check=True, capture_output=True, text=True).stdout.strip()
    new_rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                             check=True, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        base_root = os.path.join(tmp, "base")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", base_root,
                        base_rev], check=True)
        try:
            rounds = []
            for r in range(FLAGS.rounds):
                base, new = _run(base_root), _run(ROOT)
                rounds.append((base, new))
                print(f"round {r + 1}/{FLAGS.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base_root],
                           check=False)
    if FLAGS.case == "new_lengths":
        print(f"base {base_rev}, new {new_rev} (working tree); {FLAGS.rounds} rounds; "
              f"seconds of eager forward + backward calls on n = {','.join(FLAGS.ns)} "
              f"in turn\n")
        print("| method | sweep | base s | new s | new / base (median, min–max) |")
        print("|---|---|---|---|---|")
        for method in FLAGS.methods:
            for sweep in ("first", "again"):
                print(f"| {method} | {sweep} | {_paired(rounds, f'{method}|{sweep}', 2)} |")
        return
    print(f"base {base_rev}, new {new_rev} (working tree); {FLAGS.rounds} rounds; "
          f"ms per forward + backward call\n")
    print("| method | n | batch | mode | base | new | new / base (median, min–max) |")
    print("|---|---|---|---|---|---|---|")
    for method, n, xla in _configs():
        print(f"| {method} | {n} | {max(1, FLAGS.budget // n)} | {'XLA' if xla else 'graph'} "
              f"| {_paired(rounds, f'{method}|{n}|{int(xla)}', 3)} |")


if __name__ == "__main__":
    app.run(main)

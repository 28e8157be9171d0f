r"""Speed of SoftSort, NeuralSort and the Sinkhorn permutation (SoftSort paper §5.5).

Reproduces the synthetic benchmark of Prillo & Eisenschlos (2020), §5.5 and App. A.4:
a `[batch, n]` variable of scores (batch 20, initialised uniformly in [−1, 1]) is
min-max normalised to [0, 1] (the min and max without gradient), fed through the
operator, and trained so that P̂ becomes the identity (each row sorted in decreasing
order): the loss is the row-wise cross-entropy of P̂ against the identity plus
5·mean(s²), times the batch size, minimised by momentum SGD (learning rate 10,
momentum 0.5), as in the authors' TF code. One burn-in step (tracing, XLA
compilation, warm-up) is excluded; the next `--steps` (100) steps are timed.

Every (method, mode) pair of one n runs in the same process, and the timed steps are
interleaved in `--chunks` rounds, so that the load of a shared machine falls on all
of them alike. Both the wall-clock time and the process CPU time (user + system, all
threads) are recorded: on a busy machine the CPU time is the steadier of the two.

Usage:
  python scripts/bench_speed.py --ns=100,500,1000,2000,3000,4000 \
      --output_dir=docs/speed

Writes `speed.csv` and `speed.png` into `--output_dir` and prints the table and the
NeuralSort / SoftSort time ratios (> 1 means SoftSort is faster).
"""

from __future__ import annotations

import collections
import csv
import os
import platform
import resource
import time

from absl import app, flags

flags.DEFINE_list("ns", ["100", "500", "1000", "2000", "3000", "4000"],
                  "Sequence lengths n to benchmark.")
flags.DEFINE_integer("batch_size", 20, "Number of score vectors per step.")
flags.DEFINE_integer("steps", 100, "Timed optimiser steps (after the burn-in).")
flags.DEFINE_integer("burnin", 1, "Untimed steps first (tracing, compilation, warm-up).")
flags.DEFINE_integer("chunks", 10, "Rounds in which the timed steps of all methods are "
                     "interleaved; must divide --steps.")
flags.DEFINE_list("methods", ["softsort", "softsort_p2", "neuralsort", "sinkhorn"],
                  "Operators: softsort (p = 1, the package default), softsort_p2 (p = 2, "
                  "the authors' TF speed setting), neuralsort, sinkhorn.")
flags.DEFINE_list("modes", ["graph", "xla"],
                  "graph: tf.function; xla: tf.function(jit_compile=True).")
flags.DEFINE_float("softsort_tau", 0.03, "SoftSort temperature (scores are in [0, 1]; the "
                   "authors' code).")
flags.DEFINE_float("neuralsort_tau", 100.0, "NeuralSort temperature (the authors' code).")
flags.DEFINE_float("sinkhorn_epsilon", 1e-2, "Sinkhorn regularisation ε.")
flags.DEFINE_integer("sinkhorn_max_iterations", 1000, "Bound on Sinkhorn iterations.")
flags.DEFINE_integer("sinkhorn_max_n", 1000,
                     "Skip Sinkhorn above this n (it is ~20x slower than SoftSort on CPU).")
flags.DEFINE_float("learning_rate", 10.0, "Momentum SGD learning rate.")
flags.DEFINE_float("momentum", 0.5, "Momentum SGD momentum.")
flags.DEFINE_float("weight_decay", 5.0, "Weight of mean(s²) in the loss.")
flags.DEFINE_integer("seed", 1, "Seed of the initial scores.")
flags.DEFINE_string("output_dir", "docs/speed", "Where speed.csv and speed.png go.")

FLAGS = flags.FLAGS

Row = collections.namedtuple("Row", ["n", "method", "mode", "steps", "wall_s", "cpu_s",
                                     "final_loss", "spearman", "peak_rss_mb"])


def operator(method: str):
    """The relaxed permutation operator `[batch, n] → [batch, n, n]` of `method`, read from
    the families of `ss.FAMILIES` with a relaxed matrix (softsort_p2: SoftSort with
    distance_power=2)."""
    import softsort_tf as ss

    name = "softsort" if method == "softsort_p2" else method
    op = ss.get_family(name)
    temperature = {"softsort": FLAGS.softsort_tau, "neuralsort": FLAGS.neuralsort_tau,
                   "sinkhorn": FLAGS.sinkhorn_epsilon}[name]
    kwargs = {op.temperature: temperature}
    if method == "softsort_p2":
        kwargs["distance_power"] = 2.0
    if name == "sinkhorn":
        kwargs["max_iterations"] = FLAGS.sinkhorn_max_iterations
    return lambda s: op.matrix(s, **kwargs)


class Task:
    """One synthetic sorting problem: its scores, optimiser and compiled step."""

    def __init__(self, n: int, method: str, mode: str):
        import keras
        import tensorflow as tf

        import softsort_tf as ss

        self.n, self.method, self.mode = n, method, mode
        init = tf.random.stateless_uniform([FLAGS.batch_size, n], [FLAGS.seed, n],
                                           minval=-1.0, maxval=1.0)
        self.scores = tf.Variable(init, name="scores")
        self.optimizer = keras.optimizers.SGD(FLAGS.learning_rate, momentum=FLAGS.momentum)
        self.optimizer.build([self.scores])
        target = tf.broadcast_to(tf.range(n)[None, :], [FLAGS.batch_size, n])  # identity
        relax = operator(method)
        batch, decay = float(FLAGS.batch_size), FLAGS.weight_decay

        def step():
            with tf.GradientTape() as tape:
                low = tf.stop_gradient(tf.reduce_min(self.scores, axis=-1, keepdims=True))
                high = tf.stop_gradient(tf.reduce_max(self.scores, axis=-1, keepdims=True))
                perm = relax((self.scores - low) / (high - low))
                loss = batch * (tf.reduce_mean(ss.permutation_cross_entropy(target, perm))
                                + decay * tf.reduce_mean(tf.square(self.scores)))
            grads = tape.gradient(loss, [self.scores])
            self.optimizer.apply_gradients(zip(grads, [self.scores], strict=True))
            return loss

        self.step = tf.function(step, jit_compile=(mode == "xla"))
        self.wall = self.cpu = 0.0
        self.done = 0
        self.loss = float("nan")

    def run(self, steps: int, timed: bool = True):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            loss = self.step()
        self.loss = float(loss)  # waits for the last step
        if timed:
            self.wall += time.perf_counter() - wall
            self.cpu += time.process_time() - cpu
            self.done += steps

    def spearman(self) -> float:
        """Mean Spearman correlation of each row with the decreasing order."""
        import numpy as np

        s = self.scores.numpy()
        ranks = np.argsort(np.argsort(-s, axis=-1), axis=-1).astype(float)
        ideal = np.arange(self.n, dtype=float)
        ranks -= ranks.mean(-1, keepdims=True)
        ideal -= ideal.mean()
        return float(np.mean(ranks @ ideal / np.sqrt((ranks ** 2).sum(-1) * (ideal ** 2).sum())))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bench_n(n: int) -> list[Row]:
    import gc

    tasks = [Task(n, method, mode) for method in FLAGS.methods for mode in FLAGS.modes
             if method != "sinkhorn" or n <= FLAGS.sinkhorn_max_n]
    for task in tasks:
        task.run(FLAGS.burnin, timed=False)
    per_chunk = FLAGS.steps // FLAGS.chunks
    for chunk in range(FLAGS.chunks):
        for task in tasks if chunk % 2 == 0 else reversed(tasks):
            task.run(per_chunk)
    rows = [Row(n, t.method, t.mode, t.done, t.wall, t.cpu, t.loss, t.spearman(),
                peak_rss_mb()) for t in tasks]
    del tasks
    gc.collect()
    return rows


def ratios(rows: list[Row]) -> list[tuple]:
    """(n, softsort variant, mode, wall ratio, cpu ratio): NeuralSort time over SoftSort's."""
    table = {(r.n, r.method, r.mode): r for r in rows}
    out = []
    for (n, method, mode), soft in sorted(table.items()):
        neural = table.get((n, "neuralsort", mode))
        if method.startswith("softsort") and neural is not None:
            out.append((n, method, mode, neural.wall_s / soft.wall_s, neural.cpu_s / soft.cpu_s))
    return out


def write_csv(rows: list[Row], path: str) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(Row._fields)
        for r in rows:
            writer.writerow([r.n, r.method, r.mode, r.steps, f"{r.wall_s:.3f}", f"{r.cpu_s:.3f}",
                             f"{r.final_loss:.5g}", f"{r.spearman:.4f}", f"{r.peak_rss_mb:.0f}"])


def plot(rows: list[Row], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    styles = {"softsort": "tab:blue", "softsort_p2": "tab:purple", "neuralsort": "tab:orange",
              "sinkhorn": "tab:green"}
    for ax, mode in zip(axes[:2], ("graph", "xla"), strict=True):
        for method, color in styles.items():
            pts = sorted((r.n, r.wall_s, r.cpu_s) for r in rows
                         if r.method == method and r.mode == mode)
            if pts:
                ns, wall, cpu = zip(*pts, strict=True)
                ax.plot(ns, wall, "-o", color=color, label=f"{method} (wall)")
                ax.plot(ns, cpu, "--", color=color, alpha=0.6, label=f"{method} (CPU)")
        ax.set(title=f"{mode}: seconds per {FLAGS.steps} steps", xlabel="n",
               ylabel="seconds", yscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for (method, mode), marker in zip(
            [(m, d) for m in ("softsort", "softsort_p2") for d in ("graph", "xla")], "os^v",
            strict=True):
        pts = [(n, w, c) for n, m, d, w, c in ratios(rows) if m == method and d == mode]
        if pts:
            ns, wall, cpu = zip(*pts, strict=True)
            axes[2].plot(ns, wall, "-" + marker, label=f"{method} {mode} (wall)")
            axes[2].plot(ns, cpu, "--" + marker, alpha=0.6, label=f"{method} {mode} (CPU)")
    axes[2].axhline(1.0, color="gray", lw=0.8)
    axes[2].axhline(1.5, color="gray", lw=0.8, ls=":")
    axes[2].set(title="NeuralSort time / SoftSort time", xlabel="n", ylabel="ratio")
    axes[2].grid(alpha=0.3)
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    del argv
    if FLAGS.steps % FLAGS.chunks:
        raise app.UsageError("--chunks must divide --steps.")
    ns = [int(n) for n in FLAGS.ns]
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # one tf.function per task: retracing is expected
    print(f"TensorFlow {tf.__version__} on {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; batch {FLAGS.batch_size}, {FLAGS.steps} steps after "
          f"{FLAGS.burnin} burn-in", flush=True)
    rows: list[Row] = []
    for n in ns:
        start = time.perf_counter()
        new = bench_n(n)
        rows.extend(new)
        for r in new:
            print(f"n={r.n:5d} {r.method:10s} {r.mode:5s} wall {r.wall_s:8.2f} s  "
                  f"cpu {r.cpu_s:8.2f} s  loss {r.final_loss:10.4g}  spearman "
                  f"{r.spearman:.3f}  peak rss {r.peak_rss_mb:.0f} MB", flush=True)
        print(f"  ({time.perf_counter() - start:.0f} s for n={n})", flush=True)
        write_csv(rows, os.path.join(FLAGS.output_dir, "speed.csv"))
    plot(rows, os.path.join(FLAGS.output_dir, "speed.png"))
    print("\nNeuralSort time / SoftSort time (> 1: SoftSort faster):")
    for n, method, mode, wall, cpu in ratios(rows):
        print(f"  n={n:5d} {method:11s} {mode:5s} wall {wall:5.2f}x  cpu {cpu:5.2f}x")


if __name__ == "__main__":
    app.run(main)

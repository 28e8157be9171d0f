r"""Speed of the differentiable sorting networks against diffsort (PyTorch, CPU) and
against the package's other relaxed permutation matrices.

One step = forward and backward of Σ c ⊙ P̂ for `[batch, n]` standard normal scores
(c a fixed random `[batch, n, n]` cotangent): `sorting_network_permutation_matrix` (odd-even and
bitonic, Cauchy sigmoid, steepness 10) under `tf.function`, with and without XLA;
SoftSort and NeuralSort (τ = 1) and the Sinkhorn plan (ε = 0.01, the package's
defaults) under `tf.function` with XLA; and `diffsort.DiffSortNet` (same networks and
sigmoid) in PyTorch. Each configuration runs `--burnin` untimed steps (tracing, XLA
compilation, warm-up) and then `--runs` timed steps; the table gives the median wall
time per step in milliseconds and the ratio to ours (XLA) of the same network.

Skipped by default because of their memory or time: odd-even at n > `--max_odd_even_n`
(the backward pass keeps the n intermediate `[batch, n, n]` matrices: 17 GB in float32
at n = 512, batch 32), and diffsort at n > `--max_diffsort_n` (each of its layers
multiplies `[batch, n, n]` by `[n, n/2]` selection matrices, O(n³) per layer).

Usage (diffsort and torch: the `benchmark` extra, the CPU wheel of torch):
  python scripts/bench_sorting_networks.py --ns=8,32,128,512 --batch=32 --runs=7
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

flags.DEFINE_list("ns", ["8", "32", "128", "512"], "List lengths n.")
flags.DEFINE_integer("batch", 32, "Lists per step.")
flags.DEFINE_integer("runs", 7, "Timed steps per configuration (the median is reported).")
flags.DEFINE_integer("burnin", 2, "Untimed steps first.")
flags.DEFINE_integer("max_odd_even_n", 128, "Largest n for the odd-even networks.")
flags.DEFINE_integer("max_diffsort_n", 128, "Largest n for diffsort (PyTorch).")
flags.DEFINE_float("steepness", 10.0, "Steepness of both implementations.")
flags.DEFINE_string("sigmoid", "cauchy", "Sigmoid of both implementations.")
FLAGS = flags.FLAGS


def _time(step, runs: int, burnin: int) -> float:
    for _ in range(burnin):
        step()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _tf_step(matrix_fn, n: int, jit: bool):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(n)
    scores = tf.constant(rng.standard_normal((FLAGS.batch, n)), tf.float32)
    cot = tf.constant(rng.standard_normal((FLAGS.batch, n, n)), tf.float32)

    @tf.function(jit_compile=jit)
    def step(s):
        with tf.GradientTape() as tape:
            tape.watch(s)
            loss = tf.reduce_sum(matrix_fn(s) * cot)
        return tape.gradient(loss, s)

    return lambda: step(scores).numpy()


def _torch_step(network: str, n: int):
    import numpy as np
    import torch
    from diffsort import DiffSortNet

    rng = np.random.default_rng(n)
    scores = torch.tensor(rng.standard_normal((FLAGS.batch, n)), dtype=torch.float32)
    cot = torch.tensor(rng.standard_normal((FLAGS.batch, n, n)), dtype=torch.float32)
    net = DiffSortNet(network, n, steepness=FLAGS.steepness, distribution=FLAGS.sigmoid)

    def step():
        s = scores.clone().requires_grad_(True)
        _, big_x = net(s)
        (big_x.transpose(1, 2) * cot).sum().backward()
        return s.grad

    return step


def main(argv):
    del argv
    import softsort_tf as ss

    rows = []
    for n in (int(v) for v in FLAGS.ns):
        result = {}
        for network in ("odd_even", "bitonic"):
            if network == "odd_even" and n > FLAGS.max_odd_even_n:
                continue

            def ours(s, network=network):
                return ss.sorting_network_permutation_matrix(s, FLAGS.steepness, network,
                                                             FLAGS.sigmoid)

            result[f"{network} XLA"] = _time(_tf_step(ours, n, True), FLAGS.runs, FLAGS.burnin)
            result[f"{network} graph"] = _time(_tf_step(ours, n, False), FLAGS.runs,
                                               FLAGS.burnin)
            if n <= FLAGS.max_diffsort_n:
                result[f"{network} diffsort"] = _time(_torch_step(network, n), FLAGS.runs,
                                                      FLAGS.burnin)
        for method in ("softsort", "neuralsort", "sinkhorn"):
            op = ss.get_family(method)
            result[method] = _time(_tf_step(op.matrix, n, True), FLAGS.runs, FLAGS.burnin)
        rows.append((n, result))
        print(f"n={n}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in result.items()), flush=True)

    columns = ["odd_even XLA", "odd_even graph", "odd_even diffsort", "bitonic XLA",
               "bitonic graph", "bitonic diffsort", "softsort", "neuralsort", "sinkhorn"]
    print("\n| n | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for n, result in rows:
        cells = [f"{result[c]:.2f}" if c in result else "–" for c in columns]
        print(f"| {n} | " + " | ".join(cells) + " |")
    print("\nRatios (diffsort / ours XLA; ours XLA / SoftSort XLA):")
    for n, result in rows:
        parts = []
        for network in ("odd_even", "bitonic"):
            ours = result.get(f"{network} XLA")
            if ours and f"{network} diffsort" in result:
                parts.append(f"{network}: diffsort/ours {result[f'{network} diffsort'] / ours:.1f}")
            if ours:
                parts.append(f"{network}: ours/softsort {ours / result['softsort']:.1f}")
        print(f"n={n}: " + "; ".join(parts))


if __name__ == "__main__":
    app.run(main)

"""Accuracy of Sinkhorn's implicit gradients for float32 inputs: the default backward
(float64 for at most 64 targets) against conjugate gradients in float32
(`SinkhornOptions(implicit_diff=ImplicitDiff(solver="cg"))`), both against the gradient
of the same operator on float64 inputs.

For each operator (rank, sort), ε (in the squashed scores' units) and list length n:
the largest relative error max|g − g64| / max|g64| of the gradient of Σ v ⊙ op(x) over
`--seeds` batches of 8 standard normal lists (v standard normal too).

    python scripts/implicit_float32_accuracy.py --seeds=3
"""

from __future__ import annotations

import argparse
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import softsort_tf as ss  # noqa: E402

OPERATORS = {"rank": ss.sinkhorn_rank, "sort": ss.sinkhorn_sort}


def gradient(op, x, v, **kwargs) -> np.ndarray:
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = op(x, **kwargs)
        loss = tf.reduce_sum(out * tf.cast(v, out.dtype))
    g = tape.gradient(loss, x).numpy().astype(np.float64)
    if not np.all(np.isfinite(g)):
        raise FloatingPointError(f"non-finite gradient {kwargs}")
    return g


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epsilons", default="0.1,0.01,0.001,0.0001")
    parser.add_argument("--lengths", default="16,64")
    args = parser.parse_args()
    cg = ss.SinkhornOptions(implicit_diff=ss.ImplicitDiff(solver="cg"))
    print("| operator | ε | n | default (float64 backward) | cg in float32 |")
    print("|---|---|---|---|---|")
    for name, op in OPERATORS.items():
        for eps in (float(e) for e in args.epsilons.split(",")):
            for n in (int(k) for k in args.lengths.split(",")):
                worst = np.zeros(2)
                for seed in range(args.seeds):
                    rng = np.random.default_rng(seed)
                    x, v = rng.normal(size=(8, n)), rng.normal(size=(8, n))
                    g64 = gradient(op, x, v, epsilon=eps)
                    x32 = x.astype(np.float32)
                    errors = [np.abs(gradient(op, x32, v, epsilon=eps, **kw) - g64).max()
                              for kw in ({}, {"options": cg})]
                    worst = np.maximum(worst, np.array(errors) / np.abs(g64).max())
                print(f"| {name} | {eps:g} | {n} | {worst[0]:.1e} | {worst[1]:.1e} |",
                      flush=True)


if __name__ == "__main__":
    main()

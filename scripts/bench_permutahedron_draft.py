"""Draft timing of the permutahedron operators (forward + backward, one row of n
standard normal values, median of 3 calls after a warm-up), for the lead's benchmark."""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from softsort_tf.ops import lapsum, permutahedron  # noqa: E402


def timed(fn, x):
    def step(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = fn(v)
            loss = tf.reduce_sum(y * tf.range(tf.cast(tf.shape(v)[-1], v.dtype)))
        return tape.gradient(loss, v)

    g = tf.function(step, input_signature=[tf.TensorSpec([None, None], tf.float32)])
    g(x).numpy()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        g(x).numpy()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main(sizes):
    for n in sizes:
        x = tf.random.normal([1, n], seed=0)
        for name, fn in [
            ("permutahedron_rank l2", lambda v: permutahedron.permutahedron_rank(v, "l2", 0.1)),
            ("permutahedron_rank kl", lambda v: permutahedron.permutahedron_rank(v, "kl", 0.1)),
            ("permutahedron_sort l2", lambda v: permutahedron.permutahedron_sort(v, "l2", 0.1)),
            ("lapsum_rank", lambda v: lapsum.lapsum_rank(v, 0.01)),
            ("lapsum_sort", lambda v: lapsum.lapsum_sort(v, 0.01)),
        ]:
            print(f"n={n:>7} {name:<24} fwd+bwd {timed(fn, x) * 1e3:9.1f} ms", flush=True)


if __name__ == "__main__":
    main([int(float(a)) for a in sys.argv[1:]] or [1000, 10000, 100000])

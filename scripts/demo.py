"""The `make demo` job: a tour of the Sinkhorn operators, then learning through them.

1. Prints soft ranks, soft sorts and soft quantiles of one vector at several ε, next to
   the exact values, so that the effect of the regularisation is visible.
2. Fits a small Keras model through a `SinkhornRank` layer: a linear scorer of 5-d
   features whose soft ranks must match hidden ground-truth ranks.
3. Runs the large-MNIST sorting benchmark (`softsort_tf.experiments.large_mnist.run`,
   what `scripts/train_sort.py` runs) on the embedded offline digits (scikit-learn's
   8×8 digits), printing the test accuracy of the trained model next to an untrained
   one's.

Runs on CPU in about two minutes and needs no network.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

import softsort_tf as ss  # noqa: E402
from softsort_tf.experiments import flags as experiment_flags  # noqa: E402
from softsort_tf.experiments import large_mnist  # noqa: E402

_SORT_DEMO = flags.DEFINE_bool(
    "sort_demo", True, "Also run the large-MNIST sorting demo (as scripts/train_sort.py).")
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None,
    "Where the sorting demo writes checkpoints and results (default: a fresh temporary "
    "folder; an existing folder would be resumed instead of retrained).")

_EPSILONS = (1.0, 1e-1, 1e-2, 1e-3)


def _row(label: str, values) -> str:
    return f"  {label:<14}" + " ".join(f"{v:7.3f}" for v in np.asarray(values).ravel())


def operator_tour() -> None:
    """Prints soft ranks, sorts and quantiles of one vector at several ε."""
    x = np.array([2.5, -1.0, 0.3, 4.0, 0.2, 1.7, -0.4], np.float64)
    print("x =", x)
    print("\nSoft ranks (1-based, ascending), exact:", (np.argsort(np.argsort(x)) + 1))
    for eps in _EPSILONS:
        r, info = ss.sinkhorn_rank(x, epsilon=eps, return_info=True)
        print(_row(f"eps={eps:g}", r.numpy()),
              f"  [{int(info.num_iterations)} iterations, error {float(info.error):.1e}]")
    print("\nSoft sort (descending), exact:", np.sort(x)[::-1])
    for eps in _EPSILONS:
        print(_row(f"eps={eps:g}", ss.sinkhorn_sort(x, direction="DESCENDING",
                                                   epsilon=eps).numpy()))
    levels = [0.25, 0.5, 0.75]
    exact = np.quantile(x, levels, method="averaged_inverted_cdf")
    print(f"\nSoft quantiles at {levels}, exact:", np.round(exact, 3))
    for eps in _EPSILONS:
        print(_row(f"eps={eps:g}", ss.sinkhorn_quantile(x, levels, epsilon=eps).numpy()))
    print("\nSoft top-3 mask, exact:", (np.argsort(np.argsort(-x)) < 3).astype(int))
    for eps in _EPSILONS:
        print(_row(f"eps={eps:g}", ss.sinkhorn_topk(x, 3, epsilon=eps).numpy()))


def fit_scorer() -> None:
    """Learns a linear scorer whose soft ranks match hidden ranks, through SinkhornRank."""
    rng = np.random.RandomState(0)
    n, d = 10, 5
    w_true = rng.randn(d)
    x = rng.randn(512, n, d).astype(np.float32)
    ranks = np.argsort(np.argsort(x @ w_true, axis=1), axis=1).astype(np.float32) + 1
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((n, d)),
        keras.layers.Dense(1, use_bias=False),
        keras.layers.Reshape((n,)),
        ss.SinkhornRank(epsilon=0.05),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    print("\nFitting a linear scorer through SinkhornRank (MSE to the true ranks):")
    print(f"  before training: loss {model.evaluate(x, ranks, verbose=0):.3f}")
    model.fit(x, ranks, epochs=10, batch_size=64, verbose=0)
    print(f"  after 10 epochs: loss {model.evaluate(x, ranks, verbose=0):.3f}")
    w = model.layers[0].kernel.numpy()[:, 0]
    cos = float(w @ w_true / np.linalg.norm(w) / np.linalg.norm(w_true))
    print(f"  cosine(learned weights, true weights) = {cos:.3f}")


def sorting_demo(output_dir: str | None) -> None:
    """Learns to sort large-MNIST sequences (n = 3, 300 steps) on the embedded digits."""
    config = large_mnist.ExperimentConfig(
        task="sort", output_dir=output_dir or tempfile.mkdtemp(prefix="softsort_tf_demo_"),
        dataset="embedded", n=3, epochs=5, steps_per_epoch=60, num_val_sequences=200,
        num_test_sequences=1000,
        # A progress bar on a terminal, one line per epoch in logs and pipes.
        verbose=1 if sys.stdout.isatty() else 2)
    print("\nLarge-MNIST sorting on the embedded digits, the run of\n  $ python "
          f"scripts/train_sort.py --output_dir={config.output_dir} --n={config.n} "
          f"--epochs={config.epochs} --steps_per_epoch={config.steps_per_epoch} "
          f"--num_val_sequences={config.num_val_sequences} "
          f"--num_test_sequences={config.num_test_sequences}", flush=True)
    large_mnist.run(config)


def main(argv) -> None:
    del argv
    start = time.time()
    operator_tour()
    fit_scorer()
    if _SORT_DEMO.value:
        sorting_demo(_OUTPUT_DIR.value)
    print(f"\nDemo finished in {time.time() - start:.0f} s.")


if __name__ == "__main__":
    experiment_flags.run_binary(main)

"""Where the time of a large-MNIST training step goes, on this machine.

Times, for one configuration (n, batch, method), each part of a step of
`scripts/train_sort.py` alone and the whole Keras step:

- `pipeline`: producing batches with `softsort_tf.datasets.make_dataset` (parallel map,
  prefetch) and nothing else;
- `cnn`: forward + backward + Adam update of the CNN on `batch · n` images, per dtype
  policy (float32, mixed_bfloat16) and with / without XLA;
- `operator`: forward + backward of the relaxed permutation on `[batch, n]` scores and
  the permutation cross-entropy, with / without XLA;
- `fit`: `keras.Model.fit` steps of the experiment's own model and data (what the binary
  runs), per dtype policy and XLA setting, op determinism on as in the binary.

Every figure is the median of `--repeats` timings of `--steps` steps after a warm-up.
The markdown table goes to stdout (docs/benchmarks.md, "Large-MNIST training step").

    python scripts/profile_sort_step.py --mnist_npz=../shared/data/mnist.npz --n=3
"""

from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf
from absl import flags

import softsort_tf
from softsort_tf.experiments import flags as experiment_flags
from softsort_tf.experiments import large_mnist, models, training

_N = flags.DEFINE_integer("n", 3, "Numbers per sequence.", lower_bound=2)
_BATCH = flags.DEFINE_integer("batch_size", 20, "Sequences per batch.", lower_bound=1)
_METHOD = flags.DEFINE_enum("method", "softsort", list(models.permutation_methods()),
                            "Relaxed sorting operator.")
_MNIST = flags.DEFINE_string("mnist_npz", None, "MNIST npz (default: the embedded digits).")
_STEPS = flags.DEFINE_integer("steps", 30, "Steps per timing.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timings per figure (median).", lower_bound=1)
_PARTS = flags.DEFINE_list("parts", ["pipeline", "cnn", "operator", "fit"], "What to time.")


def _median_seconds(run_steps, steps: int, repeats: int) -> float:
    """Median wall time per step of `run_steps(steps)` after one warm-up call."""
    run_steps(2)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run_steps(steps)
        times.append((time.perf_counter() - start) / steps)
    return float(np.median(times))


def _config(precision: str = "float32", jit: bool = False) -> large_mnist.ExperimentConfig:
    return large_mnist.ExperimentConfig(
        n=_N.value, batch_size=_BATCH.value, method=_METHOD.value, precision=precision,
        jit_compile=jit, deterministic_ops=False, dataset="npz" if _MNIST.value else "embedded",
        mnist_npz=_MNIST.value, num_val_sequences=100, num_test_sequences=100,
        verbose=0).finalize()


def time_pipeline(steps: int, repeats: int) -> float:
    train, _, _ = large_mnist.make_datasets(_config())
    iterator = iter(train(0))

    def run(k):
        for _ in range(k):
            next(iterator)

    return _median_seconds(run, steps, repeats)


def time_cnn(precision: str, jit: bool, steps: int, repeats: int) -> float:
    cnn = models.build_cnn("cnn", precision)
    optimizer = keras.optimizers.Adam(1e-3)
    images = tf.random.stateless_uniform([_BATCH.value * _N.value, 112, 28, 1], [0, 0])

    @tf.function(jit_compile=jit)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(cnn(x, training=True)))
        grads = tape.gradient(loss, cnn.trainable_variables)
        optimizer.apply_gradients(zip(grads, cnn.trainable_variables, strict=True))
        return loss

    def run(k):
        for _ in range(k):
            loss = step(images)
        loss.numpy()

    return _median_seconds(run, steps, repeats)


def time_operator(jit: bool, steps: int, repeats: int) -> float:
    config = _config()
    scores = tf.Variable(tf.random.stateless_normal([_BATCH.value, _N.value], [0, 1]) * 100)
    order = tf.argsort(scores, axis=-1, direction="DESCENDING")
    log = large_mnist.log_cross_entropy(config)
    loss_fn = softsort_tf.PermutationCrossEntropy(y_true_format="indices", from_log=log)
    kwargs = models.operator_kwargs(config.method, temperature=config.temperature, log=log)

    @tf.function(jit_compile=jit)
    def step():
        with tf.GradientTape() as tape:
            perm = softsort_tf.permutation_matrix(scores, config.method, **kwargs)
            loss = loss_fn(order, perm)
        return tape.gradient(loss, scores)

    def run(k):
        for _ in range(k):
            grad = step()
        grad.numpy()

    return _median_seconds(run, steps, repeats)


def time_fit(precision: str, jit: bool, steps: int, repeats: int) -> float:
    config = _config(precision, jit)
    tf.config.experimental.enable_op_determinism()  # as the binary (default flags)
    train, _, _ = large_mnist.make_datasets(config)
    model = large_mnist.build_model(config)
    dataset = train(0).repeat()

    def run(k):
        model.fit(dataset, epochs=1, steps_per_epoch=k, verbose=0)

    return _median_seconds(run, steps, repeats)


def main(argv):
    del argv
    steps, repeats = _STEPS.value, _REPEATS.value
    images = _BATCH.value * _N.value
    rows = []
    if "pipeline" in _PARTS.value:
        rows.append(("pipeline (make_dataset)", "-", "-", time_pipeline(steps, repeats)))
    for precision in ("float32", "mixed_bfloat16"):
        for jit in (False, True):
            if "cnn" in _PARTS.value:
                rows.append(("CNN fwd+bwd+Adam", precision, jit,
                             time_cnn(precision, jit, steps, repeats)))
    if "operator" in _PARTS.value:
        for jit in (False, True):
            rows.append((f"{_METHOD.value} + loss fwd+bwd", "float32", jit,
                         time_operator(jit, steps, repeats)))
    if "fit" in _PARTS.value:
        for precision in ("float32", "mixed_bfloat16"):
            rows.append(("whole step (model.fit)", precision, False,
                         time_fit(precision, False, steps, repeats)))
    info = training.machine_info()
    print(f"\nn = {_N.value}, batch {_BATCH.value} ({images} images / step), method "
          f"{_METHOD.value}; {info['processor']}, {info['cpu_count']} CPUs, TF "
          f"{info['tensorflow']}; median of {repeats} × {steps} steps\n")
    print("| part | CNN dtype policy | XLA | ms / step | images / s |")
    print("|---|---|---|---|---|")
    for part, precision, jit, seconds in rows:
        print(f"| {part} | {precision} | {jit} | {1000 * seconds:.1f} | "
              f"{images / seconds:.0f} |")


if __name__ == "__main__":
    experiment_flags.run_binary(main)

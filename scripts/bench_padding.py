"""What variable-length lists cost: ragged vs padded vs one list at a time.

A batch of lists with lengths drawn log-uniformly from [--min_length, --max_length]
is ranked / sorted (forward + backward of a random linear functional of the valid
outputs) in four ways, each compiled once (`tf.function` with `None` dimensions, so no
retracing per length):

- `ragged`: the `tf.RaggedTensor` of the lists, given to the operator as it is;
- `padded`: the same lists padded to the longest with `mask=` (graph and XLA);
- `one at a time`: a Python loop over the lists, one call per list (graph and XLA);
- `padded, no mask`: the padded batch as if every entry were valid, the cost of the
  padded shape alone (the floor any padded computation pays);
- `bucketed`: the lists sorted by length and split into `--buckets` batches of equal
  count, each padded to its own longest list with `mask=` (what
  `tf.data.Dataset.bucket_by_sequence_length` does for a model's input).

The table reports the time per batch, the padded share (padded entries / all entries
of the padded batch) and the ratio to the unmasked padded batch, so the mask's own
overhead and the padding's are visible separately. Results: docs/benchmarks.md
("Variable-length lists"). CPU only here (no GPU).

    python scripts/bench_padding.py --lists=64 --min_length=10 --max_length=1000
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf
from absl import flags

import softsort_tf as ss
from softsort_tf.experiments import flags as experiment_flags
from softsort_tf.experiments import training

_LISTS = flags.DEFINE_integer("lists", 64, "Lists per batch.", lower_bound=1)
_MIN = flags.DEFINE_integer("min_length", 10, "Shortest list.", lower_bound=1)
_MAX = flags.DEFINE_integer("max_length", 1000, "Longest list.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timings per figure (median).", lower_bound=1)
_OPS = flags.DEFINE_list("ops", ["sinkhorn_rank", "sinkhorn_sort", "softsort_ranks",
                                 "neuralsort_ranks"], "Operators to time.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the lengths and values.")
_BUCKETS = flags.DEFINE_integer("buckets", 4, "Buckets of the bucketed way.", lower_bound=1)


def _softsort_ranks(x, mask=None):
    return ss.ranks_from_permutation(ss.softsort_permutation_matrix(x, tau=0.1, mask=mask))


def _neuralsort_ranks(x, mask=None):
    return ss.ranks_from_permutation(ss.neuralsort_permutation_matrix(x, tau=0.1, mask=mask))


OPERATORS = {
    "sinkhorn_rank": lambda x, mask=None: ss.sinkhorn_rank(x, mask=mask),
    "sinkhorn_sort": lambda x, mask=None: ss.sinkhorn_sort(x, mask=mask),
    "softsort_ranks": _softsort_ranks,
    "neuralsort_ranks": _neuralsort_ranks,
}


def _lists(seed: int) -> list[np.ndarray]:
    rng = np.random.RandomState(seed)
    lengths = np.exp(rng.uniform(np.log(_MIN.value), np.log(_MAX.value + 1), _LISTS.value))
    return [rng.randn(int(k)).astype(np.float32) for k in np.minimum(lengths, _MAX.value)]


def _value_and_grad(op, x, mask, weights):
    """Sum of weights × op(x) over the valid entries, and its gradient w.r.t. x."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = op(x) if mask is None else op(x, mask=mask)
        total = tf.reduce_sum(out * weights)
    return total, tape.gradient(total, x)


def _median_seconds(fn, repeats: int) -> float:
    fn()  # compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def bench(name: str, lists: list[np.ndarray], repeats: int) -> list[tuple[str, float]]:
    op = OPERATORS[name]
    ragged = tf.ragged.constant(lists, dtype=tf.float32, ragged_rank=1)
    dense = ragged.to_tensor(0.0)
    mask = tf.sequence_mask(ragged.row_lengths(), tf.shape(dense)[1])
    weights = tf.random.stateless_normal(tf.shape(dense), [_SEED.value, 1])
    weights = tf.where(mask, weights, 0.0)
    ragged_weights = tf.RaggedTensor.from_tensor(weights, lengths=ragged.row_lengths())
    spec2 = tf.TensorSpec([None, None], tf.float32)
    spec1 = tf.TensorSpec([None], tf.float32)

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.float32, 1)] * 2)
    def run_ragged(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x.flat_values)
            total = tf.reduce_sum((op(x) * w).flat_values)
        return total, tape.gradient(total, x.flat_values)

    def padded(jit):
        return tf.function(lambda x, m, w: _value_and_grad(op, x, m, w), jit_compile=jit,
                           input_signature=[spec2, tf.TensorSpec([None, None], tf.bool),
                                            spec2])

    def unmasked(jit):
        return tf.function(lambda x, w: _value_and_grad(op, x, None, w), jit_compile=jit,
                           input_signature=[spec2, spec2])

    def single(jit):
        return tf.function(lambda x, w: _value_and_grad(op, x, None, w), jit_compile=jit,
                           input_signature=[spec1, spec1])

    singles = [(tf.constant(v), w[: len(v)]) for v, w in zip(lists, weights.numpy(),
                                                              strict=True)]
    order = np.argsort([len(v) for v in lists], kind="stable")
    buckets = []
    for part in np.array_split(order, _BUCKETS.value):
        r = tf.ragged.constant([lists[i] for i in part], dtype=tf.float32, ragged_rank=1)
        d = r.to_tensor(0.0)
        m = tf.sequence_mask(r.row_lengths(), tf.shape(d)[1])
        buckets.append((d, m, tf.where(m, tf.gather(weights, part)[:, : d.shape[1]], 0.0)))
    rows = [("ragged (graph)", _median_seconds(
        lambda: run_ragged(ragged, ragged_weights)[0].numpy(), repeats))]
    for jit in (False, True):
        mode = "XLA" if jit else "graph"
        f_pad, f_full, f_one = padded(jit), unmasked(jit), single(jit)
        rows.append((f"padded + mask ({mode})", _median_seconds(
            lambda f=f_pad: f(dense, mask, weights)[0].numpy(), repeats)))
        rows.append((f"padded, no mask ({mode})", _median_seconds(
            lambda f=f_full: f(dense, weights)[0].numpy(), repeats)))
        rows.append((f"one at a time ({mode})", _median_seconds(
            lambda f=f_one: [f(x, w)[0].numpy() for x, w in singles], repeats)))
        rows.append((f"bucketed by length, {_BUCKETS.value} buckets + mask ({mode})",
                     _median_seconds(lambda f=f_pad: [f(d, m, w)[0].numpy()
                                                      for d, m, w in buckets], repeats)))
    return rows


def main(argv):
    del argv
    lists = _lists(_SEED.value)
    lengths = np.array([len(v) for v in lists])
    padded_share = 1.0 - lengths.sum() / (len(lists) * lengths.max())
    info = training.machine_info()
    print(f"\n{len(lists)} lists, lengths {lengths.min()}–{lengths.max()} (mean "
          f"{lengths.mean():.0f}), padded share {padded_share:.0%}; {info['processor']}, "
          f"{info['cpu_count']} CPUs, TF {info['tensorflow']}; forward + backward, median of "
          f"{_REPEATS.value}\n")
    print("| operator | way | ms / batch | ÷ padded, no mask (same mode) |")
    print("|---|---|---|---|")
    for name in _OPS.value:
        rows = dict(bench(name, lists, _REPEATS.value))
        for way, seconds in rows.items():
            mode = "XLA" if "XLA" in way else "graph"
            base = rows[f"padded, no mask ({mode})"]
            print(f"| {name} | {way} | {1000 * seconds:.1f} | {seconds / base:.2f} |")


if __name__ == "__main__":
    experiment_flags.run_binary(main)

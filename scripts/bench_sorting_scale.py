"""Soft ranks of long lists: the O(n log n) families (LapSum, permutahedron) against
torchsort, side by side in one run on this machine's CPU.

    python scripts/bench_sorting_scale.py --markdown=/tmp/sorting_scale.md

What it measures (float32, x standard normal, `[batch, n]`, ranks along the last axis):

- Ranks, forward + backward: the gradient w.r.t. x of the fixed linear functional
  Σ w ⊙ soft_rank(x) (w fixed standard normal), for n = 10³ … 10⁶ and batch 1 and 32:
  torchsort 0.1.10 (`soft_rank`, 'l2'; PyTorch, its C++ CPU extension), ours
  `lapsum_rank` (the whole step in one `tf.function(jit_compile=True)`) and
  `permutahedron_rank` ('l2'; the whole step in one XLA computation too: sort, the
  pool-adjacent-violators `while` loop, the block averages and the backward pass).
  Each library runs at its own strength, found per n by a small search on one row (a
  geometric bracket, then bisection in log scale): the largest strength whose max
  |soft − hard rank| is ≤ 1 (hard ranks with ties averaged), shrunk until the whole
  batch meets it; where no strength reaches 1 in float32 (torchsort at n = 10⁶), the
  one with the smallest error. The batch's error is reported.
  The permutahedron operator uses torchsort's strength (the same projection).
- Sorts, forward + backward, at the same strengths: torchsort's `soft_sort` against
  `lapsum_sort` and `permutahedron_sort` ('l2', torchsort's strength; XLA),
  Σ w ⊙ soft_sort(x).
- Our Sinkhorn ranks (`sinkhorn_rank`, ε = 1e-2, XLA) at n = 2·10⁴ against LapSum at
  the same n.
- Peak memory: ranks of 10⁶ values forward + backward (XLA for LapSum) in a fresh
  subprocess importing only that library (its peak resident set, VmHWM of
  /proc/self/status), minus that of the same subprocess on 10 values (the baseline of
  the library itself).
- The LapSum top-k mask of 10⁶ values (k = `--topk`) forward + backward against
  `tf.sort` forward + backward of the same vector (both XLA).
- Training steps of a small Keras model over one batch of 10⁵ items: a Spearman-style
  loss (1 − Pearson correlation of `soft_rank(ŷ, 'lapsum', axis=0)` and the targets'
  ranks, given as the labels) jit-compiled; `SpearmanLoss(axis=0, method='lapsum')`
  in graph mode (its hard ranks of the targets, `searchsorted`, are O(n²) under XLA);
  the same model with the mean squared error (jit-compiled).

Times are medians of `--repeats` calls after one untimed call (tracing, compilation),
wall clock and process CPU time (all threads); in the ranks table the libraries' calls
run in interleaved rounds and each ratio is the median over the rounds of the two wall
(or CPU) times of one round. The machine may be shared: the load
(`uptime`) is recorded before and after. No GPU was available: CPU numbers only.

torchsort must be built by hand for CPU (see `scripts/reference_torchsort.py`); without
it (or without torch) the torchsort columns are left empty.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import scipy.stats  # noqa: E402

try:
    import torch
    import torchsort
except ImportError:  # pragma: no cover - benchmark extra not installed
    torch = torchsort = None

import tensorflow as tf  # noqa: E402

import softsort_tf as ss  # noqa: E402

SEED = 0


# ---------------------------------------------------------------------------------
# Problems and timing.
# ---------------------------------------------------------------------------------
def problem(n: int, batch: int):
    rng = np.random.default_rng([SEED, n, batch])
    x = rng.standard_normal((batch, n)).astype(np.float32)
    w = rng.standard_normal((batch, n)).astype(np.float32)
    return x, w


def hard_ranks(x):
    """1-based ranks along the last axis, ties averaged (float32 samples of 10⁶ normal
    values hold thousands of exact ties)."""
    return scipy.stats.rankdata(x, axis=-1).astype(np.float64)


def timed(fn, repeats: int):
    """(median wall seconds, median process CPU seconds) of `fn()`, after one call."""
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return float(np.median(walls)), float(np.median(cpus))


def timed_together(fns: dict, repeats: int):
    """`{name: (median wall s, median process CPU s)}` of each `fns[name]()`, timed in
    interleaved rounds (one call of each per round, after one untimed call of each), and
    `{name: array of its wall times per round}` and the same of CPU times, for paired
    ratios (`paired_ratio`)."""
    for fn in fns.values():
        fn()
    walls = {k: [] for k in fns}
    cpus = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            walls[k].append(time.perf_counter() - w0)
            cpus[k].append(time.process_time() - c0)
    times = {k: (float(np.median(walls[k])), float(np.median(cpus[k]))) for k in fns}
    return times, {k: np.array(v) for k, v in walls.items()}, \
        {k: np.array(v) for k, v in cpus.items()}


def paired_ratio(walls, a, b):
    """The median over the rounds of a's wall time / b's in the same round: on a shared
    machine a paired ratio stays meaningful when the machine's speed drifts."""
    return float(np.median(walls[a] / walls[b]))


def search_strength(error, guess: float, steps: int = 4):
    """The largest strength s with error(s) ≤ 1, to within a factor 2^(2/2^steps); if
    no strength tried reaches 1 (float32 cancellation at large n), the one with the
    smallest error."""
    tried = {}

    def err(v):
        tried[v] = error(v)
        return tried[v]

    lo = hi = None
    s = guess
    for _ in range(12):
        if err(s) <= 1.0:
            lo = s
            if hi is not None:
                break
            s *= 4.0
        else:
            hi = s
            if lo is not None:
                break
            s /= 4.0
    if lo is None:
        return min(tried, key=tried.get)
    for _ in range(steps):
        if hi is None:
            break
        mid = float(np.sqrt(lo * hi))
        if err(mid) <= 1.0:
            lo = mid
        else:
            hi = mid
    return lo


# ---------------------------------------------------------------------------------
# The libraries.
# ---------------------------------------------------------------------------------
class TFRanker:
    """Forward (for the search) and forward + backward (timed) of one of our operators,
    each one XLA-compiled function per shape (and per strength, unless the operator
    takes the strength as a tensor)."""

    def __init__(self, rank_fn, tensor_strength: bool):
        self.rank_fn = rank_fn
        self._strength = ((lambda s: tf.constant(s, tf.float32)) if tensor_strength
                          else float)
        self._forward = tf.function(lambda x, s: rank_fn(x, s), jit_compile=True)

        def step(x, w, s):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(w * rank_fn(x, s))
            return tape.gradient(loss, x)

        self._step = tf.function(step, jit_compile=True)

    def error(self, x, s):
        out = self._forward(tf.constant(x), self._strength(s)).numpy()
        return float(np.max(np.abs(out - hard_ranks(x)))) if np.all(np.isfinite(out)) \
            else np.inf

    def stepper(self, x, w, s):
        """The timed call: forward + backward of Σ w ⊙ rank_fn(x, s)."""
        xt, wt, st = tf.constant(x), tf.constant(w), self._strength(s)
        return lambda: self._step(xt, wt, st).numpy()

    def time(self, x, w, s, repeats):
        return timed(self.stepper(x, w, s), repeats)


class TorchRanker:
    def error(self, x, s):
        with torch.no_grad():
            out = torchsort.soft_rank(torch.from_numpy(x), regularization_strength=s).numpy()
        return float(np.max(np.abs(out - hard_ranks(x))))

    def __init__(self, fn=None):
        self.fn = fn

    def stepper(self, x, w, s):
        """The timed call: forward + backward of Σ w ⊙ fn(x, s) (default: soft_rank)."""
        fn = self.fn or torchsort.soft_rank
        xt, wt = torch.from_numpy(x), torch.from_numpy(w)

        def step():
            v = xt.clone().requires_grad_(True)
            (wt * fn(v, regularization_strength=s)).sum().backward()
            return v.grad.numpy()

        return step

    def time(self, x, w, s, repeats):
        return timed(self.stepper(x, w, s), repeats)


LAPSUM = TFRanker(lambda x, a: ss.lapsum_rank(x, a), tensor_strength=True)
LAPSUM_SORT = TFRanker(lambda x, a: ss.lapsum_sort(x, a), tensor_strength=True)
PERMUTAHEDRON = TFRanker(lambda x, e: ss.permutahedron_rank(x, "l2", e),
                         tensor_strength=False)
PERMUTAHEDRON_SORT = TFRanker(lambda x, e: ss.permutahedron_sort(x, "l2", e),
                              tensor_strength=False)


def strength_for(ranker, x, guess):
    """Strength searched on the first row, shrunk (by 2^(1/4)) until the whole batch has
    max |soft − hard| ≤ 1; returns (strength, the batch's max error)."""
    s = search_strength(lambda v: ranker.error(x[:1], v), guess)
    err = ranker.error(x, s)
    for _ in range(12):
        if err <= 1.0:
            break
        smaller = s / 2 ** 0.25
        smaller_err = ranker.error(x, smaller)
        if smaller_err >= err:
            break                       # the error floor of the dtype: keep s
        s, err = smaller, smaller_err
    return s, err


# ---------------------------------------------------------------------------------
# Sections.
# ---------------------------------------------------------------------------------
def ranks_table(args):
    rows = []
    for n in args.ns:
        for batch in args.batches:
            x, w = problem(n, batch)
            repeats = args.repeats if n * batch <= 10**6 else max(3, args.repeats // 2)
            row = dict(n=n, batch=batch, repeats=repeats)
            # The timed calls, run in interleaved rounds (`timed_together`); the sorts
            # at the strengths found for the ranks.
            calls = {}
            if torchsort is not None:
                s, err = strength_for(TorchRanker(), x, 1.0 / n)
                row.update(torch_strength=s, torch_err=err)
                calls["torch"] = TorchRanker().stepper(x, w, s)
                calls["torch_sort"] = TorchRanker(torchsort.soft_sort).stepper(x, w, s)
            if "lapsum" in args.libraries:
                a, err = strength_for(LAPSUM, x, 1.0 / n)
                row.update(lapsum_alpha=a, lapsum_err=err)
                calls["lapsum"] = LAPSUM.stepper(x, w, a)
                calls["lapsum_sort"] = LAPSUM_SORT.stepper(x, w, a)
            if "permutahedron" in args.libraries and n * batch <= args.permutahedron_max_size:
                e = row.get("torch_strength")
                if e is None:
                    e, _ = strength_for(PERMUTAHEDRON, x, 1.0 / n)
                row.update(perm_strength=e, perm_err=PERMUTAHEDRON.error(x, e))
                calls["perm"] = PERMUTAHEDRON.stepper(x, w, e)
                calls["perm_sort"] = PERMUTAHEDRON_SORT.stepper(x, w, e)
            times, walls, cpus = timed_together(calls, repeats)
            row.update({f"{k}_time": v for k, v in times.items()})
            if torchsort is not None:
                pairs = dict(lapsum=("lapsum", "torch"), sort=("lapsum_sort", "torch_sort"),
                             perm=("perm", "torch"), perm_sort=("perm_sort", "torch_sort"))
                for name, (ours, theirs) in pairs.items():
                    if ours in walls:
                        row[f"{name}_ratio"] = paired_ratio(walls, ours, theirs)
                        row[f"{name}_cpu_ratio"] = paired_ratio(cpus, ours, theirs)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def sinkhorn_section(args):
    n = args.sinkhorn_n
    x, w = problem(n, 1)
    ranker = TFRanker(lambda v, e: ss.sinkhorn_rank(v, epsilon=e), tensor_strength=False)
    out = dict(n=n, epsilon=args.sinkhorn_epsilon,
               sinkhorn_err=ranker.error(x, args.sinkhorn_epsilon),
               sinkhorn_time=ranker.time(x, w, args.sinkhorn_epsilon, args.sinkhorn_repeats))
    a, err = strength_for(LAPSUM, x, 1.0 / n)
    out.update(lapsum_alpha=a, lapsum_err=err, lapsum_time=LAPSUM.time(x, w, a, args.repeats))
    print(json.dumps(out), flush=True)
    return out


def topk_section(args, alpha):
    n, k = args.topk_n, args.topk
    x, w = problem(n, 1)
    xt, wt = tf.constant(x), tf.constant(w)

    @tf.function(jit_compile=True)
    def mask_step(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            p = ss.lapsum_topk(v, k, alpha)
            loss = tf.reduce_sum(wt * p)
        return p, tape.gradient(loss, v)

    @tf.function(jit_compile=True)
    def sort_step(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            loss = tf.reduce_sum(wt * tf.sort(v, axis=-1))
        return tape.gradient(loss, v)

    p = mask_step(xt)[0].numpy()
    hard = np.zeros_like(x)
    np.put_along_axis(hard, np.argsort(-x, axis=-1)[:, :k], 1.0, axis=-1)
    out = dict(n=n, k=k, alpha=alpha, mask_err=float(np.max(np.abs(p - hard))),
               mask_sum=float(p.sum()),
               mask_time=timed(lambda: mask_step(xt)[1].numpy(), args.repeats),
               sort_time=timed(lambda: sort_step(xt).numpy(), args.repeats))
    print(json.dumps(out), flush=True)
    return out


def spearman_section(args, alpha):
    """Training steps of one model on one batch of n items with three losses."""
    import keras

    n = args.spearman_n
    rng = np.random.default_rng(SEED)
    features = rng.standard_normal((n, 16)).astype(np.float32)
    target = (features @ rng.standard_normal(16) + np.sin(3 * features[:, 0])
              + 0.3 * rng.standard_normal(n)).astype(np.float32)[:, None]
    target_ranks = hard_ranks(target.T).T

    def spearman_style(y_rank, y_pred):
        # 1 − Pearson(soft ranks of the predictions, the targets' ranks given as y).
        r = ss.soft_rank(y_pred, "lapsum", axis=0, temperature=alpha)
        r = r - tf.reduce_mean(r)
        t = y_rank - tf.reduce_mean(y_rank)
        return 1.0 - tf.reduce_sum(r * t) / tf.sqrt(tf.reduce_sum(r * r) * tf.reduce_sum(t * t))

    def run(loss, y, jit):
        keras.utils.set_random_seed(SEED)
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, "relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss, jit_compile=jit)
        times = []

        class Timer(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                self.t = time.perf_counter()

            def on_train_batch_end(self, batch, logs=None):
                times.append(time.perf_counter() - self.t)

        hist = model.fit(features, y, batch_size=n, epochs=args.spearman_epochs,
                         shuffle=False, verbose=0, callbacks=[Timer()])
        pred = model.predict(features, batch_size=n, verbose=0)[:, 0]
        rho = float(np.corrcoef(hard_ranks(pred[None])[0], target_ranks[:, 0])[0, 1])
        out = dict(step=float(np.median(times[1:])), first_loss=hist.history["loss"][0],
                   last_loss=hist.history["loss"][-1], rho=rho)
        print(json.dumps(out), flush=True)
        return out

    out = dict(n=n, alpha=alpha, epochs=args.spearman_epochs)
    out["style_xla"] = run(spearman_style, target_ranks, True)
    out["spearman_graph"] = run(ss.SpearmanLoss(axis=0, method="lapsum", temperature=alpha),
                                target, False)
    out["mse_xla"] = run("mse", target, True)
    return out


_MEMORY_CHILD = {
    # Each imports only its own library, runs forward + backward of n ranks twice and
    # prints its peak resident set in MB.
    "lapsum": """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np, tensorflow as tf, softsort_tf as ss
def _peak_mb():
    # VmHWM: this process image's peak resident set (ru_maxrss would also count the
    # parent's memory at fork time).
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024.0
n = int(sys.argv[1])
rng = np.random.default_rng(0)
x = tf.constant(rng.standard_normal((1, n)).astype(np.float32))
w = tf.constant(rng.standard_normal((1, n)).astype(np.float32))
@tf.function(jit_compile=True)
def step(v):
    with tf.GradientTape() as tape:
        tape.watch(v)
        loss = tf.reduce_sum(w * ss.lapsum_rank(v, 0.3 / n))
    return tape.gradient(loss, v)
for _ in range(2):
    step(x).numpy()
print(_peak_mb())
""",
    "torchsort": """
import sys
import numpy as np, torch, torchsort
def _peak_mb():
    # VmHWM: this process image's peak resident set (ru_maxrss would also count the
    # parent's memory at fork time).
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024.0
n = int(sys.argv[1])
rng = np.random.default_rng(0)
x = torch.from_numpy(rng.standard_normal((1, n)).astype(np.float32))
w = torch.from_numpy(rng.standard_normal((1, n)).astype(np.float32))
for _ in range(2):
    v = x.clone().requires_grad_(True)
    (w * torchsort.soft_rank(v, regularization_strength=0.3 / n)).sum().backward()
print(_peak_mb())
""",
}


def memory_section(args):
    out = {}
    libraries = ["lapsum"] + (["torchsort"] if torchsort is not None else [])
    for library in libraries:
        peaks = {}
        for n in (10, args.memory_n):
            cmd = [sys.executable, "-c", _MEMORY_CHILD[library], str(n)]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            peaks[n] = float(res.stdout.strip().splitlines()[-1])
        out[library] = dict(baseline_mb=peaks[10], peak_mb=peaks[args.memory_n],
                            extra_mb=peaks[args.memory_n] - peaks[10], n=args.memory_n)
    print(json.dumps(out), flush=True)
    return out


# ---------------------------------------------------------------------------------
# Report.
# ---------------------------------------------------------------------------------
def _sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:  # pragma: no cover
        return "?"


def _ms(t):
    return f"{t * 1e3:.3g}" if t < 1 else f"{t * 1e3:,.0f}"


def markdown(meta, rows, sink, topk, spear, mem):
    lines = [
        f"Command: `python scripts/bench_sorting_scale.py{meta['argv']}`  ",
        f"Machine: {meta['cpu']} ({meta['cores']} cores), {meta['date']}; TensorFlow "
        f"{meta['tf']}, PyTorch {meta['torch']} ({meta['torch_threads']} threads), "
        f"torchsort {meta['torchsort']}, Python {meta['python']}.  ",
        f"Load (`uptime`) before: {meta['load_before']}; after: {meta['load_after']}.  ",
        "Times: median wall ms / median process CPU ms (all threads) of forward + backward, "
        "the libraries' calls interleaved in rounds; ratios: the median over the rounds of "
        "the two wall times of the same round. Strength: the largest found with max "
        "|soft − hard rank| ≤ 1 (ties averaged; the error over the batch in brackets; where "
        "no strength reaches 1 in float32, the one with the smallest error); the sorts run "
        "at the ranks' strengths. Ratios to torchsort's rank (or sort) of the same round, "
        "wall / CPU. GPU figures were not measured.",
        "",
        "| n | batch | torchsort ε [err] | torchsort rank ms (wall / cpu) | LapSum α [err] | "
        "LapSum rank ms (wall / cpu) | LapSum rank ratio | torchsort sort ms (wall / cpu) | "
        "LapSum sort ms (wall / cpu) | LapSum sort ratio | permutahedron rank ms (wall / "
        "cpu) | permutahedron rank ratio | permutahedron sort ms (wall / cpu) | "
        "permutahedron sort ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ratio(r, name):
        if f"{name}_ratio" not in r:
            return "—"
        return f"{r[f'{name}_ratio']:.2f}× / {r[f'{name}_cpu_ratio']:.2f}×"

    def ms(r, key):
        t = r.get(f"{key}_time")
        return f"{_ms(t[0])} / {_ms(t[1])}" if t else "—"

    for r in rows:
        cells = [f"{r['n']:,}", str(r["batch"])]
        cells.append(f"{r['torch_strength']:.3g} [{r['torch_err']:.2f}]"
                     if "torch_strength" in r else "—")
        cells.append(ms(r, "torch"))
        cells.append(f"{r['lapsum_alpha']:.3g} [{r['lapsum_err']:.2f}]"
                     if "lapsum_alpha" in r else "—")
        cells += [ms(r, "lapsum"), ratio(r, "lapsum"), ms(r, "torch_sort"),
                  ms(r, "lapsum_sort"), ratio(r, "sort"), ms(r, "perm"), ratio(r, "perm"),
                  ms(r, "perm_sort"), ratio(r, "perm_sort")]
        lines.append("| " + " | ".join(cells) + " |")
    if sink:
        st, lt = sink["sinkhorn_time"], sink["lapsum_time"]
        lines += ["", f"Sinkhorn against LapSum at n = {sink['n']:,} (batch 1, forward + "
                  "backward, XLA):", "",
                  "| operator | strength | max \\|soft − hard rank\\| | ms (wall / cpu) |",
                  "|---|---|---|---|",
                  f"| `sinkhorn_rank` | ε = {sink['epsilon']:g} | {sink['sinkhorn_err']:.0f} | "
                  f"{_ms(st[0])} / {_ms(st[1])} |",
                  f"| `lapsum_rank` | α = {sink['lapsum_alpha']:.3g} | {sink['lapsum_err']:.2f} | "
                  f"{_ms(lt[0])} / {_ms(lt[1])} |",
                  "", f"LapSum is {st[0] / lt[0]:,.0f}× faster (wall; "
                  f"{st[1] / lt[1]:,.0f}× in CPU time)."]
    if mem:
        lines += ["", f"Peak memory, ranks of {mem['lapsum']['n']:,} values forward + "
                  "backward (peak resident set of a fresh process minus that of the "
                  "same process on 10 values):", "",
                  "| library | baseline MB | peak MB | extra MB |", "|---|---|---|---|"]
        for lib, m in mem.items():
            lines.append(f"| {lib} | {m['baseline_mb']:.0f} | {m['peak_mb']:.0f} | "
                         f"{m['extra_mb']:.0f} |")
    if topk:
        mt, st = topk["mask_time"], topk["sort_time"]
        lines += ["", f"Top-k mask of {topk['n']:,} values (k = {topk['k']}, α = "
                  f"{topk['alpha']:.3g}; max |p − hard mask| = {topk['mask_err']:.2g}, "
                  f"Σp = {topk['mask_sum']:.1f}), forward + backward, XLA: "
                  f"`lapsum_topk` {_ms(mt[0])} / {_ms(mt[1])} ms, `tf.sort` "
                  f"{_ms(st[0])} / {_ms(st[1])} ms (ratio {mt[0] / st[0]:.2f}× wall)."]
    if spear:
        a, b, c = spear["style_xla"], spear["spearman_graph"], spear["mse_xla"]
        lines += ["", f"Training steps over one batch of {spear['n']:,} items (Dense(32)–"
                  f"Dense(1), Adam(1e-2), median of {spear['epochs'] - 1} steps after the "
                  f"first; α = {spear['alpha']:.3g}):", "",
                  "| loss | compiled | ms per step | loss, first → last step | "
                  "Spearman ρ after |", "|---|---|---|---|---|",
                  f"| 1 − Pearson(`soft_rank(ŷ, 'lapsum', axis=0)`, ranks of y) | XLA | "
                  f"{_ms(a['step'])} | {a['first_loss']:.3f} → {a['last_loss']:.3f} | "
                  f"{a['rho']:.3f} |",
                  f"| `SpearmanLoss(axis=0, method='lapsum')` | graph (no XLA) | "
                  f"{_ms(b['step'])} | {b['first_loss']:.3f} → {b['last_loss']:.3f} | "
                  f"{b['rho']:.3f} |",
                  f"| mean squared error | XLA | {_ms(c['step'])} | "
                  f"{c['first_loss']:.3f} → {c['last_loss']:.3f} | {c['rho']:.3f} |"]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", type=lambda s: [int(float(v)) for v in s.split(",")],
                        default=[10**3, 10**4, 10**5, 10**6])
    parser.add_argument("--batches", type=lambda s: [int(v) for v in s.split(",")],
                        default=[1, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--libraries", type=lambda s: set(s.split(",")),
                        default={"lapsum", "permutahedron"},
                        help="Our operators in the ranks table: lapsum, permutahedron.")
    parser.add_argument("--permutahedron_max_size", type=float, default=4e7,
                        help="Largest n·batch timed for the permutahedron operator.")
    parser.add_argument("--sinkhorn_n", type=int, default=20_000)
    parser.add_argument("--sinkhorn_epsilon", type=float, default=1e-2)
    parser.add_argument("--sinkhorn_repeats", type=int, default=2)
    parser.add_argument("--topk_n", type=int, default=10**6)
    parser.add_argument("--topk", type=int, default=1000)
    parser.add_argument("--spearman_n", type=int, default=10**5)
    parser.add_argument("--spearman_epochs", type=int, default=8)
    parser.add_argument("--memory_n", type=int, default=10**6)
    parser.add_argument("--skip", default="", help="Comma-separated sections to skip: "
                        "ranks, sinkhorn, memory, topk, spearman.")
    parser.add_argument("--markdown", default=None, help="Also write the report here.")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    meta = dict(
        argv="".join(" " + a for a in sys.argv[1:]),
        cpu=_sh("lscpu | grep 'Model name' | sed 's/.*: *//'") or platform.processor(),
        cores=os.cpu_count(), date=datetime.date.today().isoformat(),
        tf=tf.__version__, torch=torch.__version__ if torch else "—",
        torch_threads=torch.get_num_threads() if torch else "—",
        torchsort=importlib.metadata.version("torchsort") if torchsort else "—",
        python=platform.python_version(), load_before=_sh("uptime"))
    print(json.dumps(meta), flush=True)
    rows = ranks_table(args) if "ranks" not in skip else []
    by_n = {r["n"]: r for r in rows if r["batch"] == 1}
    sink = sinkhorn_section(args) if "sinkhorn" not in skip else None
    mem = memory_section(args) if "memory" not in skip else None

    def alpha_at(n):
        if "lapsum_alpha" in by_n.get(n, {}):
            return by_n[n]["lapsum_alpha"]
        return strength_for(LAPSUM, problem(n, 1)[0], 1.0 / n)[0]

    topk = topk_section(args, alpha_at(args.topk_n)) if "topk" not in skip else None
    spear = spearman_section(args, alpha_at(args.spearman_n)) if "spearman" not in skip \
        else None
    meta["load_after"] = _sh("uptime")
    report = markdown(meta, rows, sink, topk, spear, mem)
    print(report)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()

"""Accuracy of the two target placements (`SinkhornOptions.targets`) against the hard
statistic, at equal ε and at equal iterations.

For each operator, n and ε, both grids solve the same rows of standard normal values
(float32, logistic squash, other options at their defaults) and we report the mean
absolute error against the exact statistic (numpy, float64):

- quantile: levels (0.1, 0.5, 0.9) against `np.quantile(method='averaged_inverted_cdf')`
  (the operator's hard limit with the default width);
- top-k values: `sinkhorn_sort(topk=k, direction='DESCENDING')` against the k largest;
- top-k mask: `sinkhorn_topk` against the 0/1 indicator (mean over entries);
- ranks: `sinkhorn_rank` against `scipy.stats.rankdata` (in ranks);
- sort: `sinkhorn_sort` against `np.sort` (in units of x, i.e. standard deviations).

Two budgets: "converged" (the default threshold 1e-3, max_iterations 1000; the column
`iters` is the mean number of iterations used) and "fixed" (`--fixed_iterations`
iterations exactly, threshold 1e-12). Run:

    .venv/bin/python scripts/bench_target_grid.py --markdown=/tmp/grid.md
    .venv/bin/python scripts/bench_target_grid.py --large   # adds n = 10^6 quantile/top-k
    .venv/bin/python scripts/bench_target_grid.py --issue_examples
    .venv/bin/python scripts/bench_target_grid.py --scan_n   # one ε for every n?

`--scan_n` asks whether one fixed ε serves every n (issue 10, item 1): at each n it
reports the quantile error (standard deviations), the top-k values error and the
top-k mask's recall (mass of the soft mask on the true top k, over k), converged.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import scipy.stats
from absl import app, flags

_EPSILONS = flags.DEFINE_list("epsilons", ["1e-2", "1e-3"], "Values of ε.")
_ROWS = flags.DEFINE_integer("rows", 4, "Rows (independent samples) per problem.")
_FIXED = flags.DEFINE_integer("fixed_iterations", 20, "Iterations of the fixed budget.")
_SIZES = flags.DEFINE_list("sizes", None, "Replace the n of every problem by these (top-k: "
                          "k = min(10, n - 1)), e.g. 3,5,10 for the small lists of "
                          "the sorting benchmarks.")
_LARGE = flags.DEFINE_bool("large", False, "Also n = 10^6 quantiles and top-k (1 row).")
_MARKDOWN = flags.DEFINE_string("markdown", None, "Also write the table to this file.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the rows.")
_SCAN = flags.DEFINE_bool("scan_n", False, "Only the scan over n at the given ε (quantile "
                          "error, top-k values error, top-k mask recall), both grids.")
_TOPK_RULE = flags.DEFINE_float("topk_rule", None, "With --scan_n: instead of --epsilons, "
                                "top-k uses ε = c·k/n with this c (quantiles: 1e-2).")
_ISSUE = flags.DEFINE_bool("issue_examples", False, "Only print the issue's examples: the "
                           "0.8-quantile of 100 uniform values, and the 10 %/90 % quantiles "
                           "and top-10 values of 10^6 normal values, per squash, ε and grid.")

GRIDS = ("centres", "regular")
LEVELS = (0.1, 0.5, 0.9)


def _problems(large: bool, sizes=None):
    """(operator, n, k or None) to measure."""
    if sizes:
        ops = ("quantile", "top-k values", "top-k mask", "ranks", "sort")
        return [(op, n, min(10, n - 1) if op.startswith("top-k") else None)
                for op in ops for n in sizes]
    out = [("quantile", n, None) for n in (100, 10_000)]
    out += [("top-k values", n, 10) for n in (100, 10_000)]
    out += [("top-k mask", n, 10) for n in (100, 10_000)]
    out += [("ranks", n, None) for n in (100, 1000)]
    out += [("sort", n, None) for n in (100, 1000)]
    if large:
        out += [("quantile", 1_000_000, None), ("top-k values", 1_000_000, 10)]
    return out


def _soft(ss, op: str, x, k, **options):
    """The soft statistic, as numpy `[rows, ·]`, and the iterations used per row."""
    if op == "quantile":
        out, info = ss.sinkhorn_quantile(x, LEVELS, return_info=True, **options)
    elif op == "top-k values":
        out, info = ss.sinkhorn_sort(x, topk=k, direction="DESCENDING", return_info=True,
                                     **options)
    elif op == "top-k mask":
        out, info = ss.sinkhorn_topk(x, k, return_info=True, **options)
    elif op == "ranks":
        out, info = ss.sinkhorn_rank(x, return_info=True, **options)
    else:
        out, info = ss.sinkhorn_sort(x, return_info=True, **options)
    return out.numpy().astype(np.float64), info.num_iterations.numpy()


def _hard(op: str, x, k):
    x = x.astype(np.float64)
    if op == "quantile":
        return np.quantile(x, LEVELS, axis=-1, method="averaged_inverted_cdf").T
    if op == "top-k values":
        return -np.sort(-x, axis=-1)[:, :k]
    if op == "top-k mask":
        kth = -np.sort(-x, axis=-1)[:, k - 1:k]
        return (x >= kth).astype(np.float64)
    if op == "ranks":
        return scipy.stats.rankdata(x, axis=-1)
    return np.sort(x, axis=-1)


def measure(ss, op, n, k, epsilon, grid, budget, rows, seed):
    """Mean absolute error against the hard statistic, mean iterations, seconds."""
    x = np.random.default_rng(seed).normal(size=(rows, n)).astype(np.float32)
    if budget == "converged":
        options = dict(epsilon=epsilon, targets=grid)
    else:
        options = dict(epsilon=epsilon, targets=grid, threshold=1e-12,
                       max_iterations=_FIXED.value)
    start = time.perf_counter()
    with warnings.catch_warnings():  # the fixed budget is unconverged on purpose
        warnings.simplefilter("ignore", ss.SinkhornConvergenceWarning)
        soft, iters = _soft(ss, op, x, k, **options)
    seconds = time.perf_counter() - start
    return float(np.mean(np.abs(soft - _hard(op, x, k)))), float(np.mean(iters)), seconds


def issue_examples(ss):
    """The examples of issue 10 item 1, on both grids (seed 0, float32)."""
    u = np.random.default_rng(0).uniform(size=(1, 100)).astype(np.float32)
    print(f"100 uniform values: sample 0.8-quantile "
          f"{np.quantile(u, 0.8, method='averaged_inverted_cdf'):.4f}")
    for grid in GRIDS:
        q = float(ss.sinkhorn_quantile(u, 0.8, epsilon=1e-2, targets=grid)[0])
        print(f"  ε = 1e-2, {grid}: {q:.4f}")
    x = np.random.default_rng(0).normal(size=(1, 1_000_000)).astype(np.float32)
    top = -np.sort(-x[0])[:10]
    print(f"10^6 normal values: numpy 10 %/90 % quantiles "
          f"{np.round(np.quantile(x, [0.1, 0.9]), 3)}, top-1 {top[0]:.3f}, top-10 {top[-1]:.3f}")
    print("| squash | ε | grid | 10 % | 90 % | soft top-1 | soft top-10 | top-10 mean abs error |")
    print("|" + "---|" * 8)
    for squash in ("logistic", "atan"):
        for epsilon in (1e-2, 1e-3, 1e-4):
            for grid in GRIDS:
                kw = dict(epsilon=epsilon, squash=squash, targets=grid)
                q = ss.sinkhorn_quantile(x, [0.1, 0.9], **kw).numpy()[0]
                t = ss.sinkhorn_sort(x, topk=10, direction="DESCENDING", **kw).numpy()[0]
                print(f"| {squash} | {epsilon:g} | {grid} | {q[0]:.3f} | {q[1]:.3f} | "
                      f"{t[0]:.3f} | {t[-1]:.3f} | {np.abs(t - top).mean():.3f} |", flush=True)


def scan_n(ss, epsilons, rows, seed, topk_rule=None):
    """Quantile error, top-k values error and top-k mask recall against n, converged
    (with `topk_rule` = c: quantiles at ε = 1e-2, top-k at ε = c·k/n)."""
    print("| n | k | ε (quantile / top-k) | grid | quantile error | top-k values error | "
          "top-k mask recall | iters (q / values / mask) |")
    print("|" + "---|" * 8)
    for n in (10, 100, 1000, 10_000, 100_000):
        k = 3 if n <= 10 else 10
        x = np.random.default_rng(seed).normal(size=(rows, n)).astype(np.float32)
        true_top = _hard("top-k mask", x, k)
        pairs = [(1e-2, topk_rule * k / n)] if topk_rule else [(e, e) for e in epsilons]
        for epsilon, topk_epsilon in pairs:
            for grid in GRIDS:
                kw = dict(epsilon=epsilon, targets=grid)
                kw_topk = dict(epsilon=topk_epsilon, targets=grid)
                with warnings.catch_warnings():
                    warnings.simplefilter("error", ss.SinkhornConvergenceWarning)
                    q, iq = _soft(ss, "quantile", x, None, **kw)
                    v, iv = _soft(ss, "top-k values", x, k, **kw_topk)
                    mask, im = _soft(ss, "top-k mask", x, k, **kw_topk)
                q_err = np.mean(np.abs(q - _hard("quantile", x, None)))
                v_err = np.mean(np.abs(v - _hard("top-k values", x, k)))
                recall = np.mean(np.sum(mask * true_top, axis=-1) / k)
                print(f"| {n} | {k} | {epsilon:g} / {topk_epsilon:.3g} | {grid} | "
                      f"{q_err:.4f} | {v_err:.4f} | "
                      f"{recall:.3f} | {np.mean(iq):.0f} / {np.mean(iv):.0f} / "
                      f"{np.mean(im):.0f} |", flush=True)


def main(argv):
    del argv
    import softsort_tf as ss

    if _ISSUE.value:
        issue_examples(ss)
        return
    if _SCAN.value:
        scan_n(ss, [float(e) for e in _EPSILONS.value], _ROWS.value, _SEED.value,
               _TOPK_RULE.value)
        return

    header = ("| operator | n | k | ε | budget | error centres | error regular | "
              "iters centres | iters regular | error ratio c/r |")
    lines = [header, "|" + "---|" * 10]
    print(header, flush=True)
    sizes = [int(n) for n in _SIZES.value] if _SIZES.value else None
    for op, n, k in _problems(_LARGE.value, sizes):
        rows = 1 if n >= 1_000_000 else _ROWS.value
        for epsilon in (float(e) for e in _EPSILONS.value):
            for budget in ("converged", "fixed"):
                if n >= 1_000_000 and budget == "fixed":
                    continue
                res = {g: measure(ss, op, n, k, epsilon, g, budget, rows, _SEED.value)
                       for g in GRIDS}
                (ec, ic, _), (er, ir, _) = res["centres"], res["regular"]
                ratio = ec / er if er > 0 else float("inf")
                line = (f"| {op} | {n} | {k or '–'} | {epsilon:g} | {budget} | {ec:.4g} | "
                        f"{er:.4g} | {ic:.0f} | {ir:.0f} | {ratio:.2f} |")
                lines.append(line)
                print(line, flush=True)
    if _MARKDOWN.value:
        with open(_MARKDOWN.value, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    app.run(main)

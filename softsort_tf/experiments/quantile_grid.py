"""The grid of Cuturi et al. (2019), Table 1: runs, aggregation and the Markdown table.

Used by `scripts/run_quantile_regression_grid.py`. Each cell (data set, τ, loss) is
run for `seeds` seeds with `quantile_regression.run`; the table gives the mean ± the
standard error (sample standard deviation / √runs) of the held-out pinball loss, next
to the number published in the paper's Table 1 (`PAPER_TABLE1`).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
from collections.abc import Callable
from concurrent import futures

import keras
import numpy as np

from softsort_tf.datasets import cqr
from softsort_tf.experiments import quantile_regression

__all__ = ["DATASETS", "LOSSES", "NUM_SEEDS", "PAPER_TABLE1", "QUANTILES", "Grid", "format_table"]

DATASETS = cqr.DATASETS
QUANTILES = (0.1, 0.2, 0.5)
LOSSES = quantile_regression.LOSSES
NUM_SEEDS = 12
RUNS_PER_PROCESS = 30  # see Grid.run
# Cuturi, Teboul & Vert (2019), Table 1: pinball loss averaged over 12 runs, one row per
# (τ, loss), one column per data set of DATASETS (the paper's `facebook` column is not
# among our data sets).
_PAPER_ROWS = {
    (0.1, "pinball"): (0.109, 0.145, 0.170, 0.105, 0.099),
    (0.1, "squantile"): (0.281, 0.144, 0.353, 0.482, 0.100),
    (0.2, "pinball"): (0.206, 0.272, 0.279, 0.176, 0.178),
    (0.2, "squantile"): (0.206, 0.274, 0.367, 0.367, 0.176),
    (0.5, "pinball"): (0.430, 0.513, 0.421, 0.299, 0.337),
    (0.5, "squantile"): (0.442, 0.572, 0.434, 0.287, 0.357),
}
PAPER_TABLE1 = {key: dict(zip(DATASETS, row, strict=True)) for key, row in _PAPER_ROWS.items()}
BEGIN_MARKER = "<!-- quantile-regression-table:begin -->"
END_MARKER = "<!-- quantile-regression-table:end -->"


def _run_one(config: quantile_regression.QuantileRegressionConfig) -> None:
    keras.backend.clear_session()
    quantile_regression.run(config)


def _stats(values: list[float]) -> tuple[float, float, int]:
    v = np.asarray(values, np.float64)
    se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")
    return float(v.mean()), se, len(v)


def format_table(results: dict, datasets=DATASETS, quantiles=QUANTILES, losses=LOSSES,
                 seeds: int = NUM_SEEDS, factor_key: str | None = None,
                 constants: dict | None = None) -> str:
    """Markdown table of `results[(dataset, quantile, loss)] = [results dicts]`.

    Each cell: our mean ± s.e. of the test pinball loss (with the number of runs when
    fewer than `seeds` are finished) and, in brackets, the paper's value. With
    `constants` (`{(dataset, τ): (loss, loss in std units)}`, see `Grid.constants`) a
    row per τ gives the constant predictor. With `factor_key`, every run's losses are
    multiplied by `run[factor_key]` first (a change of units; the constants' second
    value is then used).
    """

    def value(run, key):
        return run["metrics"][key] * (run[factor_key] if factor_key else 1.0)

    names = {"pinball": "Pinball", "squantile": "S-quantile"}
    lines = ["| τ, loss | " + " | ".join(datasets) + " |",
             "|---|" + "---|" * len(datasets)]
    for quantile in quantiles:
        for loss in losses:
            cells = []
            for ds in datasets:
                runs = results.get((ds, quantile, loss), [])
                paper = PAPER_TABLE1.get((quantile, loss), {}).get(ds)
                paper_txt = f" ({paper:.3f})" if paper is not None else ""
                if not runs:
                    cells.append(f"pending{paper_txt}")
                    continue
                mean, se, n = _stats([value(r, "test_pinball") for r in runs])
                count = "" if n >= seeds else f" [{n} runs]"
                cells.append(f"{mean:.4f} ± {se:.4f}{count}{paper_txt}")
            lines.append(f"| {quantile}, {names.get(loss, loss)} | " + " | ".join(cells) + " |")
        if constants:
            consts = [f"{constants[ds, quantile][1 if factor_key else 0]:.4f}"
                      if (ds, quantile) in constants else "–" for ds in datasets]
            lines.append(f"| {quantile}, constant τ-quantile | " + " | ".join(consts) + " |")
    return "\n".join(lines) + "\n"


@dataclasses.dataclass
class Grid:
    """The runs of the grid (see the module docstring)."""

    runs_dir: str
    data_dir: str
    datasets: tuple = DATASETS
    quantiles: tuple = QUANTILES
    losses: tuple = LOSSES
    seeds: int = NUM_SEEDS
    overrides: dict = dataclasses.field(default_factory=dict)

    def run_dir(self, dataset: str, quantile: float, loss: str, seed: int) -> str:
        return os.path.join(self.runs_dir, dataset, f"quantile{quantile}", loss,
                            f"seed{seed}")

    def cells(self):
        """(dataset, τ, loss, seed), seed-major: every cell gets its first runs first."""
        for seed in range(self.seeds):
            for ds in self.datasets:
                for quantile in self.quantiles:
                    for loss in self.losses:
                        yield ds, quantile, loss, seed

    def run(self, runs_per_process: int = RUNS_PER_PROCESS,
            runner: Callable[[quantile_regression.QuantileRegressionConfig], None] = _run_one,
            start_method: str = "spawn") -> None:
        """Runs every missing run; rewrites `runs_dir/table.md` after each.

        The runs go to a child process that is replaced every `runs_per_process` runs:
        each run XLA-compiles its own steps, and a process that had compiled ~130 runs
        ran out of memory maps ("LLVM compilation error: Cannot allocate memory", then a
        segmentation fault) on this machine. A child that dies stops the grid with a
        `RuntimeError` (the finished runs are kept; rerunning resumes).

        Args:
          runs_per_process: runs per child process before it is replaced.
          runner: the function a child applies to each run's config (a module-level
            function, pickled by name); `quantile_regression.run` in a fresh session.
          start_method: how the children start (`multiprocessing`): 'spawn', a fresh
            interpreter (TensorFlow's runtime is not fork-safe); 'fork' only for a
            runner that does not use TensorFlow (the tests' runner that kills its
            process, which then skips a fresh TensorFlow import); a forked child is
            never replaced (`multiprocessing` forbids it).
        """
        configs = [quantile_regression.QuantileRegressionConfig(
            output_dir=self.run_dir(ds, quantile, loss, seed), dataset=ds,
            data_dir=self.data_dir, loss=loss, quantile=quantile, seed=seed,
            **self.overrides)
            for ds, quantile, loss, seed in self.cells()
            if not os.path.exists(os.path.join(self.run_dir(ds, quantile, loss, seed),
                                               "results.json"))]
        if not configs:
            return
        with futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(start_method),
                                         max_tasks_per_child=(None if start_method == "fork"
                                                              else runs_per_process)) as pool:
            try:
                for _ in pool.map(runner, configs):
                    self.write_tables(None)
            except futures.BrokenExecutor as e:  # BrokenProcessPool
                raise RuntimeError(
                    f"A run's process died ({e}); the finished runs are kept in "
                    f"{self.runs_dir}: rerun the grid to resume.") from e

    def constants(self) -> dict:
        """`{(dataset, τ): (test pinball, same in std units)}` of the constant predictor
        (the training part's τ-quantile), averaged over the seeds; no training needed."""
        if getattr(self, "_constants", None) is None:
            out = {}
            for ds in self.datasets:
                splits = [cqr.load_split(ds, self.data_dir, seed) for seed in range(self.seeds)]
                for quantile in self.quantiles:
                    losses, scaled = [], []
                    for split in splits:
                        y = np.concatenate([split.y_train, split.y_val]).astype(np.float64)
                        r = split.y_test.astype(np.float64) - np.quantile(y, quantile)
                        losses.append(np.mean(np.maximum(quantile * r, (quantile - 1) * r)))
                        scaled.append(losses[-1] / np.std(y))
                    out[ds, quantile] = (float(np.mean(losses)), float(np.mean(scaled)))
            self._constants = out
        return self._constants

    def collect(self) -> dict:
        """`{(dataset, τ, loss): [results dicts of the finished runs]}`.

        Each run also gets `std_factor` = 1 / std of its (scaled) training responses,
        which converts its losses to units of the response's standard deviation.
        """
        results, factors = {}, {}
        for ds, quantile, loss, seed in self.cells():
            path = os.path.join(self.run_dir(ds, quantile, loss, seed), "results.json")
            if os.path.exists(path):
                with open(path) as f:
                    run = json.load(f)
                if (ds, seed) not in factors:
                    split = cqr.load_split(ds, self.data_dir, seed,
                                           run["flags"]["validation_fraction"])
                    factors[ds, seed] = 1.0 / float(np.std(np.concatenate(
                        [split.y_train, split.y_val]).astype(np.float64)))
                run["std_factor"] = factors[ds, seed]
                results.setdefault((ds, quantile, loss), []).append(run)
        return results

    def complete(self, results: dict) -> bool:
        return sum(len(v) for v in results.values()) == (
            len(self.datasets) * len(self.quantiles) * len(self.losses) * self.seeds)

    def write_tables(self, results_md: str | None, force: bool = False) -> str:
        """Writes `runs_dir/table.md`; also the section of `results_md` (between
        `BEGIN_MARKER` and `END_MARKER`) when the grid is complete or `force`."""
        results = self.collect()
        args = (results, self.datasets, self.quantiles, self.losses, self.seeds)
        constants = self.constants()
        table = (f"Held-out pinball loss, responses divided by the mean absolute training "
                 f"response (the reference protocol):\n\n"
                 f"{format_table(*args, constants=constants)}\n"
                 f"The same runs in units of the training responses' standard deviation "
                 f"(loss × mean\\|y\\| / std(y)):\n\n"
                 f"{format_table(*args, factor_key='std_factor', constants=constants)}")
        os.makedirs(self.runs_dir, exist_ok=True)
        with open(os.path.join(self.runs_dir, "table.md"), "w") as f:
            f.write(table)
        if results_md and (force or self.complete(results)):
            with open(results_md) as f:
                text = f.read()
            if BEGIN_MARKER not in text or END_MARKER not in text:
                raise ValueError(f"{results_md} has no {BEGIN_MARKER} ... {END_MARKER} section.")
            head, rest = text.split(BEGIN_MARKER, 1)
            _, tail = rest.split(END_MARKER, 1)
            tmp = results_md + ".tmp"
            with open(tmp, "w") as f:
                f.write(f"{head}{BEGIN_MARKER}\n{table}{END_MARKER}{tail}")
            os.replace(tmp, results_md)
        return table

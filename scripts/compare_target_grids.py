"""The losses' results on both target grids (`SinkhornOptions.targets`).

Runs the two small learning problems of `softsort_tf.experiments.small_problems` with
every Sinkhorn loss they exercise, once with the targets at the bin centres
('centres', the former default) and once on the paper's regular grid ('regular', the
default now), same seeds and budgets, and prints a markdown table (docs/RESULTS.md,
"Target grid: the losses").

    python scripts/compare_target_grids.py --seeds=0,1,2
"""

from __future__ import annotations

import time

import keras
import numpy as np
from absl import flags

import softsort_tf as ss
from softsort_tf.experiments import flags as experiment_flags
from softsort_tf.experiments import small_problems, training

_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of each problem.")
GRIDS = ("centres", "regular")


def _rows(seeds: list[int]):
    problems = {
        "8×8 digits, test accuracy: `SoftTopKLoss(k=1)` rank form":
            (small_problems.digits_accuracy,
             lambda grid: ss.SoftTopKLoss(k=1, from_sparse=True, targets=grid)),
        "8×8 digits, test accuracy: `SoftTopKLoss(k=1, form='cdf')`":
            (small_problems.digits_accuracy,
             lambda grid: ss.SoftTopKLoss(k=1, from_sparse=True, form="cdf", targets=grid)),
        "outliers, fitted slope (true 3): `SoftLeastQuantileRegressionLoss(0.5)`":
            (small_problems.outlier_slope,
             lambda grid: ss.SoftLeastQuantileRegressionLoss(quantile=0.5, targets=grid)),
        "outliers, fitted slope (true 3): `SoftTrimmedRegressionLoss(0.0, 0.6)`":
            (small_problems.outlier_slope,
             lambda grid: ss.SoftTrimmedRegressionLoss(0.0, 0.6, targets=grid)),
    }
    for name, (problem, make_loss) in problems.items():
        values = {}
        for grid in GRIDS:
            start = time.perf_counter()
            values[grid] = [problem(make_loss(grid), seed=seed) for seed in seeds]
            values[f"{grid}_s"] = time.perf_counter() - start
        yield name, values


def main(argv):
    del argv
    seeds = [int(s) for s in _SEEDS.value]
    info = training.machine_info()
    print(f"\nseeds {seeds}; {info['processor']}, {info['cpu_count']} CPUs, TF "
          f"{info['tensorflow']}, Keras {keras.__version__}\n")
    print("| problem and loss | centres (per seed) | mean | regular (per seed) | mean |")
    print("|---|---|---|---|---|")
    for name, values in _rows(seeds):
        cells = []
        for grid in GRIDS:
            cells.append(", ".join(f"{v:.4f}" for v in values[grid]))
            cells.append(f"{np.mean(values[grid]):.4f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    experiment_flags.run_binary(main)

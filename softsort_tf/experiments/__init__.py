"""Large-MNIST experiments behind `scripts/train_sort.py` and `scripts/train_median.py`.

- `models`: the CNN of SoftSort App. A.1.1, `PermutationLearner`, `MedianRegressor`;
- `training`: strategies, per-epoch checkpoints with automatic resume, results JSON;
- `large_mnist`: `ExperimentConfig` and `run(config)`, a whole run;
- `flags`: the binaries' absl flags.
"""

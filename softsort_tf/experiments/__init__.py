"""Experiments behind the training binaries (one absl program family).

- `flags`: the absl flags shared by every binary (run, relaxation and data groups),
  with validators, and `run_binary` (one-line flag errors, one log handler);
- `checks`: the allowed values of the experiment settings, used by configs and flags;
- `training`: `tf.distribute` strategies, `fit_resumable` (Keras' `BackupAndRestore`,
  `ModelCheckpoint`, `CSVLogger` and `TensorBoard`: resume after an interruption, best
  epoch on validation, early stopping that survives a restart), the output folder,
  results JSON;
- `models`: the CNN of SoftSort App. A.1.1, `PermutationLearner`, `MedianRegressor`;
- `large_mnist`: `ExperimentConfig` and `run(config)` of the large-MNIST sorting and
  median tasks (`scripts/train_sort.py`, `scripts/train_median.py`, `scripts/demo.py`);
- `tuning`: the keras-tuner search of τ / ε and the learning rate (`scripts/tune.py`);
- `quantile_regression`, `quantile_grid`: the quantile-regression benchmark of
  Cuturi et al. (2019, Table 1) and its grid.
"""

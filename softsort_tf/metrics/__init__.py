"""Hard (exact) metrics matching the soft losses of `softsort_tf.losses`.

- `QuantileError`, `TrimmedError`: the τ-quantile and the trimmed mean of the batch
  errors |y − ŷ|^power (counterparts of `SoftLeastQuantileRegressionLoss` and
  `SoftTrimmedRegressionLoss`). Like those losses they describe a batch: `result()` is
  the mean of the per-batch statistics weighted by batch size (as `Model.fit` averages
  a loss), not the statistic of all the errors of the epoch.
- `SpearmanCorrelation`, `KendallTau`, `NDCGMetric`, `MRRMetric`, the permutation
  accuracies: sample-weighted means of per-list (or per-example) values (docs/api.md,
  "Metrics"); `SoftTopKLoss`'s are Keras' `SparseTopKCategoricalAccuracy(k)`.
"""

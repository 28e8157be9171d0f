"""Hard (exact) metrics matching the soft losses of `softsort_tf.losses`.

- `QuantileError`: the τ-quantile of the batch errors |y − ŷ|^power, the exact
  counterpart of `SoftLeastQuantileRegressionLoss`.
- `TrimmedError`: the mean of the batch errors between two quantiles, the exact
  counterpart of `SoftTrimmedRegressionLoss`.
- `SpearmanCorrelation`: Spearman's ρ along an axis with ties averaged, the exact
  counterpart of 1 − `SpearmanLoss`.
- `NDCGMetric` (NDCG@k) and `MRRMetric` (mean reciprocal rank): ranking metrics over
  padded or ragged lists (`softsort_tf._lists`; label < 0 = padding).

For `SoftTopKLoss` no new metric is needed: Keras' own
`keras.metrics.SparseTopKCategoricalAccuracy(k)` (integer labels) and
`keras.metrics.TopKCategoricalAccuracy(k)` (one-hot labels) are its hard
counterparts (1 − accuracy is the mean hard top-k 0/1 loss).

Streaming. `QuantileError` and `TrimmedError` describe a *batch* (like the losses
they match, which are batch statistics): each `update_state` call computes the
statistic of that batch, and `result()` is the mean of these per-batch values
weighted by batch size, which is how `Model.fit` averages a loss over an epoch. It is
not the quantile of all the errors of the epoch (that would need to keep every error);
evaluate with one large batch to get that. `SpearmanCorrelation`, `NDCGMetric` and
`MRRMetric` are per-list values and stream as ordinary (sample-weighted) means over lists.
"""

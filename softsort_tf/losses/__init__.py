"""Keras losses built on the package's soft sorting and ranking operators.

Each loss is a thin `keras.losses.Loss` around a functional form (the pattern of
Keras' own losses, `losses.base.LossFunctionWrapper`): the class validates its
arguments at construction and holds no maths; the function computes one loss per
example or per list, and Keras reduces them with `sample_weight`.

- `SoftTopKLoss` (`soft_topk_loss`): the S-top-k classification loss of Cuturi, Teboul
  & Vert (2019, §4), read off the Sinkhorn ranks or S-CDF of the logits;
- `SoftLeastQuantileRegressionLoss`, `SoftTrimmedRegressionLoss`: robust regression
  through the S-quantile (eq. 4) and a trimmed mean of the batch errors;
- `SpearmanLoss` (`spearman_loss`): 1 − Pearson correlation of the soft prediction
  ranks and the hard target ranks;
- `SoftNDCGLoss` (`soft_ndcg_loss`), `ListwisePermutationLoss`
  (`listwise_permutation_loss`): listwise learning to rank over padded or ragged lists
  (`softsort_tf._lists`);
- `PermutationCrossEntropy` (`permutation_cross_entropy`): learning to sort with a
  relaxed permutation matrix.

Every Sinkhorn-based loss (`losses.base.SinkhornLoss`) takes the same settings: the
solver's `SinkhornOptions` as `options=` or as keyword arguments with the names of its
fields (`epsilon`, `power`, `threshold`, ...), and the operator settings `squash` and
`targets`; all are validated at construction and are part of `get_config()`.

Temperatures: a loss that takes `method` calls the temperature of that method
`temperature`; it is τ (`tau`) for SoftSort and NeuralSort and ε (`epsilon`) for
Sinkhorn (`Family.temperature`). The other naming rules (direction, `k`
and `topk`) are stated in `softsort_tf.ops.soft`.
"""

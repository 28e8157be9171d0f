"""Rank- and quantile-based Keras losses built on the Sinkhorn operators.

The losses of §4 of Cuturi, Teboul & Vert (2019), "Differentiable Sorting using
Optimal Transport: The Sinkhorn CDF and Quantile Operator" (and the "Applications"
part of the NeurIPS 2019 talk), plus a Spearman loss for learning to rank:

- `SoftTopKLoss`: the S-top-k loss, a differentiable 0/1 (top-k) classification loss
  read off the Sinkhorn ranks (talk) or S-CDF (paper) of the logits;
- `SoftLeastQuantileRegressionLoss`: the τ-S-quantile (eq. 4) of the batch errors
  (least-quantile regression, robust to outliers);
- `SoftTrimmedRegressionLoss`: the soft mean of the batch errors between two quantiles
  (trimmed regression), read from one bin of the same transport problem;
- `SpearmanLoss`: 1 − Pearson correlation of soft prediction ranks and hard target ranks.

Listwise learning-to-rank losses over padded or ragged lists (`ranking`, padding
convention: label < 0 or a boolean mask; see that module):

- `SoftNDCGLoss`: 1 − NDCG of the soft ranks (Sinkhorn, SoftSort or NeuralSort);
- `ListwisePermutationLoss`: NeuralSort/SoftSort cross-entropy against the order by
  relevance (PiRank/NeuralSort style).

Every loss is a thin wrapper over a functional op (`soft_top_k_loss`,
`sinkhorn_quantile`, `sinkhorn_trimmed_mean`, `soft_spearman_correlation`), which in
turn only reads out `softsort_tf.ops.sinkhorn` operators: no loss runs its own
Sinkhorn loop.

The Sinkhorn losses take their solver settings as one `SinkhornOptions`
(`options=`), or as keyword arguments with the names of its fields (`epsilon`,
`power` — the cost exponent —, `threshold`, ...); see `softsort_tf.options`. The
former arguments `cost_power` and `solver_options` are accepted with a deprecation
warning; the regression losses' error exponent is `error_power`.
"""

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

Every loss is a thin wrapper over a functional op (`soft_top_k_loss`,
`sinkhorn_quantile`, `sinkhorn_trimmed_mean`, `soft_spearman_correlation`), which in
turn only reads out `softsort_tf.ops.sinkhorn` operators: no loss runs its own
Sinkhorn loop.

Sinkhorn arguments common to the loss classes (meaning as in `sinkhorn_ops`):
`epsilon` (ε), `cost_power` (the exponent p of the transport cost |x̃ − y|^p, default
2, called `power` in the operators; the regression losses use `power` for the error
exponent), `threshold` (1e-3), `max_iterations` (1000), `implicit` (True), `squash`
('logistic') and `solver_options` (a dict of advanced `sinkhorn_solver.solve`
options such as `implicit_solver`, `warm_start`, `epsilon_start`).
"""

"""Keras losses built on the package's soft sorting and ranking operators.

Each loss is a thin `keras.losses.Loss` around a functional form
(`losses.base.LossFunctionWrapper`): the class validates its arguments at
construction, the function computes one loss per example or per list, and Keras
reduces them with `sample_weight`.

- `SoftTopKLoss` (`soft_topk_loss`): the S-top-k classification loss (Cuturi, Teboul &
  Vert 2019, §4);
- `SoftLeastQuantileRegressionLoss`, `SoftTrimmedRegressionLoss`,
  `SoftQuantileRegressionLoss`, `PinballLoss`: robust and quantile regression;
- `SpearmanLoss`, `KendallTauLoss`: 1 − a soft rank correlation of each list;
- `SoftNDCGLoss`, `ListwisePermutationLoss`: listwise learning to rank over padded or
  ragged lists;
- `PermutationCrossEntropy`: learning to sort with a relaxed permutation matrix.

The losses that take `method=` call that family's temperature `temperature`
(`Family.temperature`); Sinkhorn's settings (`options`, its fields such as `epsilon`,
`squash`, `targets`) are keyword arguments of their own, part of `get_config()`.
"""

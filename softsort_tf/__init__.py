"""softsort_tf: differentiable sorting, ranking and quantile operators for TensorFlow/Keras."""

from softsort_tf.hard_stats import rankdata
from softsort_tf.losses import (
    SoftLeastQuantileRegressionLoss,
    SoftTopKLoss,
    SoftTrimmedRegressionLoss,
    SpearmanLoss,
    sinkhorn_trimmed_mean,
    soft_spearman_correlation,
    soft_top_k_loss,
)
from softsort_tf.metrics import (
    QuantileError,
    SpearmanCorrelation,
    TrimmedError,
    spearman_correlation,
)
from softsort_tf.permutation_layers import NeuralSort, SinkhornPermutation, SoftSort
from softsort_tf.permutation_losses import (
    ElementwisePermutationAccuracy,
    ExactPermutationAccuracy,
    PermutationCrossEntropy,
    elementwise_permutation_accuracy,
    exact_permutation_accuracy,
    permutation_cross_entropy,
)
from softsort_tf.permutation_ops import (
    gumbel_perturb,
    hard_permutation_matrix,
    neural_sort_matrix,
    permutation_matrix,
    permute_values,
    ranks_from_permutation,
    soft_sort_matrix,
    stochastic_neural_sort_matrix,
    stochastic_permutation_matrix,
    stochastic_sinkhorn_permutation_matrix,
    stochastic_soft_sort_matrix,
    straight_through,
)
from softsort_tf.sinkhorn_layers import (
    SinkhornCDF,
    SinkhornQuantile,
    SinkhornQuantileNormalization,
    SinkhornRank,
    SinkhornSort,
)
from softsort_tf.sinkhorn_ops import (
    SinkhornInfo,
    quantile_target_weights,
    sinkhorn_cdf,
    sinkhorn_permutation_matrix,
    sinkhorn_quantile,
    sinkhorn_quantile_normalization,
    sinkhorn_rank,
    sinkhorn_sort,
    sinkhorn_topk_mask,
)
from softsort_tf.squash import squash_values

__version__ = "0.1.0"

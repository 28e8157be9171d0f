"""softsort_tf: differentiable sorting, ranking and quantile operators for TensorFlow/Keras."""

from softsort_tf import _autograph
from softsort_tf._version import __version__
from softsort_tf.layers.kendall import KendallEmbedding
from softsort_tf.layers.permutation import NeuralSort, SinkhornPermutation, SoftSort
from softsort_tf.layers.sinkhorn import (
    SinkhornCDF,
    SinkhornQuantile,
    SinkhornQuantileNormalization,
    SinkhornRank,
    SinkhornSort,
)
from softsort_tf.layers.soft import QuantileLayer, RankLayer, SortLayer, TopKLayer
from softsort_tf.losses.kendall import KendallTauLoss
from softsort_tf.losses.permutation import PermutationCrossEntropy, permutation_cross_entropy
from softsort_tf.losses.ranking import (
    ListwisePermutationLoss,
    SoftNDCGLoss,
    listwise_permutation_loss,
    soft_ndcg,
)
from softsort_tf.losses.regression import (
    PinballLoss,
    SoftLeastQuantileRegressionLoss,
    SoftQuantileRegressionLoss,
    SoftTrimmedRegressionLoss,
    pinball_loss,
    sinkhorn_trimmed_mean,
    soft_least_quantile_regression_loss,
    soft_quantile_regression_loss,
    soft_trimmed_regression_loss,
)
from softsort_tf.losses.spearman import SpearmanLoss, soft_spearman_correlation
from softsort_tf.losses.top_k import SoftTopKLoss, soft_topk_loss
from softsort_tf.metrics.kendall import KendallTau
from softsort_tf.metrics.permutation import (
    ElementwisePermutationAccuracy,
    ExactPermutationAccuracy,
    elementwise_permutation_accuracy,
    exact_permutation_accuracy,
)
from softsort_tf.metrics.ranking import MRRMetric, NDCGMetric, ndcg, reciprocal_rank
from softsort_tf.metrics.regression import QuantileError, TrimmedError
from softsort_tf.metrics.spearman import SpearmanCorrelation, spearman_correlation
from softsort_tf.ops.family import (
    FAMILIES,
    TEMPERATURE_UNITS,
    Family,
    Settings,
    get_family,
    register_family,
    unregister_family,
)
from softsort_tf.ops.hard_stats import rankdata
from softsort_tf.ops.kendall import (
    discordant_pairs,
    kendall_embedding,
    kendall_kernel,
    kendall_tau,
    mallows_kernel,
    soft_kendall_tau,
    weighted_kendall_kernel,
)
from softsort_tf.ops.lapsum import (
    lapsum_permutation_matrix,
    lapsum_quantile,
    lapsum_rank,
    lapsum_sort,
    lapsum_topk,
)
from softsort_tf.ops.permutahedron import permutahedron_rank, permutahedron_sort
from softsort_tf.ops.permutation import (
    hard_permutation_matrix,
    neuralsort_permutation_matrix,
    softsort_permutation_matrix,
    straight_through,
)
from softsort_tf.ops.permutation_readout import permute_values, ranks_from_permutation
from softsort_tf.ops.sampling import (
    gumbel_perturb,
    stochastic_neuralsort_permutation_matrix,
    stochastic_permutation_matrix,
    stochastic_sinkhorn_permutation_matrix,
    stochastic_softsort_permutation_matrix,
)
from softsort_tf.ops.sinkhorn import (
    quantile_target_weights,
    sinkhorn_cdf,
    sinkhorn_permutation_matrix,
    sinkhorn_quantile,
    sinkhorn_quantile_normalization,
    sinkhorn_rank,
    sinkhorn_sort,
    sinkhorn_topk,
)
from softsort_tf.ops.soft import permutation_matrix, soft_quantile, soft_rank, soft_sort, soft_topk
from softsort_tf.ops.sorting_networks import (
    sorting_network_permutation_matrix,
    sorting_network_sort,
)
from softsort_tf.ops.squash import squash_values
from softsort_tf.ops.transport import SinkhornConvergenceWarning, SinkhornInfo
from softsort_tf.options import ImplicitDiff, SinkhornOptions

_autograph.register()

__all__ = [
    "__version__", "ElementwisePermutationAccuracy", "ExactPermutationAccuracy", "FAMILIES",
    "Family", "ImplicitDiff", "KendallEmbedding", "KendallTau", "KendallTauLoss",
    "ListwisePermutationLoss", "MRRMetric", "NDCGMetric", "NeuralSort",
    "PermutationCrossEntropy", "PinballLoss", "QuantileError", "QuantileLayer", "RankLayer",
    "Settings", "SinkhornCDF", "SinkhornConvergenceWarning", "SinkhornInfo", "SinkhornOptions",
    "SinkhornPermutation", "SinkhornQuantile", "SinkhornQuantileNormalization", "SinkhornRank",
    "SinkhornSort", "SoftLeastQuantileRegressionLoss", "SoftNDCGLoss",
    "SoftQuantileRegressionLoss", "SoftSort", "SoftTopKLoss", "SoftTrimmedRegressionLoss",
    "SortLayer", "SpearmanCorrelation", "SpearmanLoss", "TEMPERATURE_UNITS", "TopKLayer",
    "TrimmedError", "discordant_pairs", "elementwise_permutation_accuracy",
    "exact_permutation_accuracy", "get_family", "gumbel_perturb", "hard_permutation_matrix",
    "kendall_embedding", "kendall_kernel", "kendall_tau", "lapsum_permutation_matrix",
    "lapsum_quantile", "lapsum_rank", "lapsum_sort", "lapsum_topk", "listwise_permutation_loss",
    "mallows_kernel", "ndcg", "neuralsort_permutation_matrix", "permutahedron_rank",
    "permutahedron_sort", "permutation_cross_entropy", "permutation_matrix", "permute_values",
    "pinball_loss", "quantile_target_weights", "rankdata", "ranks_from_permutation",
    "reciprocal_rank", "register_family", "sinkhorn_cdf", "sinkhorn_permutation_matrix",
    "sinkhorn_quantile", "sinkhorn_quantile_normalization", "sinkhorn_rank", "sinkhorn_sort",
    "sinkhorn_topk", "sinkhorn_trimmed_mean", "soft_kendall_tau",
    "soft_least_quantile_regression_loss", "soft_ndcg", "soft_quantile",
    "soft_quantile_regression_loss", "soft_rank", "soft_sort", "soft_spearman_correlation",
    "soft_topk", "soft_topk_loss", "soft_trimmed_regression_loss",
    "softsort_permutation_matrix", "sorting_network_permutation_matrix", "sorting_network_sort",
    "spearman_correlation", "squash_values", "stochastic_neuralsort_permutation_matrix",
    "stochastic_permutation_matrix", "stochastic_sinkhorn_permutation_matrix",
    "stochastic_softsort_permutation_matrix", "straight_through", "unregister_family",
    "weighted_kendall_kernel",
]

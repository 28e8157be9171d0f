"""softsort_tf: differentiable sorting, ranking and quantile operators for TensorFlow/Keras."""

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

# --- sinkhorn layers (foundation) ---
# --- permutation operators and layers (SoftSort / NeuralSort) ---
# --- losses and metrics ---

__version__ = "0.1.0"

"""The Kendall embedding as a Keras layer (permutations as inputs, Jiao & Vert 2015)."""

from __future__ import annotations

import keras

from softsort_tf import _checks
from softsort_tf._keras import broadcast_keras_mask, full_precision_layer_kwargs
from softsort_tf.ops import kendall as kendall_ops

_PACKAGE = "softsort_tf"


@keras.saving.register_keras_serializable(package=_PACKAGE)
class KendallEmbedding(keras.layers.Layer):
    """Maps scores `[..., n]` to the Kendall embedding of their ranking `[..., n(n−1)/2]`.

    Φ_ij = 1[x_i < x_j] for the pairs i < j, or with `smooth_scale=σ` its
    differentiable expectation under Gaussian noise N(0, σ²) on every score
    (`softsort_tf.ops.kendall.kendall_embedding`): a linear model on it is a linear
    function of the pairwise comparisons of the items.

    Args:
      smooth_scale: None (hard, default: 0/1, no gradient) or the noise scale σ > 0.
      signed: output sign(x_j − x_i) (smooth: erf((x_j − x_i)/(2σ))) instead of the
        0/1 comparison (default False).
      **kwargs: base `keras.layers.Layer` arguments (name, dtype, ...).

    Call arguments:
      inputs: `[..., n]` scores; n may be unknown when the model is built.
      mask: boolean `[..., n]` (or a Keras mask, broadcast along the items), False for
        padding: a pair with a padded item is 0. No mask is propagated.

    Output: `[..., n(n − 1)/2]` in the layer's compute dtype (float32 under a
    float16/bfloat16 policy).

    Example:
    >>> layer = KendallEmbedding()
    >>> layer(tf.constant([[3.0, 1.0, 2.0]])).numpy().tolist()
    [[0.0, 0.0, 1.0]]
    """

    def __init__(self, smooth_scale: float | None = None, signed: bool = False, **kwargs):
        super().__init__(**full_precision_layer_kwargs(kwargs))
        self.smooth_scale = _checks.check_positive("smooth_scale", smooth_scale,
                                                   allow_none=True)
        self.signed = _checks.check_bool("signed", signed)
        self.supports_masking = True

    def call(self, inputs, mask=None):
        if mask is not None:
            mask = broadcast_keras_mask(inputs, mask)  # also one without the item axis
        return kendall_ops.kendall_embedding(inputs, self.smooth_scale, signed=self.signed,
                                             mask=mask)

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        n = input_shape[-1]
        return (*input_shape[:-1], None if n is None else n * (n - 1) // 2)

    def get_config(self) -> dict:
        return {**super().get_config(), "smooth_scale": self.smooth_scale,
                "signed": self.signed}

"""Keras contracts shared by the layers and losses: the compute dtype and the Keras mask.

- `full_precision_dtype`: the relaxed permutations, the Sinkhorn operators and the
  losses over them compute in float32 under a float16/bfloat16 policy (a
  cross-entropy's gradient, ≈ 1/P̂, overflows float16).
- `get_keras_mask`: the mask Keras attaches to a tensor (`keras.layers.Masking`,
  `Embedding(mask_zero=True)`, ...), read through Keras' own accessor, the one
  `keras.losses.Loss.__call__` uses.
"""

from __future__ import annotations

import keras

try:  # Keras' accessor of a tensor's mask (public where the installed Keras exports it)
    from keras.backend import get_keras_mask as _keras_get_mask
except ImportError:
    from keras.src.backend import get_keras_mask as _keras_get_mask


def full_precision_dtype(dtype=None):
    """'float32' if `dtype` computes in float16/bfloat16, else `dtype` unchanged.

    Args:
      dtype: a dtype or `keras.DTypePolicy` (or its name); None reads the global policy
        (`keras.config.dtype_policy()`), and is returned unchanged unless that policy
        computes in float16/bfloat16.

    Example:
    >>> full_precision_dtype("mixed_float16"), full_precision_dtype("float64")
    ('float32', 'float64')
    """
    policy = keras.dtype_policies.get(dtype) if dtype is not None else (
        keras.config.dtype_policy())
    return "float32" if policy.compute_dtype in ("float16", "bfloat16") else dtype


def compute_dtype(dtype=None) -> str:
    """The dtype a loss or layer built with `dtype` computes in: that of its policy
    (`full_precision_dtype` first), or of `keras.config.floatx()` for None.

    Example:
    >>> compute_dtype("mixed_float16"), compute_dtype("float64")
    ('float32', 'float64')
    """
    dtype = full_precision_dtype(dtype)
    return keras.dtype_policies.get(dtype or keras.config.floatx()).compute_dtype


def get_keras_mask(x):
    """The Keras mask attached to `x` (a boolean tensor), or None without one."""
    return _keras_get_mask(x)

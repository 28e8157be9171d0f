"""Keras layers over the relaxed permutation matrices of the families: `SoftSort`,
`NeuralSort`, `SinkhornPermutation` (`Family.matrix`). `output_mode` returns P̂
('matrix'), P̂ @ x ('sorted') or soft ranks ('ranks'); the output mask is the input
mask for 'ranks', the first n_valid positions for 'sorted', None for 'matrix'.
`stochastic=True` perturbs the scores by Gumbel noise (`softsort_tf.ops.sampling`) from
a `keras.random.SeedGenerator` saved with the model; `num_samples=S` adds a sample axis
before the matrix axes. The layers compute in float32 (or float64) under any policy.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from softsort_tf import _checks, _masking
from softsort_tf._keras import full_precision_layer_kwargs, layer_compute_dtype, sorted_mask
from softsort_tf.layers.sinkhorn import sinkhorn_settings
from softsort_tf.ops import permutation as permutation_ops
from softsort_tf.ops import permutation_readout, sampling
from softsort_tf.ops.family import get_family
from softsort_tf.options import SinkhornOptions

_PACKAGE = "softsort_tf"
OUTPUT_MODES = ("matrix", "sorted", "ranks")


class _PermutationLayer(keras.layers.Layer):
    """Common arguments, call and config of the permutation layers.

    Args:
      direction: 'DESCENDING' (default) or 'ASCENDING'.
      hard: straight-through estimator: exact permutation forward, relaxed gradient.
      output_mode: 'matrix' (default), 'sorted' or 'ranks' (see the module docstring).
      stochastic: perturb the scores with Gumbel noise when training.
      num_samples: None (one sample, no sample axis) or the number S of samples.
      sample_at_inference: also draw noise when `training` is False.
      seed: int seed of the layer's `keras.random.SeedGenerator` (None: random).
      **kwargs: base `keras.layers.Layer` arguments (name, dtype, ...).

    Call arguments:
      inputs: scores `[batch, n]` (n may be unknown), `[scores, values]` with
        `output_mode='sorted'`, or a `tf.RaggedTensor` `[batch, (n)]` (not under XLA).
      training: whether to draw Gumbel noise (stochastic layers).
      mask: boolean `[batch, n]`, True = valid (for `[scores, values]`: both masks).
    """

    method: str = ""
    op_arguments: tuple = ()  # the attributes passed to the matrix (tau, ...)

    def __init__(self, direction: str = "DESCENDING", hard: bool = False,
                 output_mode: str = "matrix", stochastic: bool = False,
                 num_samples: int | None = None, sample_at_inference: bool = False,
                 seed: int | None = None, **kwargs):
        super().__init__(**full_precision_layer_kwargs(kwargs))
        self.supports_masking = True
        self.direction = _checks.check_direction(direction)
        self.hard = permutation_ops.check_hard(hard)
        self.output_mode = _checks.check_choice("output_mode", output_mode, OUTPUT_MODES)
        self.stochastic = bool(stochastic)
        self.num_samples = (None if num_samples is None
                            else _checks.check_positive_int("num_samples", num_samples))
        if self.num_samples is not None and not self.stochastic:
            raise ValueError("`num_samples` needs `stochastic=True`.")
        self.sample_at_inference = bool(sample_at_inference)
        self.seed = None if seed is None else _checks.check_positive_int("seed", seed, minimum=0)
        self.seed_generator = keras.random.SeedGenerator(self.seed) if self.stochastic else None

    def _checked_tau(self, tau) -> float:
        """τ checked > 0 and in the range the layer's compute dtype holds."""
        return get_family(self.method).check_temperature(
            _checks.check_positive("tau", tau), layer_compute_dtype(self), name="tau")

    def _op_kwargs(self) -> dict:
        return {name: getattr(self, name) for name in self.op_arguments}

    def _permutation(self, scores, training, mask=None):
        kwargs = dict(direction=self.direction, hard=self.hard, mask=mask, **self._op_kwargs())
        if self.stochastic and (training or self.sample_at_inference):
            perm = sampling.stochastic_permutation_matrix(
                scores, self.num_samples or 1, self.seed_generator.next(), self.method,
                **kwargs)
            if self.num_samples is None:
                return perm[..., 0, :, :]
        else:
            perm = get_family(self.method).matrix(scores, **kwargs)
            if self.num_samples is None:
                return perm
            # S copies of the noise-free matrix: the sample axis keeps its size S.
            perm = tf.repeat(perm[..., None, :, :], self.num_samples, axis=-3)
        n = scores.shape[-1]
        return tf.ensure_shape(perm, scores.shape[:-1].concatenate([self.num_samples, n, n]))

    @staticmethod
    def _split(inputs, mask):
        """`(scores, values, mask)`: the mask of the scores (an explicit or Keras mask;
        for `[scores, values]` the AND of both masks), as `[batch, n]` or None."""
        if isinstance(inputs, (list, tuple)):
            scores, values = inputs
            if isinstance(mask, (list, tuple)):
                mask = _masking.combine(*mask)
        else:
            scores = values = inputs
        if not _masking.is_ragged(scores):
            scores = tf.convert_to_tensor(scores)
        if mask is not None and isinstance(scores, tf.Tensor):
            mask = tf.convert_to_tensor(mask)
            if mask.shape.rank is not None and mask.shape.rank == scores.shape.rank - 1:
                mask = mask[..., None]  # a Keras mask without the list axis
            mask = tf.broadcast_to(tf.cast(mask, tf.bool), tf.shape(scores))
        return scores, values, mask

    def call(self, inputs, training=None, mask=None):
        if isinstance(inputs, (list, tuple)) and (len(inputs), self.output_mode) != (2, "sorted"):
            raise ValueError("A list input must be [scores, values], with output_mode='sorted'.")
        scores, values, mask = self._split(inputs, mask)
        if _masking.is_ragged(scores):
            return self._ragged_call(scores, values, training, mask)
        perm = self._permutation(scores, training, mask)
        if self.output_mode == "sorted":
            return permutation_readout.permute_values(perm, values, mask=mask)
        if self.output_mode == "ranks":
            if mask is not None and self.num_samples is not None:
                mask = mask[..., None, :]
            return permutation_readout.ranks_from_permutation(perm, mask=mask)
        return perm

    def _ragged_call(self, scores, values, training, mask):
        """The call on ragged `[batch, (n)]` lists: computed on the padded lists and
        their mask, returned ragged (`[batch, (S,) (n), (n)]` or `[batch, (S,) (n)]`)."""
        separate = values is not scores

        def run(lists, aligned, group):
            del group
            inputs = lists.dense
            if separate:
                inputs = [lists.dense, aligned[0].to_tensor()]
            out = self.call(inputs, training=training, mask=lists.mask)
            if self.output_mode == "matrix":
                if self.num_samples is None:
                    return lists.to_square(out)
                return sampling.ragged_samples(lists, out, self.num_samples)
            if self.num_samples is None:
                return lists.to_elementwise(out)
            rows = tf.RaggedTensor.from_tensor(
                tf.reshape(out, tf.stack([-1, tf.shape(out)[-1]])),
                lengths=tf.repeat(lists.lengths, self.num_samples))
            return lists.to_per_list(tf.RaggedTensor.from_uniform_row_length(
                rows, self.num_samples))

        return _masking.map_lists(run, scores, mask, aligned=(values,) if separate else (),
                                  name="scores")

    def compute_mask(self, inputs, mask=None):
        """The input mask for 'ranks', the first n_valid positions for 'sorted', None for
        'matrix' (`keras.ops`, for symbolic tensors too)."""
        ops = keras.ops
        if self.output_mode == "matrix" or mask is None:
            return None
        if isinstance(mask, (list, tuple)):
            masks = [m for m in mask if m is not None]
            if not masks:
                return None
            mask = masks[0]
            for other in masks[1:]:
                mask = ops.logical_and(mask, other)
        scores = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
        if _masking.is_ragged(scores):
            return None
        mask = ops.cast(mask, "bool")
        if len(mask.shape) == len(scores.shape) - 1:  # a Keras mask without the list axis
            mask = ops.logical_and(ops.expand_dims(mask, -1), ops.ones_like(scores, "bool"))
        if self.output_mode == "sorted":
            mask = sorted_mask(scores, mask, -1)
        if self.num_samples is not None:
            mask = ops.repeat(ops.expand_dims(mask, -2), self.num_samples, axis=-2)
        return mask

    def compute_output_shape(self, input_shape):
        if isinstance(input_shape, list) and input_shape and isinstance(input_shape[0],
                                                                        (list, tuple)):
            input_shape = input_shape[0]
        *lead, n = input_shape
        lead = (*lead, *(() if self.num_samples is None else (self.num_samples,)))
        return (*lead, n, n) if self.output_mode == "matrix" else (*lead, n)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(direction=self.direction, hard=self.hard, output_mode=self.output_mode,
                      stochastic=self.stochastic, num_samples=self.num_samples,
                      sample_at_inference=self.sample_at_inference, seed=self.seed,
                      **self._op_kwargs())
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SoftSort(_PermutationLayer):
    """SoftSort relaxed permutation (Prillo & Eisenschlos, 2020); see `softsort_permutation_matrix`.

    Args:
      tau, distance_power: as in `softsort_permutation_matrix`.
      **kwargs: the arguments of `_PermutationLayer` and of a Layer.

    Example:
    >>> layer = SoftSort(tau=0.1, output_mode="sorted")
    >>> np.round(layer(np.array([[0.3, 2.0, 1.0]])).numpy(), 2)
    array([[2. , 1. , 0.3]], dtype=float32)
    """

    method, op_arguments = "softsort", ("tau", "distance_power")

    def __init__(self, tau: float = permutation_ops.DEFAULT_TAU,
                 distance_power: float = permutation_ops.DEFAULT_DISTANCE_POWER, **kwargs):
        super().__init__(**kwargs)
        self.tau = self._checked_tau(tau)
        self.distance_power = _checks.check_positive("distance_power", distance_power)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class NeuralSort(_PermutationLayer):
    """NeuralSort relaxed permutation (Grover et al., 2019); see `neuralsort_permutation_matrix`.

    Args:
      tau: as in `neuralsort_permutation_matrix`.
      **kwargs: as in `SoftSort`.

    Example:
    >>> layer = NeuralSort(tau=0.1, output_mode="ranks")
    >>> np.round(layer(np.array([[0.3, 2.0, 1.0]])).numpy(), 2)
    array([[3., 1., 2.]], dtype=float32)
    """

    method, op_arguments = "neuralsort", ("tau",)

    def __init__(self, tau: float = permutation_ops.DEFAULT_TAU, **kwargs):
        super().__init__(**kwargs)
        self.tau = self._checked_tau(tau)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class SinkhornPermutation(_PermutationLayer):
    """Doubly-stochastic Sinkhorn relaxed permutation; see `sinkhorn_permutation_matrix`.

    Args:
      options: a `SinkhornOptions` (or its config dict); default `SinkhornOptions()`.
      squash: how scores are mapped into [0, 1] ('logistic', 'atan', 'robust' or None).
      targets: where the targets sit on [0, 1] ('regular' or 'centres').
      **kwargs: fields of `SinkhornOptions` (`epsilon`, `power`, ...) overriding those
        of `options`, and the arguments of `_PermutationLayer` and of a Layer.

    Example:
    >>> layer = SinkhornPermutation(epsilon=1e-3, output_mode="ranks")
    >>> np.round(layer(np.array([[0.3, 2.0, 1.0]])).numpy(), 2)
    array([[3., 1., 2.]], dtype=float32)
    """

    method, op_arguments = "sinkhorn", ("options", "squash", "targets")

    def __init__(self, options: SinkhornOptions | dict | None = None, squash="logistic",
                 targets: str = "regular", **kwargs):
        self._settings, layer_kwargs = sinkhorn_settings(kwargs, options, squash, targets)
        super().__init__(**layer_kwargs)
        for name, value in self._settings.attributes().items():
            setattr(self, name, value)
        self._settings.check_temperature(None, layer_compute_dtype(self))  # the options' ε

    def get_config(self) -> dict:
        config = super().get_config()
        for name in self.op_arguments:
            del config[name]
        config.update(self._settings.get_config())
        return config

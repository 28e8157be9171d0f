"""Models of the large-MNIST experiments: the CNN, learning to sort and median regression.

The CNN is the one of the SoftSort paper (Prillo & Eisenschlos, 2020, App. A.1.1),
inherited from NeuralSort (Grover et al., 2019, App. D.1):

    Conv 5×5, 32 filters, stride 1, ReLU   -> 112×28×32
    Max-pool stride 2                      ->  56×14×32
    Conv 5×5, 64 filters, stride 1, ReLU   ->  56×14×64
    Max-pool stride 2                      ->  28×7×64
    Dense 64, ReLU
    Dense 1 (no activation)                -> one score per 112×28 image

Both models take `{"images": [batch, n, 112, 28, 1], "step": [batch]}` (as produced by
`softsort_tf.datasets.make_dataset`); `step` seeds the Gumbel noise of the stochastic
variants (with the replica id folded in under a `tf.distribute` strategy), so that the
noise of a step is the same after a resume.
"""

from __future__ import annotations

import keras
import tensorflow as tf

import softsort_tf as ss

__all__ = ["permutation_methods", "MedianRegressor", "PermutationLearner", "build_cnn",
           "operator_kwargs", "parse_method_kwargs"]



def permutation_methods() -> tuple[str, ...]:
    """The `method`s a model can train with: the families of `ss.FAMILIES` registered now
    (outside ones included) that have a relaxed permutation matrix."""
    return tuple(name for name, family in ss.FAMILIES.items() if family.has_matrix)

IMAGE_SHAPE = (112, 28, 1)


def build_cnn(name: str = "cnn", dtype: str = "float32") -> keras.Sequential:
    """The CNN of SoftSort App. A.1.1: a `[batch, 112, 28, 1]` image -> a `[batch, 1]` score.

    Args:
      name: the model's name.
      dtype: the dtype policy of the hidden layers, e.g. 'float32' (default) or
        'mixed_bfloat16' (bfloat16 compute, float32 weights: about twice as fast on CPUs
        with AVX-512 BF16, see docs/benchmarks.md). The output layer always computes in
        float32, so the scores fed to the sorting operator keep full precision.
    """
    layers = keras.layers
    return keras.Sequential([
        keras.Input(IMAGE_SHAPE),
        layers.Conv2D(32, 5, padding="same", activation="relu", dtype=dtype),
        layers.MaxPooling2D(2, dtype=dtype),
        layers.Conv2D(64, 5, padding="same", activation="relu", dtype=dtype),
        layers.MaxPooling2D(2, dtype=dtype),
        layers.Flatten(dtype=dtype),
        layers.Dense(64, activation="relu", dtype=dtype),
        layers.Dense(1, dtype="float32"),
    ], name=name)


def _per_image(cnn: keras.Model, images: tf.Tensor, training) -> tf.Tensor:
    """Applies `cnn` to every image of `[batch, n, 112, 28, 1]`; returns `[batch, n]`."""
    n = images.shape[1]
    flat = tf.reshape(images, (-1,) + IMAGE_SHAPE)
    return tf.reshape(cnn(flat, training=training), (-1, n))


def parse_method_kwargs(method: str, text: str | dict | None) -> dict:
    """The family's own settings of a run (`--method_kwargs`, a JSON object, e.g.
    `'{"squash": null}'` for Sinkhorn on the raw scores or `'{"network": "bitonic"}'`
    for the sorting networks), checked against the keywords the family's matrix takes.

    Example:
    >>> parse_method_kwargs("sinkhorn", '{"squash": null}')
    {'squash': None}
    """
    import json

    if text is None:
        return {}
    kwargs = json.loads(text) if isinstance(text, str) else dict(text)
    if not isinstance(kwargs, dict):
        raise ValueError(f"method_kwargs must be a JSON object, got {text!r}.")
    family = ss.get_family(method)
    reserved = sorted(set(kwargs) & {"temperature", family.temperature, "direction", "mask",
                                     "hard", "log"})
    if reserved:
        raise ValueError(f"method_kwargs cannot set {reserved[0]!r}: it is an argument of its "
                         f"own (the family's temperature is `temperature`).")
    family.check_keywords(kwargs, "rank", what="`method_kwargs`")
    return kwargs


def operator_kwargs(method: str, *, temperature: float | None = None,
                    log: bool = False, method_kwargs: dict | None = None) -> dict:
    """The keyword arguments of `ss.permutation_matrix(scores, method, ...)` for the
    experiments: `temperature` (the family's own, None for its default), the family's
    own settings `method_kwargs`, and `log=True` for log P̂ when `log`.

    Example:
    >>> operator_kwargs("sinkhorn", temperature=0.01)
    {'temperature': 0.01}
    """
    ss.get_family(method)
    kwargs = dict(method_kwargs or {})
    if temperature is not None:
        kwargs["temperature"] = float(temperature)
    if log:
        kwargs["log"] = True
    return kwargs


def _noise_seed(seed: int, step) -> tf.Tensor:
    """The `[2]` stateless seed of the Gumbel noise of one training step on this replica.

    Keyed by (seed, step), so that a resumed run draws the noise it would have drawn,
    with the replica id folded in, so that the replicas of a `tf.distribute` strategy
    (each holding its own slice of the global batch) draw different noise.
    """
    context = tf.distribute.get_replica_context()
    replica = 0 if context is None else context.replica_id_in_sync_group
    base = tf.stack([tf.constant(seed, tf.int64), tf.cast(step, tf.int64)])
    return tf.random.experimental.stateless_fold_in(base, tf.cast(replica, tf.int64))


class _LargeMnistModel(keras.Model):
    """Shared set-up: the relaxation hyper-parameters and the noise seed of a step."""

    def __init__(self, method: str = "softsort", temperature: float | None = None,
                 stochastic: bool = False, num_samples: int = 1, seed: int = 0,
                 cnn_dtype: str = "float32", log: bool = False,
                 method_kwargs: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        self.method_kwargs = parse_method_kwargs(method, method_kwargs)
        self.cnn_dtype = cnn_dtype
        family = ss.get_family(method)  # a family with a relaxed matrix
        if temperature is None:
            temperature = family.default_temperature
        temperature = family.check_temperature(float(temperature), "float32")
        if int(num_samples) != num_samples or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples}.")
        if log and not family.log_domain:
            raise ValueError(f"log=True needs an operator with a log-domain matrix; "
                             f"{method!r} has none.")
        self.method, self.temperature, self.log = method, temperature, bool(log)
        self.stochastic, self.num_samples, self.seed = bool(stochastic), int(num_samples), seed

    def _permutation(self, scores, inputs, training, log: bool = False) -> tf.Tensor:
        """Deterministic P̂ `[batch, n, n]`; Gumbel samples `[batch, S, n, n]` in training
        (log P̂ with `log`)."""
        kwargs = operator_kwargs(self.method, temperature=self.temperature, log=log,
                                 method_kwargs=self.method_kwargs)
        if self.stochastic and bool(training):
            seed = _noise_seed(self.seed, inputs["step"][0])
            return ss.stochastic_permutation_matrix(scores, self.num_samples, seed,
                                                    self.method, **kwargs)
        return ss.permutation_matrix(scores, self.method, **kwargs)

    def build(self, input_shape=None):
        for cnn in self._cnns():
            cnn.build((None,) + IMAGE_SHAPE)
        self.built = True

    def get_config(self):
        return {**super().get_config(), "method": self.method,
                "temperature": self.temperature, "stochastic": self.stochastic,
                "num_samples": self.num_samples, "seed": self.seed,
                "cnn_dtype": self.cnn_dtype, "log": self.log,
                "method_kwargs": dict(self.method_kwargs)}


@keras.saving.register_keras_serializable(package="softsort_tf")
class PermutationLearner(_LargeMnistModel):
    """Learns to sort large-MNIST sequences: CNN scores -> relaxed permutation P̂.

    Args:
      method: one of `permutation_methods()` (a family with a relaxed matrix:
        'softsort', 'neuralsort', 'sinkhorn', 'lapsum', 'sorting_network', or one registered
        with `ss.register_family`).
      temperature: the family's temperature (τ, ε, α, β, ...; None: its default), on
        the raw CNN scores for a temperature in the units of the scores.
      method_kwargs: the family's own settings (a dict or its JSON text, e.g.
        `{"squash": None}` for Sinkhorn on the raw scores; `parse_method_kwargs`).
      log: return log P̂ (computed in the log domain; for operators with
        `log_domain`), for `PermutationCrossEntropy(from_log=True)`: a nearly hard
        P̂ then keeps the gradient of its wrongly ordered rows.
      stochastic: Gumbel-perturbed scores during training (reparameterised
        Plackett–Luce); evaluation is always deterministic.
      num_samples: Gumbel samples per sequence in training.
      seed: seed of the Gumbel noise (combined with the batch's `step` and the replica id).
      cnn_dtype: dtype policy of the CNN's hidden layers (`build_cnn`); the scores, P̂
        and the loss are float32.

    Call returns P̂ `[batch, n, n]` (row i = the i-th largest number; log P̂ with
    `log`), or `[batch, num_samples, n, n]` when training a stochastic model.

    Example:
    >>> model = PermutationLearner("softsort", temperature=1024.0)
    >>> model({"images": tf.zeros([2, 3, 112, 28, 1]), "step": tf.zeros([2], tf.int64)}).shape
    TensorShape([2, 3, 3])
    """

    def __init__(self, method="softsort", temperature=None, stochastic=False,
                 num_samples=1, seed=0, cnn_dtype="float32", log=False, method_kwargs=None,
                 **kwargs):
        super().__init__(method, temperature, stochastic, num_samples, seed, cnn_dtype, log,
                         method_kwargs, **kwargs)
        self.scorer = build_cnn("scorer", cnn_dtype)

    def _cnns(self):
        return [self.scorer]

    def call(self, inputs, training=None):
        scores = _per_image(self.scorer, inputs["images"], training)
        return self._permutation(scores, inputs, training, log=self.log)


@keras.saving.register_keras_serializable(package="softsort_tf")
class MedianRegressor(_LargeMnistModel):
    """Median regression (NeuralSort App. E.2, SoftSort App. A.2) with two CNNs.

    A scorer CNN gives the scores whose relaxed permutation P̂ picks the median row
    P̂[(n - 1) / 2] (n odd); a regressor CNN maps each image to its value; the prediction
    is that row times the regressed values, ŷ = P̂[(n-1)/2] · r(images), trained with an
    ℓ2 loss to the true median (values scaled to [0, 1) by 1/10⁴).

    Arguments are those of `PermutationLearner`.

    Call returns `[batch]` predictions, or `[batch, num_samples]` when training a
    stochastic model.

    Example:
    >>> model = MedianRegressor("neuralsort", temperature=1024.0)
    >>> model({"images": tf.zeros([2, 5, 112, 28, 1]), "step": tf.zeros([2], tf.int64)}).shape
    TensorShape([2])
    """

    def __init__(self, method="softsort", temperature=None, stochastic=False,
                 num_samples=1, seed=0, cnn_dtype="float32", method_kwargs=None, **kwargs):
        kwargs.pop("log", None)  # the median row is read off P̂ itself
        super().__init__(method, temperature, stochastic, num_samples, seed, cnn_dtype,
                         False, method_kwargs, **kwargs)
        self.scorer = build_cnn("scorer", cnn_dtype)
        self.regressor = build_cnn("regressor", cnn_dtype)

    def _cnns(self):
        return [self.scorer, self.regressor]

    def call(self, inputs, training=None):
        images = inputs["images"]
        n = images.shape[1]
        if n % 2 != 1:
            raise ValueError(f"median regression needs an odd n, got n={n}.")
        perm = self._permutation(_per_image(self.scorer, images, training), inputs, training)
        values = _per_image(self.regressor, images, training)  # [batch, n]
        middle = perm[..., (n - 1) // 2, :]  # [batch, (S,) n]
        if middle.shape.rank == 3:
            values = values[:, None, :]
        return tf.reduce_sum(middle * values, axis=-1)

"""Quantile regression with the pinball loss or the τ-S-quantile (Cuturi et al. 2019, Table 1).

`run(config)` trains one regressor (2 hidden layers of 64 ReLU units, Adam 1e-4, as in
the paper) on one data set of `softsort_tf.datasets.cqr`, one level τ, one method and
one seed, with early stopping on the validation pinball loss, and writes the held-out
(test) pinball loss to `results.json`. `scripts/train_quantile_regression.py` is the
binary, `scripts/run_quantile_regression_grid.py` the driver of the paper's grid.

The two methods
---------------
- `pinball`: minimise the mean pinball loss ρ_τ(r) = max(τ r, (τ − 1) r) of the
  residuals r_i = z_i − f_θ(w_i) of a batch.
- `squantile`: minimise the τ-S-quantile (eq. 4). §4 of the paper states quantile
  regression as "minimising w.r.t. θ the τ-th quantile of ξ", ξ the measure with
  uniform weights on the residuals x_i = z_i − f_θ(w_i). Taken literally this is
  unbounded below (adding a constant to f_θ lowers every quantile of ξ), so we read it
  through the variational definition of the quantile that the pinball loss encodes:
  the τ-quantile of ξ is q = argmin_c ∫ ρ_τ(x − c) dξ(x), and at that c

      min_c ∫ ρ_τ(x − c) dξ = τ · mean(x) − (mass τ of ξ below q) · (mean of that mass),

  the τ-quantile *loss* of ξ. Both terms are read off the one transport of eq. (4):
  ξ is sent by Sinkhorn onto three bins of masses b = [τ − t/2, t, 1 − τ − t/2]
  (bin t centred on τ, `softsort_tf.quantile_target_weights`), and the S-quantile
  vector Q̃ = b⁻¹ ∘ (Pᵀ x) (Definition 2, `softsort_tf.sinkhorn_sort` with these
  target weights) holds the means of the three bins; Q̃_2 is the τ-S-quantile. The
  mass τ below q is bin 1 plus half of bin 2, so the loss is

      L(θ) = τ · mean(x) − b_1 · Q̃_1 − (t/2) · Q̃_2 + Q̃_2².

  The first three terms are the τ-quantile loss (the hard limit ε → 0 is exactly
  min_c of the mean pinball loss when τ·n and t·n/2 are integers); they do not change
  when a constant is added to f_θ, so the last term places f_θ: it drives the
  τ-S-quantile of the residuals to 0, i.e. a fraction τ of the responses below the
  predictions. The gradient reaches every residual through the transport plan.
  ε = 0.01 on the logistic-squashed residuals and t = 0.1 (capped at τ) as in the
  paper (ℓ = 100 iterations there; here Sinkhorn runs to its tolerance).

Budget (ours; the paper does not give its epochs or batch): batch 64 (as in the
code of the data sets' authors); an "epoch" of the run is a validation interval of
`steps_per_epoch` = 200 steps (the data are reshuffled at every full pass, see
`softsort_tf.datasets.arrays`); at most `epochs` = 100 of them (20,000 steps); the
weights of the best interval on the validation pinball loss (20 % of the training
part) are kept, and training stops when, at a multiple of `patience` = 10 intervals,
the best one is 10 or more intervals (2,000 steps) back. The steps are XLA-compiled (`jit_compile`).

Initialisation (ours; the paper does not give it): `output_init="quantile"` starts the
network as the constant predictor, output kernel 0 and output bias the training
τ-quantile, so training starts from the baseline every method must beat. With Keras'
default ("glorot") the untrained output varies by O(1) with the input; on a data set
whose scaled responses vary little (star: std 0.06 around 1) the early-stopped network
never unlearns that: 0.027 held-out pinball loss at τ = 0.1 against 0.0083 from the
constant start and 0.0092 for the constant itself (seed 2, both methods alike; the
ablation is in docs/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
import os
import time

import keras
import numpy as np
import tensorflow as tf

import softsort_tf
from softsort_tf.datasets import arrays, cqr
from softsort_tf.experiments import training

__all__ = ["METHODS", "QuantileRegressionConfig", "SQuantileRegressionLoss", "build_model",
           "pinball_loss", "run"]

METHODS = ("pinball", "squantile")
OUTPUT_INITS = ("quantile", "glorot")
HIDDEN_UNITS = 64


def pinball_loss(y_true, y_pred, tau: float):
    """Per-example pinball loss ρ_τ(y − ŷ) = max(τ (y − ŷ), (τ − 1)(y − ŷ)).

    Args:
      y_true, y_pred: `[batch]` or `[batch, 1]`.
      tau: level in (0, 1).

    Returns:
      `[batch]` losses.

    Example:
    >>> pinball_loss([1.0, 0.0], [0.0, 1.0], 0.1).numpy().round(2)
    array([0.1, 0.9], dtype=float32)
    """
    y_pred = tf.reshape(tf.convert_to_tensor(y_pred, tf.float32), [-1])
    r = tf.reshape(tf.cast(y_true, y_pred.dtype), [-1]) - y_pred
    return tf.maximum(tau * r, (tau - 1.0) * r)


def _check_tau(tau: float) -> float:
    if not 0.0 < tau < 1.0:
        raise ValueError(f"tau must be in (0, 1), got {tau}.")
    return float(tau)


@keras.saving.register_keras_serializable(package="softsort_tf")
class PinballLoss(keras.losses.Loss):
    """The mean pinball loss at level τ (see `pinball_loss`).

    Args:
      tau: level in (0, 1).

    Example:
    >>> float(PinballLoss(0.5)([1.0, 3.0], [2.0, 2.0]))
    0.5
    """

    def __init__(self, tau: float = 0.5, name: str = "pinball", **kwargs):
        super().__init__(name=name, **kwargs)
        self.tau = _check_tau(tau)

    def call(self, y_true, y_pred):
        return pinball_loss(y_true, y_pred, self.tau)

    def get_config(self):
        return {**super().get_config(), "tau": self.tau}


@keras.saving.register_keras_serializable(package="softsort_tf")
class SQuantileRegressionLoss(keras.losses.Loss):
    """The τ-S-quantile loss of the batch residuals (module docstring, "squantile").

    With residuals x = y − ŷ over the batch and Q̃ the S-quantile vector of eq. (4)
    (three bins of masses b = [τ − t/2, t, 1 − τ − t/2]):

        L = τ · mean(x) − b_1 · Q̃_1 − (t/2) · Q̃_2 + Q̃_2².

    Args:
      tau: level in (0, 1).
      width: t, the mass of the middle bin (default min(0.1, τ, 1 − τ)).
      epsilon: Sinkhorn regularisation (paper: 0.01).
      squash: how the residuals are mapped into [0, 1] before the transport
        (`softsort_tf.SinkhornOptions.squash`; default 'logistic', as in the paper).
      targets: where the three bins sit on [0, 1] (`SinkhornOptions.targets`;
        default 'regular': 0, 1/2, 1, the paper's grid).
      **kwargs: `keras.losses.Loss` arguments (the reduced value is the batch statistic).

    Input shapes: `[batch]` or `[batch, 1]`. Output: a scalar.

    Example:
    >>> loss = SQuantileRegressionLoss(0.5, epsilon=1e-3)
    >>> y = np.linspace(-1.0, 1.0, 101).astype("float32")
    >>> bool(abs(float(loss(y, np.zeros_like(y))) - np.mean(np.abs(y)) / 2) < 0.02)
    True
    """

    def __init__(self, tau: float = 0.5, width: float | None = None, epsilon: float = 0.01,
                 squash: str | None = "logistic", targets: str = "regular",
                 name: str = "squantile", **kwargs):
        super().__init__(name=name, **kwargs)
        self.squash, self.targets = squash, targets
        # Validates ε, squash and targets now (a clear error before any training).
        self.options = softsort_tf.SinkhornOptions(epsilon=float(epsilon), squash=squash,
                                                   targets=targets)
        self.tau = _check_tau(tau)
        self.width = float(width) if width is not None else min(0.1, self.tau, 1 - self.tau)
        self.epsilon = float(epsilon)
        self.target_weights, _ = softsort_tf.quantile_target_weights(self.tau, self.width)

    def statistic(self, residuals):
        """The loss of a `[n]` vector of residuals (a scalar)."""
        q = softsort_tf.sinkhorn_sort(residuals, axis=0, target_weights=self.target_weights,
                                      options=self.options)
        b1 = float(self.target_weights[0])
        return (self.tau * tf.reduce_mean(residuals) - b1 * q[0]
                - 0.5 * self.width * q[1] + tf.square(q[1]))

    def call(self, y_true, y_pred):
        """Each example carries the batch statistic, so Keras' reduction (the mean by
        default) returns it and scales it like every Keras loss under `tf.distribute`
        (the mean of the per-replica statistics); `Loss.__call__` is not overridden."""
        y_pred = tf.reshape(y_pred, [-1])
        r = tf.reshape(tf.cast(y_true, y_pred.dtype), [-1]) - y_pred
        return tf.fill(tf.shape(r), self.statistic(r))

    def get_config(self):
        return {**super().get_config(), "tau": self.tau, "width": self.width,
                "epsilon": self.epsilon, "squash": self.squash, "targets": self.targets}


@dataclasses.dataclass
class QuantileRegressionConfig:
    """Everything a quantile-regression run depends on (the binary's flags)."""

    output_dir: str = "/tmp/softsort_tf_quantile_regression"
    dataset: str = "synthetic"
    data_dir: str | None = None
    method: str = "squantile"
    tau: float = 0.1
    seed: int = 0
    epochs: int = 100
    steps_per_epoch: int = 200
    patience: int = 10
    batch_size: int = 64
    learning_rate: float = 1e-4
    epsilon: float = 0.01
    width: float | None = None
    squash: str | None = "logistic"
    targets: str = "regular"
    output_init: str = "quantile"
    validation_fraction: float = 0.2
    strategy: str = "default"
    num_cpu_devices: int = 0
    deterministic_ops: bool = False  # Keras turns XLA off under op determinism (5x slower)
    jit_compile: bool = True
    stop_after_epochs: int | None = None
    verbose: int | str = 0

    def finalize(self) -> QuantileRegressionConfig:
        """Validates the fields; returns self."""
        if self.dataset not in cqr.ALL_DATASETS:
            raise ValueError(f"dataset must be one of {cqr.ALL_DATASETS}, got "
                             f"{self.dataset!r}.")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}.")
        _check_tau(self.tau)
        if self.output_init not in OUTPUT_INITS:
            raise ValueError(f"output_init must be one of {OUTPUT_INITS}, got "
                             f"{self.output_init!r}.")
        for name in ("epochs", "steps_per_epoch", "patience", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)}.")
        if not (self.learning_rate > 0 and self.epsilon > 0):
            raise ValueError("learning_rate and epsilon must be > 0.")
        # The loss checks width, squash and targets.
        SQuantileRegressionLoss(self.tau, self.width, self.epsilon, self.squash, self.targets)
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(f"validation_fraction must be in (0, 1), got "
                             f"{self.validation_fraction}.")
        if self.strategy not in training.STRATEGIES:
            raise ValueError(f"strategy must be one of {training.STRATEGIES}, got "
                             f"{self.strategy!r}.")
        return self


def build_model(num_features: int, config: QuantileRegressionConfig,
                y_train: np.ndarray | None = None) -> keras.Model:
    """The regressor (2 hidden layers of 64 ReLU units), compiled with the method's loss.

    With `config.output_init == "quantile"` (and `y_train` given) the network starts as
    the constant predictor: output kernel 0, output bias the training τ-quantile; with
    "glorot" every layer has Keras' default initialisation (the output then varies by
    O(1) with the input at step 0, far more than the responses do on some data sets).
    Both methods report the hard pinball loss as the metric `pinball`.
    """
    output = keras.layers.Dense(1)
    if config.output_init == "quantile" and y_train is not None:
        start = float(np.quantile(np.asarray(y_train, np.float64), config.tau))
        output = keras.layers.Dense(1, kernel_initializer="zeros",
                                    bias_initializer=keras.initializers.Constant(start))
    model = keras.Sequential([
        keras.Input((num_features,)),
        keras.layers.Dense(HIDDEN_UNITS, activation="relu"),
        keras.layers.Dense(HIDDEN_UNITS, activation="relu"),
        output,
    ], name="quantile_regressor")
    if config.method == "pinball":
        loss = PinballLoss(config.tau, name="pinball_loss")
    else:
        loss = SQuantileRegressionLoss(config.tau, config.width, config.epsilon,
                                       config.squash, config.targets)
    metric = keras.metrics.MeanMetricWrapper(pinball_loss, name="pinball", tau=config.tau)
    # XLA cannot place a distributed (mirrored) variable: compile only without a strategy.
    model.compile(keras.optimizers.Adam(config.learning_rate), loss=loss, metrics=[metric],
                  jit_compile=config.jit_compile and config.strategy == "default")
    return model


def test_pinball(model: keras.Model, x: np.ndarray, y: np.ndarray, tau: float) -> float:
    """Mean pinball loss of `model` on `(x, y)` (float64 average)."""
    pred = model(x, training=False)
    return float(np.mean(pinball_loss(y, pred, tau).numpy().astype(np.float64)))


def constant_pinball(y_train: np.ndarray, y_test: np.ndarray, tau: float) -> float:
    """Test pinball loss of the constant predictor: the training τ-quantile (a baseline)."""
    q = np.quantile(y_train.astype(np.float64), tau)
    r = y_test.astype(np.float64) - q
    return float(np.mean(np.maximum(tau * r, (tau - 1) * r)))


def _prepare(config: QuantileRegressionConfig) -> tf.distribute.Strategy:
    strategy = training.prepare_runtime(config)
    os.makedirs(config.output_dir, exist_ok=True)
    return strategy


def run(config: QuantileRegressionConfig) -> dict:
    """Runs (or resumes) one quantile-regression run; returns the results dict.

    The results (also in `output_dir/results.json` when finished) hold the test pinball
    loss of the best validation epoch (`metrics.test_pinball`), that of the constant
    training τ-quantile (`metrics.constant_test_pinball`) and the training history.
    Early stopping is checked every `patience` epochs (it stops when the best epoch is
    `patience` or more epochs back) from the run's saved history, so a resumed run
    stops where an uninterrupted one would.
    """
    config = config.finalize()
    wall_start = time.time()
    strategy = _prepare(config)
    chief = training.is_chief(strategy)
    split = cqr.load_split(config.dataset, config.data_dir, config.seed,
                           config.validation_fraction)
    arrays.steps_per_epoch(len(split.y_train), config.batch_size)  # validates the batch
    spe = config.steps_per_epoch
    with strategy.scope():
        model = build_model(split.x_train.shape[1], config, split.y_train)
    # One validation batch of static size: the S-quantile loss needs a known n.
    val = tf.data.Dataset.from_tensors((split.x_val, split.y_val))

    def train_dataset(start_step):
        return arrays.shuffled_batches((split.x_train, split.y_train), config.batch_size,
                                       config.seed, start_step)

    # Early stopping is decided only at multiples of `chunk` epochs, from the checkpoint
    # state: a resumed run takes the same decisions as an uninterrupted one.
    chunk = config.patience
    target, stopped_early = min(config.epochs, chunk), False
    while True:
        fit = training.fit_resumable(
            model, train_dataset, val, epochs=target, steps_per_epoch=spe,
            output_dir=config.output_dir, monitor="val_pinball", mode="min", writer=chief,
            stop_after_epochs=config.stop_after_epochs, verbose=config.verbose)
        done, best = fit.epochs_completed, fit.best_epoch
        if done >= config.epochs or (config.stop_after_epochs is not None
                                     and done >= config.stop_after_epochs):
            break
        if done % chunk == 0 and best is not None and done - best >= config.patience:
            stopped_early = True
            break
        target = min(config.epochs, (done // chunk + 1) * chunk)
    finished = stopped_early or fit.epochs_completed >= config.epochs
    results = {
        "task": "quantile_regression",
        "flags": dataclasses.asdict(config),
        "machine": training.machine_info(),
        "finished": finished,
        "stopped_early": stopped_early,
        "epochs_completed": fit.epochs_completed,
        "steps_per_epoch": spe,
        "best_epoch": fit.best_epoch,
        "history": fit.history,
        "train_seconds_all_sessions": float(sum(fit.history.get("epoch_seconds", []))),
        "num_train": len(split.y_train), "num_val": len(split.y_val),
        "num_test": len(split.y_test), "y_scale": split.y_scale,
    }
    if not finished:
        results["wall_time_s"] = time.time() - wall_start
        return results
    model.load_weights(fit.best_path)
    results["metrics"] = {
        "test_pinball": test_pinball(model, split.x_test, split.y_test, config.tau),
        "val_pinball": fit.best_value,
        "constant_test_pinball": constant_pinball(split.y_train, split.y_test, config.tau),
        "test_coverage": float(np.mean(
            split.y_test <= np.asarray(model(split.x_test, training=False))[:, 0])),
    }
    results["wall_time_s"] = time.time() - wall_start
    if chief:
        training.write_json(os.path.join(config.output_dir, "results.json"), results)
    m = results["metrics"]
    print(f"{config.dataset} τ={config.tau} {config.method} seed={config.seed}: test pinball "
          f"{m['test_pinball']:.4f} (constant {m['constant_test_pinball']:.4f}), coverage "
          f"{m['test_coverage']:.3f}, best epoch {fit.best_epoch}/{fit.epochs_completed}")
    return results

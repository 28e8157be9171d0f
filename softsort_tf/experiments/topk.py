"""The soft top-k loss and soft quantile-normalisation layers on a vanilla CNN (Cuturi et al. 2019).

§4 of the paper trains "a vanilla CNN (4 Conv2D with 2 max-pooling layers, ReLU
activation, 2 fully connected layers, batchnorm on each)" on CIFAR-10/100 with the
S-top-k loss (k = 1, ε = 0.01, ℓ = 100, squared cost) against cross-entropy (Fig. 4,
test accuracy per epoch, 12 runs), and the same CNN with soft quantile instance
normalisation layers (m = 16) trained with cross-entropy (Fig. 6).

`run(config)` trains every variant × seed (each a resumable run in
`output_dir/<variant>/seed<k>/`), then writes `curves.csv` and `curves.png`: test
accuracy after each epoch, mean ± standard deviation over the seeds, and
`summary.json` (final test accuracy per variant). Variants:

- `cross_entropy`: sparse categorical cross-entropy on the logits;
- `soft_topk`: `softsort_tf.SoftTopKLoss(k, epsilon)` on the logits (form 'rank' by
  default, the NeurIPS talk's J_k(L − R̃_l); `topk_form='cdf'` is the arXiv text's
  J_k(1 − F̃_l), see `softsort_tf.losses.top_k`);
- `cross_entropy_qn` (with `quantile_norm_layers`): cross-entropy, with an
  `InstanceQuantileNormalization` (a `SinkhornQuantileNormalization` with m = 16 over
  all the activations of one image) after each of the two conv blocks.

The curves are the test accuracy after each epoch, as in Fig. 4 (no model selection on
the test set: the reported accuracy is the last epoch's).

The CNN (our reading of the paper's one line; widths are ours):
    [Conv 3×3 32, BN, ReLU] ×2 → max-pool 2 → (QN) →
    [Conv 3×3 64, BN, ReLU] ×2 → max-pool 2 → (QN) →
    Flatten → Dense 256, BN, ReLU → Dense L (logits).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

import softsort_tf
from softsort_tf.datasets import arrays, images
from softsort_tf.experiments import training

__all__ = ["VARIANTS", "InstanceQuantileNormalization", "TopKConfig", "build_cnn", "run"]

VARIANTS = ("cross_entropy", "soft_topk", "cross_entropy_qn")
EVAL_BATCH_SIZE = 256


@keras.saving.register_keras_serializable(package="softsort_tf")
class InstanceQuantileNormalization(keras.layers.Layer):
    """Soft quantile normalisation of all the activations of each example (paper §4).

    Flattens each example `[..., d1, d2, ...]` to one vector of n values, applies a
    `softsort_tf.SinkhornQuantileNormalization` (learned sorted targets, m values) and
    restores the shape: the order of the activations of an example is kept and their
    values are replaced by the learned quantile function.

    Args:
      num_targets: m (paper: 16).
      **kwargs: `keras.layers.Layer` arguments.

    Input: `[batch, d1, ..., dk]` with static d's. Output: the same shape.

    Example:
    >>> layer = InstanceQuantileNormalization(num_targets=4)
    >>> layer(np.random.rand(2, 3, 3, 2).astype("float32")).shape
    TensorShape([2, 3, 3, 2])
    """

    def __init__(self, num_targets: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.num_targets = int(num_targets)
        self.normalization = softsort_tf.SinkhornQuantileNormalization(
            num_targets=self.num_targets)

    def build(self, input_shape):
        self.normalization.build((input_shape[0], int(np.prod(input_shape[1:]))))

    def call(self, inputs):
        shape = tf.shape(inputs)
        flat = tf.reshape(inputs, [-1, int(np.prod(inputs.shape[1:]))])
        return tf.reshape(self.normalization(flat), shape)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "num_targets": self.num_targets}


def build_cnn(image_shape: tuple, num_classes: int, quantile_norm: bool = False,
              num_targets: int = 16, name: str = "vanilla_cnn") -> keras.Sequential:
    """The vanilla CNN (module docstring): images `[batch, H, W, C]` -> logits `[batch, L]`."""
    L = keras.layers
    stack = [keras.Input(image_shape)]
    for filters in (32, 64):
        for _ in range(2):
            stack += [L.Conv2D(filters, 3, padding="same", use_bias=False),
                      L.BatchNormalization(momentum=0.9), L.ReLU()]
        stack.append(L.MaxPooling2D(2))
        if quantile_norm:
            stack.append(InstanceQuantileNormalization(num_targets))
    stack += [L.Flatten(), L.Dense(256, use_bias=False), L.BatchNormalization(momentum=0.9),
              L.ReLU(), L.Dense(num_classes)]
    return keras.Sequential(stack, name=name)


@dataclasses.dataclass
class TopKConfig(training.RunConfig):
    """Everything a top-k run depends on (the binary's flags)."""

    dataset: str = "digits"
    npz_path: str | None = None
    losses: tuple = ("cross_entropy", "soft_topk")
    quantile_norm_layers: bool = False
    num_targets: int = 16
    k: int = 1
    epsilon: float = 0.01
    topk_form: str = "rank"
    num_seeds: int = 3
    batch_size: int = 32
    limit_per_split: int | None = None
    # This binary's defaults of `RunConfig` fields.
    output_dir: str = "/tmp/softsort_tf_topk"
    epochs: int = 30
    learning_rate: float = 1e-3

    def variants(self) -> list[str]:
        out = list(self.losses)
        if self.quantile_norm_layers:
            out.append("cross_entropy_qn")
        return out

    def finalize(self) -> TopKConfig:
        """Validates the fields; returns self."""
        self.losses = tuple(self.losses)
        self.check(losses=VARIANTS[:2], dataset=images.SOURCES, topk_form=("rank", "cdf"))
        if not self.variants():
            raise ValueError("nothing to train: give losses or quantile_norm_layers.")
        return self


def _compile(model: keras.Model, variant: str, config: TopKConfig) -> None:
    if variant == "soft_topk":
        loss = softsort_tf.SoftTopKLoss(k=config.k, form=config.topk_form, from_sparse=True,
                                        epsilon=config.epsilon)
    else:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(keras.optimizers.Adam(config.learning_rate), loss=loss,
                  metrics=[keras.metrics.SparseCategoricalAccuracy("accuracy")])


def _run_one(config: TopKConfig, splits: images.ImageSplits, variant: str, seed: int,
             strategy: tf.distribute.Strategy) -> dict:
    out = os.path.join(config.output_dir, variant, f"seed{seed}")
    done_path = os.path.join(out, "results.json")
    if os.path.exists(done_path):
        with open(done_path) as f:
            return json.load(f)
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    with training.output_directory(out):
        with strategy.scope():
            model = build_cnn(splits.image_shape, splits.num_classes,
                              quantile_norm=variant == "cross_entropy_qn",
                              num_targets=config.num_targets)
            _compile(model, variant, config)
        test = tf.data.Dataset.from_tensor_slices((splits.x_test, splits.y_test)).batch(
            EVAL_BATCH_SIZE)
        spe = arrays.steps_per_epoch(len(splits.y_train), config.batch_size)
        fit = training.fit_resumable(
            model, lambda step: arrays.shuffled_batches((splits.x_train, splits.y_train),
                                                        config.batch_size, seed, step),
            test, epochs=config.epochs, steps_per_epoch=spe, output_dir=out,
            monitor="val_accuracy", mode="max", writer=training.is_chief(strategy),
            stop_after_epochs=config.stop_after_epochs, verbose=config.verbose)
        result = {"variant": variant, "seed": seed, "finished": fit.finished,
                  "epochs_completed": fit.epochs_completed, "steps_per_epoch": spe,
                  "test_accuracy_curve": fit.history.get("val_accuracy", []),
                  "test_loss_curve": fit.history.get("val_loss", []),
                  "train_accuracy_curve": fit.history.get("accuracy", []),
                  "train_seconds_all_sessions": float(sum(fit.history.get("epoch_seconds",
                                                                          [])))}
        if fit.finished:
            logs = model.evaluate(test, verbose=0, return_dict=True)
            result["final_test_accuracy"] = float(logs["accuracy"])
            if training.is_chief(strategy):
                training.write_json(done_path, result)
    return result


def write_curves(output_dir: str, runs: dict[str, list[dict]]) -> dict:
    """Writes `curves.csv` (variant, epoch, mean, std, runs) and `curves.png`; returns the
    per-variant summary (final test accuracy mean ± std)."""
    rows, summary = [], {}
    for variant, results in runs.items():
        curves = [r["test_accuracy_curve"] for r in results if r["test_accuracy_curve"]]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        stacked = np.array([c[:length] for c in curves])
        for epoch in range(length):
            rows.append([variant, epoch + 1, float(stacked[:, epoch].mean()),
                         float(stacked[:, epoch].std()), len(curves)])
        finals = [r["final_test_accuracy"] for r in results if "final_test_accuracy" in r]
        summary[variant] = {"final_test_accuracy_mean": float(np.mean(finals)) if finals
                            else None,
                            "final_test_accuracy_std": float(np.std(finals)) if finals
                            else None, "runs": len(finals), "epochs": length}
    with open(os.path.join(output_dir, "curves.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["variant", "epoch", "test_accuracy_mean", "test_accuracy_std",
                         "runs"])
        writer.writerows(rows)
    try:
        import matplotlib  # noqa: PLC0415 (optional)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("matplotlib is not installed: curves.png not written.")
        return summary
    fig, ax = plt.subplots(figsize=(6, 4))
    for variant in runs:
        pts = [r for r in rows if r[0] == variant]
        if not pts:
            continue
        epoch = np.array([p[1] for p in pts])
        mean, std = np.array([p[2] for p in pts]), np.array([p[3] for p in pts])
        ax.plot(epoch, mean, label=f"{variant} ({pts[0][4]} runs)")
        ax.fill_between(epoch, mean - std, mean + std, alpha=0.25)
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(output_dir, "curves.png"), dpi=120)
    plt.close(fig)
    return summary


def run(config: TopKConfig) -> dict:
    """Trains every variant × seed (resumable), writes the curves; returns the summary."""
    config = config.finalize()
    wall = time.time()
    strategy = training.prepare_runtime(config)
    os.makedirs(config.output_dir, exist_ok=True)
    splits = images.load_image_splits(config.dataset, config.npz_path,
                                      limit_per_split=config.limit_per_split)
    runs = {v: [_run_one(config, splits, v, seed, strategy) for seed in range(config.num_seeds)]
            for v in config.variants()}
    summary = write_curves(config.output_dir, runs)
    results = {"task": "topk", "flags": dataclasses.asdict(config),
               "machine": training.machine_info(), "summary": summary,
               "finished": all(r["finished"] for rs in runs.values() for r in rs),
               "num_train": len(splits.y_train), "num_test": len(splits.y_test),
               "wall_time_s": time.time() - wall}
    if training.is_chief(strategy):
        training.write_json(os.path.join(config.output_dir, "results.json"), results)
    for variant, s in summary.items():
        print(f"{variant}: final test accuracy {s['final_test_accuracy_mean']} ± "
              f"{s['final_test_accuracy_std']} over {s['runs']} runs")
    return results

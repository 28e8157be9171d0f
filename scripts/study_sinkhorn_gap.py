"""Side-by-side study of Sinkhorn against SoftSort on the large-MNIST sorting task.

Trains one variant of the sorting model of `scripts/train_sort.py` (same data, CNN,
loss, optimiser and resumable training loop, `softsort_tf.experiments`) and reports
its validation accuracy per epoch; with `--diagnose`, also measures on training
batches, before training and after every epoch, what the loss gives the CNN:

- the per-row loss −log P̂[i, y_i] and its gradient w.r.t. the CNN's scores, per row of
  P̂ (one sorted position of one sequence), split by whether the sequence is sorted
  right; a row's gradient "vanishes" when its norm, in units of the list's spread
  (‖∂ℓ_i/∂s‖ · std(s), the same for any rescaling of the scores), is below 1e-3;
- the gradient w.r.t. the scores' scale, d ℓ / d log c at c = 1 for the scores c·s
  (Σ_j s_j ∂ℓ/∂s_j);
- the hardness of the relaxation: for Sinkhorn, the smallest gap between neighbouring
  squashed scores times the cost of a swap on the target grid over ε
  (2 · gap · Δy / ε, Δy = 1/(n − 1) on the 'regular' grid, 1/n on 'centres'); for
  SoftSort, the smallest gap of the raw scores over τ.

Only validation data choose anything here: the test set is not read.

Example (300 steps, embedded digits, n = 3):

    python scripts/study_sinkhorn_gap.py --method=sinkhorn --epsilon=0.05 \
        --output_dir=/tmp/study/sinkhorn_eps0.05 --diagnose
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import keras
import numpy as np
import tensorflow as tf

import softsort_tf as ss
from softsort_tf.experiments import large_mnist, models, training

VANISHING = 1e-3
DIAGNOSE_START_STEP = 1_000_000  # training batches far from those trained on


class StudyLearner(keras.Model):
    """The sorting model of the binaries (the CNN of `models.build_cnn` scoring each
    image, then P̂, or log P̂ for the operators with a log-domain matrix), with the
    operator's arguments given as a dict (Sinkhorn's `squash`, `targets`,
    `implicit_diff`, ...) and an optional rescaling of the scores."""

    def __init__(self, method, operator_args, score_scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self.method = method
        self.log = bool(ss.get_family(method).log_domain)
        self.operator_args = dict(operator_args)
        self.score_scale = float(score_scale)
        self.scorer = models.build_cnn("scorer")

    def build(self, input_shape=None):
        self.scorer.build((None,) + models.IMAGE_SHAPE)
        self.built = True

    def scores(self, images, training=None):
        n = images.shape[1]
        flat = tf.reshape(images, (-1,) + models.IMAGE_SHAPE)
        return tf.reshape(self.scorer(flat, training=training), (-1, n)) * self.score_scale

    def matrix(self, scores):
        return ss.permutation_matrix(scores, self.method, log=self.log, **self.operator_args)

    def call(self, inputs, training=None):
        return self.matrix(self.scores(inputs["images"], training))


def operator_args(args) -> dict:
    if args.method == "sinkhorn":
        out = {"epsilon": args.epsilon, "squash": args.squash, "targets": args.targets}
        if args.unrolled:
            out["implicit_diff"] = None
        return out
    if args.method == "lapsum":
        return {"alpha": args.tau}
    return {"tau": args.tau}


def diagnose(model: StudyLearner, batches, args) -> dict:
    """The measures of the module docstring on `batches` of training sequences."""
    n = args.n
    rows_norm, rows_loss, rows_sorted, scale_grad, hardness = [], [], [], [], []
    spreads = []
    for features, order in batches:
        scores = tf.stop_gradient(model.scores(features["images"], training=False))
        order = tf.cast(order, tf.int32)
        grads = []
        for i in range(n):
            with tf.GradientTape() as tape:
                tape.watch(scores)
                log_p = model.matrix(scores)
                if not model.log:
                    log_p = tf.math.log(1e-7 + (1.0 - 1e-7) * log_p)
                row = -tf.gather(log_p[:, i, :], order[:, i:i + 1], batch_dims=1)[:, 0]
                total = tf.reduce_sum(row)
            grads.append(tape.gradient(total, scores).numpy())
            rows_loss.append(row.numpy())
        grads = np.stack(grads, axis=1)  # [batch, n rows, n scores]
        s = scores.numpy().astype(np.float64)
        spread = s.std(axis=-1, keepdims=True)
        spreads.append(spread[:, 0])
        rows_norm.append(np.linalg.norm(grads, axis=-1) * spread)  # [batch, n]
        scale_grad.append(np.einsum("brj,bj->b", grads, s) / n)  # d mean-row-loss / d log c
        predicted = np.argsort(-s, axis=-1, kind="stable")
        rows_sorted.append(np.all(predicted == order.numpy(), axis=-1))
        if args.method == "sinkhorn":
            # Sinkhorn sorts in DESCENDING order by squashing −s.
            squashed = ss.squash_values(-scores, args.squash).numpy() if args.squash else -s
            step = 1.0 / (n - 1) if args.targets == "regular" else 1.0 / n
            gap = np.diff(np.sort(squashed, axis=-1), axis=-1).min(axis=-1)
            hardness.append(2.0 * gap * step / args.epsilon)
        else:
            gap = np.diff(np.sort(s, axis=-1), axis=-1).min(axis=-1)
            hardness.append(gap / args.tau)
    norm = np.concatenate(rows_norm)  # [sequences, n]
    loss = np.stack(rows_loss).reshape(len(rows_norm), n, -1).transpose(0, 2, 1).reshape(-1, n)
    right = np.concatenate(rows_sorted)
    scale = np.concatenate(scale_grad)
    hard = np.concatenate(hardness)
    vanish = norm < VANISHING

    def q(x):
        return [float(v) for v in np.quantile(x, [0.1, 0.5, 0.9])] if x.size else None

    return {
        "sequences": int(norm.shape[0]),
        "train_sorted_fraction": float(right.mean()),
        "rows_vanishing_fraction": float(vanish.mean()),
        "rows_vanishing_fraction_sorted": float(vanish[right].mean()) if right.any() else None,
        "rows_vanishing_fraction_unsorted": (float(vanish[~right].mean())
                                             if (~right).any() else None),
        "row_grad_norm_q10_50_90_sorted": q(norm[right].ravel()),
        "row_grad_norm_q10_50_90_unsorted": q(norm[~right].ravel()),
        "row_grad_norm_mean_by_row": [float(v) for v in norm.mean(axis=0)],
        "row_loss_mean_by_row": [float(v) for v in loss.mean(axis=0)],
        "row_loss_q10_50_90": q(loss.ravel()),
        "scale_grad_mean": float(scale.mean()),
        "scale_grad_abs_mean": float(np.abs(scale).mean()),
        "score_spread_q10_50_90": q(np.concatenate(spreads)),
        "hardness_q10_50_90": q(hard),
        "hardness_above_10_fraction": float((hard > 10).mean()),
    }


class Diagnose(keras.callbacks.Callback):
    def __init__(self, batches, args, records):
        super().__init__()
        self.batches, self.args, self.records = batches, args, records

    def on_epoch_end(self, epoch, logs=None):
        record = diagnose(self.model, self.batches, self.args)
        record["epoch"] = epoch + 1
        self.records.append(record)
        print(json.dumps(record))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--method", default="sinkhorn", choices=["sinkhorn", "softsort",
                                                                 "neuralsort", "lapsum"])
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--epsilon", type=float, default=5e-3)
    parser.add_argument("--tau", type=float, default=None, help="SoftSort/NeuralSort τ "
                        "(LapSum α); default the binary's (1024 for n <= 7)")
    parser.add_argument("--squash", default="logistic",
                        choices=["logistic", "atan", "robust", "none"])
    parser.add_argument("--targets", default="regular", choices=["regular", "centres"])
    parser.add_argument("--unrolled", action="store_true",
                        help="Sinkhorn: backpropagate through the loop (implicit_diff=None)")
    parser.add_argument("--score_scale", type=float, default=1.0,
                        help="multiply the CNN's scores by this before the operator")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps_per_epoch", type=int, default=100)
    parser.add_argument("--num_val_sequences", type=int, default=200)
    parser.add_argument("--learning_rate", type=float, default=0.005)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--diagnose", action="store_true")
    parser.add_argument("--diagnose_batches", type=int, default=10)
    args = parser.parse_args()
    if args.squash == "none":
        args.squash = None
    if args.tau is None:
        args.tau = large_mnist.default_tau(args.n)

    # The binary's config (so data, seeds and determinism are those of train_sort).
    config = large_mnist.ExperimentConfig(
        task="sort", method=args.method, n=args.n, epochs=args.epochs,
        steps_per_epoch=args.steps_per_epoch, num_val_sequences=args.num_val_sequences,
        num_test_sequences=1, seed=args.seed, learning_rate=args.learning_rate,
        output_dir=args.output_dir, verbose=2).finalize()
    strategy = large_mnist.prepare_runtime(config)
    train_dataset, val_ds, _ = large_mnist.make_datasets(config)
    with strategy.scope():
        model = StudyLearner(args.method, operator_args(args), score_scale=args.score_scale)
        model.build()
        model.compile(
            keras.optimizers.Adam(large_mnist.learning_rate_schedule(config)),
            loss=ss.PermutationCrossEntropy(y_true_format="indices", from_log=model.log),
            metrics=[ss.ExactPermutationAccuracy(name="exact_accuracy",
                                                 y_true_format="indices"),
                     ss.ElementwisePermutationAccuracy(name="elementwise_accuracy",
                                                       y_true_format="indices")])
    records = []
    callbacks = []
    if args.diagnose:
        batches = list(train_dataset(DIAGNOSE_START_STEP).take(args.diagnose_batches))
        record = diagnose(model, batches, args)
        record["epoch"] = 0
        records.append(record)
        print(json.dumps(record))
        callbacks.append(Diagnose(batches, args, records))
    start = time.time()
    fit = training.fit_resumable(
        model, train_dataset, val_ds, epochs=config.epochs,
        steps_per_epoch=config.steps_per_epoch, output_dir=config.output_dir,
        monitor="val_exact_accuracy", mode="max", verbose=2, callbacks=callbacks)
    history = fit.history
    result = {
        "args": vars(args),
        "operator_args": {k: str(v) for k, v in operator_args(args).items()},
        "val_exact_accuracy": history.get("val_exact_accuracy"),
        "val_elementwise_accuracy": history.get("val_elementwise_accuracy"),
        "best_epoch": fit.best_epoch,
        "best_val_exact_accuracy": fit.best_value,
        "wall_seconds": time.time() - start,
        "diagnostics": records,
        "machine": training.machine_info(),
    }
    with open(os.path.join(args.output_dir, "study.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    best = fit.best_epoch
    elementwise = (history["val_elementwise_accuracy"][best - 1]
                   if best and "val_elementwise_accuracy" in history else math.nan)
    print(f"best epoch {best}: validation exact {fit.best_value:.4f} "
          f"(elementwise {elementwise:.4f})")


if __name__ == "__main__":
    main()

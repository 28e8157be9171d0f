"""One worker of the multi-worker tests (`test_training.py`), or the one-process reference.

    python multi_worker_job.py OUTPUT_DIR STRATEGY PAUSE

runs two jobs through `training.fit_resumable` on `STRATEGY` ('multi_worker' with
`TF_CONFIG` set, or 'default'): "keras", a Keras model with two heads (SoftSort's
`SpearmanLoss` on per-item scores, `SoftTrimmedRegressionLoss` (Sinkhorn) on a pooled
regression), then "sort", the
train_sort experiment (`large_mnist.run`). With PAUSE = 'keras' or 'sort', that job stops
before the second step of its second epoch (for the test to kill the process). Prints
`RESULT <json>` with what the test compares.
"""

import json
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import softsort_tf as ss
from softsort_tf.experiments import large_mnist, training

LR, L, D, B, EPOCHS, STEPS = 0.1, 4, 3, 8, 2, 2


class Pause(keras.callbacks.Callback):
    """Stops (for the test to kill the process) before the 2nd step of the 2nd epoch."""

    def __init__(self, job, out):
        super().__init__()
        self.job, self.out, self.epoch = job, out, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch == 1 and batch == 1:
            index = training.worker_index(self.model.distribute_strategy)[0]
            open(os.path.join(self.out, f"paused-{self.job}-{index}"), "w").close()
            time.sleep(3600)


rng = np.random.RandomState(0)
x = rng.randn(40, L, D).astype(np.float32)
w_true = rng.randn(D)
rel = (x @ w_true + 0.3 * rng.randn(40, L)).astype(np.float32)
y = (x.mean(1) @ w_true + 0.5 * rng.standard_cauchy(40))[:, None].astype(np.float32)
W0 = [rng.randn(D, 1).astype(np.float32) * 0.5, np.zeros(1, np.float32),
      rng.randn(D, 1).astype(np.float32) * 0.5, np.array([0.2], np.float32)]
train_x, train_y = x[:B * STEPS], {"rank": rel[:B * STEPS], "reg": y[:B * STEPS]}


def losses():
    # The ranking head is SoftSort's Spearman loss: what the test checks of it (a mean
    # over lists steps as on one process) does not depend on the operator, and Sinkhorn
    # under the strategy is the trimmed head's (a second Sinkhorn solve with its
    # implicit gradient, traced and run eagerly, cost each of the three processes
    # about 2 s of CPU).
    return {"rank": ss.SpearmanLoss(method="softsort"),
            "reg": ss.SoftTrimmedRegressionLoss(0.0, 0.75)}


def build():
    inputs = keras.Input((L, D))
    rank = keras.layers.Reshape((L,), name="rank")(
        keras.layers.Dense(1, name="rank_dense")(inputs))
    reg = keras.layers.Dense(1, name="reg")(
        keras.layers.GlobalAveragePooling1D(name="pool")(inputs))
    model = keras.Model(inputs, {"rank": rank, "reg": reg})
    model.set_weights(W0)
    model.compile(keras.optimizers.SGD(LR), loss=losses())
    return model


def train_batches(start_step):
    ds = tf.data.Dataset.from_tensor_slices((train_x, train_y)).batch(B).repeat()
    return ds.skip(start_step)


def main(out, strategy_name, pause):
    """Runs both jobs on this process's strategy; returns what the test compares."""
    strategy = training.make_strategy(strategy_name)
    index, workers = training.worker_index(strategy)
    chief = training.is_chief(strategy)
    fit_resumable = training.fit_resumable

    def fit_with_pause(*args, job, **kwargs):
        callbacks = [Pause(job, out)] if pause == job else []
        return fit_resumable(*args, callbacks=callbacks, **kwargs)

    results = {"index": index, "workers": workers}
    with strategy.scope():
        model = build()
    val = tf.data.Dataset.from_tensor_slices((x[B * STEPS:], {"rank": rel[B * STEPS:],
                                                               "reg": y[B * STEPS:]})).batch(B)
    fit = fit_with_pause(model, train_batches, val, epochs=EPOCHS, steps_per_epoch=STEPS,
                         output_dir=os.path.join(out, "keras"), monitor="val_loss", mode="min",
                         writer=chief, verbose=0, job="keras")
    results["keras"] = {"resumed_from_epoch": fit.resumed_from_epoch, "history": fit.history}

    if strategy_name == "default":
        # The step of two replicas: the mean of the two half-batch losses.
        model, opt, epoch_losses = build(), keras.optimizers.SGD(LR), []
        for _ in range(EPOCHS):
            step_losses = []
            for step in range(STEPS):
                with tf.GradientTape() as tape:
                    halves = []
                    for h in range(2):
                        part = slice(step * B + h * B // 2, step * B + (h + 1) * B // 2)
                        pred = model(train_x[part])
                        halves.append(sum(loss(train_y[k][part], pred[k])
                                          for k, loss in losses().items()))
                    loss = (halves[0] + halves[1]) / 2
                grads = tape.gradient(loss, model.trainable_weights)
                opt.apply(grads, model.trainable_weights)
                step_losses.append(float(loss))
            epoch_losses.append(float(np.mean(step_losses)))
        model.save_weights(os.path.join(out, "two_halves.weights.h5"))
        results["two_halves_loss"] = epoch_losses

    config = large_mnist.ExperimentConfig(
        task="sort", output_dir=os.path.join(out, "sort"), n=3, epochs=2, steps_per_epoch=2,
        batch_size=4, digits_per_class=10, num_val_sequences=4, num_test_sequences=4,
        strategy=strategy_name, deterministic_ops=False, verbose=0)
    training.fit_resumable = lambda *a, **k: fit_with_pause(*a, job="sort", **k)
    try:  # the binary's code path, with the pause
        sort = large_mnist.run(config)
    finally:
        training.fit_resumable = fit_resumable
    results["sort"] = {k: sort.get(k) for k in ("resumed_from_epoch", "history", "metrics",
                                                "finished")}
    return results


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(*sys.argv[1:4])))

"""`training.fit_resumable` (Keras' BackupAndRestore / ModelCheckpoint / CSVLogger) on a
model whose validation loss follows a fixed schedule, interrupted and resumed."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from softsort_tf.experiments import training

# Validation loss of epoch e (1-based) is SCHEDULE[e - 1] ** 2: best at epoch 4.
SCHEDULE = [5.0, 3.0, 4.0, 2.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]


class _Scaled(keras.layers.Layer):
    """x * w with w a non-trainable weight set by `_FollowSchedule` before each epoch."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(), initializer="ones", trainable=False)
        self.bias = self.add_weight(shape=(), initializer="zeros")

    def call(self, x):
        return x * self.w + self.bias


class _FollowSchedule(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.model.layers[-1].w.assign(SCHEDULE[epoch])


def _model():
    model = keras.Sequential([keras.Input((1,)), _Scaled()])
    model.compile(keras.optimizers.SGD(0.0), loss="mse")
    return model


def _fit(output_dir, **kwargs):
    data = tf.data.Dataset.from_tensors((tf.ones([4, 1]), tf.zeros([4, 1])))
    kwargs = dict(dict(epochs=len(SCHEDULE), patience=2), **kwargs)
    return training.fit_resumable(
        _model(), lambda step: data.repeat(), data, steps_per_epoch=1, output_dir=output_dir,
        monitor="val_loss", mode="min", verbose=0, callbacks=[_FollowSchedule()],
        on_fresh_start=lambda: {"fresh": 1.0}, **kwargs)


def _best_w(output_dir):
    model = _model()
    model.load_weights(os.path.join(output_dir, "checkpoints", "best.weights.h5"))
    return float(model.layers[-1].w.numpy())


def test_patience_and_best_epoch_survive_a_restart(tmp_path):
    straight = _fit(str(tmp_path / "straight"))
    assert straight.stopped_early and straight.finished and straight.epochs_completed == 6
    assert straight.best_epoch == 4 and straight.best_value == pytest.approx(4.0)
    assert _best_w(str(tmp_path / "straight")) == 2.0

    # Interrupted after epoch 5, one epoch after the best: the restart must remember
    # both the best value (so that ModelCheckpoint keeps epoch 4's weights) and the
    # best epoch (so that patience stops after epoch 6, not 4 epochs later).
    out = str(tmp_path / "resumed")
    first = _fit(out, stop_after_epochs=5)
    assert first.epochs_completed == 5 and not first.finished and not first.stopped_early
    resumed = _fit(out)
    assert resumed.resumed_from_epoch == 5 and resumed.epochs_completed == 6
    assert resumed.stopped_early and resumed.best_epoch == 4
    assert _best_w(out) == 2.0
    assert resumed.history["val_loss"] == pytest.approx(straight.history["val_loss"])
    assert resumed.history["val_loss"] == pytest.approx(np.square(SCHEDULE[:6]))
    assert len(resumed.history["epoch_seconds"]) == 6
    assert resumed.extra == {"fresh": 1.0}
    # A rerun of a stopped run does not train again.
    again = _fit(out)
    assert again.resumed_from_epoch == 6 and again.epochs_completed == 6 and again.finished


def test_an_epoch_logged_twice_counts_once(tmp_path):
    path = tmp_path / "history.csv"
    path.write_text("epoch,loss,val_loss\n0,1.0,2.0\n1,0.5,1.5\n1,0.25,1.25\n2,0.1,9.0\n")
    history = training.read_history(str(path), 2)
    assert history == {"loss": [1.0, 0.25], "val_loss": [2.0, 1.25]}
    assert training.best_epoch([3.0, float("nan"), 1.0, 1.0], "min") == (3, 1.0)
    assert training.best_epoch([float("nan")], "max") == (None, None)


def test_output_directory_is_removed_only_when_this_run_created_it_empty(tmp_path):
    fresh, existing, written = (str(tmp_path / name) for name in ("a", "b", "c"))
    os.makedirs(existing)
    for path in (fresh, existing, written):
        with pytest.raises(RuntimeError):
            with training.output_directory(path):
                if path == written:
                    with open(os.path.join(path, "state.json"), "w") as f:
                        json.dump({}, f)
                raise RuntimeError("the run failed")
    assert not os.path.exists(fresh)
    assert os.path.isdir(existing) and os.path.isdir(written)


def _unknown_length_batches():
    # Three static-shape batches behind a filter: tf.data cannot know the length.
    x = tf.reshape(tf.range(12, dtype=tf.float32), [3, 4, 1])
    return tf.data.Dataset.from_tensor_slices((x, tf.zeros([3, 4, 1]))).filter(
        lambda a, b: True)


def test_validation_of_unknown_length_is_averaged_over_its_batches(tmp_path):
    # Keras' non-XLA graph evaluate adds a phantom batch to the metrics of a
    # static-shape dataset of unknown length (mean over 3 batches reported ×3/4).
    val = _unknown_length_batches()
    assert int(val.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    exact = float(np.mean(np.square(np.arange(12.0))))
    counted = training.with_known_length(val)
    assert int(counted.cardinality()) == 3
    assert _model().evaluate(counted, verbose=0) == pytest.approx(exact)
    fit = training.fit_resumable(
        _model(), lambda step: val.repeat(), val, epochs=1, steps_per_epoch=1,
        output_dir=str(tmp_path / "run"), monitor="val_loss", mode="min", verbose=0)
    assert fit.history["val_loss"] == pytest.approx([exact])
    with pytest.raises(ValueError, match="finite"):
        training.with_known_length(val.repeat())

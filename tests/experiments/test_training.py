"""Resumable training (`softsort_tf.experiments.training`): `fit_resumable` (Keras'
BackupAndRestore / ModelCheckpoint / CSVLogger), patience and time budget over restarts,
the output folder, validation sets of unknown length, and training on two workers.

`fit_resumable` is first checked on a model whose validation loss follows a fixed
schedule, interrupted and resumed.

Two workers (`tf.distribute.MultiWorkerMirroredStrategy`) on localhost: a cluster of two
worker processes (`multi_worker_job.py`; free ports picked at run time, `TF_CONFIG`)
runs two jobs one after the other, each through `training.fit_resumable`:
- "keras": a user's own Keras model with our losses, two heads on lists of 4 items:
  `SpearmanLoss` (SoftSort) on per-item scores (a mean over lists) and
  `SoftTrimmedRegressionLoss` (Sinkhorn) on a pooled regression (a batch statistic);
- "sort": the train_sort experiment (`large_mnist.run`, the binary's code path).

The cluster trains the "keras" job to its end, is killed mid-epoch in the "sort" job
(after the first step of its second epoch) and restarted: the second round skips the
finished job and resumes the other (killing the cluster in the "keras" job as well
would run the same resume of `fit_resumable` again, in a third round). The finished
run is compared with one process without a strategy (same global batch, same initial
weights):
- "sort" and the Spearman head: the same per-epoch losses and the same weights;
- the trimmed head: each replica takes the batch statistic over its own half of the
  global batch and Keras averages the replicas, so the two workers step on the mean of
  the two half-batch losses; the one-process reference computes that step with a
  GradientTape, and the one-process Keras fit on the global batch is measurably
  different.
"""

import json
import os
import runpy
import signal
import socket
import time

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

from softsort_tf.experiments import training

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multi_worker_job.py")
TIMEOUT = 600  # seconds, for all the rounds of the cluster

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


def test_time_budget_stops_the_run_and_a_rerun_does_not_train_again(tmp_path):
    out = str(tmp_path / "run")
    first = _fit(out, patience=None, max_train_seconds=1e-9)
    assert first.epochs_completed == 1 and first.finished and first.out_of_time
    again = _fit(out, patience=None, max_train_seconds=1e-9)
    assert again.epochs_completed == 1 and again.finished and again.out_of_time
    # Without the budget the same folder trains on.
    more = _fit(out, patience=None, epochs=3)
    assert more.epochs_completed == 3 and not more.out_of_time


class _CountingTraces(keras.Sequential):
    traces = 0

    def train_step(self, data):  # runs once per trace of the train function
        type(self).traces += 1
        return super().train_step(data)


def _adam_model(seed):
    keras.utils.set_random_seed(seed)
    model = _CountingTraces([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)],
                            name="counting")
    model.compile(keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
    return model


def test_fit_resumable_traces_the_train_step_once_and_trains_as_fit(tmp_path):
    # Keras creates Adam's slots and the metrics' variables in the first trace, and a
    # tf.function that creates variables is traced again: fit_resumable builds them
    # first. The weights and logs are those of a plain `fit` on the same batches.
    rng = np.random.RandomState(0)
    x, y = rng.randn(32, 3).astype(np.float32), rng.randn(32, 1).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    model = _adam_model(3)
    _CountingTraces.traces = 0
    fit = training.fit_resumable(model, lambda step: data.repeat(), data, epochs=2,
                                 steps_per_epoch=4, output_dir=str(tmp_path / "run"),
                                 monitor="val_loss", mode="min", verbose=0)
    assert _CountingTraces.traces == 1
    reference = _adam_model(3)
    history = reference.fit(data.repeat(), epochs=2, steps_per_epoch=4,
                            validation_data=data, verbose=0).history
    for got, want in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    for key in ("loss", "mae", "val_loss", "val_mae"):
        assert np.isfinite(fit.history[key]).all()
        np.testing.assert_allclose(fit.history[key], history[key], rtol=1e-6)


def test_split_batches_gives_each_worker_its_slice_of_every_batch():
    ds = tf.data.Dataset.range(10).batch(5)
    slices = [[b.numpy().tolist() for b in training.split_batches(ds, 2, i)] for i in (0, 1)]
    assert slices == [[[0, 1], [5, 6]], [[2, 3, 4], [7, 8, 9]]]
    pairs = tf.data.Dataset.from_tensor_slices(({"a": np.arange(8)}, np.arange(8) * 10))
    for features, labels in training.split_batches(pairs.batch(4), 4, 3):
        assert features["a"].numpy().tolist() == [3] and labels.numpy().tolist() == [30]
        break
    ragged = tf.data.Dataset.from_tensors(tf.ragged.constant([[1], [2, 3], [4], [5, 6, 7]]))
    (part,) = list(training.split_batches(ragged, 2, 1))
    assert part.to_list() == [[4], [5, 6, 7]]
    assert training.worker_index(tf.distribute.get_strategy()) == (0, 1)
    with pytest.raises(ValueError, match="index"):
        training.split_batches(ds, 2, 2)
    with pytest.raises(ValueError, match="num_workers"):
        training.split_batches(ds, 0, 0)


# Training on two workers.
def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _start_cluster(server, out, pause, round_):
    os.makedirs(out, exist_ok=True)
    ports = _free_ports(2)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    workers = []
    for i in range(2):
        tf_config = {"cluster": cluster, "task": {"type": "worker", "index": i}}
        log = os.path.join(out, f"worker{i}-round{round_}.txt")
        workers.append(server.start({"argv": [JOB, out, "multi_worker", pause],
                                     "env": {"TF_CONFIG": json.dumps(tf_config)}}, log, log))
    return workers


def _stop(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    for proc in procs:
        assert proc.wait(timeout=30) is not None


def _log(out, name):
    with open(os.path.join(out, f"{name}.txt")) as f:
        return f.read()


def _wait_for_pause(procs, out, job, deadline):
    markers = [os.path.join(out, f"paused-{job}-{i}") for i in range(2)]
    while not all(os.path.exists(m) for m in markers):
        for proc in procs:
            assert proc.poll() is None, f"a worker exited before pausing in {job}"
        assert time.time() < deadline, f"the workers did not reach the pause in {job}"
        time.sleep(0.2)


def _result(text):
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    assert lines, text[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def _weights(path):
    """The model's arrays of a `.weights.h5` file, by their h5 path (no optimizer)."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) and not name.startswith("optimizer")
                     else None)
    assert out
    return out


def _backed_up_epoch(run_dir):
    with open(os.path.join(run_dir, "backup", "training_metadata.json")) as f:
        return json.load(f)["epoch"]


def _reference(out):
    """Both jobs in this process, without a strategy (the one-worker reference)."""
    namespace = runpy.run_path(JOB, run_name="multi_worker_job")
    os.makedirs(out, exist_ok=True)
    return namespace["main"](out, "default", "none")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, fork_server):
    """The one-process reference and the two-worker cluster, killed twice. The workers
    are forked from the session's fork server (`conftest.py`)."""
    base = tmp_path_factory.mktemp("multi_worker")
    ref_dir, mw_dir = str(base / "one_process"), str(base / "two_workers")
    procs, deadline = [], time.time() + TIMEOUT
    state = {}
    try:
        # Round 1: the Keras job trains to its end; killed in the second epoch of the
        # sort job.
        cluster = _start_cluster(fork_server, mw_dir, "sort", 1)
        procs += cluster
        state["reference"] = _reference(ref_dir)  # while the cluster trains
        _wait_for_pause(cluster, mw_dir, "sort", deadline)
        cluster[1].send_signal(signal.SIGKILL)  # one worker dies, then the other
        _stop(cluster)
        state["sort_backup_at_kill"] = _backed_up_epoch(os.path.join(mw_dir, "sort"))
        state["worker1_backup_at_kill"] = _backed_up_epoch(
            os.path.join(mw_dir, "sort", "worker-1"))
        state["results_at_kill"] = os.path.exists(os.path.join(mw_dir, "sort",
                                                               "results.json"))
        # Round 2: the sort job resumes and finishes (the Keras job is finished).
        cluster = _start_cluster(fork_server, mw_dir, "none", 2)
        procs += cluster
        for proc in cluster:
            assert proc.wait(timeout=max(1.0, deadline - time.time())) is not None
    finally:
        _stop(procs)
    state["round2"] = [_log(mw_dir, f"worker{i}-round2") for i in range(2)]
    state["workers"] = [_result(log) for log in state["round2"]]
    state["ref_dir"], state["mw_dir"], state["all_procs"] = ref_dir, mw_dir, procs
    return state


@pytest.mark.slow
@pytest.mark.multi_worker
def test_killed_mid_epoch_the_cluster_resumes_from_the_last_backup(runs):
    # Killed after the first step of epoch 2: the last backup is epoch 1, on both workers.
    assert runs["sort_backup_at_kill"] == 1 and runs["worker1_backup_at_kill"] == 1
    assert not runs["results_at_kill"]
    for log in runs["round2"]:
        assert "Resuming after epoch 1" in log
    for worker in runs["workers"]:
        assert worker["workers"] == 2
        assert worker["sort"]["resumed_from_epoch"] == 1 and worker["sort"]["finished"]
        assert worker["keras"]["resumed_from_epoch"] == 2  # finished in round 1
    assert all(proc.poll() is not None for proc in runs["all_procs"])


@pytest.mark.slow
@pytest.mark.multi_worker
def test_two_workers_match_one_process_on_the_sort_experiment(runs):
    ref, mw = runs["reference"]["sort"], runs["workers"][0]["sort"]
    for key in ("loss", "exact_accuracy", "val_loss", "val_exact_accuracy"):
        np.testing.assert_allclose(mw["history"][key], ref["history"][key], rtol=1e-4,
                                   atol=1e-5, err_msg=key)
        assert np.all(np.isfinite(mw["history"][key]))
    for key, value in ref["metrics"].items():
        np.testing.assert_allclose(mw["metrics"][key], value, rtol=1e-4, atol=1e-5,
                                   err_msg=key)
    # Both workers report the metrics over the whole test set; the chief writes them once.
    assert runs["workers"][1]["sort"]["metrics"] == pytest.approx(mw["metrics"])
    sort_dir = os.path.join(runs["mw_dir"], "sort")
    with open(os.path.join(sort_dir, "results.json")) as f:
        assert json.load(f)["metrics"] == pytest.approx(mw["metrics"])
    assert not os.path.exists(os.path.join(sort_dir, "worker-1", "results.json"))
    expected = _weights(os.path.join(runs["ref_dir"], "sort", "backup", "latest.weights.h5"))
    for path in (os.path.join(sort_dir, "backup", "latest.weights.h5"),
                 os.path.join(sort_dir, "worker-1", "backup", "latest.weights.h5")):
        got = _weights(path)
        assert got.keys() == expected.keys()
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.slow
@pytest.mark.multi_worker
def test_two_workers_on_a_keras_model_with_a_ranking_and_a_batch_statistic_loss(runs):
    ref, mw = runs["reference"], runs["workers"][0]["keras"]
    # The ranking loss is a mean over lists: as on one process at the same global batch.
    np.testing.assert_allclose(mw["history"]["rank_loss"], ref["keras"]["history"]["rank_loss"],
                               rtol=1e-5, atol=1e-6)
    # The whole loss is the mean of the two half-batch losses (the trimmed term).
    np.testing.assert_allclose(mw["history"]["loss"], ref["two_halves_loss"], rtol=1e-5,
                               atol=1e-6)
    # Validation: every worker evaluates all of it, the metrics are those of one process.
    np.testing.assert_allclose(mw["history"]["val_rank_loss"],
                               ref["keras"]["history"]["val_rank_loss"], rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(mw["history"]["val_loss"]))
    keras_dir = os.path.join(runs["mw_dir"], "keras")
    got = _weights(os.path.join(keras_dir, "backup", "latest.weights.h5"))
    one_process = _weights(os.path.join(runs["ref_dir"], "keras", "backup",
                                        "latest.weights.h5"))
    two_halves = _weights(os.path.join(runs["ref_dir"], "two_halves.weights.h5"))
    assert got.keys() == one_process.keys() and any("dense_1/" in k for k in got)
    for name, value in got.items():
        assert np.all(np.isfinite(value))
        np.testing.assert_allclose(value, two_halves[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
        # `.weights.h5` names the layers by type and order: dense = rank head, dense_1 = reg.
        if name.startswith("layers/dense_1/"):  # the global-batch statistic steps elsewhere
            assert np.max(np.abs(value - one_process[name])) > 1e-3, name
        else:
            np.testing.assert_allclose(value, one_process[name], rtol=1e-5, atol=1e-6,
                                       err_msg=name)


def test_build_training_state_from_a_batch_and_not_under_a_strategy():
    x, y = np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32)

    def compiled():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
        return model

    model = compiled()
    assert training.build_training_state(model, (x, y))
    assert model.optimizer.built and len(model.optimizer.variables) > 2
    assert all(float(v.numpy()) == 0.0 for m in model.metrics for v in m.variables)
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        under_strategy = compiled()
    assert not training.build_training_state(under_strategy, (x, y))
    assert not under_strategy.optimizer.built

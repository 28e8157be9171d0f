"""Training on two workers (`tf.distribute.MultiWorkerMirroredStrategy`) on localhost.

A cluster of two worker processes (free ports picked at run time, `TF_CONFIG`) runs
two jobs one after the other, each through `training.fit_resumable`:
- "keras": a user's own Keras model with our losses, two heads on lists of 4 items:
  `SpearmanLoss` on per-item scores (a mean over lists) and
  `SoftTrimmedRegressionLoss` on a pooled regression (a batch statistic);
- "sort": the train_sort experiment (`large_mnist.run`, the binary's code path).

The cluster is killed mid-epoch twice (once in each job, after the first step of the
second epoch) and restarted; the finished run is compared with one process without a
strategy (same global batch, same initial weights):
- "sort" and the Spearman head: the same per-epoch losses and the same weights;
- the trimmed head: each replica takes the batch statistic over its own half of the
  global batch and Keras averages the replicas, so the two workers step on the mean of
  the two half-batch losses; the one-process reference computes that step with a
  GradientTape, and the one-process Keras fit on the global batch is measurably
  different.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import tensorflow as tf

from softsort_tf.experiments import training

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 600  # seconds, for all the rounds

_JOB = r'''
import json, os, sys, time
import numpy as np
import tensorflow as tf
import keras
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
    return {"rank": ss.SpearmanLoss(), "reg": ss.SoftTrimmedRegressionLoss(0.0, 0.75)}


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
'''


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _env(tf_config=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([ROOT] + ([os.environ["PYTHONPATH"]]
                                                    if os.environ.get("PYTHONPATH") else [])))
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def _start(out, strategy, pause, tf_config=None, log="log"):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{log}.txt"), "w") as f:
        return subprocess.Popen([sys.executable, "-c", _JOB, out, strategy, pause],
                                stdout=f, stderr=subprocess.STDOUT, env=_env(tf_config))


def _start_cluster(out, pause, round_):
    ports = _free_ports(2)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    return [_start(out, "multi_worker", pause,
                   {"cluster": cluster, "task": {"type": "worker", "index": i}},
                   log=f"worker{i}-round{round_}") for i in range(2)]


def _stop(procs):
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    for proc in procs:
        proc.wait(timeout=30)


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
    namespace = {"__name__": "multi_worker_job"}
    exec(compile(_JOB, "multi_worker_job", "exec"), namespace)  # noqa: S102
    os.makedirs(out, exist_ok=True)
    return namespace["main"](out, "default", "none")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The one-process reference and the two-worker cluster, killed twice."""
    base = tmp_path_factory.mktemp("multi_worker")
    ref_dir, mw_dir = str(base / "one_process"), str(base / "two_workers")
    procs, deadline = [], time.time() + TIMEOUT
    state = {}
    try:
        # Round 1: killed in the second epoch of the Keras job.
        cluster = _start_cluster(mw_dir, "keras", 1)
        procs += cluster
        state["reference"] = _reference(ref_dir)  # while the cluster trains
        _wait_for_pause(cluster, mw_dir, "keras", deadline)
        cluster[1].send_signal(signal.SIGKILL)  # one worker dies, then the other
        _stop(cluster)
        state["keras_backup_at_kill"] = _backed_up_epoch(os.path.join(mw_dir, "keras"))
        state["worker1_backup_at_kill"] = _backed_up_epoch(
            os.path.join(mw_dir, "keras", "worker-1"))
        # Round 2: the Keras job resumes and finishes; killed in the sort job.
        cluster = _start_cluster(mw_dir, "sort", 2)
        procs += cluster
        _wait_for_pause(cluster, mw_dir, "sort", deadline)
        cluster[0].send_signal(signal.SIGKILL)
        _stop(cluster)
        state["sort_backup_at_kill"] = _backed_up_epoch(os.path.join(mw_dir, "sort"))
        state["results_at_kill"] = os.path.exists(os.path.join(mw_dir, "sort",
                                                               "results.json"))
        # Round 3: both jobs resume and finish.
        cluster = _start_cluster(mw_dir, "none", 3)
        procs += cluster
        for proc in cluster:
            proc.wait(timeout=max(1.0, deadline - time.time()))
    finally:
        _stop(procs)
    state["workers"] = [_result(_log(mw_dir, f"worker{i}-round3")) for i in range(2)]
    state["round2"] = [_log(mw_dir, f"worker{i}-round2") for i in range(2)]
    state["ref_dir"], state["mw_dir"], state["all_procs"] = ref_dir, mw_dir, procs
    return state


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


@pytest.mark.slow
def test_killed_mid_epoch_the_cluster_resumes_from_the_last_backup(runs):
    # Killed after the first step of epoch 2: the last backup is epoch 1, on both workers.
    assert runs["keras_backup_at_kill"] == 1 and runs["worker1_backup_at_kill"] == 1
    assert runs["sort_backup_at_kill"] == 1 and not runs["results_at_kill"]
    for log in runs["round2"]:
        assert "Resuming after epoch 1" in log
    for worker in runs["workers"]:
        assert worker["workers"] == 2
        assert worker["sort"]["resumed_from_epoch"] == 1 and worker["sort"]["finished"]
        assert worker["keras"]["resumed_from_epoch"] == 2  # finished in round 2
    assert all(proc.poll() is not None for proc in runs["all_procs"])


@pytest.mark.slow
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

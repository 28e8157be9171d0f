"""The kNN experiment (`softsort_tf.experiments.knn`) and its binaries
`scripts/train_knn.py` and `scripts/run_knn_grid.py`."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from softsort_tf.datasets import images
from softsort_tf.experiments import knn


def test_knn_probabilities_and_plain_knn_accuracy_match_references():
    from sklearn.neighbors import KNeighborsClassifier

    rng = np.random.default_rng(5)
    perm = tf.nn.softmax(tf.constant(rng.normal(size=(2, 6, 6)), tf.float32) * 3, axis=-1)
    labels = np.array([0, 2, 1, 1, 0, 2])
    probs = knn.knn_class_probabilities(perm, tf.constant(labels), 3, 3).numpy()
    expected = np.einsum("qkc,cl->ql", perm.numpy()[:, :3], np.eye(3)[labels]) / 3
    np.testing.assert_allclose(probs, expected, rtol=1e-5)
    np.testing.assert_allclose(probs.sum(-1), 1, rtol=1e-5)

    # Plain kNN: against a float64 numpy reference of the vote, ties included (4 classes
    # and even k make ties of counts frequent).
    train, test = rng.normal(size=(300, 4)), rng.normal(size=(200, 4))
    y_train, y_test = rng.integers(0, 4, 300), rng.integers(0, 4, 200)
    distances = np.sum((test[:, None, :] - train[None, :, :]) ** 2, axis=-1)
    for k in (1, 4, 6, 9):
        nearest = np.argsort(distances, axis=1, kind="stable")[:, :k]
        expected = []
        for labels in y_train[nearest]:
            # most votes, then the smaller sum of ranks (nearer), then the smaller label
            expected.append(min((-np.sum(labels == c), np.sum(np.flatnonzero(labels == c)), c)
                                for c in np.unique(labels))[2])
        classifier = knn.knn_classifier(k).fit(train, y_train)
        np.testing.assert_array_equal(classifier.predict(test), expected)
        assert classifier.score(test, y_test) == pytest.approx(np.mean(expected == y_test))
        # Where no two classes tie, it is scikit-learn's plain majority vote.
        reference = KNeighborsClassifier(k).fit(train, y_train)
        counts = np.stack([np.bincount(row, minlength=4) for row in y_train[nearest]])
        clear = np.sort(counts, 1)[:, -1] > np.sort(counts, 1)[:, -2]
        np.testing.assert_array_equal(reference.predict(test[clear]),
                                      np.asarray(expected)[clear])
        if k in (4, 6):
            assert not clear.all()  # the fixture has ties


def test_knn_training_episodes_never_use_a_query_as_its_own_candidate():
    x = np.arange(60, dtype=np.float32)[:, None, None, None] * np.ones((1, 2, 2, 1), np.float32)
    y = np.arange(60) % 10
    train = (x, y)
    seen = []
    for features, labels in knn._episodes(train, train, 5, 7, seed=3).take(20):
        q = features["queries"].numpy()[:, 0, 0, 0]
        c = features["candidates"].numpy()[:, 0, 0, 0]
        assert not set(q) & set(c) and len(set(c)) == 7
        np.testing.assert_array_equal(labels.numpy(), q.astype(int) % 10)
        np.testing.assert_array_equal(features["candidate_labels"].numpy(), c.astype(int) % 10)
        seen.append(q)
    later = next(iter(knn._episodes(train, train, 5, 7, seed=3, start_step=19)))[0]
    np.testing.assert_array_equal(later["queries"].numpy()[:, 0, 0, 0], seen[19])  # resume


# Episodes of 40 queries × 40 candidates from 200 images per split: what is compared is
# the validation metric inside `fit` against the same episodes evaluated eagerly (a
# phantom batch scales the in-fit accuracy by 3/4), not the accuracy itself.
EPISODE, LIMIT = 40, 200


def _eager_validation_accuracy(output_dir, method, tau, seed):
    """Accuracy of the best weights of the run in `output_dir` on the 3 validation
    episodes of `knn.run`, evaluated eagerly."""
    s = images.load_image_splits("embedded", limit_per_split=LIMIT)
    model = knn.KnnEmbedder(s.image_shape, 10, 3, method, tau)
    model.build()
    model.load_weights(os.path.join(output_dir, "checkpoints", "best.weights.h5"))
    val = knn._episodes((s.x_val, s.y_val), (s.x_train, s.y_train), EPISODE, EPISODE,
                        seed=10_000 + seed, num_steps=3)
    return np.mean([np.mean(model(f, training=False).numpy().argmax(-1) == y.numpy())
                    for f, y in val])


@pytest.mark.slow
def test_knn_validation_inside_fit_matches_eager_execution(tmp_path):
    # XLA-compiled steps here; without XLA (which failed, 0.67 vs 0.89, until the
    # validation episodes had a known length, training.with_known_length) the same
    # comparison is made on the train_knn binary's run (test_train_knn_binary_offline).
    config = knn.KnnConfig(output_dir=str(tmp_path / "knn"), epochs=1, steps_per_epoch=2,
                           k=3, num_val_episodes=3, verbose=0, jit_compile=True,
                           num_queries=EPISODE, num_candidates=EPISODE,
                           limit_per_split=LIMIT)
    in_fit = knn.run(config)["history"]["val_accuracy"][0]
    eager = _eager_validation_accuracy(config.output_dir, "softsort", config.tau, config.seed)
    assert in_fit == pytest.approx(eager, abs=1e-6)


def _mtime(path):
    """A case (`run_binaries`) printing the modification time of `path`."""
    return {"code": f"import os; print(repr(os.path.getmtime({str(path)!r})))"}


@pytest.fixture(scope="module")
def binaries(run_binaries, tmp_path_factory):
    """train_knn once, and run_knn_grid three times on one folder: a grid of one run,
    the same grid again (skips it), then a larger grid with `--summarize_only`.
    Returns ({name: run}, folder)."""
    tmp = tmp_path_factory.mktemp("knn")
    grid = ["run_knn_grid.py", f"--runs_dir={tmp / 'grid'}", "--ks=2", "--methods=neuralsort",
            "--variants=stochastic", "--epochs=1", "--steps_per_epoch=1",
            "--limit_per_split=250", "--num_samples=2",
            # The driver's table and skipping do not depend on XLA (its compile was most of
            # the run); XLA-compiled kNN steps: test_knn_validation_inside_fit_...[True].
            "--nojit_compile"]
    result = tmp / "grid" / "neuralsort_stochastic_k2" / "results.json"
    cases = {
        # Validation as in test_knn_validation_inside_fit_matches_eager_execution.
        "knn": {"argv": ["train_knn.py", f"--output_dir={tmp / 'knn'}", "--epochs=1",
                         "--steps_per_epoch=2", f"--num_queries={EPISODE}",
                         f"--num_candidates={EPISODE}", "--k=3", "--stochastic",
                         "--num_samples=2", "--method=neuralsort", "--num_val_episodes=3",
                         "--verbose=0", f"--limit_per_split={LIMIT}",
                         # XLA's compile is the cost of a run; XLA-compiled kNN steps run
                         # in test_knn_validation_inside_fit[True].
                         "--nojit_compile"]},
        "grid": {"argv": grid},
        "stamp": _mtime(result),
        "again": {"argv": grid},
        "stamp again": _mtime(result),
        "summary": {"argv": [*grid, "--ks=2,4", "--summarize_only"]},
    }
    return run_binaries(cases, check=True), tmp


@pytest.mark.slow
def test_knn_grid_driver_writes_the_table_and_skips_finished_runs(binaries):
    procs, tmp = binaries
    runs = str(tmp / "grid")
    with open(os.path.join(runs, "neuralsort_stochastic_k2", "results.json")) as f:
        res = json.load(f)
    assert res["flags"]["stochastic"] and res["flags"]["k"] == 2 and res["wall_time_s"] > 0
    assert res["flags"]["jit_compile"] is False  # the flag reaches the runs
    assert procs["stamp again"].stdout == procs["stamp"].stdout  # skipped, not rerun
    table = procs["again"].stdout
    acc = 100 * res["metrics"]["test_knn_accuracy"]
    assert f"| neuralsort (stochastic) | {acc:.2f} %" in table
    assert f"k = 2: {acc:.2f} %" in table
    assert "| pending |" in procs["summary"].stdout and not os.path.exists(
        os.path.join(runs, "neuralsort_stochastic_k4"))


@pytest.mark.slow
def test_train_knn_binary_offline(binaries):
    out = str(binaries[1] / "knn")
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    m = res["metrics"]
    assert 0.0 <= m["test_knn_accuracy"] <= 1.0 and "untrained_test_knn_accuracy" in m
    assert res["flags"]["method"] == "neuralsort" and res["flags"]["stochastic"]
    assert res["flags"]["jit_compile"] is False
    # Without XLA, the validation inside fit matches eager execution (the stochastic
    # model validates with its deterministic P̂, as the eager call does).
    assert res["history"]["val_accuracy"][0] == pytest.approx(
        _eager_validation_accuracy(out, "neuralsort", res["flags"]["tau"],
                                   res["flags"]["seed"]), abs=1e-6)


def test_method_kwargs_reach_the_relaxed_matrix_and_are_checked():
    # --method_kwargs was accepted by train_knn and silently ignored: the family's own
    # settings now reach its matrix (SoftSort's distance power changes P̂), survive
    # get_config, and an unknown one is refused when the config is finalized.
    tf.keras.utils.set_random_seed(0)
    episode = {"queries": tf.random.normal([4, 28, 28, 1]),
               "candidates": tf.random.normal([6, 28, 28, 1]),
               "candidate_labels": tf.range(6) % 3, "step": tf.zeros([4], tf.int64)}
    plain = knn.KnnEmbedder((28, 28, 1), 3, 2, "softsort", 1.0)
    squared = knn.KnnEmbedder.from_config(
        {**plain.get_config(), "method_kwargs": {"distance_power": 2.0}})
    squared.build()
    plain.build()
    squared.set_weights(plain.get_weights())
    a, b = plain(episode).numpy(), squared(episode).numpy()
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b))
    assert np.abs(a - b).max() > 1e-3
    assert squared.get_config()["method_kwargs"] == {"distance_power": 2.0}
    with pytest.raises(ValueError, match="epsilon"):
        knn.KnnConfig(method="softsort", method_kwargs='{"epsilon": 0.1}').finalize()

"""Learning to rank on synthetic queries (`softsort_tf.experiments.ranking`) and its
binary `scripts/train_ranking.py`."""

import csv
import json
import os

import numpy as np
import pytest

import softsort_tf as ss
from softsort_tf.experiments import ranking


def test_synthetic_queries_have_graded_labels_and_variable_lengths():
    config = ranking.RankingConfig(min_list_size=5, max_list_size=40)
    train, thresholds = ranking.make_queries(300, config, seed=1)
    test, same = ranking.make_queries(50, config, seed=3, thresholds=thresholds)
    lengths = train.labels.row_lengths().numpy()
    assert lengths.min() >= 5 and lengths.max() <= 40 and len(set(lengths)) > 10
    labels = train.labels.flat_values.numpy()
    assert set(np.unique(labels)) == {0.0, 1.0, 2.0, 3.0, 4.0}
    share = np.mean(labels[:, None] < np.arange(1, 5), axis=0)
    np.testing.assert_allclose(share, ranking.GRADE_QUANTILES, atol=0.01)
    assert same is thresholds
    # The hidden scorer is the task (same for all splits); the grades follow it.
    rho = np.corrcoef(test.true_scores.flat_values.numpy(), test.labels.flat_values.numpy())
    assert rho[0, 1] > 0.5
    batch = next(iter(ranking.padded_batches(test, 8)))
    assert batch[0].shape[0] == 8 and batch[1].shape[1] == max(test.labels.row_lengths()[:8])
    assert (batch[1].numpy() == -1).sum() == batch[1].shape[1] * 8 - sum(
        test.labels.row_lengths()[:8])


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="losses"):
        ranking.RankingConfig(losses=("mse", "bogus")).finalize()
    with pytest.raises(ValueError, match="min_list_size"):
        ranking.RankingConfig(min_list_size=10, max_list_size=5).finalize()


def test_make_loss_builds_each_loss_of_the_table_with_the_config_temperatures():
    # The binary trains two losses (below); the table entry of every loss is checked
    # here: same value as the library loss built by hand, padding (label -1) ignored.
    config = ranking.RankingConfig(tau=0.7, epsilon=0.05)
    expected = {
        "mse": lambda: ranking.masked_mse,
        "soft_ndcg_sinkhorn": lambda: ss.SoftNDCGLoss(method="sinkhorn", temperature=0.05),
        "soft_ndcg_softsort": lambda: ss.SoftNDCGLoss(method="softsort", temperature=0.7),
        "soft_ndcg_neuralsort": lambda: ss.SoftNDCGLoss(method="neuralsort",
                                                        temperature=0.7),
        "listwise_neuralsort": lambda: ss.ListwisePermutationLoss(method="neuralsort",
                                                                  temperature=0.7),
        "listwise_softsort": lambda: ss.ListwisePermutationLoss(method="softsort",
                                                                temperature=0.7),
        "spearman": lambda: ss.SpearmanLoss(negative_labels_are_padding=True, epsilon=0.05),
    }
    assert set(expected) == set(ranking.LOSSES)
    labels = np.array([[2.0, 0.0, 1.0, 3.0, -1.0], [1.0, 0.0, 2.0, -1.0, -1.0]], np.float32)
    scores = np.array([[0.3, -0.2, 0.9, 0.1, 5.0], [0.4, 0.2, -0.5, -3.0, 7.0]], np.float32)
    moved = scores.copy()
    moved[labels < 0] = np.array([-4.0, 2.0, 0.5], np.float32)
    for name in ranking.LOSSES:
        loss = ranking.make_loss(name, config)
        value = np.asarray(loss(labels, scores))
        assert np.all(np.isfinite(value)), name
        np.testing.assert_allclose(value, np.asarray(expected[name]()(labels, scores)),
                                   rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(np.asarray(loss(labels, moved)), value, rtol=1e-5,
                                   err_msg=name)
    # The temperatures reach the losses (not the library defaults).
    default = ranking.make_loss("soft_ndcg_softsort", ranking.RankingConfig())
    assert abs(float(default(labels, scores)) - float(
        ranking.make_loss("soft_ndcg_softsort", config)(labels, scores))) > 1e-6


@pytest.fixture(scope="module")
def binary(run_binaries, tmp_path_factory):
    """The binary at a tiny budget: one loss (mse) interrupted after its first epoch, then
    both losses (the interrupted one resumes, the other trains from scratch). Each loss is
    one lookup of `make_loss` (every entry: test_make_loss_builds_each_loss_...); the
    library's tests train each of them in Keras on padded lists of two lengths
    (tests/ops/test_ranking.py::test_keras_model_fed_two_list_lengths).
    Returns (interrupted run, finished run, output folder)."""
    tmp = tmp_path_factory.mktemp("ranking")
    out = str(tmp / "ranking")
    args = [f"--output_dir={out}", "--epochs=2", "--steps_per_epoch=3",
            "--num_train_queries=24", "--num_val_queries=8", "--num_test_queries=16",
            "--max_list_size=20", "--batch_size=8", "--verbose=0"]
    losses = "--losses=mse,soft_ndcg_softsort"
    # The interrupted loss is the cheap one to trace (mse): the resume is the driver's,
    # the same for every loss.
    cases = [["train_ranking.py", *args, "--losses=mse", "--stop_after_epochs=1"],
             ["train_ranking.py", *args, losses]]
    interrupted, finished = run_binaries([{"argv": argv, "timeout": 900} for argv in cases])
    return interrupted, finished, tmp


@pytest.mark.slow
def test_train_ranking_binary_tiny_budget_writes_the_table(binary):
    interrupted, proc, tmp = binary
    out = str(tmp / "ranking")
    assert interrupted.returncode == 0, interrupted.stderr[-3000:]
    assert "Interrupted before the end" in interrupted.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The interrupted loss resumes after its first epoch; the others start afresh.
    assert proc.stdout.count("Resuming after epoch 1") == 1, proc.stdout
    with open(os.path.join(out, "results.csv")) as f:
        rows = {r["loss"]: r for r in csv.DictReader(f)}
    assert list(rows) == ["mse", "soft_ndcg_softsort", "(hidden_scorer)", "(random_order)"]
    for name in ("mse", "soft_ndcg_softsort"):
        assert 0.0 <= float(rows[name]["test_ndcg_at_10"]) <= 1.0
        assert rows[name]["epochs"] == "2"
    assert float(rows["(hidden_scorer)"]["test_ndcg_at_10"]) > float(
        rows["(random_order)"]["test_ndcg_at_10"])
    for name in ("mse", "soft_ndcg_softsort"):
        with open(os.path.join(out, name, "results.json")) as f:
            result = json.load(f)
        assert result["finished"] and len(result["val_ndcg_at_10_curve"]) == 2

"""The top-k classification experiment (`softsort_tf.experiments.topk`) and its binary
`scripts/train_topk.py`."""

import csv
import json
import os

import keras
import numpy as np
import pytest

from softsort_tf.experiments import topk


def test_instance_quantile_normalization_keeps_the_order_of_each_example():
    x = np.random.default_rng(6).normal(size=(3, 4, 4, 2)).astype(np.float32)
    layer = topk.InstanceQuantileNormalization(num_targets=16)
    out = layer(x).numpy()
    assert out.shape == x.shape
    for a, b in zip(x.reshape(3, -1), out.reshape(3, -1), strict=True):
        order = np.argsort(a)
        assert np.all(np.diff(b[order]) >= -1e-5)  # monotone in the input
        assert b.min() >= 0.0 and b.max() <= 1.0 + 1e-5  # initial targets in (0, 1]


def test_top_k_cnn_survives_saving(tmp_path):
    model = topk.build_cnn((8, 8, 1), 10, quantile_norm=True, num_targets=4)
    x = np.random.default_rng(7).random((3, 8, 8, 1)).astype(np.float32)
    path = str(tmp_path / "cnn.keras")
    model.save(path)
    np.testing.assert_allclose(keras.models.load_model(path)(x), model(x), rtol=1e-5,
                               atol=1e-6)


def test_write_curves_averages_the_seeds_of_each_variant(tmp_path):
    # Mean and (population) standard deviation over the seeds of each epoch, curves cut
    # to the shortest run's; runs without a curve are left out; the finals' summary.
    runs = {"a": [{"test_accuracy_curve": [0.1, 0.5, 0.9], "final_test_accuracy": 0.9},
                  {"test_accuracy_curve": [0.3, 0.7], "final_test_accuracy": 0.7},
                  {"test_accuracy_curve": []}],
            "b": [{"test_accuracy_curve": [0.2, 0.4], "final_test_accuracy": 0.4}],
            "c": [{"test_accuracy_curve": []}]}
    summary = topk.write_curves(str(tmp_path), runs)
    with open(tmp_path / "curves.csv") as f:
        rows = [(r["variant"], int(r["epoch"]), float(r["test_accuracy_mean"]),
                 float(r["test_accuracy_std"]), int(r["runs"])) for r in csv.DictReader(f)]
    expected = [("a", 1, 0.2, 0.1, 2), ("a", 2, 0.6, 0.1, 2),
                ("b", 1, 0.2, 0.0, 1), ("b", 2, 0.4, 0.0, 1)]
    assert [r[0:2] + (r[4],) for r in rows] == [e[0:2] + (e[4],) for e in expected]
    np.testing.assert_allclose([r[2:4] for r in rows], [e[2:4] for e in expected], atol=1e-12)
    assert set(summary) == {"a", "b"} and summary["a"]["runs"] == 2
    assert summary["a"]["epochs"] == 2
    assert summary["a"]["final_test_accuracy_mean"] == pytest.approx(0.8)
    assert summary["a"]["final_test_accuracy_std"] == pytest.approx(0.1)
    assert os.path.getsize(tmp_path / "curves.png") > 1000


@pytest.mark.slow
def test_train_topk_binary_writes_curves(tmp_path, run_binaries):
    out = str(tmp_path / "topk")
    (proc,) = run_binaries([{"argv": [
        # 8 images per split in one batch of 8 (one step per epoch): every step and
        # evaluation runs Sinkhorn over all the activations of each image, so the images
        # are most of the run's compute (no assertion depends on their number).
        # One seed: averaging over seeds is write_curves' (test_write_curves_averages_...).
        "train_topk.py", f"--output_dir={out}", "--epochs=2", "--num_seeds=1",
        "--limit_per_split=8", "--batch_size=8", "--quantile_norm_layers",
        "--losses=soft_topk", "--verbose=0"],
        "timeout": 600}])
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(out, "curves.csv")) as f:
        rows = list(csv.DictReader(f))
    assert {r["variant"] for r in rows} == {"soft_topk", "cross_entropy_qn"}
    assert all(r["runs"] == "1" for r in rows) and len(rows) == 4
    assert sorted(os.listdir(os.path.join(out, "soft_topk"))) == ["seed0"]
    assert os.path.getsize(os.path.join(out, "curves.png")) > 1000
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    assert results["finished"] and results["num_train"] == 8
    assert results["flags"]["batch_size"] == 8

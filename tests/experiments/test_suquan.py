"""Tests of the SUQUAN / Kendall-kernel benchmark (`softsort_tf.experiments.suquan`) and
its binary `scripts/train_suquan.py`.

The data are a tiny synthetic stand-in in MNIST's npz format (6×6 uint8 images, many
tied zero pixels), written by a fixture: the tests never read ../shared/data.
"""

import json
import os

import numpy as np
import pytest
import scipy.stats

import softsort_tf as ss
from softsort_tf.experiments import suquan


def _images(rng, labels, side=6):
    """A bright pixel pattern per class on a mostly zero background, with noise."""
    x = np.zeros((len(labels), side * side))
    for i, c in enumerate(labels):
        x[i, (3 * c + np.arange(4)) % (side * side)] = 200 + 50 * rng.random(4)
        noisy = rng.choice(side * side, 6, replace=False)
        x[i, noisy] = rng.integers(0, 120, 6)
    return x.reshape(-1, side, side).astype(np.uint8)


@pytest.fixture(scope="module")
def npz_path(tmp_path_factory):
    rng = np.random.default_rng(0)
    y_train = rng.permutation(np.repeat(np.arange(10), 40))  # 100 held out for validation
    y_test = np.repeat(np.arange(10), 12)
    path = str(tmp_path_factory.mktemp("suquan") / "tiny_mnist.npz")
    np.savez(path, x_train=_images(rng, y_train), y_train=y_train.astype(np.uint8),
             x_test=_images(rng, y_test), y_test=y_test.astype(np.uint8))
    return path


def _config(npz_path, output_dir, **kwargs):
    defaults = dict(output_dir=str(output_dir), mnist_npz=npz_path, validation_size=100,
                    pairs=((0, 1), (2, 3)), train_size=40, val_size=20, steps=20,
                    eval_every=10, l2_grid=(1e-4, 1e-2), kernel_sizes=(10, 20),
                    kernel_test_per_class=6, kernel_block=50, cv_folds=2, verbose=0,
                    jit_compile=False)
    return suquan.SuquanConfig(**{**defaults, **kwargs})


def _mid_tie_reference(x, f):
    """float64 reference of Ψ_f with m = p: a tie block at ranks [lo, hi) takes the
    mean of f over those ranks."""
    out = np.empty_like(x, dtype=np.float64)
    for r, row in enumerate(x):
        for i, v in enumerate(row):
            lo, hi = np.sum(row < v), np.sum(row <= v)
            out[r, i] = np.mean(np.sort(f)[lo:hi])
    return out


def test_rank_intervals_give_scipy_mid_ranks():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 4, size=(5, 9)).astype(np.float32)
    lo, hi = suquan.rank_intervals(x)
    np.testing.assert_array_equal((lo + hi + 1) / 2, scipy.stats.rankdata(x, axis=1))
    np.testing.assert_array_equal(hi - lo, [[np.sum(row == v) for v in row] for row in x])


def test_quantile_normalize_matches_reference_with_ties():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 3, size=(4, 7)).astype(np.float32)
    x[0] = rng.normal(size=7)  # one row without ties: f at the ranks
    f = np.sort(rng.normal(size=7))
    out = suquan.quantile_normalize(x, f)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, _mid_tie_reference(x, f), atol=1e-6)
    np.testing.assert_allclose(out[0], f[scipy.stats.rankdata(x[0]).astype(int) - 1],
                               atol=1e-6)


def test_quantile_normalize_is_the_hard_limit_of_the_sinkhorn_layer():
    """Ψ_f equals `sinkhorn_quantile_normalization` at small ε (m = p and m < p, ties)."""
    x = np.array([[0.0, 0.0, 0.7, 0.2, 0.0, 0.9, 0.4, 0.0],
                  [0.5, 0.1, 0.3, 0.3, 0.8, 0.0, 0.6, 0.2]], np.float32)
    for f in (np.linspace(-1.0, 2.0, 8) ** 3, np.array([0.0, 1.0, 3.0, 7.0])):
        soft = ss.sinkhorn_quantile_normalization(x, f.astype(np.float32), epsilon=3e-4,
                                                  max_iterations=20000, threshold=1e-5)
        assert np.all(np.isfinite(soft.numpy()))
        np.testing.assert_allclose(suquan.quantile_normalize(x, f), soft.numpy(), atol=1e-4)


def test_quantile_functions_and_fixed_targets():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 12))
    np.testing.assert_allclose(suquan.quantile_functions(x, 12), np.sort(x, axis=1), atol=1e-6)
    np.testing.assert_allclose(suquan.quantile_functions(x, 4),
                               np.sort(x, axis=1).reshape(6, 4, 3).mean(-1), atol=1e-6)
    # m not dividing p: level means weighted by the covered mass, still averaging to x.
    np.testing.assert_allclose(suquan.quantile_functions(x, 5).mean(1), x.mean(1), atol=1e-6)
    # A row normalised onto its own quantile function is unchanged, ties included.
    x[0, :4] = 0.0
    own = suquan.quantile_functions(x[:1], 12)[0]
    np.testing.assert_allclose(suquan.quantile_normalize(x[:1], own), x[:1], atol=1e-6)
    np.testing.assert_allclose(suquan.fixed_quantile_function("uniform", 4),
                               [0.125, 0.375, 0.625, 0.875])
    np.testing.assert_allclose(suquan.fixed_quantile_function("gaussian", 4),
                               scipy.stats.norm.ppf([0.125, 0.375, 0.625, 0.875]), rtol=1e-6)
    np.testing.assert_allclose(suquan.fixed_quantile_function("median", 12, x),
                               np.median(np.sort(x, axis=1), axis=0), atol=1e-6)
    with pytest.raises(ValueError, match="normalization"):
        suquan.fixed_quantile_function("beta", 4)


def test_suquan_starts_at_the_median_normalisation():
    """SUQUAN's f (the library layer's trainable targets) starts at the median f, so
    its first features are the median-normalised pixels."""
    rng = np.random.default_rng(4)
    x = np.where(rng.random((30, 16)) < 0.6, 0.0, rng.random((30, 16))).astype(np.float32)
    f_median = suquan.fixed_quantile_function("median", 16, x)
    assert np.all(f_median[:8] == 0.0) and f_median[-1] > 0.8  # flat run of zeros: tied steps
    f_median = f_median / f_median[-1]
    (layer,) = suquan.suquan_targets(f_median)
    assert isinstance(layer, ss.SinkhornQuantileNormalization)
    f0 = layer.target_values().numpy()
    assert np.all(np.diff(f0) > 0)
    np.testing.assert_allclose(f0, f_median, atol=1e-3)
    np.testing.assert_allclose(suquan.quantile_normalize(x, f0),
                               suquan.quantile_normalize(x, f_median), atol=1e-3)


def test_training_fixed_and_learned_targets():
    rng = np.random.default_rng(5)
    x = np.where(rng.random((80, 16)) < 0.5, 0.0, rng.random((80, 16))).astype(np.float32)
    y = (x[:, :8].sum(1) > x[:, 8:].sum(1)).astype(np.float32)
    tr, va = slice(0, 60), slice(60, 80)
    f = suquan.fixed_quantile_function("median", 16, x[tr])
    kwargs = dict(l2_grid=(1e-4, 1e-1), steps=60, eval_every=20, learning_rate=0.05)
    feats = suquan.quantile_normalize(x, f)
    fixed = suquan.train_linear_models(feats[tr], y[tr], feats[va], y[va], **kwargs)
    assert fixed["f"] is None and fixed["l2"] in (1e-4, 1e-1) and fixed["step"] in (20, 40, 60)
    scores = fixed["predict"](feats[va])
    assert np.all(np.isfinite(scores))
    assert fixed["val_accuracy"] == pytest.approx(np.mean((scores > 0) == (y[va] > 0.5)))
    interp = {name: suquan.QuantileNormalizer(x[part], 16)
              for name, part in (("tr", tr), ("va", va))}
    layers = suquan.suquan_targets(f, 2)
    start = layers[0].target_values().numpy()
    learned = suquan.train_linear_models(interp["tr"], y[tr], interp["va"], y[va],
                                         targets=layers, **kwargs)
    # The learned f moved, stayed increasing and in (0, 1].
    assert learned["f"].shape == (16,) and np.all(np.isfinite(learned["f"]))
    assert np.all(np.diff(learned["f"]) > 0) and 0 < learned["f"][0]
    assert learned["f"][-1] <= 1 + 1e-6
    assert np.max(np.abs(learned["f"] - start)) > 1e-3
    scores = learned["predict"](interp["va"])
    assert learned["val_accuracy"] == pytest.approx(np.mean((scores > 0) == (y[va] > 0.5)))


def test_config_errors_name_the_field(npz_path, tmp_path):
    for kwargs, field in (({"pairs": ((3, 3),)}, "pairs"),
                          ({"normalizations": ("svd",)}, "normalizations"),
                          ({"train_size": 0}, "train_size"), ({"kernel_sizes": (7,)},
                                                              "kernel_sizes"),
                          ({"l2_grid": ()}, "l2_grid"), ({"dataset": "svhn"}, "dataset")):
        with pytest.raises(ValueError, match=field):
            _config(npz_path, tmp_path / "x", **kwargs).finalize()
    with pytest.raises(ValueError, match="mnist_npz"):
        suquan.run(_config(str(tmp_path / "missing.npz"), tmp_path / "y"))
    assert not os.path.exists(tmp_path / "y")


def test_run_resumes_and_writes_results(npz_path, tmp_path):
    out = tmp_path / "run"
    first = suquan.run(_config(npz_path, out, stop_after_pairs=1))
    assert not first["complete"] and list(first["pairs"]) == ["0_1"]
    assert first["kernel_pairs"] == {}
    stamp = os.path.getmtime(out / "pairs" / "0_1.json")
    results = suquan.run(_config(npz_path, out))
    assert os.path.getmtime(out / "pairs" / "0_1.json") == stamp  # not run again
    assert results["complete"] and sorted(results["pairs"]) == ["0_1", "2_3"]
    assert results["wall_seconds"] >= first["wall_seconds"]
    with open(out / "results.json") as f:
        assert json.load(f)["summary"] == results["summary"]
    tables = suquan.format_tables(results)
    assert tables.count("\n| SUQUAN (learned f) | ") == 1 and "| 20 | " in tables
    assert tables.index("| raw pixels |") < tables.index("| uniform QN |")
    for normalization in suquan.NORMALIZATIONS:
        for key in ("test_accuracy", "test_auc"):
            cell = results["summary"]["linear"][normalization][key]
            assert cell["count"] == 2 and 0.0 <= cell["mean"] <= 1.0
    pair = results["pairs"]["2_3"]
    assert pair["num_train"] == 40 and pair["num_test"] == 24 and pair["num_levels"] == 36
    assert pair["normalizations"]["raw"]["f"] is None
    assert len(pair["normalizations"]["suquan"]["f"]) == 36
    for size in ("10", "20"):
        for method in suquan.KERNEL_METHODS:
            cell = results["summary"]["kernel"][f"{method}@{size}"]["test_accuracy"]
            assert cell["count"] == 2 and 0.0 <= cell["mean"] <= 1.0
    assert results["kernel_pairs"]["0_1"]["num_test"] == 12
    # The Gram blocks are the library's Kendall τ-b, which is scipy's.
    block = np.load(out / "kernel" / "gram" / "train" / "block_0_0.npy")
    assert np.all(np.isfinite(block)) and np.allclose(np.diag(block), 1.0, atol=1e-6)
    np.testing.assert_allclose(block, block.T, atol=1e-6)
    blocks = sorted(os.listdir(out / "kernel" / "gram" / "train"))
    assert blocks == ["block_0_0.npy", "block_0_50.npy", "block_50_50.npy"]  # upper blocks


def test_kernel_gram_is_scipy_kendall_tau_b(npz_path, tmp_path):
    config = _config(npz_path, tmp_path / "g").finalize()
    x = suquan.load_images(config).x_train[:5]
    gram = suquan.gram_blocks(x, x, str(tmp_path / "g" / "blocks"), 2, True)
    ref = [[scipy.stats.kendalltau(a, b)[0] for b in x] for a in x]
    np.testing.assert_allclose(gram, ref, atol=1e-6)


@pytest.mark.slow
def test_binary_end_to_end(npz_path, tmp_path, run_binaries):
    out = tmp_path / "bin"
    argv = ["train_suquan.py", f"--output_dir={out}", f"--mnist_npz={npz_path}",
            "--validation_size=100", "--pairs=0-1,2-3", "--train_size=40", "--val_size=20",
            "--steps=10", "--eval_every=5", "--l2_grid=0.001", "--kernel_sizes=10",
            "--kernel_block=20", "--kernel_test_per_class=4", "--cv_folds=2", "--verbose=0",
            "--nojit_compile",
            # Two of the five normalisations (each traces its own training step): the
            # fixed features and the learned f. All five: test_run_resumes_and_writes_results.
            "--normalizations=raw,suquan"]
    (first,) = run_binaries([{"argv": [*argv, "--stop_after_pairs=1"], "timeout": 300}])
    assert first.returncode == 0, first.stderr[-3000:]
    with open(out / "results.json") as f:  # after the first session
        assert list(json.load(f)["pairs"]) == ["0_1"]
    (second,) = run_binaries([{"argv": argv, "timeout": 300}])
    assert second.returncode == 0, second.stderr[-3000:]
    with open(out / "results.json") as f:
        results = json.load(f)
    assert results["complete"] and results["config"]["l2_grid"] == [0.001]
    assert results["config"]["normalizations"] == ["raw", "suquan"]
    assert sorted(results["pairs"]["2_3"]["normalizations"]) == ["raw", "suquan"]
    assert results["summary"]["kernel"]["kendall_svm@10"]["test_accuracy"]["count"] == 2


def test_colour_images_become_grey_levels(tmp_path):
    """Colour images (CIFAR-10's format) are read as 0.299 R + 0.587 G + 0.114 B."""
    rng = np.random.default_rng(6)
    x = rng.integers(0, 256, size=(30, 4, 4, 3)).astype(np.uint8)
    y = np.arange(30) % 10
    path = str(tmp_path / "colour.npz")
    np.savez(path, x_train=x[:20], y_train=y[:20], x_test=x[20:], y_test=y[20:])
    config = suquan.SuquanConfig(mnist_npz=path, validation_size=5).finalize()
    data = suquan.load_images(config)
    assert data.x_train.shape == (15, 16) and data.x_val.shape == (5, 16)
    assert data.x_test.shape == (10, 16)
    grey = (x[:15].astype(np.float64) / 255) @ [0.299, 0.587, 0.114]
    np.testing.assert_allclose(data.x_train, grey.reshape(15, 16), atol=1e-6)
    np.testing.assert_array_equal(data.y_train, y[:15])

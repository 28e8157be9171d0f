"""The quantile-regression experiment (`softsort_tf.experiments.quantile_regression`)
and its binary `scripts/train_quantile_regression.py`.

The CQR data files are stand-ins in the same formats (fixture `cqr_dir`).
"""

import glob
import json
import os

import numpy as np
import pytest

import softsort_tf as ss
from softsort_tf.experiments import quantile_regression


@pytest.mark.parametrize("quantile", [0.1, 0.5])
def test_quantile_regressor_starts_as_the_constant_training_quantile(quantile):
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(40, 6)).astype(np.float32), rng.gamma(2.0, size=300)
    config = quantile_regression.QuantileRegressionConfig(loss="pinball", quantile=quantile,
                                                          jit_compile=False)
    pred = np.asarray(quantile_regression.build_model(6, config, y)(x))
    np.testing.assert_allclose(pred, np.quantile(y, quantile), rtol=1e-6)
    config.output_init = "glorot"  # Keras' default: the output depends on the input
    assert np.std(np.asarray(quantile_regression.build_model(6, config, y)(x))) > 1e-2
    config.output_init = "zeros"
    with pytest.raises(ValueError, match="output_init"):
        config.finalize()


def test_quantile_regression_config_uses_the_library_losses_and_checks_them():
    config = quantile_regression.QuantileRegressionConfig(quantile=0.2, width=0.05,
                                                          epsilon=0.03, squash="atan",
                                                          targets="centres")
    loss = quantile_regression.make_loss(config.finalize())
    assert isinstance(loss, ss.SoftQuantileRegressionLoss)
    settings = loss.get_config()
    assert {key: settings[key] for key in ("quantile", "width", "epsilon", "squash", "targets")
            } == dict(quantile=0.2, width=0.05, epsilon=0.03, squash="atan", targets="centres")
    pinball = quantile_regression.make_loss(config, "pinball")
    assert isinstance(pinball, ss.PinballLoss) and pinball.quantile == 0.2
    for field, value in (("quantile", 1.0), ("width", 0.5), ("squash", "tanh"),
                         ("epsilon", 0.0)):
        bad = quantile_regression.QuantileRegressionConfig(**{field: value})
        with pytest.raises(ValueError, match=field):
            bad.finalize()


@pytest.fixture(scope="module")
def binary(run_binaries, cqr_dir, tmp_path_factory):
    """The binary on the stand-in concrete data, interrupted after its first epoch, then
    resumed (without XLA: the XLA-compiled steps run in the grid's runs,
    `test_quantile_grid.py`); and on the synthetic default data under a mirrored
    strategy on two logical CPUs. Returns ({name: run}, folder).

    One loss per run, both losses trained by the binaries: the pinball loss here (resuming
    does not depend on the loss, and the S-quantile's Sinkhorn graph was most of these
    runs' tracing), the S-quantile in the mirrored run (the binary's default loss) and
    XLA-compiled in the grid's run."""
    tmp = tmp_path_factory.mktemp("quantile_regression")
    args = ["train_quantile_regression.py", "--dataset=concrete", f"--data_dir={cqr_dir[0]}",
            "--quantile=0.2", "--loss=pinball", "--epochs=3", "--steps_per_epoch=5",
            "--patience=1", f"--output_dir={tmp / 'qr'}", "--verbose=0", "--nojit_compile"]
    cases = {
        "interrupted": [*args, "--stop_after_epochs=1"],
        "interrupted results": None,
        "resumed": args,
        # Two logical CPUs: the S-quantile loss is a statistic of each replica's batch.
        "mirrored": ["train_quantile_regression.py", f"--output_dir={tmp / 'qr_mirrored'}",
                     "--epochs=1", "--steps_per_epoch=3", "--strategy=mirrored",
                     "--num_cpu_devices=2", "--verbose=0"],
    }
    results_json = str(tmp / "qr" / "results.json")
    cases["interrupted results"] = {
        "code": f"import os; print(os.path.exists({results_json!r}))"}
    cases = {name: case if isinstance(case, dict) else {"argv": case}
             for name, case in cases.items()}
    return run_binaries(cases, check=True), tmp


@pytest.mark.slow
def test_train_quantile_regression_binary_resumes_and_writes_results(binary):
    procs, tmp = binary
    out = str(tmp / "qr")
    assert procs["interrupted results"].stdout.strip() == "False"  # no results.json yet
    assert "Resuming after epoch 1" in procs["resumed"].stdout
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    assert res["finished"] and res["epochs_completed"] >= 1
    assert res["flags"]["loss"] == "pinball"
    assert len(res["history"]["val_pinball"]) == res["epochs_completed"]
    assert np.isfinite(res["metrics"]["test_pinball"]) and res["num_test"] == 30
    assert glob.glob(os.path.join(out, "tensorboard", "train", "events.out*"))


@pytest.mark.slow
def test_train_quantile_regression_offline_default_under_mirrored_strategy(binary):
    with open(os.path.join(binary[1], "qr_mirrored", "results.json")) as f:
        res = json.load(f)
    assert res["flags"]["dataset"] == "synthetic" and res["flags"]["strategy"] == "mirrored"
    assert res["flags"]["loss"] == "squantile"  # the default loss, statistic of each replica
    assert "/device:CPU:1" in " ".join(res["machine"]["devices"])
    assert np.isfinite(res["metrics"]["test_pinball"])

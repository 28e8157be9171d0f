"""Runs the differentiable-kNN grid of the SoftSort paper (§5.4) and writes its table.

k ∈ {1, 3, 5, 9} × {SoftSort, NeuralSort} × {deterministic, stochastic}, one run each
(`scripts/train_knn.py`'s `softsort_tf.experiments.knn.run`, same budget for every cell),
in `<runs_dir>/<method>_<variant>_k<k>/`. Resumable: a finished run (results.json) is
skipped, an interrupted one resumes from its last epoch. After every run
`<runs_dir>/table.md` gets the test accuracy of plain kNN on the learned embeddings per
cell, and per row the k chosen on the validation episodes (never on the test set).

    python scripts/run_knn_grid.py --runs_dir=runs/knn_grid \
        --mnist_npz=../shared/data/mnist.npz --epochs=2 --steps_per_epoch=200
"""

import json
import os

import keras
from absl import flags

from softsort_tf.datasets import images
from softsort_tf.experiments import flags as experiment_flags
from softsort_tf.experiments import knn

_D = knn.KnnConfig()
VARIANTS = ("deterministic", "stochastic")
_RUNS_DIR = flags.DEFINE_string("runs_dir", "runs/knn_grid", "Folder of the runs.")
_DATASET = flags.DEFINE_enum("dataset", _D.dataset, images.SOURCES, "Images (see train_knn).")
_MNIST_NPZ = flags.DEFINE_string("mnist_npz", None, "MNIST-format npz (implies 'npz').")
_KS = flags.DEFINE_list("ks", ["1", "3", "5", "9"], "Neighbours k.")
_METHODS = flags.DEFINE_list("methods", list(knn.KNN_METHODS), "Relaxed sorts.")
_VARIANTS = flags.DEFINE_list("variants", ["deterministic", "stochastic"],
                              "deterministic and/or stochastic (Gumbel-perturbed scores).")
_EPOCHS = flags.DEFINE_integer("epochs", 2, "Epochs per run.", lower_bound=1)
_STEPS = flags.DEFINE_integer("steps_per_epoch", 200, "Steps per epoch.", lower_bound=1)
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", _D.num_samples,
                                    "Gumbel samples per episode (stochastic runs).",
                                    lower_bound=1)
_TAU = flags.DEFINE_float("temperature", _D.tau, "Temperature τ of the relaxed sort.",
                          lower_bound=0.0)
_SEED = flags.DEFINE_integer("seed", _D.seed, "Seed of every run.")
_LIMIT = flags.DEFINE_integer("limit_per_split", None, "Keep only this many images per split.")
_JIT = flags.DEFINE_bool("jit_compile", _D.jit_compile, "XLA-compile the runs' training and "
                         "evaluation steps (see train_knn).")
_SUMMARIZE_ONLY = flags.DEFINE_bool("summarize_only", False,
                                    "Only write the table from the finished runs.")
flags.register_validator("variants", lambda v: bool(v) and set(v) <= set(VARIANTS),
                         f"--variants: a non-empty list among {VARIANTS}.")
flags.register_validator("methods", lambda v: bool(v) and set(v) <= set(knn.KNN_METHODS),
                         f"--methods: a non-empty list among {knn.KNN_METHODS}.")
flags.register_validator("ks", lambda v: bool(v) and all(k.isdigit() and int(k) >= 1
                                                         for k in v),
                         "--ks: a non-empty list of positive ints.")


def _cells():
    for method in _METHODS.value:
        for variant in _VARIANTS.value:
            for k in _KS.value:
                yield method, variant, int(k)


def _run_dir(method: str, variant: str, k: int) -> str:
    return os.path.join(_RUNS_DIR.value, f"{method}_{variant}_k{k}")


def _table() -> str:
    """Markdown: rows method × variant, columns k; validation-selected k per row."""
    ks = [int(k) for k in _KS.value]
    lines = ["| method | " + " | ".join(f"k = {k}" for k in ks) + " | k chosen on validation |",
             "|---|" + "---|" * (len(ks) + 1)]
    for method in _METHODS.value:
        for variant in _VARIANTS.value:
            cells, chosen = [], None
            for k in ks:
                path = os.path.join(_run_dir(method, variant, k), "results.json")
                if not os.path.exists(path):
                    cells.append("pending")
                    continue
                with open(path) as f:
                    res = json.load(f)
                best = res["best_epoch"]
                val_acc = res["history"]["val_accuracy"][best - 1]
                acc = res["metrics"]["test_knn_accuracy"]
                cells.append(f"{100 * acc:.2f} % (val {100 * val_acc:.1f} %, "
                             f"{res['train_seconds_all_sessions']:.0f} s)")
                if chosen is None or val_acc > chosen[0]:
                    chosen = (val_acc, k, acc)
            pick = f"k = {chosen[1]}: {100 * chosen[2]:.2f} %" if chosen else "pending"
            lines.append(f"| {method} ({variant}) | " + " | ".join(cells) + f" | {pick} |")
    return "\n".join(lines) + "\n"


def main(argv):
    del argv
    for method, variant, k in _cells():
        out = _run_dir(method, variant, k)
        if not (_SUMMARIZE_ONLY.value or os.path.exists(os.path.join(out, "results.json"))):
            keras.backend.clear_session()
            knn.run(knn.KnnConfig(
                output_dir=out, dataset=_DATASET.value, mnist_npz=_MNIST_NPZ.value,
                method=method, stochastic=variant == "stochastic",
                num_samples=_NUM_SAMPLES.value, k=k, tau=_TAU.value, epochs=_EPOCHS.value,
                steps_per_epoch=_STEPS.value, seed=_SEED.value,
                limit_per_split=_LIMIT.value, jit_compile=_JIT.value, verbose=0))
        os.makedirs(_RUNS_DIR.value, exist_ok=True)
        with open(os.path.join(_RUNS_DIR.value, "table.md"), "w") as f:
            f.write(_table())
    print(_table())


if __name__ == "__main__":
    experiment_flags.run_binary(main)

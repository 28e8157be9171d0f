"""Runs the quantile-regression grid of Cuturi et al. (2019), Table 1, and writes the table.

5 data sets × τ ∈ {0.1, 0.2, 0.5} × {pinball, squantile} × 12 seeds, each run in
`<runs_dir>/<dataset>/quantile<τ>/<loss>/seed<k>/` (its own `results.json`, checkpoints
and TensorBoard logs; see `softsort_tf.experiments.quantile_regression`). Resumable: a
finished run (results.json present) is skipped, an interrupted one resumes from its
last checkpoint. Runs go seed by seed, so a partial grid already covers every cell.

After every run the table (mean ± standard error over the finished seeds of the
held-out pinball loss, beside the paper's numbers) is written to
`<runs_dir>/table.md`; when the grid is complete, or with `--summarize_only`, it also
replaces the quantile-regression table of docs/RESULTS.md (between its markers).

    nice -n 19 python scripts/run_quantile_regression_grid.py \
        --data_dir=../shared/data/cqr --runs_dir=runs/quantile_regression

Ablations override one setting of every run (`--epsilon`, `--width`, `--squash`,
`--targets`, `--output_init`) in their own runs folder; they never replace the table of
docs/RESULTS.md unless `--results_md` is given:

    python scripts/run_quantile_regression_grid.py --data_dir=../shared/data/cqr \
        --runs_dir=runs/qr_ablation/eps0.1 --epsilon=0.1 --datasets=bio,star,concrete \
        --quantiles=0.1 --losses=squantile --seeds=3
"""

import os

from absl import app, flags

from softsort_tf.experiments import quantile_grid

_DATA_DIR = flags.DEFINE_string("data_dir", None,
                                "Folder of the data files (softsort_tf.datasets.cqr).")
_RUNS_DIR = flags.DEFINE_string("runs_dir", "runs/quantile_regression", "Folder of the runs.")
_SEEDS = flags.DEFINE_integer("seeds", quantile_grid.NUM_SEEDS, "Seeds per cell.",
                              lower_bound=1)
_DATASETS = flags.DEFINE_list("datasets", list(quantile_grid.DATASETS), "Data sets.")
_QUANTILES = flags.DEFINE_list("quantiles", [str(q) for q in quantile_grid.QUANTILES],
                               "Quantile levels.")
_LOSSES_FLAG = flags.DEFINE_list("losses", list(quantile_grid.LOSSES), "Training losses.")
_EPOCHS = flags.DEFINE_integer("epochs", None, "Override the runs' epochs (tests, quick "
                               "looks); default that of train_quantile_regression.")
_STEPS = flags.DEFINE_integer("steps_per_epoch", None, "Override the runs' steps per epoch.")
_OUTPUT_INIT = flags.DEFINE_enum("output_init", None, ["quantile", "glorot"],
                                 "Override the runs' output initialisation (ablation).")
_EPSILON = flags.DEFINE_float("epsilon", None, "Override the S-quantile's ε (ablation).",
                              lower_bound=0.0)
_WIDTH = flags.DEFINE_float("width", None, "Override the middle bin's mass t (ablation).",
                            lower_bound=0.0)
_SQUASH = flags.DEFINE_enum("squash", None, ["logistic", "atan", "robust"],
                            "Override the S-quantile's squashing (ablation).")
_TARGETS = flags.DEFINE_enum("targets", None, ["regular", "centres"],
                             "Override the S-quantile's target grid (ablation).")
_SUMMARIZE_ONLY = flags.DEFINE_bool("summarize_only", False,
                                    "Only write the tables from the finished runs.")
_RESULTS_MD = flags.DEFINE_string(
    "results_md", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "docs", "RESULTS.md"),
    "Markdown file whose quantile-regression table is replaced ('' : none; with an "
    "override flag (an ablation) only when given explicitly).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    overrides = {name: flag.value for name, flag in (
        ("epochs", _EPOCHS), ("steps_per_epoch", _STEPS), ("output_init", _OUTPUT_INIT),
        ("epsilon", _EPSILON), ("width", _WIDTH), ("squash", _SQUASH),
        ("targets", _TARGETS)) if flag.value is not None}
    grid = quantile_grid.Grid(runs_dir=_RUNS_DIR.value, data_dir=_DATA_DIR.value,
                              datasets=tuple(_DATASETS.value),
                              quantiles=tuple(float(q) for q in _QUANTILES.value),
                              losses=tuple(_LOSSES_FLAG.value), seeds=_SEEDS.value,
                              overrides=overrides)
    # An ablation (any override) never replaces the main table unless asked to.
    results_md = _RESULTS_MD.value or None
    if overrides and not flags.FLAGS["results_md"].present:
        results_md = None
    if not _SUMMARIZE_ONLY.value:
        grid.run()
    grid.write_tables(results_md, force=_SUMMARIZE_ONLY.value)


if __name__ == "__main__":
    flags.mark_flag_as_required("data_dir")
    app.run(main)

"""The quantile-regression grid (`softsort_tf.experiments.quantile_grid`) and its binary
`scripts/run_quantile_regression_grid.py`: the table, the grid's child processes, and
skipping finished runs.

The CQR data files are stand-ins in the same formats (fixture `cqr_dir`).
"""

import glob
import itertools
import json
import os
import threading

import pytest

from softsort_tf.experiments import quantile_grid


def test_grid_table_and_results_md_section(tmp_path, cqr_dir):
    results = {("concrete", 0.1, "pinball"): [
        {"metrics": {"test_pinball": v, "constant_test_pinball": 0.07}} for v in (0.1, 0.2)]}
    table = quantile_grid.format_table(results, datasets=("concrete",), quantiles=(0.1,),
                                       seeds=2, constants={("concrete", 0.1): (0.07, 0.2)})
    assert "0.1500 ± 0.0500 (0.105)" in table  # mean ± std/√2, the paper's value
    assert "pending (0.482)" in table and "| 0.1, constant τ-quantile | 0.0700 |" in table
    for r in results["concrete", 0.1, "pinball"]:
        r["f"] = 2.0
    table = quantile_grid.format_table(results, datasets=("concrete",), quantiles=(0.1,),
                                       seeds=2, factor_key="f",
                                       constants={("concrete", 0.1): (0.07, 0.2)})
    assert "0.3000 ± 0.1000 (0.105)" in table and "constant τ-quantile | 0.2000 |" in table
    md = tmp_path / "R.md"
    md.write_text(f"a\n{quantile_grid.BEGIN_MARKER}\nold\n{quantile_grid.END_MARKER}\nb\n")
    grid = quantile_grid.Grid(str(tmp_path / "runs"), cqr_dir[0], datasets=("concrete",),
                              quantiles=(0.1,), seeds=1)
    grid.write_tables(str(md), force=True)
    text = md.read_text()
    assert "old" not in text and text.startswith("a\n") and text.endswith("\nb\n")
    assert "| τ, loss | concrete |" in text


def test_grid_cells_are_every_dataset_quantile_loss_and_seed_seed_major(tmp_path):
    grid = quantile_grid.Grid(str(tmp_path), str(tmp_path), datasets=("concrete", "bio"),
                              quantiles=(0.1, 0.5), losses=("pinball", "squantile"),
                              seeds=2)
    cells = list(grid.cells())
    assert cells == [(ds, q, loss, seed) for seed, ds, q, loss in itertools.product(
        range(2), ("concrete", "bio"), (0.1, 0.5), ("pinball", "squantile"))]
    dirs = {grid.run_dir(*cell) for cell in cells}
    assert len(dirs) == 16
    assert grid.run_dir("bio", 0.5, "squantile", 1) == os.path.join(
        str(tmp_path), "bio", "quantile0.5", "squantile", "seed1")
    assert grid.complete({("bio", 0.5, "pinball"): [{}] * 16})
    assert not grid.complete({("bio", 0.5, "pinball"): [{}] * 15})


def _kill_the_process(config):
    """A grid runner that dies the way an out-of-memory XLA compile did (no exception)."""
    os._exit(3)


# The real runs' children are spawned (fresh interpreters): the driver's test,
# test_quantile_grid_driver_skips_finished_runs, runs one. This runner uses no TensorFlow,
# so its child is forked: a spawned one would spend its time importing TensorFlow (to
# unpickle the run's config) before dying. Either way the pool breaks the same way.
def test_quantile_grid_stops_with_an_error_when_a_run_kills_its_process(tmp_path):
    grid = quantile_grid.Grid(runs_dir=str(tmp_path), data_dir=str(tmp_path),
                              datasets=("concrete",), quantiles=(0.5,), losses=("pinball",),
                              seeds=2)
    errors = []

    def run():
        try:
            grid.run(runner=_kill_the_process, start_method="fork")
        except Exception as e:  # noqa: BLE001 (checked below)
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the grid hangs when a run's process dies"
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError), errors
    assert "rerun the grid to resume" in str(errors[0])


@pytest.mark.slow
def test_quantile_grid_driver_skips_finished_runs(cqr_dir, tmp_path, run_binaries):
    runs, md = str(tmp_path / "runs"), tmp_path / "R.md"
    md.write_text(f"{quantile_grid.BEGIN_MARKER}\n{quantile_grid.END_MARKER}\n")
    argv = ["run_quantile_regression_grid.py", f"--data_dir={cqr_dir[0]}",
            # One loss (the S-quantile, XLA-compiled as in the real grid): the runs of
            # every loss are the grid's cells (test_grid_cells_are_every_...).
            f"--runs_dir={runs}", "--datasets=community", "--quantiles=0.5", "--seeds=1",
            "--losses=squantile",
            "--epochs=1", "--steps_per_epoch=3", f"--results_md={md}"]
    pattern = os.path.join(runs, "community", "quantile0.5", "*", "seed0", "results.json")
    stamps = {"code": f"import glob, os; print(sorted((p, os.path.getmtime(p)) "
                      f"for p in glob.glob({pattern!r})))"}
    first, stamp, again, stamp_again = run_binaries(
        [{"argv": argv, "timeout": 600}, stamps, {"argv": argv, "timeout": 600}, stamps])
    for proc in (first, stamp, again, stamp_again):
        assert proc.returncode == 0, proc.stderr[-3000:]
    (found,) = glob.glob(pattern)
    assert found.split(os.sep)[-3] == "squantile"
    with open(found) as f:
        assert json.load(f)["flags"]["loss"] == "squantile"
    assert stamp_again.stdout == stamp.stdout  # skipped, not rerun
    assert "| 0.5, S-quantile |" in md.read_text()

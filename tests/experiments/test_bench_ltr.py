"""The learning-to-rank benchmark `scripts/bench_ltr.py` at a tiny budget: both tasks,
one of our losses and one baseline each, resumable (a rerun with the same --output
trains nothing), the summary table and the oracle. About 40 s of CPU."""

import csv

import pytest

from .conftest import script


@pytest.mark.slow
def test_bench_ltr_runs_both_tasks_resumably_at_a_tiny_budget(run_binaries, tmp_path):
    out = str(tmp_path / "ltr.csv")
    tiny = {"ltr": ["--queries=40", "--max_list=20", "--validation=10"],
            "keras_rs": ["--train_lists=2"]}
    cases = []
    for task, extra in tiny.items():
        argv = [script("bench_ltr.py"), f"--task={task}", "--seeds=0", "--epochs=1",
                "--losses=pairwise_logistic,soft_ndcg_lapsum", f"--output={out}", *extra]
        cases += [{"argv": argv, "timeout": 600}, {"argv": argv, "timeout": 600}]
    cases.append({"argv": [script("bench_ltr.py"), "--task=keras_rs", f"--output={out}",
                           "--summarize", "--select"], "timeout": 120})
    cases.append({"argv": [script("bench_ltr.py"), "--task=ltr", "--seeds=0,1",
                           "--queries=40", "--max_list=20", "--validation=10", "--oracle"],
                  "timeout": 120})
    procs = run_binaries(cases)
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    first_ltr, rerun_ltr, first_krs, rerun_krs, summary, oracle = procs
    assert first_ltr.stdout.count("test ") == 2 and first_krs.stdout.count("test ") == 2
    assert "test " not in rerun_ltr.stdout and "test " not in rerun_krs.stdout  # resumed
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert [(r["task"], r["loss"]) for r in rows] == [
        (task, loss) for task in tiny for loss in ("pairwise_logistic", "soft_ndcg_lapsum")]
    for row in rows:
        for column in ("untrained", "val_ndcg", "test_ndcg"):
            assert 0.0 < float(row[column]) <= 1.0
    assert "| `soft_ndcg_lapsum` | 1 |" in summary.stdout
    values = [float(line.rsplit(" ", 1)[1]) for line in oracle.stdout.splitlines()
              if line.startswith("ltr oracle")]
    assert len(values) == 2 and all(0.0 < v <= 1.0 for v in values)

"""Command-line behaviour of the experiment binaries (`softsort_tf.experiments.flags` and
the validators of `softsort_tf.experiments.checks`).

`--help` lists the experiment flags; a bad flag value is one absl error line naming the
flag (exit code 1, no traceback) and leaves no output folder behind; a run that fails
after it started removes the empty folder it created; every log line is printed once.
Every command line runs as its own process, forked from the session's fork server
(`run_binaries`, `conftest.py`).
"""

import re
import textwrap

import numpy as np
import pytest

EXPERIMENT_FLAGS = ("--output_dir", "--method", "--temperature", "--stochastic",
                    "--num_samples", "--n", "--epochs", "--steps_per_epoch", "--batch_size",
                    "--learning_rate", "--seed", "--dataset", "--strategy")
HELP = {"train_sort.py": (), "train_median.py": (), "tune.py": ("--task", "--max_trials")}
SCHEDULE_FLAGS = ("--precision", "--lr_schedule", "--warmup_steps", "--patience",
                  "--max_train_minutes", "--[no]save_every_epoch", "--[no]jit_compile")
BAD_FLAGS = [
    ("train_sort.py", "n", "1"),
    ("train_median.py", "n", "4"),  # the median needs an odd n
    ("train_sort.py", "temperature", "0"),
    ("train_sort.py", "method", "bubblesort"),
    ("train_sort.py", "epochs", "0"),
    ("train_median.py", "temperature", "-1"),
    ("train_sort.py", "mnist_npz", "/nonexistent/mnist.npz"),
    ("tune.py", "max_trials", "0"),
]
LOG_ONCE = textwrap.dedent("""
    import tensorflow as tf
    from absl import logging
    from softsort_tf.experiments import flags as experiment_flags

    experiment_flags.define_run_flags()

    def main(argv):
        del argv
        logging.warning("absl-marker")
        tf.get_logger().warning("tf-marker")

    if __name__ == "__main__":
        experiment_flags.run_binary(main)
""")


@pytest.fixture(scope="module")
def cli(run_binaries, tmp_path_factory):
    """Every command line of this module, run once: name -> (result, output folder)."""
    tmp = tmp_path_factory.mktemp("cli")
    bad_npz = tmp / "not_mnist.npz"
    np.savez(bad_npz, images=np.zeros([3, 28, 28], np.uint8))  # exists, but not MNIST's keys
    program = tmp / "binary.py"
    program.write_text(LOG_ONCE)
    (tmp / "existing").mkdir()  # a folder that exists before the run
    cases = {f"help {name}": [name, "--help"] for name in HELP}
    cases["helpshort train_sort.py"] = ["train_sort.py", "--helpshort"]
    for i, (name, flag, value) in enumerate(BAD_FLAGS):
        cases[f"bad {i}"] = [name, f"--output_dir={tmp / f'bad{i}'}",
                                       f"--{flag}={value}"]
    for folder in ("failed", "existing"):
        cases[folder] = ["train_sort.py", f"--output_dir={tmp / folder}",
                         f"--mnist_npz={bad_npz}", "--n=3", "--epochs=1", "--steps_per_epoch=1"]
    cases["log once"] = [str(program), f"--output_dir={tmp / 'log_once'}"]
    cases["positional"] = ["train_sort.py", f"--output_dir={tmp / 'positional'}", "oops"]
    cases["ranking losses"] = ["train_ranking.py", f"--output_dir={tmp / 'ranking'}",
                               "--losses=mse,bogus"]
    results = run_binaries([{"argv": argv, "timeout": 300} for argv in cases.values()])
    out = {name: (result, tmp) for name, result in zip(cases, results, strict=True)}
    return out


def _python_lines(stderr):
    """stderr without TensorFlow's C++ start-up log lines (`I0000 ...`, `E0000 ...`)."""
    return [line for line in stderr.splitlines()
            if not re.match(r"[IWEF]\d{4} ", line) and "absl::InitializeLog" not in line]


@pytest.mark.parametrize("script", sorted(HELP))
def test_help_lists_the_experiment_flags(cli, script):
    proc, _ = cli[f"help {script}"]  # absl exits with 1 after the help
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    listed = {line.split(":")[0].strip().replace("[no]", "")
              for line in proc.stdout.splitlines() if line.strip().startswith("--")}
    for flag in EXPERIMENT_FLAGS + HELP[script]:
        assert flag in listed, (flag, proc.stdout[:3000])
    assert "--helpfull" not in listed  # absl's own flags stay under --helpfull


def test_train_sort_help_lists_the_schedule_flags(cli):
    proc, _ = cli["helpshort train_sort.py"]
    for flag in SCHEDULE_FLAGS:
        assert flag in proc.stdout, flag


@pytest.mark.parametrize("index", range(len(BAD_FLAGS)),
                         ids=["-".join(case) for case in BAD_FLAGS])
def test_bad_flag_value_is_one_line_naming_the_flag(cli, index):
    script, flag, _ = BAD_FLAGS[index]
    proc, tmp = cli[f"bad {index}"]
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in _python_lines(proc.stderr) if "error" in line.lower()]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith("FATAL Flags parsing error") and f"--{flag}=" in errors[0]
    assert not (tmp / f"bad{index}").exists()


def test_a_run_that_fails_leaves_no_empty_output_folder(cli):
    proc, tmp = cli["failed"]
    assert proc.returncode != 0
    assert "x_train" in proc.stderr  # the error names what the file lacks
    assert not (tmp / "failed").exists()
    # A folder that existed before the run is left in place.
    proc, tmp = cli["existing"]
    assert proc.returncode != 0 and "x_train" in proc.stderr
    assert (tmp / "existing").is_dir()


def test_each_log_line_is_printed_once(cli):
    proc, _ = cli["log once"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("absl-marker") == 1, proc.stderr
    assert proc.stderr.count("tf-marker") == 1, proc.stderr


def test_extra_positional_arguments_are_rejected(cli):
    proc, tmp = cli["positional"]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "oops" in proc.stderr and not (tmp / "positional").exists()


def test_binary_rejects_unknown_losses_in_one_line(cli):
    proc, tmp = cli["ranking losses"]  # scripts/train_ranking.py
    assert proc.returncode == 1
    assert "--losses must be a non-empty list" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp / "ranking").exists()

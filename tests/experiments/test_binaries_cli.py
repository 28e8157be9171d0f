"""Command-line behaviour of the experiment binaries (train_sort, train_median, tune).

`--help` lists the experiment flags; a bad flag value is one absl error line naming the
flag (exit code 1, no traceback) and leaves no output folder behind; a run that fails
after it started removes the empty folder it created; every log line is printed once.
"""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPERIMENT_FLAGS = ("--output_dir", "--method", "--tau", "--epsilon", "--stochastic",
                    "--num_samples", "--n", "--epochs", "--steps_per_epoch", "--batch_size",
                    "--learning_rate", "--seed", "--dataset", "--strategy")


def _run(args, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def _python_lines(stderr):
    """stderr without TensorFlow's C++ start-up log lines (`I0000 ...`, `E0000 ...`)."""
    return [line for line in stderr.splitlines()
            if not re.match(r"[IWEF]\d{4} ", line) and "absl::InitializeLog" not in line]


def _script(name):
    return os.path.join(ROOT, "scripts", name)


@pytest.mark.slow
@pytest.mark.parametrize("script, extra", [("train_sort.py", ()), ("train_median.py", ()),
                                           ("tune.py", ("--task", "--max_trials"))])
def test_help_lists_the_experiment_flags(script, extra):
    proc = _run([_script(script), "--help"])  # absl exits with 1 after the help
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    listed = {line.split(":")[0].strip().replace("[no]", "")
              for line in proc.stdout.splitlines() if line.strip().startswith("--")}
    for flag in EXPERIMENT_FLAGS + extra:
        assert flag in listed, (flag, proc.stdout[:3000])
    assert "--helpfull" not in listed  # absl's own flags stay under --helpfull


BAD_FLAGS = [
    ("train_sort.py", "n", "1"),
    ("train_median.py", "n", "4"),  # the median needs an odd n
    ("train_sort.py", "epsilon", "0"),
    ("train_sort.py", "epochs", "0"),
    ("train_median.py", "tau", "-1"),
    ("train_sort.py", "mnist_npz", "/nonexistent/mnist.npz"),
    ("tune.py", "max_trials", "0"),
]


@pytest.mark.slow
@pytest.mark.parametrize("script, flag, value", BAD_FLAGS)
def test_bad_flag_value_is_one_line_naming_the_flag(tmp_path, script, flag, value):
    out = tmp_path / "run"
    proc = _run([_script(script), f"--output_dir={out}", f"--{flag}={value}"])
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in _python_lines(proc.stderr) if "error" in line.lower()]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert errors[0].startswith("FATAL Flags parsing error") and f"--{flag}=" in errors[0]
    assert not out.exists()


@pytest.mark.slow
def test_a_run_that_fails_leaves_no_empty_output_folder(tmp_path):
    bad_npz = tmp_path / "not_mnist.npz"
    np.savez(bad_npz, images=np.zeros([3, 28, 28], np.uint8))  # exists, but not MNIST's keys
    out = tmp_path / "run"
    proc = _run([_script("train_sort.py"), f"--output_dir={out}", f"--mnist_npz={bad_npz}",
                 "--n=3", "--epochs=1", "--steps_per_epoch=1"])
    assert proc.returncode != 0
    assert "x_train" in proc.stderr  # the error names what the file lacks
    assert not out.exists()
    # A folder that existed before the run is left in place.
    out.mkdir()
    proc = _run([_script("train_sort.py"), f"--output_dir={out}", f"--mnist_npz={bad_npz}",
                 "--n=3", "--epochs=1", "--steps_per_epoch=1"])
    assert proc.returncode != 0 and out.is_dir()


def test_each_log_line_is_printed_once(tmp_path):
    program = tmp_path / "binary.py"
    program.write_text(textwrap.dedent("""
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
    """))
    proc = _run([str(program), f"--output_dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("absl-marker") == 1, proc.stderr
    assert proc.stderr.count("tf-marker") == 1, proc.stderr


def test_extra_positional_arguments_are_rejected(tmp_path):
    proc = _run([_script("train_sort.py"), f"--output_dir={tmp_path / 'run'}", "oops"])
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "oops" in proc.stderr and not (tmp_path / "run").exists()

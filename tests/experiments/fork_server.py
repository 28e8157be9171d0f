"""A fork server for the harness' tests: starts command lines of the experiment binaries,
each in its own process, paying TensorFlow's import once.

    python fork_server.py

imports the modules the binaries import (TensorFlow, Keras, the harness) without
initialising TensorFlow's runtime, then forks one child per request: each child is a
fresh program as far as TensorFlow's devices, absl's flags and Keras' global state go,
and exits with the exit code, stdout and stderr `python` would give.

It reads one JSON request per line on stdin and answers one JSON line on stdout:

- `{"start": case, "stdout": path, "stderr": path}` starts a child (answer `{"pid": pid}`)
  whose stdout and stderr are appended to the files `path`. A case is
  `{"argv": [script, arg, ...]}` (a Python file run as `__main__`, as
  `python script arg ...` does) or `{"code": source, "argv": [...]}` (as
  `python -c source ...`), with optional `"env"` (variables to set) and `"cwd"`;
- `{"poll": pid}` answers `{"returncode": code, "cpu_seconds": seconds}`, both None
  while the child runs (a child killed by a signal: minus the signal's number; the
  CPU time, user + system, is the child's own);
- `{"wait": pid, "timeout": seconds}` answers the same once the child has exited or the
  timeout has passed.

A request it cannot serve (say, a pid that is not its child) is answered with
`{"error": message}`.

At the end of stdin (the test session ends, or dies) it kills the children still
running and exits.
"""

import gc
import importlib
import json
import os
import runpy
import signal
import sys
import time
import traceback
import warnings

PRELOAD = ("tensorflow", "tensorflow.summary", "keras", "sklearn.datasets", "softsort_tf",
           "softsort_tf.datasets", "softsort_tf.experiments.flags",
           "softsort_tf.experiments.curves", "softsort_tf.experiments.knn",
           "softsort_tf.experiments.quantile_grid", "softsort_tf.experiments.quantile_regression",
           "softsort_tf.experiments.ranking", "softsort_tf.experiments.suquan",
           "softsort_tf.experiments.topk", "softsort_tf.experiments.tuning")


def _exit_code(error: SystemExit) -> int:
    """The exit status of `sys.exit(code)`, printing a non-int code as Python does."""
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def _child(case: dict, stdout_path: str, stderr_path: str) -> None:
    """Runs `case` in this (forked) process and exits with its exit code."""
    code = 1
    try:
        for fd, path in ((0, os.devnull), (1, stdout_path), (2, stderr_path)):
            flags = os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_APPEND
            os.dup2(os.open(path, flags), fd)
        os.environ.update(case.get("env", {}))
        os.chdir(case.get("cwd") or os.getcwd())
        if "code" in case:
            sys.argv = ["-c", *case.get("argv", ())]
            sys.path[0] = ""
            exec(compile(case["code"], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
        else:
            sys.argv = list(case["argv"])
            sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
            runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as error:
        code = _exit_code(error)
    except BaseException:  # noqa: BLE001 (reported as `python` does)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pid: int, timeout: float) -> tuple[int, float] | None:
    """The exit code and CPU seconds (user + system) of the child `pid`, None if it
    still runs after `timeout` seconds."""
    deadline = time.time() + timeout
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime
        if time.time() >= deadline:
            return None
        time.sleep(0.05)


def main() -> None:
    warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
    for name in PRELOAD:
        importlib.import_module(name)
    # As in the test processes (tests/conftest.py): the preloaded modules out of the
    # collector's reach (also spares the children copy-on-write of their pages), the
    # youngest generation collected less often; the children inherit both.
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 10)
    answers = os.fdopen(os.dup(1), "w")
    running, exited = set(), {}  # exited: pid -> (exit code, CPU seconds)

    def returncode(pid, timeout):
        if pid not in exited:
            done = _wait(pid, timeout)
            if done is not None:
                exited[pid] = done
                running.discard(pid)
        code, cpu = exited.get(pid, (None, None))
        return {"returncode": code, "cpu_seconds": cpu}

    for line in sys.stdin:
        try:
            request = json.loads(line)
            if "start" in request:
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request["start"], request["stdout"], request["stderr"])
                running.add(pid)
                answer = {"pid": pid}
            elif "poll" in request:
                answer = returncode(request["poll"], 0)
            else:
                answer = returncode(request["wait"], request["timeout"])
        except Exception as error:  # noqa: BLE001 (a bad request: answered, not fatal)
            answer = {"error": repr(error)}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()
    for pid in running:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()

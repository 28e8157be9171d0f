"""Fixtures of the harness' tests: the binaries' command lines, run as processes forked
from one fork server per test session (`fork_server`, `run_binaries`: TensorFlow is
imported once, not once per process), and the stand-in CQR data files (`cqr_dir`)."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fork_server.py")


class ForkServer:
    """Starts processes forked from `fork_server.py` (see there), each a fresh program,
    and follows them by pid.

    `start` does not wait for the server's answer (the server may still be importing
    TensorFlow): the caller goes on, and the pid is read when it is first needed.
    """

    def __init__(self, log_path: str):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        env.pop("TF_CONFIG", None)
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, SERVER], cwd=ROOT, env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, text=True)
        self.unanswered = []  # processes started whose pid is not read yet

    def _send(self, request: dict) -> None:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, "the fork server died (its log: fork_server.txt in the tmp folder)"
        answer = json.loads(line)
        assert "error" not in answer, answer["error"]
        return answer

    def read_pids(self) -> None:
        while self.unanswered:
            self.unanswered.pop(0).pid = self._answer()["pid"]

    def ask(self, **request) -> dict:
        self.read_pids()
        self._send(request)
        return self._answer()

    def start(self, case: dict, stdout: str, stderr: str) -> "Forked":
        """Starts `case` (`fork_server.py`) with its output appended to the files
        `stdout` and `stderr` (the same path for both is fine)."""
        process = Forked(self)
        self._send({"start": {"cwd": ROOT, **case}, "stdout": stdout, "stderr": stderr})
        self.unanswered.append(process)
        return process

    def close(self) -> None:
        """Ends the server; it kills the processes still running."""
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class Forked:
    """A process started by `ForkServer`, with the part of `subprocess.Popen` the tests
    use: `pid`, `poll`, `wait`, `send_signal`, `returncode`; and `cpu_seconds`, its CPU
    time once it has exited."""

    def __init__(self, server: ForkServer):
        self.server, self.pid, self.returncode, self.cpu_seconds = server, None, None, None

    def _update(self, answer: dict) -> int | None:
        self.returncode, self.cpu_seconds = answer["returncode"], answer["cpu_seconds"]
        return self.returncode

    def poll(self) -> int | None:
        self.server.read_pids()
        if self.returncode is None:
            self._update(self.server.ask(poll=self.pid))
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        """The exit code, None if the process still runs after `timeout` seconds."""
        self.server.read_pids()
        if self.returncode is None:
            self._update(self.server.ask(wait=self.pid, timeout=timeout))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.server.read_pids()
        os.kill(self.pid, sig)


@pytest.fixture(scope="session")
def fork_server(tmp_path_factory):
    """The session's `ForkServer` (started at its first use)."""
    server = ForkServer(str(tmp_path_factory.mktemp("fork_server") / "fork_server.txt"))
    yield server
    server.close()


def script(name: str) -> str:
    """Path of `scripts/<name>`."""
    return os.path.join(ROOT, "scripts", name)


@pytest.fixture(scope="session")
def run_binaries(fork_server, tmp_path_factory):
    """`run(cases, check=False)`: runs the command lines `cases` (`fork_server.py`; a
    script name alone is looked up in `scripts/`; `"timeout"`: seconds, default 600) one
    after the other, each in its own process forked from `fork_server`. Returns one
    `returncode`, `stdout`, `stderr`, `seconds`, `cpu_seconds` namespace per case: a list
    in order, or a dict with the keys of `cases` when `cases` is a dict. `check` asserts
    that every case exited with 0."""

    def run(cases, check: bool = False):
        if isinstance(cases, dict):
            return dict(zip(cases, run(list(cases.values()), check), strict=True))
        folder = tmp_path_factory.mktemp("run_binaries")
        results = []
        for i, case in enumerate(cases):
            case = dict(case)
            timeout = case.pop("timeout", 600)
            if "code" not in case and not os.path.isabs(case["argv"][0]):
                case["argv"] = [script(case["argv"][0]), *case["argv"][1:]]
            out, err = folder / f"{i}.stdout", folder / f"{i}.stderr"
            start = time.time()
            process = fork_server.start(case, str(out), str(err))
            if process.wait(timeout) is None:
                process.send_signal(signal.SIGKILL)
                process.wait(60)
            results.append(types.SimpleNamespace(
                returncode=process.returncode, stdout=out.read_text() if out.exists() else "",
                stderr=err.read_text() if err.exists() else "", seconds=time.time() - start,
                cpu_seconds=process.cpu_seconds))
            name = "<code>" if "code" in case else os.path.basename(case["argv"][0])
            # Shown with `pytest -s`: where the time goes.
            print(f"[run_binaries] {results[-1].seconds:6.1f} s  "
                  f"{process.cpu_seconds or 0.0:6.1f} s CPU  exit {process.returncode}  {name}")
        for result in results if check else ():
            assert result.returncode == 0, result.stderr[-3000:]
        return results

    return run


def _load_cqr_standin():
    path = os.path.join(ROOT, "tests", "datasets", "cqr_standin.py")
    spec = importlib.util.spec_from_file_location("cqr_standin", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def cqr_dir(tmp_path_factory):
    """The six CQR files in the formats of the published ones (`tests/datasets/
    cqr_standin.py`): `(folder, what each data set must read as)`."""
    folder = tmp_path_factory.mktemp("cqr")
    return str(folder), _load_cqr_standin().write(folder)

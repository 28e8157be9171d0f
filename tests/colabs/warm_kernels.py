"""Jupyter kernels forked from a warm parent, for the notebook tests: TensorFlow, Keras,
matplotlib, scikit-learn and softsort_tf are imported once, not once per notebook.

    python warm_kernels.py serve SOCKET     # the parent (started by the tests)
    python warm_kernels.py launch SOCKET ARG...   # the kernel spec's argv
    python warm_kernels.py script SOCKET SCRIPT ARG...   # `python SCRIPT ARG...`, forked

The parent imports the modules WITHOUT initialising TensorFlow's runtime (it checks, and
that it runs no thread but OpenBLAS' workers, before every fork), then listens on the Unix
socket SOCKET. Each `launch` (a light program: it imports no TensorFlow) sends its argv,
environment, working directory and stdin/stdout/stderr to the parent, which forks a child
that runs `python -m ipykernel_launcher ARG...` with them: a fresh kernel program per notebook
as far as TensorFlow's devices and thread pools, Keras and the notebook's namespace go
(with Grappler's graph rewrites off, as in the test processes). `script` does the same for
`python SCRIPT ARG...` (the `make demo` test): a fresh program whose tf.functions are
all traced in it.
The launcher stands for the kernel: it forwards SIGINT/SIGTERM/SIGHUP to it and exits with
its exit code; if the launcher dies (SIGKILL), the parent kills the kernel. The parent
exits (killing the kernels left) at the end of its stdin.
"""

import gc
import json
import os
import signal
import socket
import sys

# Not ipykernel (its app reads JPY_PARENT_PID & co. when imported) nor matplotlib's inline
# backend (it hooks itself into the running IPython shell when imported): the kernel
# imports those itself.
PRELOAD = ("numpy", "tensorflow", "keras", "matplotlib", "matplotlib.pyplot",
           "sklearn.datasets", "sklearn.model_selection", "sklearn.svm", "softsort_tf",
           "softsort_tf.datasets", "softsort_tf.experiments.large_mnist",
           "softsort_tf.experiments.suquan")
_MAX_REQUEST = 1 << 20


def _check_pristine() -> None:
    """Raises if TensorFlow's runtime has started or this process runs threads other than
    the OpenBLAS workers (which load with numpy and scipy and are fork-safe: OpenBLAS shuts
    them down around a fork)."""
    import threadpoolctl
    blas_workers = sum(max(pool["num_threads"] - 1, 0)
                       for pool in threadpoolctl.threadpool_info()
                       if pool["internal_api"] == "openblas")
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1 + blas_workers:  # fewer after a fork: OpenBLAS restarts them lazily
        raise RuntimeError(f"the warm parent runs {threads} threads, at most {blas_workers} "
                           "of them OpenBLAS workers: it cannot fork")
    from tensorflow.python.eager import context
    ctx = context.context_safe()
    if ctx is not None and ctx._context_handle is not None:  # noqa: SLF001
        raise RuntimeError("TensorFlow's runtime was initialised in the warm parent")


def _kernel(conn, listener, others, request, fds) -> None:
    """The forked child: becomes `python -m ipykernel_launcher ARG...`; never returns."""
    code = 1
    try:
        for sock in (conn, listener, *others):
            sock.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        import runpy
        import tempfile
        tempfile.tempdir = None  # read TMPDIR again
        # As in the test processes (tests/conftest.py): no Grappler rewrites. At the small
        # budget every graph runs once or twice, so rewriting it costs more than it saves
        # (a fifth of a notebook's time); what is computed is the same.
        import tensorflow as tf
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
        if "script" in request:  # as `python SCRIPT ARG...` does
            script = os.path.abspath(request["script"])
            sys.argv = [script, *request["args"]]
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")
        else:
            sys.argv = ["-m", *request["args"]]
            sys.path[0] = os.getcwd()  # as `python -m` does
            runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as error:
        code = error.code if isinstance(error.code, int) else (error.code is not None)
    except BaseException:  # noqa: BLE001 (reported as `python` does)
        import traceback
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(path: str) -> None:
    import importlib
    import select
    import warnings

    warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
    for name in PRELOAD:
        importlib.import_module(name)
    # As in the test processes (tests/conftest.py): the preloaded modules out of the
    # collector's reach (also spares the children copy-on-write of their pages), the
    # youngest generation collected less often; the children inherit both.
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 10)
    _check_pristine()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    print("ready", flush=True)
    kernels = {}  # launcher connection -> kernel pid
    while True:
        ready, _, _ = select.select([sys.stdin, listener, *kernels], [], [], 0.1)
        if sys.stdin in ready and not sys.stdin.readline():
            break
        if listener in ready:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST, 3)
            _check_pristine()
            pid = os.fork()
            if pid == 0:
                _kernel(conn, listener, list(kernels), json.loads(message), fds)
            for fd in fds:
                os.close(fd)
            kernels[conn] = pid
        for conn in [c for c in ready if c in kernels]:
            data = conn.recv(64)
            if not data:  # the launcher died: so does its kernel
                os.kill(kernels[conn], signal.SIGKILL)
            else:
                for line in data.decode().split():
                    os.kill(kernels[conn], int(line))
        for conn, pid in list(kernels.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                try:
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()
                del kernels[conn]
    for conn, pid in kernels.items():
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        conn.close()
    sys.stdout.flush()
    os._exit(0)  # no TensorFlow teardown: it never ran anything


def launch(path: str, args: list, script: str | None = None) -> None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    request = {"args": args, "env": dict(os.environ), "cwd": os.getcwd()}
    if script is not None:
        request["script"] = script
    socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])

    def forward(signum, _frame):
        conn.sendall(f"{signum}\n".encode())

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    answer = b""
    while not answer.endswith(b"\n"):
        try:
            data = conn.recv(64)
        except InterruptedError:
            continue
        if not data:
            sys.exit("warm_kernels: the warm parent went away")
        answer += data
    code = int(answer)
    if code < 0:  # killed by a signal: so is the launcher
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif sys.argv[1] == "script":
        launch(sys.argv[2], sys.argv[4:], script=sys.argv[3])
    else:
        launch(sys.argv[2], sys.argv[3:])

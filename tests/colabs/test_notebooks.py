"""The Colab notebooks in `colabs/`: structure, committed outputs, and headless runs.

The slow tests execute each notebook from a clean kernel (nbclient), on the CPU, at the
small budget (the environment variable `SOFTSORT_TF_BUDGET` read by the notebook's
`parameters` cell), and check that it finished, drew its figures and printed its key
numbers. The kernel is this interpreter (a `python3` kernel spec written for the test),
so the notebooks run against the checkout's installed package. Each kernel is a fresh
process forked from a warm parent that has imported TensorFlow & co. once, without
starting TensorFlow's runtime (`warm_kernels.py`).

Every notebook opens with the same install cell (INSTALL_CELL_START): in the runs, it
finds the wheel that `make dist` built (once per session, offline) in its working
directory, as on a Colab runtime the wheel was uploaded to, and installs it with pip into
a throwaway folder (PIP_TARGET, without dependencies or index): the files installed are
those of the wheel. The notebook itself runs against the checkout's package, which the
warm parent imported.

`make demo` (scripts/demo.py) is tested here too, forked from the same warm parent: the
operator tour and the scorer fit run without a retracing warning, and the scorer trained
through `SinkhornRank` recovers the hidden ranking (the large-MNIST part is
`large_mnist.run`, tested with the binaries).
"""

from __future__ import annotations

import configparser
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile

import nbclient
import nbformat
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLABS = os.path.join(ROOT, "colabs")
WARM_KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_kernels.py")
MAX_COMMITTED_BYTES = 1_500_000

# notebook -> (minimum number of figures, regular expressions its printed output must match)
NOTEBOOKS = {
    "01_operators_tour.ipynb": (7, [
        r"ranks\s+max \|soft − hard\| at ε = 1e-04: \d\.\d{4}",
        r"neuralsort max \|soft − hard\| sort at τ = 1e-03: \d\.\d{4}",
        r"n = \d+: blur at ε = 1e-02: measured \d+\.\d\d, rule \d+\.\d\d positions",
        r"softsort\s+tau = 0\.05\s+row sums 1\.000-1\.000",
        r"sinkhorn\s+epsilon = 0\.001\s+row sums 1\.000-1\.000, column sums 1\.000-1\.000",
        r"Jacobian row sums \(≈ 0\)",
        r"warm start off\s+ε = 1e-04:\s+\d+ iterations, error ",
        r"n =   10, blur 1 position, .*'epsilon': 0\.02",
    ]),
    "02_learning_to_sort_large_mnist.ipynb": (3, [
        r"Digits: embedded",
        r"softsort\s+\d\.\d{3}\s+\(\d\.\d{3}\)",
        r"neuralsort\s+\d\.\d{3}\s+\(\d\.\d{3}\)",
        r"sinkhorn\s+\d\.\d{3}\s+\(\d\.\d{3}\)",
        r"lapsum\s+\d\.\d{3}\s+\(\d\.\d{3}\)",
        r"sorting_network\s+\d\.\d{3}\s+\(\d\.\d{3}\)",
        r"Deterministic NeuralSort \(NeuralSort paper\)\s+0\.930 \(0\.951\)",
        r"predicted order",
    ]),
    "03_robust_and_rank_based_learning.ipynb": (4, [
        r"MSE\s+slope\s+-?\d+\.\d\d, intercept\s+-?\d+\.\d\d",
        r"least median.*slope\s+-?\d+\.\d\d",
        r"trimmed.*slope\s+-?\d+\.\d\d",
        r"cross-entropy\s+final test top-1 accuracy \d\.\d{3}",
        r"soft top-1\s+final test top-1 accuracy \d\.\d{3}",
        r"learned f vs true f: max \|error\| \d+\.\d{3}",
        r"Spearman loss\s+final test Spearman -?\d\.\d{3}",
    ]),
    "04_speed.ipynb": (2, [
        r"Device: CPU",
        r"softsort\s+graph\s+n =\s+\d+:\s+\d+\.\d+ ms",
        r"sinkhorn ranks\s+graph\s+n =\s+\d+:\s+\d+\.\d+ ms",
        r"tf\.sort\s+graph",
        r"implicit\s+\d+ iterations: peak \+?-?\d+\.\d MB",
        r"unrolled\s+\d+ iterations: peak \+?-?\d+\.\d MB",
    ]),
    "05_permutations_as_inputs.ipynb": (4, [
        r"quantile normalisation\s+\[",
        r"Kendall τ\s+min eigenvalue [+-]\d\.\d\de[+-]\d\d \(positive semi-definite\)",
        r"median\s+test accuracy \d\.\d{4}",
        r"SUQUAN\s+test accuracy \d\.\d{4}",
        r"Keras SinkhornQuantileNormalization \+ Dense\s+test accuracy \d\.\d{4}",
        r"Kendall τ loss\s+final test Kendall tau -?\d\.\d{3}",
        r"MSE\s+final test Kendall tau -?\d\.\d{3}",
        r"\d+ training images: Kendall-kernel SVM \d\.\d{3}, linear SVM \(raw pixels\) \d\.\d{3}",
    ]),
}


def _read(name):
    return nbformat.read(os.path.join(COLABS, name), as_version=4)


def _text_outputs(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out["text"])
            elif "data" in out and "text/plain" in out["data"]:
                parts.append(out["data"]["text/plain"])
    return "".join(parts)


def _num_figures(nb) -> int:
    return sum("image/png" in out.get("data", {})
               for cell in nb.cells for out in cell.get("outputs", []))


def test_every_notebook_is_listed():
    assert sorted(n for n in os.listdir(COLABS) if n.endswith(".ipynb")) == sorted(NOTEBOOKS)


INSTALL_CELL_START = "# Installs softsort_tf with its \"experiments\" extra."


def _install_cell() -> str:
    return next(c for c in _read("01_operators_tour.ipynb").cells if c.cell_type == "code").source


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_structure(name):
    """The first code cell is the install cell, the same in every notebook; the second
    reports the device; the third, tagged `parameters`, holds the budget switch ("colab"
    on a GPU, "medium" without one); everything else is fixed."""
    nb = _read(name)
    code = [c for c in nb.cells if c.cell_type == "code"]
    first = code[0].source
    assert first.startswith(INSTALL_CELL_START) and first == _install_cell()
    assert re.search(r'^SOFTSORT_SOURCE = ""$', first, re.M) and "pip" in first
    assert "tf.__version__" in code[1].source and "No GPU" in code[1].source
    assert "Change runtime type" in code[1].source
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1
    assert re.search(r'^BUDGET = os\.environ\.get\("SOFTSORT_TF_BUDGET", '
                     r'"colab" if ON_GPU else "medium"\)$', params[0].source, re.M)
    assert code.index(params[0]) == 2
    # No library code copied in: the notebooks import softsort_tf, they define no
    # operators, layers, losses or models of their own.
    assert not re.search(r"^class ", "\n".join(c.source for c in code), re.M)


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_committed_outputs(name):
    """The committed notebook carries the outputs of a real run: figures, key numbers,
    the device that produced them, and stays small enough to read on GitHub."""
    path = os.path.join(COLABS, name)
    assert os.path.getsize(path) < MAX_COMMITTED_BYTES
    nb = _read(name)
    min_figures, patterns = NOTEBOOKS[name]
    assert _num_figures(nb) >= min_figures
    text = _text_outputs(nb)
    for pattern in patterns:
        assert re.search(pattern, text), pattern
    assert re.search(r"Run finished on CPU at budget 'medium'", text)
    assert "No GPU in this runtime" in text
    assert not any(o.get("output_type") == "error"
                   for c in nb.cells for o in c.get("outputs", []))
    intro = nb.cells[0].source
    assert "CPU" in intro and "medium" in intro


class _Dist(types.SimpleNamespace):
    """What `make dist` built: `wheel` and `sdist` (paths), `version`, and
    `wheel_modules` (the .py files of the wheel, relative to its root)."""


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """`make dist` into a temporary folder, once for the module: offline (the build
    backend of this environment, `BUILD_OPTIONS="--no-isolation --skip-dependency-check"`)
    and without re-installing the environment (`-o` its stamp)."""
    out = tmp_path_factory.mktemp("dist")
    venv = os.path.dirname(os.path.dirname(sys.executable))
    proc = subprocess.run(
        ["make", "--no-print-directory", "-o", os.path.join(venv, ".installed-stamp"), "dist",
         f"VENV={venv}", f"DIST_DIR={out}", "BUILD_OPTIONS=--no-isolation --skip-dependency-check"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = out.glob("softsort_tf-*-py3-none-any.whl")
    (sdist,) = out.glob("softsort_tf-*.tar.gz")
    version = wheel.name.split("-")[1]
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"softsort_tf-{version}.dist-info/METADATA").decode()
    return _Dist(wheel=wheel, sdist=sdist, version=version, metadata=metadata,
                 wheel_modules={n for n in names if n.endswith(".py")})


def test_make_dist_builds_the_wheel_and_the_sdist(dist):
    """The wheel holds every module of the package (and nothing else: no tests, scripts or
    notebooks), at the package's version, and declares setup.cfg's requirements; the sdist
    is of the same version."""
    package = pathlib.Path(ROOT, "softsort_tf")
    modules = {str(p.relative_to(ROOT)) for p in package.rglob("*.py")}
    assert dist.wheel_modules == modules
    spec = importlib.util.spec_from_file_location("_version", package / "_version.py")
    version_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(version_module)
    assert dist.version == version_module.__version__
    assert dist.sdist.name == f"softsort_tf-{dist.version}.tar.gz"
    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    declared = [line.split("#")[0].strip().replace(" ", "")
                for line in config["options"]["install_requires"].splitlines()]
    requires = {line.split(": ", 1)[1].split(";")[0] for line in dist.metadata.splitlines()
                if line.startswith("Requires-Dist: ") and "extra ==" not in line}
    # Requires-Dist lists a requirement's bounds in its own order: compare them as sets.
    def bounds(requirement):
        name = re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)
        return name, frozenset(requirement[len(name):].split(","))
    assert {bounds(r) for r in requires} == {bounds(r) for r in declared if r}
    assert "Provides-Extra: experiments" in dist.metadata


def _run_install_cell(source, monkeypatch, installed=True):
    """Runs the notebooks' install cell with SOFTSORT_SOURCE = `source` in the current
    directory, pip replaced by a recorder and softsort_tf by a stand-in (installed or
    not); returns (the pip commands, what it printed)."""
    cell = _install_cell()
    assert cell.count('SOFTSORT_SOURCE = ""\n') == 1
    cell = cell.replace('SOFTSORT_SOURCE = ""\n', f"SOFTSORT_SOURCE = {source!r}\n")
    calls, printed = [], []
    monkeypatch.setattr(subprocess, "check_call", lambda args: calls.append(args))
    stand_in = types.ModuleType("softsort_tf")
    stand_in.__version__ = "0.0"
    monkeypatch.setitem(sys.modules, "softsort_tf", stand_in)
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        if name == "softsort_tf":  # installed from the start, or by the cell's pip
            return (importlib.machinery.ModuleSpec(name, None, origin=os.path.join(
                "somewhere", "__init__.py")) if installed or calls else None)
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    namespace = {"print": lambda *args: printed.append(" ".join(args))}
    exec(compile(cell, "install cell", "exec"), namespace)  # noqa: S102
    return calls, "\n".join(printed)


def _pip(requirement):
    return [sys.executable, "-m", "pip", "install", "-q", requirement]


def test_install_cell_takes_the_wheel_uploaded_last(tmp_path, monkeypatch):
    """A wheel in the working directory is installed even when softsort_tf is: the one
    modified last (here the older version)."""
    monkeypatch.chdir(tmp_path)
    old = tmp_path / "softsort_tf-0.1-py3-none-any.whl"
    new = tmp_path / "softsort_tf-0.2-py3-none-any.whl"
    old.write_bytes(b"")
    new.write_bytes(b"")
    os.utime(old, (2e9, 2e9))
    calls, printed = _run_install_cell("", monkeypatch)
    assert calls == [_pip(f"softsort_tf[experiments] @ {old.as_uri()}")]
    assert f"softsort_tf: installing the wheel {old}" in printed
    assert "restart it" in printed  # softsort_tf was imported before the install


def test_install_cell_installs_nothing_when_installed_and_no_wheel(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    calls, printed = _run_install_cell("", monkeypatch)
    assert calls == []
    assert "using the softsort_tf already installed (nothing installed)" in printed
    assert "softsort_tf 0.0 imported from somewhere" in printed


def test_install_cell_finds_the_repository_around_the_notebook(tmp_path, monkeypatch):
    (tmp_path / "setup.cfg").write_text("")
    (tmp_path / "softsort_tf").mkdir()
    (tmp_path / "colabs").mkdir()
    monkeypatch.chdir(tmp_path / "colabs")
    calls, printed = _run_install_cell("", monkeypatch, installed=False)
    assert calls == [_pip(f"softsort_tf[experiments] @ {tmp_path.as_uri()}")]
    assert f"installing the folder {tmp_path}" in printed
    monkeypatch.chdir(tmp_path / "softsort_tf")  # neither here nor one folder up
    (tmp_path / "setup.cfg").unlink()
    with pytest.raises(ImportError, match="SOFTSORT_SOURCE"):
        _run_install_cell("", monkeypatch, installed=False)


@pytest.mark.parametrize("source, requirement", [
    ("https://example.org/me/softsort_tf.git", "git+https://example.org/me/softsort_tf.git"),
    ("git+ssh://git@example.org/me/softsort_tf.git@v0.2", "git+ssh://git@example.org/me/softsort_tf.git@v0.2"),
    ("https://example.org/softsort_tf-0.2-py3-none-any.whl", "https://example.org/softsort_tf-0.2-py3-none-any.whl"),
])
def test_install_cell_installs_a_given_url(source, requirement, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "softsort_tf-0.1-py3-none-any.whl").write_bytes(b"")  # a given source wins
    calls, _ = _run_install_cell(source, monkeypatch)
    assert calls == [_pip(f"softsort_tf[experiments] @ {requirement}")]


def test_install_cell_refuses_a_source_it_cannot_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="SOFTSORT_SOURCE='missing.whl'"):
        _run_install_cell("missing.whl", monkeypatch)


KERNEL_ENV = {"SOFTSORT_TF_BUDGET": "small", "TF_CPP_MIN_LOG_LEVEL": "2",
              "MPLBACKEND": "module://matplotlib_inline.backend_inline"}


@pytest.fixture(scope="module")
def warm_parent():
    """The Unix socket of a `warm_kernels.py serve` process (this interpreter, the
    kernels' environment), which forks the kernels; stopped with the module's tests."""
    folder = tempfile.mkdtemp(prefix="softsort_nb_")  # short: a socket path is <= 107 bytes
    path = os.path.join(folder, "kernels.sock")
    server = subprocess.Popen([sys.executable, WARM_KERNELS, "serve", path],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, **KERNEL_ENV), cwd=folder)
    try:
        assert server.stdout.readline() == "ready\n", "the warm kernel parent did not start"
        yield path
    finally:
        server.stdin.close()  # it kills the kernels left and exits
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def venv_kernel(tmp_path, monkeypatch, warm_parent):
    """A `python3` kernel spec running this interpreter (forked from the warm parent),
    first on JUPYTER_PATH."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, WARM_KERNELS, "launch", warm_parent,
                 "-f", "{connection_file}"],
        "display_name": "Python 3 (test)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    for name, value in KERNEL_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebooks' run folders go there
    return "python3"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs_at_small_budget(name, venv_kernel, tmp_path, monkeypatch, dist):
    nb = _read(name)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    # Which interpreter the kernel runs, checked below (not part of the notebook).
    nb.cells.insert(0, nbformat.v4.new_code_cell("import sys\nprint('KERNEL', sys.executable)"))
    workdir = tmp_path / "run"
    workdir.mkdir()
    # The wheel in the working directory, as uploaded to a Colab runtime; the install cell
    # installs it, here into a throwaway folder without dependencies or package index.
    wheel = shutil.copy(dist.wheel, workdir)
    site = tmp_path / "site"
    for variable, value in {"PIP_TARGET": str(site), "PIP_NO_DEPS": "1", "PIP_NO_INDEX": "1",
                            "PIP_NO_COMPILE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}.items():
        monkeypatch.setenv(variable, value)
    client = nbclient.NotebookClient(nb, kernel_name=venv_kernel, timeout=240,
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError if a cell fails
    text = _text_outputs(nb)
    assert f"KERNEL {sys.executable}\n" in text
    assert f"softsort_tf: installing the wheel {wheel}\n" in text
    installed = {str(p.relative_to(site)) for p in site.rglob("*.py")}
    assert installed == dist.wheel_modules
    assert (site / f"softsort_tf-{dist.version}.dist-info" / "METADATA").is_file()
    assert "budget 'small'" in text
    min_figures, patterns = NOTEBOOKS[name]
    assert _num_figures(nb) >= min_figures
    for pattern in patterns:
        assert re.search(pattern, text), pattern


@pytest.mark.slow
def test_demo_tour_has_no_retracing_warning(warm_parent):
    """`python scripts/demo.py --nosort_demo`, forked from the warm parent (a fresh program:
    the parent traced nothing)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, WARM_KERNELS, "script", warm_parent,
         os.path.join(ROOT, "scripts", "demo.py"), "--nosort_demo"],
        capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Demo finished" in proc.stdout
    # The ε tour calls the solver eagerly with a new ε each time: one graph serves all.
    assert not re.search("retrac", proc.stdout + proc.stderr, re.IGNORECASE), proc.stderr
    assert "Traceback" not in proc.stderr
    # The scorer fit: the MSE to the true ranks falls five-fold and the learned weights
    # point along the hidden ones.
    before = float(re.search(r"before training: loss ([0-9.]+)", proc.stdout).group(1))
    after = float(re.search(r"after 10 epochs: loss ([0-9.]+)", proc.stdout).group(1))
    cosine = float(re.search(r"true weights\) = (-?[0-9.]+)", proc.stdout).group(1))
    assert np.isfinite([before, after, cosine]).all()
    assert after < 0.2 * before, (before, after)
    assert cosine > 0.9, cosine

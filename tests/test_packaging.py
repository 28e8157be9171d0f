"""The installable core stands apart from the research harness.

- `import softsort_tf` works without the harness' packages (tensorflow_datasets,
  keras_tuner, sklearn), and the core's modules never import them nor the harness;
- `setup.cfg` installs only tensorflow, keras and numpy; the harness' packages are the
  `experiments` extra;
- the harness (softsort_tf/experiments, softsort_tf/datasets, scripts/, the notebooks)
  uses only the public API of `softsort_tf`: `import softsort_tf as ss`, the names of
  `softsort_tf.__all__`, and its own modules; never `softsort_tf.ops...`,
  `softsort_tf.losses...`, nor a `_private` name of any softsort_tf module.
"""

from __future__ import annotations

import ast
import configparser
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "softsort_tf"
HARNESS_MODULES = ("experiments", "datasets")  # subpackages of softsort_tf
HARNESS_DISTRIBUTIONS = ("tensorflow-datasets", "keras-tuner", "absl-py", "scikit-learn",
                         "tensorboard")
HARNESS_IMPORTS = ("tensorflow_datasets", "keras_tuner", "sklearn")
CORE_DISTRIBUTIONS = ("tensorflow", "keras", "numpy")
# Benchmarks of an internal piece itself (not of the public API): (file, module) pairs.
INTERNAL_BENCHMARKS = {
    ("scripts/bench_sinkhorn.py", "softsort_tf.solvers.sinkhorn"),  # the solver loop
}


def _requirement_names(text: str) -> list[str]:
    """The normalised distribution names of a setup.cfg requirement list."""
    names = []
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if line:
            name = re.match(r"[A-Za-z0-9_.\-]+", line).group(0)
            names.append(re.sub(r"[-_.]+", "-", name).lower())
    return names


def _setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config


def test_install_requires_is_the_core_only():
    config = _setup_cfg()
    core = _requirement_names(config["options"]["install_requires"])
    assert sorted(core) == sorted(CORE_DISTRIBUTIONS)
    assert not set(core) & set(HARNESS_DISTRIBUTIONS)
    extras = config["options.extras_require"]
    assert sorted(_requirement_names(extras["experiments"])) == sorted(HARNESS_DISTRIBUTIONS)
    assert "dev" in extras


def test_make_installs_the_experiments_extra():
    makefile = (ROOT / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if "pip install" in line and "-e" in line]
    assert installs and all("experiments" in line for line in installs)


_BLOCKED_IMPORT = textwrap.dedent("""
    import importlib.abc
    import sys

    BLOCKED = {blocked!r}

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{{name}} is blocked")
            return None

    sys.meta_path.insert(0, Blocker())
    for name in list(sys.modules):
        if name.split(".")[0] in BLOCKED:
            del sys.modules[name]

    import numpy as np
    import softsort_tf as ss

    ranks = ss.sinkhorn_rank([[3.0, 1.0, 2.0, 5.0]], epsilon=1e-3).numpy()
    np.testing.assert_allclose(ranks, [[3.0, 1.0, 2.0, 4.0]], atol=1e-2)
    assert np.all(np.isfinite(ranks))
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED)
    assert not loaded, loaded
    harness = sorted(name for name in sys.modules
                     if name.startswith(("softsort_tf.experiments", "softsort_tf.datasets")))
    assert not harness, harness
    print("ok")
""")


def test_core_imports_without_the_harness_packages():
    code = _BLOCKED_IMPORT.format(blocked=HARNESS_IMPORTS)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok")


def _core_files() -> list[pathlib.Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py"))
            if path.relative_to(PACKAGE).parts[0] not in HARNESS_MODULES]


def _imported_modules(tree: ast.AST, module: str) -> set[str]:
    """Absolute names of the modules imported by the tree of `module` (dotted name)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_core_modules_never_import_the_harness():
    offenders = []
    for path in _core_files():
        module = _module_name(path)
        for name in _imported_modules(ast.parse(path.read_text()), module):
            top = name.split(".")
            if top[0] in HARNESS_IMPORTS or (top[0] == "softsort_tf" and len(top) > 1
                                             and top[1] in HARNESS_MODULES):
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offenders, offenders


# --- The harness imports only public names. ----------------------------------------------


def public_names() -> set[str]:
    """`softsort_tf.__all__`, read from the source (no import needed)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("softsort_tf/__init__.py defines no __all__")


def test_all_lists_the_public_names():
    import softsort_tf

    listed = set(softsort_tf.__all__)
    assert len(listed) == len(softsort_tf.__all__), "duplicates in __all__"
    assert listed == public_names()
    public = {name for name, value in vars(softsort_tf).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert public | {"__version__"} == listed
    for name in listed:
        assert hasattr(softsort_tf, name), name


def _module_name(path: pathlib.Path) -> str | None:
    """The dotted name of a file of the package, `__init__` included (None outside it)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts) if parts[0] == "softsort_tf" else None


def _absolute(node: ast.ImportFrom, module: str | None) -> str:
    if not node.level:
        return node.module or ""
    if module is None:
        raise AssertionError(f"relative import outside the package: line {node.lineno}")
    package = module.split(".")  # `level` 1 is the package holding `module`
    base = package[:len(package) - node.level]
    return ".".join(base + ([node.module] if node.module else []))


def _is_harness(module: str) -> bool:
    parts = module.split(".")
    return len(parts) > 1 and parts[0] == "softsort_tf" and parts[1] in HARNESS_MODULES


def private_uses(source: str, module: str | None = None,
                 public: set[str] | None = None, allowed: frozenset = frozenset()) -> list[str]:
    """The uses of non-public softsort_tf names in `source` (one string per use).

    Allowed: `import softsort_tf [as ss]`, the names of `__all__` (imported from
    `softsort_tf` or read as `ss.name`), and the harness' own modules
    (`softsort_tf.experiments...`, `softsort_tf.datasets...`) with their names that do
    not start with an underscore. `module` is the dotted name of the file (for its
    relative imports); `allowed` holds module names exempted for this file.
    """
    public = public_names() if public is None else public
    tree = ast.parse(source)
    found, aliases = [], set()

    def check_module(name: str, line: int):
        parts = name.split(".")
        if parts[0] != "softsort_tf" or name in allowed or len(parts) == 1:
            return
        if not _is_harness(name) or any(p.startswith("_") for p in parts):
            found.append(f"line {line}: module {name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check_module(alias.name, node.lineno)
                if alias.name.split(".")[0] == "softsort_tf":
                    aliases.add(alias.asname or "softsort_tf")
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module)
            if base.split(".")[0] != "softsort_tf" or base in allowed or all(
                    f"{base}.{alias.name}" in allowed for alias in node.names):
                continue
            check_module(base, node.lineno)
            for alias in node.names:
                name = alias.name
                if base == "softsort_tf":
                    if name not in public and name not in HARNESS_MODULES:
                        found.append(f"line {node.lineno}: softsort_tf.{name}")
                elif name.startswith("_") or name == "*":
                    found.append(f"line {node.lineno}: {base}.{name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases):
            name = node.attr
            if name not in public and name not in HARNESS_MODULES:
                found.append(f"line {node.lineno}: {node.value.id}.{name}")
    return found


def _notebook_code(path: pathlib.Path) -> str:
    """The code cells of a notebook, IPython magics and shell lines left out."""
    cells = json.loads(path.read_text())["cells"]
    lines = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        lines.extend(line for line in source.splitlines()
                     if not line.lstrip().startswith(("!", "%")))
        lines.append("")
    return "\n".join(lines)


def harness_files() -> list[pathlib.Path]:
    files = []
    for sub in HARNESS_MODULES:
        files += sorted((PACKAGE / sub).rglob("*.py"))
    files += sorted((ROOT / "scripts").glob("*.py"))
    files += sorted((ROOT / "colabs").glob("*.ipynb"))
    return files


def test_harness_files_are_found():
    names = {path.relative_to(ROOT).as_posix() for path in harness_files()}
    assert "softsort_tf/experiments/models.py" in names
    assert "softsort_tf/datasets/large_mnist.py" in names
    assert "scripts/train_sort.py" in names
    assert any(name.startswith("colabs/") for name in names)


@pytest.mark.parametrize("path", harness_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_harness_uses_only_public_names(path):
    relative = path.relative_to(ROOT).as_posix()
    source = _notebook_code(path) if path.suffix == ".ipynb" else path.read_text()
    allowed = frozenset(m for f, m in INTERNAL_BENCHMARKS if f == relative)
    uses = private_uses(source, _module_name(path), allowed=allowed)
    assert not uses, f"{relative} uses non-public softsort_tf names: {uses}"


@pytest.mark.parametrize("source, expected", [
    ("import softsort_tf as ss\nss.sinkhorn_rank", 0),
    ("from softsort_tf import sinkhorn_rank, experiments", 0),
    ("from softsort_tf.experiments import training\nfrom softsort_tf.datasets import cqr", 0),
    ("from softsort_tf.experiments.training import fit_resumable", 0),
    ("import softsort_tf.experiments.flags", 0),
    ("from softsort_tf.ops.registry import METHODS", 1),
    ("import softsort_tf.ops.registry", 1),
    ("from softsort_tf.losses import ranking", 1),
    ("from softsort_tf import _checks", 1),
    ("from softsort_tf import ops", 1),
    ("from softsort_tf.experiments.training import _helper", 1),
    ("import softsort_tf as ss\nss.ops.registry.METHODS", 1),
    ("import softsort_tf\nsoftsort_tf._masking", 1),
    ("from softsort_tf.experiments import *", 1),
])
def test_private_use_checker(source, expected):
    assert len(private_uses(source, public={"sinkhorn_rank"})) == expected


def test_relative_imports_resolve_in_the_package():
    source = "from .training import _x\nfrom ..ops import registry\nfrom . import models"
    uses = private_uses(source, "softsort_tf.experiments.knn", public=set())
    assert uses == ["line 1: softsort_tf.experiments.training._x",
                    "line 2: module softsort_tf.ops"]

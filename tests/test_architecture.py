"""The module graph of the core package: layered, without cycles.

Read from the source (imports at any depth, `from x import y` resolved to modules), so
the test sees what a reader sees and needs no import side effects.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "softsort_tf"
HARNESS = ("softsort_tf.experiments", "softsort_tf.datasets")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _core_modules() -> dict[str, pathlib.Path]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: p for m, p in modules.items() if not m.startswith(HARNESS)}


def _imports(path: pathlib.Path, modules) -> set[str]:
    """The core modules that `path` imports (a package's `__init__` only when imported
    as such)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            if name in modules:
                found.add(name)
                if isinstance(node, ast.ImportFrom) and name != node.module:
                    continue  # `from package import module`: the module, not the package
    return found


def _graph():
    modules = _core_modules()
    graph = {m: _imports(p, modules) - {m} for m, p in modules.items()}
    # `from softsort_tf.ops import sinkhorn` names the submodule: drop the bare package
    # edge when a submodule of it was named by the same statement.
    for targets in graph.values():
        for t in list(targets):
            if any(o.startswith(t + ".") for o in targets) and _is_package(t):
                targets.discard(t)
    return graph


def _is_package(module: str) -> bool:
    return (PACKAGE.parent / module.replace(".", "/") / "__init__.py").exists()


GRAPH = _graph()


def _edges(source_prefix: str, target_prefix: str):
    return sorted((m, t) for m, targets in GRAPH.items() if m.startswith(source_prefix)
                  for t in targets if t.startswith(target_prefix))


@pytest.mark.parametrize("source, target", [
    ("softsort_tf.options", "softsort_tf.ops"),
    ("softsort_tf.options", "softsort_tf.solvers"),
    ("softsort_tf.solvers", "softsort_tf.ops"),
    ("softsort_tf.ops", "softsort_tf.losses"),
    ("softsort_tf.ops", "softsort_tf.metrics"),
    ("softsort_tf.ops", "softsort_tf.layers"),
    ("softsort_tf.layers", "softsort_tf.losses"),
    ("softsort_tf.metrics", "softsort_tf.losses"),
    ("softsort_tf.losses", "softsort_tf.metrics"),
    ("softsort_tf.losses", "softsort_tf.layers"),
])
def test_no_arrow_against_the_layering(source, target):
    assert _edges(source, target) == []


def test_no_import_cycle():
    """Depth-first search for a cycle among the core modules (the package's own
    `__init__` re-exports everything and is left out)."""
    graph = {m: {t for t in ts if t != "softsort_tf"} for m, ts in GRAPH.items()
             if m != "softsort_tf"}
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == "open":
                cycle = stack[stack.index(t):] + [t]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_the_graph_is_read():
    """The reader finds known arrows (so the tests above can fail)."""
    assert "softsort_tf.solvers.sinkhorn" in GRAPH["softsort_tf.ops.transport"]
    assert "softsort_tf.options" in GRAPH["softsort_tf.solvers.sinkhorn"]


def test_no_private_name_imported_from_another_subpackage():
    """`from softsort_tf.a.b import _name` only within the subpackage `softsort_tf.a`
    (the package's private helper modules `softsort_tf._x` may be imported anywhere)."""
    modules = _core_modules()
    offenders = []
    for module, path in modules.items():
        home = module.split(".")[1] if module.count(".") >= 1 else ""
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith("softsort_tf.")):
                continue
            source_home = node.module.split(".")[1]
            for alias in node.names:
                if (alias.name.startswith("_") and not alias.name.startswith("__")
                        and f"{node.module}.{alias.name}" not in modules
                        and source_home != home):
                    offenders.append(f"{module}: from {node.module} import {alias.name}")
    assert offenders == []


def test_autograph_leaves_the_core_alone_and_converts_the_harness():
    """Library functions reached from a user's `tf.function` are called as written (their
    control flow on tensors is explicit), not parsed and rewritten on every trace; the
    harness' helpers are converted like any user code."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.autograph.impl import conversion

    import softsort_tf as ss
    import softsort_tf.experiments.models as models
    from softsort_tf import _lists as ranking
    from softsort_tf.losses import spearman

    for fn in (spearman.soft_spearman_correlation, ranking.padded_lists, ss.soft_rank,
               ss.metrics.ranking.ndcg, ss.SpearmanLoss.call):
        assert conversion.is_allowlisted(fn), fn
    assert not conversion.is_allowlisted(models.operator_kwargs)

    @tf.function
    def user_code(scores):  # a Python `if` on a tensor: autograph still converts user code
        ranks = ss.soft_rank(scores, method="softsort")
        if tf.reduce_sum(ranks) > 0:
            return ranks
        return -ranks

    np.testing.assert_allclose(user_code(tf.constant([[3.0, 1.0, 2.0]])).numpy(),
                               ss.soft_rank(tf.constant([[3.0, 1.0, 2.0]]),
                                            method="softsort").numpy(), atol=1e-6)


def test_one_autograph_mechanism():
    """The package is kept from autograph in one place (`softsort_tf._autograph.register`),
    not function by function: no `do_not_convert` in the core package."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if {"experiments", "datasets"} & set(path.relative_to(PACKAGE).parts):
            continue
        if "do_not_convert" in path.read_text():
            offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []


def _family_modules() -> dict[str, str]:
    """Family name -> the module whose top level holds its `Family` record."""
    import sys

    import softsort_tf as ss

    owners = {}
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith("softsort_tf.") or module is None:
            continue
        for value in vars(module).values():
            if isinstance(value, ss.Family) and value.name not in owners:
                if ss.FAMILIES.get(value.name) is value:
                    owners[value.name] = module_name
    return owners


def _name_branches(path: pathlib.Path, names) -> list[tuple[int, str]]:
    """`(line, name)` of each comparison with a family name (`method == "sinkhorn"`,
    `method in ("lapsum", ...)`) and each dict keyed by one (a lookup by name)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        constants = []
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                elements = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) \
                    else [side]
                constants += [e.value for e in elements if isinstance(e, ast.Constant)]
        elif isinstance(node, ast.Dict):
            constants += [k.value for k in node.keys if isinstance(k, ast.Constant)]
        found += [(node.lineno, c) for c in constants if isinstance(c, str) and c in names]
    return found


def test_no_branch_on_a_family_name_outside_the_family_module():
    """A family is one record plus its maths: no other module of the package (harness
    included) compares a `method` with a family's name or looks one up in a dict keyed
    by family names; they read the record instead (its temperature, operations, masks,
    settings)."""
    owners = _family_modules()
    assert set(owners) == {"sinkhorn", "lapsum", "permutahedron", "softsort", "neuralsort",
                           "sorting_network"}
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for line, name in _name_branches(path, set(owners)):
            if owners[name] != module:
                offenders.append(f"{module}:{line} ({name!r})")
    assert not offenders, offenders


def test_the_name_branch_detector_finds_branches(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('if method == "sinkhorn":\n    pass\nx = method in ("lapsum",)\n'
                    'y = {"softsort": 1}[method]\nz = f("sinkhorn")\n')
    assert _name_branches(path, {"sinkhorn", "lapsum", "softsort"}) == [
        (1, "sinkhorn"), (3, "lapsum"), (4, "softsort")]


def test_ops_holds_operators_not_loss_and_metric_helpers():
    """A module of `softsort_tf.ops` serves the operators: some module outside the losses
    and metrics (an operator, a layer, the package's exports) imports it. Helpers that
    only losses and metrics use (the conventions of ranked lists, permutation targets,
    regression errors) live beside them, in the package's private modules."""
    importers = {}
    for module, targets in GRAPH.items():
        for target in targets:
            importers.setdefault(target, set()).add(module)
    loss_or_metric = ("softsort_tf.losses", "softsort_tf.metrics")
    only_losses = sorted(
        m for m in GRAPH if m.startswith("softsort_tf.ops.")
        and importers.get(m) and all(i.startswith(loss_or_metric) for i in importers[m]))
    assert not only_losses, only_losses
    assert "softsort_tf._lists" in GRAPH and "softsort_tf.ops.ranking" not in GRAPH

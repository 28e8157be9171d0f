"""The reference pages list what they document: every flag (docs/binaries.md) and every
public name (docs/api.md)."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _flag_names(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr.startswith("DEFINE_") and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value)
        # The harness' flag table: `_FLAGS = {"name": (type, help), ...}`.
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "_FLAGS" for t in node.targets)):
            names.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return names


def test_every_flag_is_documented():
    sources = [*ROOT.glob("scripts/train_*.py"), *ROOT.glob("scripts/run_*.py"),
               ROOT / "scripts" / "tune.py", ROOT / "softsort_tf" / "experiments" / "flags.py"]
    names = set().union(*(_flag_names(p) for p in sources))
    # The reader finds the flags, those of the shared table among them.
    assert {"output_dir", "epochs", "learning_rate", "strategy", "n", "method"} <= names
    text = (ROOT / "docs" / "binaries.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"--([a-z_0-9]+)", text)) | set(re.findall(r"`([a-z_0-9]+)`", text))
    missing = sorted(names - documented)
    assert not missing, f"docs/binaries.md does not document {missing}"


def test_every_public_name_is_in_the_api_page():
    import softsort_tf as ss
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    missing = [name for name in ss.__all__ if not name.startswith("__")
               and not re.search(r"\b" + re.escape(name) + r"\b", text)]
    assert not missing, f"docs/api.md does not list {missing}"


def test_every_test_path_named_in_the_docs_exists():
    # The guides point readers at tests by path; CHANGELOG.md is history and may not.
    texts = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("scripts/*.py"),
             *ROOT.glob("softsort_tf/**/*.py")]
    named = {path for p in texts
             for path in re.findall(r"tests/[A-Za-z0-9_/]+\.py", p.read_text(encoding="utf-8"))}
    assert named  # the pattern finds the references
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, f"the docs name tests that do not exist: {missing}"

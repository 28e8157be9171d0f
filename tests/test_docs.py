"""docs/binaries.md lists every flag the binaries define."""

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
    return names


def test_every_flag_is_documented():
    sources = [*ROOT.glob("scripts/train_*.py"), *ROOT.glob("scripts/run_*.py"),
               ROOT / "scripts" / "tune.py", ROOT / "softsort_tf" / "experiments" / "flags.py"]
    names = set().union(*(_flag_names(p) for p in sources))
    assert len(names) > 20  # the reader finds the flags
    text = (ROOT / "docs" / "binaries.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"--([a-z_0-9]+)", text)) | set(re.findall(r"`([a-z_0-9]+)`", text))
    missing = sorted(names - documented)
    assert not missing, f"docs/binaries.md does not document {missing}"

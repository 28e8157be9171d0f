"""Every ```python block of README.md runs, in order, in one namespace."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_shows_the_two_setup_commands_first():
    text = README.read_text(encoding="utf-8")
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", text, re.S).group(1)
    assert "make demo" in first_block and "make test" in first_block


def test_readme_examples_run(tmp_path, monkeypatch):
    blocks = python_blocks()
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    for i, block in enumerate(blocks):
        code = compile(block, f"README.md python block {i}", "exec")
        exec(code, namespace)  # noqa: S102


def test_readme_gives_a_command_for_every_training_binary_and_grid_driver():
    folder = README.parent / "scripts"
    scripts = sorted(p.name for pattern in ("train_*.py", "run_*.py")
                     for p in folder.glob(pattern))
    assert len(scripts) >= 8
    text = README.read_text(encoding="utf-8")
    missing = [s for s in scripts if f"python scripts/{s} " not in text]
    assert not missing, f"README has no command line for {missing}"

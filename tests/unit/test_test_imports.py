"""Test modules import helper modules, never another test module (importing one runs its module
code a second time under another name and ties two test files together)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEST_MODULE = re.compile(r"^tests(\.\w+)*\.test_\w+$")


def imports_of_test_modules(root: Path) -> list[str]:
    """``path:line module`` for each import of a ``tests...test_*`` module in the .py files under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names if TEST_MODULE.match(n)]
    return found


def test_no_test_module_imports_another() -> None:
    assert imports_of_test_modules(REPO / "tests") == []
    assert imports_of_test_modules(REPO / "bench") == []


def test_the_check_finds_such_an_import(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text("from tests.unit.test_report import SCHEMA\nimport tests.unit.reports\n")
    (tmp_path / "b.py").write_text("def f():\n    from tests.integration.test_inject import running\n")
    assert imports_of_test_modules(tmp_path) == [
        "b.py:2 tests.integration.test_inject",
        "test_a.py:1 tests.unit.test_report",
    ]

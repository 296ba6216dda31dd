"""The parts of torchwatch and the arrows allowed between them (pyproject's [tool.importlinter] contracts).

import-linter builds the package's import graph (direct and indirect imports) and checks each
contract: the hook channel (wire) imports the standard library only, the hook imports no part but
wire, no part imports the hook but its boot path, the core never imports a face or the CLI, the
faces read only the model, sources and analysis stay apart.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import torchwatch

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
PACKAGE = Path(torchwatch.__file__).parent
LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(sys.argv[1], no_cache=True))"
# pyproject's names of the contracts about the hook and its channel
WIRE_ALONE = "The hook channel (wire) imports the standard library only: no other part, no third-party package"
HOOK_ALONE = "The in-process hook imports the channel (wire), the standard library and torch (lazily) only"
HOOK_BY_BOOT_PATH = "No part imports the in-process hook but the boot path"
HOOK_PARTS = "The hook's parts (patches, steps, requests, traces, burst, trial) never import its runtime"
MAX_WIRE_LINES = 400  # issue 34: each section of the hook channel's contract stays readable on its own


def lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with pyproject's contracts, importing torchwatch as found from ``cwd``."""
    return subprocess.run(
        [sys.executable, "-c", LINT, str(PYPROJECT)], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def copy_with(tmp_path: Path, additions: dict[str, str]) -> Path:
    """A copy of the package under ``tmp_path`` with ``additions`` (``{path in the package: line}``)
    appended to its modules; returns the folder to lint from (the copy comes first on sys.path)."""
    copy = tmp_path / "torchwatch"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, line in additions.items():
        module = copy / rel
        module.write_text(module.read_text() + f"\n{line}  # noqa\n")
    return tmp_path


def test_the_import_contracts_hold() -> None:
    result = lint(PYPROJECT.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_forbidden_arrow_breaks_its_contract(tmp_path: Path) -> None:
    """A copy of the package where the analysis imports the report: the check names the contract."""
    result = lint(copy_with(tmp_path, {"analysis/features/__init__.py": "import torchwatch.faces.report"}))
    assert result.returncode != 0
    assert "The core (model, sources, analysis, watch) never imports a face or the CLI BROKEN" in " ".join(
        result.stdout.split()
    )
    assert "torchwatch.analysis.features -> torchwatch.faces.report" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract", "chain"),
    [
        (
            "model/units.py",
            "import torchwatch.hook.runtime",
            HOOK_BY_BOOT_PATH,
            "torchwatch.model.units -> torchwatch.hook.runtime",
        ),
        (
            "wire/records.py",
            "import psutil",
            WIRE_ALONE,
            "torchwatch.wire.records -> psutil",
        ),
        (
            "wire/base.py",
            "import torchwatch.model.units",
            WIRE_ALONE,
            "torchwatch.wire.base -> torchwatch.model.units",
        ),
        (
            "hook/gpu.py",
            "import torchwatch.sources.nvml",
            HOOK_ALONE,
            "torchwatch.hook.gpu -> torchwatch.sources.nvml",
        ),
        (
            "hook/steps.py",
            "from torchwatch.hook import runtime",
            HOOK_PARTS,
            "torchwatch.hook.steps -> torchwatch.hook.runtime",
        ),
    ],
)
def test_the_hook_and_its_channel_keep_to_themselves(
    tmp_path: Path, module: str, line: str, contract: str, chain: str
) -> None:
    """A copy where the model imports the hook's runtime, the channel imports psutil or the model,
    or the hook imports a source: the contract breaks, named with the import that broke it."""
    result = lint(copy_with(tmp_path, {module: line}))
    assert result.returncode != 0
    assert f"{contract} BROKEN" in " ".join(result.stdout.split())
    assert chain in result.stdout


def test_each_module_of_the_channel_is_short() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in (PACKAGE / "wire").glob("*.py")}
    assert len(sizes) > 10 and "records.py" in sizes
    assert {name: n for name, n in sizes.items() if n > MAX_WIRE_LINES} == {}


def imported_top_modules(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports (in functions too); ``torchwatch.wire``
    counts as ``torchwatch.wire``, and a relative import as the absolute name it resolves to."""
    names: set[str] = set()
    package = ".".join(path.relative_to(PACKAGE.parent).parent.parts)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                names.add(node.module or "")
                continue
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            names.add(f"{base}.{node.module}" if node.module else base)
    return {n if n.startswith("torchwatch.") or n == "torchwatch" else n.split(".")[0] for n in names}


def test_the_hook_and_its_channel_import_torchwatch_only_relatively() -> None:
    """``torchwatch run`` and ``attach`` load the hook by path under a private name when the training's
    ``torchwatch`` is another package (:mod:`torchwatch.wire.bypath`): an absolute ``torchwatch``
    import in the hook or its channel would reach that other package."""
    absolute = []
    for path in [*(PACKAGE / "wire").glob("*.py"), *(PACKAGE / "hook").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                absolute += [
                    f"{path.name}: import {a.name}" for a in node.names if a.name.split(".")[0] == "torchwatch"
                ]
            elif (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").split(".")[0] == "torchwatch"
            ):
                absolute.append(f"{path.name}: from {node.module}")
    assert absolute == []


def test_the_channel_imports_the_standard_library_only() -> None:
    """What the contract's list of third-party packages cannot say: nothing at all outside the
    standard library (the hook runs it inside the user's training)."""
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    outside = {
        p.name: sorted(m for m in imported_top_modules(p) if m not in stdlib and not m.startswith("torchwatch.wire"))
        for p in (PACKAGE / "wire").glob("*.py")
    }
    assert {name: mods for name, mods in outside.items() if mods} == {}
    assert imported_top_modules(PACKAGE / "wire" / "files.py") >= {"os", "json", "torchwatch.wire.identity"}

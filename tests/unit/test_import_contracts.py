"""The parts of torchwatch and the arrows allowed between them (pyproject's [tool.importlinter] contracts).

import-linter builds the package's import graph (direct and indirect imports) and checks each
contract: the hook imports no other part, the core never imports a face or the CLI, the faces
read only the model, sources and analysis stay apart.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import torchwatch

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(sys.argv[1], no_cache=True))"


def lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with pyproject's contracts, importing torchwatch as found from ``cwd``."""
    return subprocess.run(
        [sys.executable, "-c", LINT, str(PYPROJECT)], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_the_import_contracts_hold() -> None:
    result = lint(PYPROJECT.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_a_forbidden_arrow_breaks_its_contract(tmp_path: Path) -> None:
    """A copy of the package where the analysis imports the report: the check names the contract."""
    copy = tmp_path / "torchwatch"
    shutil.copytree(Path(torchwatch.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    features = copy / "analysis" / "features.py"
    features.write_text(features.read_text() + "\nimport torchwatch.faces.report  # noqa\n")
    result = lint(tmp_path)  # the copy comes first on sys.path
    assert result.returncode != 0
    assert "The core (model, sources, analysis, watch) never imports a face or the CLI BROKEN" in " ".join(
        result.stdout.split()
    )
    assert "torchwatch.analysis.features -> torchwatch.faces.report" in result.stdout

"""The docs in the repository cover every rule, and no user-facing text points outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import torchwatch
from torchwatch.analysis.rules_engine import builtin_dir, load_dir

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


@pytest.mark.skipif(not DOCS.is_dir(), reason="the docs are not installed with the package")
def test_every_rule_has_its_threshold_documented() -> None:
    text = (DOCS / "thresholds.md").read_text()
    missing = [r.id for r in load_dir(builtin_dir()) if f"`{r.id}`" not in text]
    assert not missing, f"docs/thresholds.md does not list {missing}"


def test_rule_sources_and_code_cite_nothing_outside_the_repository() -> None:
    outside = re.compile(r"\b(DESIGN|FIELD|STYLE)\.md\b")
    files = [*builtin_dir().glob("*.toml"), *Path(torchwatch.__file__).parent.glob("**/*.py")]
    files += [REPO / "README.md", *DOCS.glob("*.md")] if DOCS.is_dir() else []
    cited = [str(f) for f in files if f.exists() and outside.search(f.read_text())]
    assert not cited

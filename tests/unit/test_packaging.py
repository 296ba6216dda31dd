"""The wheel ships every package of the source tree: ``pyproject.toml`` lists its packages by hand
(``[tool.setuptools] packages``), and a package missing there installs fine in editable mode and
breaks every non-editable install (the CI's wheel check once failed: ``No module named
'torchwatch.cli.commands'``)."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the runtime dependency tomli on 3.10, as torchwatch's rules engine reads TOML
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

REPO = Path(__file__).resolve().parents[2]


def test_every_package_of_the_tree_is_listed_for_the_wheel() -> None:
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    tree = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in (REPO / "torchwatch").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert tree, "no package found under torchwatch/"
    assert tree <= listed, f"not in pyproject.toml's [tool.setuptools] packages: {sorted(tree - listed)}"

"""A stand-in package named torchwatch (another project's), for the by-path install tests."""

from __future__ import annotations

from pathlib import Path


def stand_in(where: Path) -> Path:
    """A package named ``torchwatch`` 0.0.0 with no hook (like the package index's placeholder),
    installed (with its metadata) in directory ``where``."""
    (where / "torchwatch").mkdir(parents=True)
    (where / "torchwatch" / "__init__.py").write_text('__version__ = "0.0.0"\nSTAND_IN = True\n')
    info = where / "torchwatch-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchwatch\nVersion: 0.0.0\n")
    return where

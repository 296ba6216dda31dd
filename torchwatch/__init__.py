"""torchwatch: tells a PyTorch user, live, why their training is slow and what to change."""

from __future__ import annotations

# The version lives in pyproject.toml only; it is read from the installed metadata when asked
# for (not at import: the hook imports this package inside the training).


def __getattr__(name: str) -> str:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("torchwatch")
        except PackageNotFoundError:  # a source tree on sys.path, not installed
            return "0+unknown"
    raise AttributeError(f"module 'torchwatch' has no attribute {name!r}")

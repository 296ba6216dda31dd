"""torchwatch: tells a PyTorch user, live, why their training is slow and what to change."""

from __future__ import annotations

# The distribution's name on the package index (pyproject.toml's [project] name): the import
# name and the command are "torchwatch", which on the index is an unrelated placeholder.
DISTRIBUTION = "torchwatch-live"

# The version lives in pyproject.toml only; it is read from the installed metadata when asked
# for (not at import: the hook imports this package inside the training).


def __getattr__(name: str) -> str:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(DISTRIBUTION)
        except PackageNotFoundError:  # a source tree on sys.path, not installed
            return "0+unknown"
    raise AttributeError(f"module 'torchwatch' has no attribute {name!r}")


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext torchwatch`` in a Jupyter notebook: the ``%torchwatch`` magic (:mod:`torchwatch.notebook`)."""
    from torchwatch.notebook import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    """``%unload_ext torchwatch``: stops the kernel's watcher."""
    from torchwatch.notebook import unload_ipython_extension as unload

    unload(ipython)

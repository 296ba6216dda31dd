"""Loading this torchwatch's hook into a training by path, never by the import name.

The training's environment may hold another package named ``torchwatch`` (the package index's
0.0.0 placeholder, ``torchwatch-tui``, an older torchwatch): importing ``torchwatch.hook`` by
name there gets that one, or nothing. :func:`load` imports a module of the torchwatch package in
a given directory: by its name when the name already resolves to that very package (the same
``__init__.py``), otherwise under the private top-level name :data:`PRIVATE`, so that the
training's own ``import torchwatch`` still gets its own package and ``sys.modules["torchwatch"]``
is never touched. The hook and its channel (``torchwatch.hook``, ``torchwatch.wire``) import each
other with relative imports only, so they work under either name.

Standard library only, and self-contained: the boot (``torchwatch/hook/boot/sitecustomize.py``)
executes this file by its path, and ``torchwatch attach``'s injected code embeds its source
(:mod:`torchwatch.inject.payload`). It is not re-exported by :mod:`torchwatch.wire`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

# The name the package is loaded under when "torchwatch" is someone else's in the training.
PRIVATE = "_torchwatch_by_path"
NAME = "torchwatch"


def _origin(name: str) -> str | None:
    """The file top-level module ``name`` is (or would be) imported from, without importing it."""
    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None)
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return None if spec is None else spec.origin


def _same_file(a: str | None, b: str) -> bool:
    try:
        return a is not None and os.path.samefile(a, b)
    except OSError:
        return False


def load(root: str, name: str) -> ModuleType:
    """Import module ``name`` (``torchwatch`` or ``torchwatch.X.Y``) of the torchwatch package in
    directory ``root`` (the directory holding ``torchwatch/__init__.py``).

    Returns:
        The module: ``sys.modules[name]`` when ``import torchwatch`` resolves to ``root``'s
        package; otherwise the same module under :data:`PRIVATE` (``_torchwatch_by_path.X.Y``),
        loaded once per process and reused (a second call with the same ``root`` gets the same
        modules, so ``torchwatch run``'s hook and ``torchwatch attach``'s injected code share one).

    Raises:
        ImportError: ``name`` is not in the torchwatch package, ``root`` holds no torchwatch
            package, :data:`PRIVATE` is already a torchwatch from another directory, or the
            package cannot be imported by this interpreter (the message says why).
    """
    if name != NAME and not name.startswith(NAME + "."):
        raise ImportError(f"{name} is not a module of the torchwatch package")
    package = os.path.join(root, NAME)
    init = os.path.join(package, "__init__.py")
    if not os.path.isfile(init):
        raise ImportError(f"no torchwatch package in {root}")
    if _same_file(_origin(NAME), init):
        return importlib.import_module(name)
    top = sys.modules.get(PRIVATE)
    if top is None:
        spec = importlib.util.spec_from_file_location(PRIVATE, init, submodule_search_locations=[package])
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {init}")
        top = importlib.util.module_from_spec(spec)
        sys.modules[PRIVATE] = top
        try:
            spec.loader.exec_module(top)
        except BaseException:
            sys.modules.pop(PRIVATE, None)
            raise
    elif not _same_file(getattr(top, "__file__", None), init):
        raise ImportError(f"{PRIVATE} is already the torchwatch in {os.path.dirname(str(top.__file__))}, not {package}")
    return importlib.import_module(PRIVATE + name[len(NAME) :])

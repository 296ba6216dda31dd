"""torchwatch's bootstrap: ``torchwatch run`` puts this directory first on ``PYTHONPATH``.

It installs the hook when ``TORCHWATCH_HOOK=1`` (the hook itself decides whether this process
is a training process), loaded from this torchwatch's own directory whatever ``torchwatch``
the training's environment holds, then runs the ``sitecustomize`` that would have run without it. It
never raises: a failure costs the hook, never the training.
"""

import os
import sys

# a failure is said once per training (the first process to fail writes the note): the report
# reads it (TORCHWATCH_BOOT_NOTE, a file in a directory torchwatch run made for it)
_NOTE_BYTES = 400


def _note(line: str) -> None:
    """Say why the hook is not loaded: in the note file ``torchwatch run`` reads, and on stderr."""
    line = " ".join(line.split())[:_NOTE_BYTES]
    path = os.environ.get("TORCHWATCH_BOOT_NOTE")
    if path:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except OSError:
            return  # another process of the training said it first (or the directory is gone)
        try:
            os.write(fd, line.encode("utf-8", "replace")[:_NOTE_BYTES])
        finally:
            os.close(fd)
    sys.stderr.write(f"torchwatch hook: not installed: {line}\n")


def _torchwatch_boot() -> None:
    """Load *this* torchwatch's hook by its path (``torchwatch.wire.bypath``), never by the name
    ``torchwatch``, which in the training's environment may be another package: the training's own
    ``import torchwatch`` is left as it was."""
    if os.environ.get("TORCHWATCH_HOOK") != "1":
        return
    import importlib.util

    # this file is <root>/torchwatch/hook/boot/sitecustomize.py: the hook comes from the same install
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    where = os.path.join(root, "torchwatch", "wire", "bypath.py")
    if not os.path.isfile(where) and os.environ.get("TORCHWATCH_HOOK_PATH"):
        root = os.environ["TORCHWATCH_HOOK_PATH"]  # the boot directory was copied away from its install
        where = os.path.join(root, "torchwatch", "wire", "bypath.py")
    try:
        if not os.path.isfile(where):
            raise ImportError(f"{where} is missing")
        spec = importlib.util.spec_from_file_location("_torchwatch_bypath", where)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot read {where}")
        bypath = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bypath)
        hook = bypath.load(root, "torchwatch.hook")
    except Exception as exc:
        python = f"{sys.version_info[0]}.{sys.version_info[1]}"
        _note(f"this torchwatch ({root}) could not be loaded by Python {python} ({sys.executable}): {exc!r}")
        return
    hook.install()


def _chain() -> None:
    """Run the next ``sitecustomize`` on sys.path, as if this one were not there."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _torchwatch_boot()
except Exception as exc:
    sys.stderr.write(f"torchwatch hook: not installed: {exc!r}\n")
try:
    _chain()
except Exception:
    # the user's own sitecustomize failed: report it as Python would have
    import traceback

    traceback.print_exc()

"""torchwatch's bootstrap: ``torchwatch run`` puts this directory first on ``PYTHONPATH``.

It installs the hook when ``TORCHWATCH_HOOK=1`` (the hook itself decides whether this process
is a training process), then runs the ``sitecustomize`` that would have run without it. It
never raises: a failure costs the hook, never the training.
"""

import os
import sys


def _torchwatch_boot() -> None:
    if os.environ.get("TORCHWATCH_HOOK") != "1":
        return
    try:
        import torchwatch.hook as hook
    except ImportError:
        # This interpreter lacks torchwatch: borrow the package torchwatch runs from, without
        # putting that directory ahead of the user's own packages.
        where = os.environ.get("TORCHWATCH_HOOK_PATH")
        if not where:
            return
        sys.path.append(where)
        try:
            import torchwatch.hook as hook
        except ImportError:
            return
        finally:
            if where in sys.path:
                sys.path.remove(where)
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

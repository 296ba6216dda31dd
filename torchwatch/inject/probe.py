"""The entry point :func:`torchwatch.inject.injector.inject` runs by default: it only reports back.

Standard library only, and it changes nothing in the process it runs in. Part of what
``torchwatch doctor`` and the tests use to show that code reaches a live process.
"""

from __future__ import annotations

import _thread
import os
import sys
from typing import Any


def run() -> dict[str, Any]:
    """Facts about the process this runs in.

    Returns:
        ``{"pid", "python" ("3.12.1"), "executable", "main_thread" (whether this runs on the
        main thread; ``None`` when the process never imported ``threading``), "torch" (version,
        or ``None`` when torch is not imported), "threading" (whether it is imported)}``.
        ``threading`` is looked up, never imported: imported first from another thread it
        would take that thread for the main one.
    """
    torch = sys.modules.get("torch")
    threading = sys.modules.get("threading")
    main = getattr(threading, "main_thread", None)
    return {
        "pid": os.getpid(),
        "python": ".".join(str(v) for v in sys.version_info[:3]),
        "executable": sys.executable,
        "main_thread": None if main is None else main().ident == _thread.get_ident(),
        "torch": getattr(torch, "__version__", None) if torch is not None else None,
        "threading": threading is not None,
    }

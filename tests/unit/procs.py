"""Process-tree test helpers: a process node with given facts."""

from __future__ import annotations

import ctypes
import threading

PY = "/usr/bin/python3.11"


TRAIN = (PY, "train.py", "--epochs", "1")


def node(
    ppid: int, cmdline: tuple[str, ...], name: str | None = None, exe: str = PY
) -> tuple[int, str, tuple[str, ...], str]:
    return (ppid, name or cmdline[0].rsplit("/", 1)[-1], cmdline, exe)


def _named_thread(name: bytes, spin: threading.Event, stop: threading.Event) -> None:
    """A thread that names itself (prctl PR_SET_NAME, as c10::setThreadName does), then spins while
    ``spin`` is set, until ``stop``."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
    while not stop.is_set():
        if not spin.is_set():
            spin.wait(0.01)

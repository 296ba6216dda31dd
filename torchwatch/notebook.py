"""Watching a Jupyter kernel from its notebook: ``%load_ext torchwatch``, then ``%torchwatch``.

``%torchwatch`` installs the hook in the kernel it runs in (on the kernel's main thread, as
``torchwatch attach`` would inject it: :func:`torchwatch.hook.live.install`) and starts the watcher as
a separate process, ``torchwatch attach KERNEL_PID --headless --no-inject``; a thread of the kernel
reads the watcher's status lines and updates one display in the notebook (the verdict, its
confidence, data wait, loop CPU, ...), also while another cell runs. ``%torchwatch stop`` stops the
watcher and shows its report there. The watcher ends by itself when the kernel exits (``attach``
ends with its target); the kernel also stops it at exit (``atexit``) and when the extension is
unloaded.

IPython is imported only here, when the extension loads: torchwatch does not depend on it.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import signal
import subprocess
import sys
import threading
from typing import Any

STOP_WAIT_S = 15.0  # the watcher writes its report after SIGINT: how long the kernel waits for it


class Watcher:
    """The watcher process of this kernel and the display it updates.

    Args:
        show: called with the text to show (the latest status line, then the report).
        pid: the process to watch (default this kernel).
    """

    def __init__(self, show: Any, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.show = show
        self.last = "torchwatch: starting"
        self.report = ""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchwatch", "attach", str(self.pid), "--headless", "--no-inject"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a Ctrl-C (kernel interrupt) of the notebook is not the watcher's
        )
        self._out = threading.Thread(target=self._read_report, daemon=True, name="torchwatch-report")
        self._err = threading.Thread(target=self._read_status, daemon=True, name="torchwatch-status")
        self._out.start()
        self._err.start()

    def _read_status(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            line = line.rstrip()
            if line.startswith("torchwatch"):
                self.last = line
                with contextlib.suppress(Exception):
                    self.show(line)

    def _read_report(self) -> None:
        assert self.proc.stdout is not None
        self.report = self.proc.stdout.read()

    def stop(self) -> str:
        """Stop the watcher (SIGINT: it writes its report) and return the report (or the last status)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.join(STOP_WAIT_S)
        return self.report.strip() or self.last


_WATCHER: Watcher | None = None


def _install_hook() -> str:
    """Install torchwatch's hook in this kernel (as ``attach`` injects it); one line saying what happened."""
    live = importlib.import_module("torchwatch.hook.live")  # the hook, as attach's injected code loads it
    done: dict[str, Any] = live.install()
    if done.get("installed"):
        return "hook installed" if not done.get("already") else "hook already there"
    return f"no hook: {done.get('reason')}"


def start(show: Any) -> str:
    """``%torchwatch``: hook this kernel and start its watcher (once); one line for the notebook."""
    global _WATCHER
    if _WATCHER is not None and _WATCHER.proc.poll() is None:
        return f"torchwatch: already watching this kernel (PID {_WATCHER.pid}); %torchwatch stop ends it"
    said = _install_hook()
    _WATCHER = Watcher(show)
    return f"torchwatch: watching this kernel (PID {_WATCHER.pid}; {said}); %torchwatch stop ends it"


def stop() -> str:
    """``%torchwatch stop``: the watcher's report ("" when none was running)."""
    global _WATCHER
    watcher, _WATCHER = _WATCHER, None
    return "" if watcher is None else watcher.stop()


atexit.register(stop)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext torchwatch``: registers the ``%torchwatch`` line magic."""
    from IPython.display import display

    def magic(line: str) -> None:
        if line.strip() == "stop":
            print(stop() or "torchwatch: not watching")
            return
        if line.strip():
            print("torchwatch: %torchwatch starts watching this kernel, %torchwatch stop ends it")
            return
        handle = display({"text/plain": "torchwatch: starting"}, raw=True, display_id=True)  # type: ignore[no-untyped-call]

        def show(text: str) -> None:
            handle.update({"text/plain": text}, raw=True)

        print(start(show))

    ipython.register_magic_function(magic, "line", "torchwatch")


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext torchwatch``: stops the watcher."""
    stop()

"""A private tmux server for the tests that drive the real TUI in a terminal (the tmux tests of
``tests/integration``)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable

import psutil

_ENV = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE", "COLUMNS", "LINES")}
"""The environment for the test's own tmux server and the app in its pane. A suite run inside tmux
would hand the outer session's ``TMUX`` to the server; and pytest-xdist's workers carry ``COLUMNS``
and ``LINES`` of the terminal the suite was started in (200 and 50 in a 200×50 tmux window), which
Textual (``shutil.get_terminal_size``) takes over the 80×24 pane's own size: the app drew for 200×50
and the pane showed only its last lines, so both TUI tests failed when the suite ran in a tmux window."""


class Tmux:
    """A private tmux server (its own socket); its session ``tw`` is made by the test (its size with it)."""

    def __init__(self) -> None:
        self.socket = f"torchwatch-test-{os.getpid()}-{time.monotonic_ns()}"

    def __call__(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True, timeout=10, env=_ENV
        ).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "tw")

    def history(self) -> str:
        """The pane and the 500 lines above it (the report printed after the app is longer than
        24 rows), wrapped lines joined."""
        return self("capture-pane", "-p", "-J", "-S", "-500", "-t", "tw")

    def wait_for(self, found: Callable[[str], bool], seconds: float, also: Callable[[], None] = lambda: None) -> str:
        deadline = time.monotonic() + seconds
        screen = ""
        while time.monotonic() < deadline:
            also()
            screen = self.screen()
            if found(screen):
                return screen
            time.sleep(0.25)
        return screen

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10, env=_ENV)


def descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

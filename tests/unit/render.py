"""TUI test helpers: a Rich renderable as plain text, a launched training as WatchApp sees it, and a
run of the app against a recorded watch."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from rich.console import Console

from tests.unit.recorded import NOW, RecordedWatch
from torchwatch.faces.tui.app import WatchApp


def plain(renderable: Any, width: int = 200) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


Check = Callable[[WatchApp, Any], Awaitable[None]]


class FakeChild:
    """A launched training as WatchApp sees it: pid, args, poll()."""

    def __init__(self, code: int | None = None) -> None:
        self.pid = 5151
        self.args = ["python", "train.py"]
        self.returncode = code

    def poll(self) -> int | None:
        return self.returncode


def run(session: RecordedWatch, check: Check, size: tuple[int, int] = (100, 30), **kwargs: Any) -> WatchApp:
    session.child = kwargs.get("child")  # the session knows the command it launched, as the app does
    app = WatchApp(session, clock=lambda: NOW, **kwargs)

    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await check(app, pilot)

    asyncio.run(go())
    return app

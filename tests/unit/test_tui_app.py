"""The minimal live screen: verdict, findings with fixes, source statuses, exit, quit (Textual Pilot)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from textual.widgets import Static

from tests.unit.featuresets import consistent
from torchwatch.diagnosis import Analysis, Diagnoser
from torchwatch.features import CATALOGUE
from torchwatch.readings import SourceStatus, Status
from torchwatch.rules_engine import load_rules
from torchwatch.tui.app import WatchApp


def analysed(**values: float) -> Analysis:
    f: dict[str, float | None] = {name: None for name in CATALOGUE}
    f.update(stack_samples=100.0, thread_samples=50.0, **consistent(values))
    d = Diagnoser(load_rules())
    d.evaluate(f, 0.0)
    return d.evaluate(f, 10.0)


@dataclass
class _Tree:
    root: int = 4242


@dataclass
class FakeSession:
    """What WatchApp reads from a session: recorded analyses and statuses, no sampling."""

    latest: Analysis | None = None
    last_alive: Analysis | None = None
    target_gone: bool = False
    tree: _Tree = field(default_factory=_Tree)
    sources: dict[str, SourceStatus] = field(
        default_factory=lambda: {
            "psutil": SourceStatus.ok(),
            "nvml": SourceStatus.unavailable("NVML library not found (no NVIDIA driver)", "install the driver"),
        }
    )

    def statuses(self) -> dict[str, SourceStatus]:
        return self.sources


def text_of(app: WatchApp, selector: str) -> str:
    widget = app.query_one(selector, Static)
    return str(widget.render())


def run(session: Any, check: Any) -> None:
    async def go() -> None:
        app = WatchApp(session)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            await check(app, pilot)

    asyncio.run(go())


def test_shows_verdict_fixes_and_source_status() -> None:
    session = FakeSession(latest=analysed(fetch_cpu_share=0.8, worker_count=0.0, usable_cpus=8.0))

    async def check(app: WatchApp, pilot: Any) -> None:
        verdict = text_of(app, "#verdict")
        assert "DATALOADER-BOUND" in verdict
        assert app.query_one("#verdict").has_class("dataloader-bound")
        findings = text_of(app, "#findings-body")
        assert "num_workers=0 on 8 usable CPUs: try num_workers=7" in findings
        assert "nvml unavailable: NVML library not found (no NVIDIA driver)" in text_of(app, "#sources")

    run(session, check)


def test_starting_then_live_update() -> None:
    session = FakeSession()

    async def check(app: WatchApp, pilot: Any) -> None:
        assert "starting" in text_of(app, "#verdict")
        session.latest = analysed(storage_wait_share=0.6)
        app.refresh_view()
        await pilot.pause()
        assert "IO-BOUND" in text_of(app, "#verdict")

    run(session, check)


def test_target_exit_keeps_last_verdict_and_q_quits() -> None:
    alive = analysed(loop_cpu_share=0.9)
    session = FakeSession(latest=analysed(), last_alive=alive)

    async def check(app: WatchApp, pilot: Any) -> None:
        session.target_gone = True
        session.sources["psutil"] = SourceStatus(Status.GONE, "the target process exited")
        app.refresh_view()
        await pilot.pause()
        verdict = text_of(app, "#verdict")
        assert "CPU-BOUND" in verdict and "exited" in verdict
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running

    run(session, check)

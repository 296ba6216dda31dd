"""docs/architecture.md's recipe "A source": a source declared in one SourceSpec and listed in SOURCES
is built, ticked, stored, paced, reported and blamed by the session with no other site kept by hand.

The source here is made up (a heartbeat of the test process): if any of those sites named its
sources again, this one would be missing from it and a test below would fail.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from torchwatch.analysis import features as feats
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.model.observation import FeatureSpec
from torchwatch.model.readings import SourceStatus, Status
from torchwatch.sources import Pace, SourceContext, SourceSpec, set_interval
from torchwatch.sources.registry import SOURCES, feature_sources
from torchwatch.watch import cadence, diagnose, session
from torchwatch.watch.cadence import SETTLE_EVALUATIONS, CadenceReading
from torchwatch.watch.session import Session, SessionOptions


@dataclass(frozen=True)
class Beat:
    """One heartbeat of process ``pid`` at ``t`` (monotonic s): the made-up source's reading (step 3
    of the recipe: a reading type that names its store list)."""

    STORE_KIND: ClassVar[str] = "beats"

    t: float
    pid: int


class BeatSource:
    """The made-up source (step 1): follows the ``Source`` protocol, one :class:`Beat` a round."""

    name = "beat"

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.interval = 1.0
        self.status = SourceStatus.ok()
        self.closed = False

    def sample(self, now: float) -> list[object]:
        return [Beat(now, self.pid)]

    def close(self) -> None:
        self.closed = True


def _make(ctx: SourceContext) -> BeatSource:
    return BeatSource(ctx.tree.root)


def _steady(fast: Pace, window_s: float) -> Pace:
    return {"interval_s": max(fast["interval_s"], 1.0)}


SPEC = SourceSpec(
    name="beat",
    readings=(Beat,),
    make=_make,
    ticked=True,
    words=("heartbeat",),
    fast=lambda options: {"interval_s": 0.25},
    steady=_steady,
    apply=set_interval,
)


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Steps 2 and 4: the spec in SOURCES and a feature of the catalogue with its word."""
    SOURCES.append(SPEC)
    monkeypatch.setitem(feats.CATALOGUE, "beat_rate", FeatureSpec("beat_rate", "1/s", "heartbeat", "beats per s"))
    try:
        yield
    finally:
        SOURCES.remove(SPEC)


def _beat(s: Session) -> BeatSource:
    src = s.sources.get("beat")
    assert isinstance(src, BeatSource)
    return src


def test_a_source_in_sources_is_built_ticked_and_its_readings_stored(registered: None) -> None:
    s = Session(os.getpid(), load_rules(), SessionOptions(nvml=False, kernel_log=False))
    src = _beat(s)
    assert src.pid == os.getpid() and src in s.sources.ticked() and src not in s.sources.threaded()
    # the session's tick thread, as start() runs it (the sources that block are left out: no py-spy here)
    tick = threading.Thread(target=s._tick_loop, args=(s.sources.ticked(),), daemon=True)
    tick.start()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and len(s.store.window(0.0, time.monotonic()).of("beats")) < 2:
        time.sleep(0.05)
    s._stop.set()
    s.pacer.interrupt()
    tick.join(5.0)
    beats = s.store.window(0.0, time.monotonic(), kinds=("beats",)).more["beats"]
    assert len(beats) >= 2 and all(isinstance(b, Beat) and b.pid == os.getpid() for b in beats)
    assert isinstance(s.store.latest(Beat), Beat)
    s.stop()
    assert src.closed


def test_a_source_in_sources_is_paced_by_the_cadence(registered: None) -> None:
    s = Session(os.getpid(), load_rules(), SessionOptions(nvml=False, kernel_log=False))
    src = _beat(s)
    assert s.pacer.cadence.pace("beat") == {"interval_s": 0.25} and src.interval == 0.25  # fast at once
    reading = CadenceReading(label="cpu-bound", top_finding="loop-cpu", confidence=0.9, processes=(1, 0))
    for _ in range(SETTLE_EVALUATIONS):
        s.pacer.update(reading)
    assert s.pacer.cadence.mode == "steady" and src.interval == 1.0
    s.wake("a key was pressed in the TUI")
    assert src.interval == 0.25


def test_a_source_in_sources_is_reported_and_blamed_for_its_features(registered: None) -> None:
    s = Session(os.getpid(), load_rules(), SessionOptions(nvml=False, kernel_log=False))
    src = _beat(s)
    assert feature_sources()["heartbeat"] == "beat"
    assert list(s.statuses()) == ["psutil", "threads", "py-spy", "hook", "memory", "beat"]
    src.status = SourceStatus.unavailable("no heart", "none")
    assert s.why_missing("beat_rate") == "beat unavailable: no heart"
    assert dict(s.observe().statuses)["beat"].status is Status.UNAVAILABLE


def test_the_session_the_cadence_and_why_missing_name_no_source() -> None:
    """Their text names none of the classes SOURCES builds: what a source is to them is its spec."""
    s = Session(os.getpid(), load_rules(), SessionOptions(nvml=False, kernel_log=False))
    classes = {type(src).__name__ for src in s.sources.all} | {"NvmlSource"}
    assert len(classes) == len(SOURCES)
    for module in (session, cadence, diagnose):
        text = Path(str(module.__file__)).read_text()
        assert not [c for c in classes if c in text], module.__name__

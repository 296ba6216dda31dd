"""SVG snapshots of the app at 80×24 and 160×48 over recorded readings and a frozen clock.

Update after a deliberate change with ``pytest tests/unit/test_tui_snapshots.py --snapshot-update``
and look at the SVGs in ``tests/unit/__snapshots__/test_tui_snapshots/``.
"""

from __future__ import annotations

import math
from typing import Any

from tests.unit.recorded import NOW, recorded_session
from torchwatch.faces.tui.app import WatchApp


def app_over(gpus: bool = False, hooked: bool = False) -> WatchApp:
    watched = recorded_session(gpus=gpus, hooked=hooked)
    if hooked:
        # a minute of recorded live values (the builder's history of earlier ticks)
        watched.trends.extend("steps_per_s", [(float(t), 3.0 + 0.4 * math.sin(t / 5)) for t in range(60)])
        watched.trends.extend("data_wait_pct", [(float(t), 60.0 + 8 * math.cos(t / 7)) for t in range(60)])
    return WatchApp(watched, clock=lambda: NOW)


def test_main_view_80x24_no_gpu_no_hook(snap_compare: Any) -> None:
    assert snap_compare(app_over(), terminal_size=(80, 24))


def test_main_view_160x48_gpus_and_hook(snap_compare: Any) -> None:
    assert snap_compare(app_over(gpus=True, hooked=True), terminal_size=(160, 48))


def test_steps_panel_160x48(snap_compare: Any) -> None:
    assert snap_compare(app_over(gpus=True, hooked=True), press=["4"], terminal_size=(160, 48))


def test_evidence_80x24(snap_compare: Any) -> None:
    assert snap_compare(app_over(), press=["down", "enter"], terminal_size=(80, 24))


def test_burst_panel_80x24(snap_compare: Any) -> None:
    assert snap_compare(app_over(hooked=True), press=["5"], terminal_size=(80, 24))

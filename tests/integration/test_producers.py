"""A training fed by a hand-written producer thread (tests/scenarios/producer_thread.py: a
``threading.Thread`` filling a ``queue.Queue``, gradient accumulation on top) under ``torchwatch
run``: the loop waits in ``queue.get()`` while the producer augments, which is the data pipeline
(dataloader-bound, its relief 3.3x here), not the loop's CPU work (was loop-cpu, cpu-bound 0.95)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, headless_run, torchwatch

pytestmark = [pytest.mark.integration, pytest.mark.quiet]  # reads CPU time: no other test beside it

WATCH_S = 20.0  # the scenario steps from ~3 s here; the rule holds 2 s over a 10 s window


def test_a_loop_fed_by_a_producer_thread_is_dataloader_bound_and_names_it(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    script = str(REPO / "tests" / "scenarios" / "producer_thread.py")
    result = torchwatch(*headless_run(WATCH_S, out, sys.executable, script, "--seconds", "80"), json_path=out)
    assert result.report is not None, result.stderr[-2000:]
    report = result.report
    assert (report.get("hook") or {}).get("first_step_after_s") is not None, (
        f"the training did not reach its first step in {WATCH_S:g} s (a busy machine?)",
        report["verdict"],
    )
    found = {f["rule"]: f for f in report["findings"]}
    assert "loader-producer-thread" in found, (list(found), report["features"])
    assert "loop-cpu" not in found
    assert report["verdict"]["label"] == "dataloader-bound", report["verdict"]
    finding = found["loader-producer-thread"]
    assert "augment (_producer.py:" in finding["summary"]  # what the producer runs
    assert finding["evidence"]["producer_wait_share"] >= 0.2
    assert "GIL" in " ".join(fx["detail"] for fx in finding["fixes"])

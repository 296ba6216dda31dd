"""A real CPU training under ``torchwatch run --headless --trace`` whose learning rate jumps 30x for 10
steps at a known step (the loss jumps from ~1 to 5-85, then comes back, finite): ``loss-spike`` fires
after that step and not before, names a step of the jump, and never becomes the verdict."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPO, headless_run, torchwatch

pytestmark = pytest.mark.integration
SCENARIO = REPO / "tests" / "scenarios" / "loss_nan.py"
JUMP_AT = 300  # 15 s of steps at 20 a second: the spike rule's baseline (20 readings) is long full
WATCH_S = 60.0
"""The jump comes ~15 s after the first step (~3 s after launch alone, 25 s beside three workers
importing torch); the rule holds 1 s. 60 s leaves the jump 20 s of watch on the slowest start seen."""


def watched(tmp_path: Path, *script_args: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The report and every analysis (the trace) of ``loss_nan.py`` (no NaN, 40 epochs, and
    ``script_args``) under ``run --headless --trace`` for :data:`WATCH_S`."""
    out, trace = tmp_path / "report.json", tmp_path / "trace.jsonl"
    cmd = [sys.executable, str(SCENARIO), "--nan-at", "1000000", "--epochs", "40", *script_args]
    args = list(headless_run(WATCH_S, out, *cmd))
    args.insert(args.index("--json"), "--trace")
    args.insert(args.index("--json"), str(trace))
    w = torchwatch(*args, json_path=out, timeout=WATCH_S + 120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert w.report is not None, w.stderr[-3000:]
    return w.report, [json.loads(line) for line in trace.read_text().splitlines() if line]


def test_a_learning_rate_jump_is_named_a_loss_spike_at_its_step_and_not_before(tmp_path: Path) -> None:
    _report, ticks = watched(tmp_path, "--lr-jump-at", str(JUMP_AT), "--lr-jump", "30")
    fired = [t for t in ticks if "loss-spike" in t["findings"]]
    reached = [t for t in ticks if (t["features"].get("loss_step") or 0) >= JUMP_AT + 20]
    assert reached, "the training did not reach its jump within the watch (a busy machine?)"
    assert fired, [(t["t"], t["features"].get("loss_step"), t["features"].get("loss_spike_z")) for t in ticks]
    first = fired[0]["features"]  # (a finding then holds a while: later ticks' features have moved on)
    assert JUMP_AT <= first["loss_spike_step"] < JUMP_AT + 10 + 20, first  # a step of the jump, or just after
    assert first["loss_spike_ratio"] >= 1.5 and first["loss_spike_z"] >= 8, first
    for t in fired:  # beside the verdict, never in it
        assert t["findings"][0] != "loss-spike" and "loss" not in t["verdict"]["summary"].lower(), t
    before = [t for t in ticks if (t["features"].get("loss_step") or 0) < JUMP_AT]
    assert before and not any("loss-spike" in t["findings"] for t in before), "a spike before the jump"
    assert not any("loss-stalled" in t["findings"] for t in ticks), "a learning model called stalled"


def test_a_frozen_model_is_named_loss_stalled_within_a_minute_and_never_the_verdict(tmp_path: Path) -> None:
    """lr=0: every optimizer step writes the parameters (alpha -0.0) and changes nothing; the loss
    of random batches is flat with its own noise. The rule's parameter terms (every learning rate
    0 for 20 s and 10 steps, held 10 s) fire long before the loss's 2 minutes."""
    report, ticks = watched(tmp_path, "--lr", "0")
    fired = [t for t in ticks if "loss-stalled" in t["findings"]]
    assert fired, [(t["t"], t["features"].get("params_still_s"), t["features"].get("params_still_why")) for t in ticks]
    first = fired[0]["features"]
    assert first["params_still_why"] == 2 and first["params_still_s"] >= 20, first  # lr-zero
    assert (first.get("loss_step") or 0) > 0 and first.get("loss_change_share") is None, first  # not the loss's 2 min
    for t in fired:
        assert t["findings"][0] != "loss-stalled" and "learn" not in t["verdict"]["summary"].lower(), t
    stalled = [f for f in report["findings"] if f["rule"] == "loss-stalled"]
    assert stalled and "every learning rate is 0" in stalled[0]["summary"], report["findings"]

"""What the hook changes in a training it leaves as it found it (issue 49): the dispatch-mode and
function-mode stacks, the profiler's state, every function and method it wraps, the signal
handlers, the intra-op threads, the DataLoader's settings, ``sys.meta_path`` and its threads,
before and after bursts, live trials and attach/detach cycles, in a training that counts its own
FLOPs around each whole step (``tests/unit/_state_script.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchwatch.hook.trial import TIMER_GRACE_S

pytest.importorskip("torch")
SCRIPT = Path(__file__).with_name("_state_script.py")
SIGNAL_TAKEN = Path(__file__).with_name("_signal_taken_script.py")
REPO = Path(__file__).resolve().parents[2]


def _differences(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}


def test_bursts_trials_and_attach_cycles_leave_the_trainings_state_as_it_was(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TORCHWATCH_DIR": str(tmp_path / "hooks"),
        "TORCHWATCH_TRACE_DIR": str(tmp_path / "traces"),
        "TORCHWATCH_BURST_COOLDOWN_S": "0",
    }
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "3"], capture_output=True, text=True, timeout=300, cwd=REPO, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # the training's own FlopCounterMode: nothing of it, nor of torchwatch's, outside its block
    assert out["stacks"] == [[]], out["stacks"]
    assert len(out["training_flop_counts"]) == 1  # and it counted every step alike
    # every attach/detach cycle (one detached mid-burst, one mid-trial) leaves everything as before any hook
    assert len(out["detached"]) == 3
    for after in out["detached"]:
        assert _differences(out["unhooked"], after) == {}
    # with the hook in: two bursts and two trials each time change nothing
    for hooked, after in zip(out["hooked"], out["after"], strict=True):
        assert _differences(hooked, after) == {}
    # ... and they did run: the bursts recorded, refusing to count FLOPs inside the training's mode
    assert len(out["bursts"]) == 6
    for burst in out["bursts"]:
        assert burst["trace_path"] and "dispatch mode of its own on the stack" in burst["flops_note"], burst
    assert [(t["setting"], t["state"], t["restored"]) for t in out["trials"]] == [
        ("threads", "done", True),
        ("num_workers", "done", True),
    ] * 3
    assert out["burst_state_at_detach"] == "running"
    assert out["trial_at_detach"] == ["running", 2]  # the trial's value was on when the hook was taken out


def test_a_trial_ends_at_max_s_when_the_training_takes_the_signal_and_stops_stepping(tmp_path: Path) -> None:
    # issue 49: the trial's timer reached the main thread only through the burst signal's handler;
    # a training that took the signal for itself kept the trial's value ~20 s past --max-s
    max_s = 5.0
    proc = subprocess.run(
        [sys.executable, str(SIGNAL_TAKEN), str(max_s)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "TORCHWATCH_DIR": str(tmp_path / "hooks")},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["back_after_s"] is not None, out
    # max_s + the timer's grace (hook.trial.TIMER_GRACE_S, 2 s) + 1 s for a loaded machine
    assert out["back_after_s"] <= max_s + TIMER_GRACE_S + 1.0, out
    assert (out["state"], out["restored"]) == ("done", True) and "no step boundary" in out["reason"]
    assert not out["their_handler_ran"]  # their handler is never called in the hook's place

"""Step boundaries with and without ``torch.optim``, and the backward and collective times the
hook publishes per step (real torch runs, each in a fresh interpreter)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torchwatch.hook import steps

SCRIPT = Path(__file__).with_name("_steps_script.py")
REPO = Path(__file__).resolve().parents[2]
N = 30  # iterations of each loop (_steps_script.ITERATIONS)


def steps_script(mode: str, tmp_path: Path) -> dict[str, Any]:
    pytest.importorskip("torch", reason="the hook's training runs need torch")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), mode, str(tmp_path / "tw")],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["installed"] and out["state"]["errors"] == [], out["state"]["errors"]
    return out


def test_a_manual_sgd_loop_gets_one_step_per_backward_pass(tmp_path: Path) -> None:
    r = steps_script("manual", tmp_path)
    assert r["step_source"] == "backward" and r["state"]["step_source"] == "backward"
    assert r["steps"] == N and r["backward_calls"] == N
    steps = r["rank_steps"]
    assert len(steps) == N - 1  # the first boundary has no known start
    for s in steps:
        assert 0 < s["backward"] < s["duration"]
        assert 0 <= s["backward_blocked"] <= s["backward"] and s["collective"] == 0
    assert r["in_backward_since"] == 0.0


def test_optimizer_steps_are_the_steps_when_there_are_some(tmp_path: Path) -> None:
    r = steps_script("optimizer", tmp_path)
    assert (r["step_source"], r["steps"], r["backward_calls"]) == ("optimizer", N, N)


def test_gradient_accumulation_keeps_optimizer_steps(tmp_path: Path) -> None:
    r = steps_script("accumulate", tmp_path)
    assert (r["step_source"], r["steps"], r["backward_calls"]) == ("optimizer", N, 4 * N)
    # each step holds its four backward passes: all but the first step's are in the entries
    per_pass = r["backward_s"] / r["backward_calls"]
    in_entries = sum(s["backward"] for s in r["rank_steps"])
    assert 4 * (N - 1) * per_pass * 0.5 < in_entries < r["backward_s"]


def test_an_optimizer_that_never_steps_gives_way_to_backward_passes(tmp_path: Path) -> None:
    r = steps_script("never_stepped", tmp_path)
    assert r["step_source"] == "backward" and r["backward_calls"] == N
    # the decision needs 5 passes and 0.2 s since the first one (10 ms apart): passes 1-4 are
    # never boundaries; the 5th is the first one at the earliest (when 4 gaps took >= 0.2 s, as on
    # a loaded machine), and every pass from the deciding one on ends a step
    assert 1 <= r["steps"] <= N - 4


def test_a_late_optimizer_takes_over_once(tmp_path: Path) -> None:
    r = steps_script("switch", tmp_path)
    assert r["before"]["step_source"] == "backward" and r["before"]["steps"] == 10
    assert r["step_source"] == "optimizer"
    # 11 backward passes end steps (the 11th before its optimizer step is seen); that optimizer
    # step comes right after a boundary and is not one; the 9 after it are
    assert r["steps"] == 11 + 9


def test_explicit_collectives_are_timed_once_and_ddp_backward_is_not_a_collective(tmp_path: Path) -> None:
    r = steps_script("collectives", tmp_path)
    before, between = r["before"], r["between"]
    assert between["collective_calls"] - before["collective_calls"] == 5
    assert between["collective_s"] > before["collective_s"]
    assert r["collective_calls"] == between["collective_calls"]  # DDP's all-reduce: inside backward
    assert r["backward_calls"] == 5 and r["in_collective_since"] == 0.0
    rank = r["state"]["rank"]
    assert (rank["rank"], rank["world_size"], rank["backend"]) == (0, 1, "gloo")
    assert rank["sources"]["rank"] == "torch.distributed"


def test_the_step_source_rule_is_documented_with_its_thresholds() -> None:
    assert str(steps.BACKWARD_DECIDE_CALLS) in steps.STEP_SOURCE_RULE


def test_a_rank_known_from_its_environment_names_its_trace_and_marks_it_for_hta(tmp_path: Path) -> None:
    """Without torch.distributed initialised kineto writes no ``distributedInfo``: the hook adds
    the rank it knows from the environment, where HTA looks for it."""
    from tests.unit.hookrun import hook_script, result

    r = result(hook_script("burst", tmp_path / "tw", tmp_path / "traces", RANK="3", WORLD_SIZE="4"))
    assert r["state"]["rank"]["rank"] == 3 and r["state"]["rank"]["sources"]["rank"] == "env"
    last = r["state"]["burst"]["last"]
    assert last.get("error") is None and last["rank"] == 3
    path = Path(last["trace_path"])
    assert path.name.endswith(".rank3.1.pt.trace.json.gz")
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    assert trace["distributedInfo"] == {"rank": 3} and trace["traceEvents"]
    hta_file = pytest.importorskip("hta.common.trace_file", reason="HolisticTraceAnalysis is in the test extra")
    ok, found = hta_file.create_rank_to_trace_dict([str(path)])
    assert ok and list(found) == [3]

"""The stall / hang recorder on real trainings that hang (tests/scenarios/hang/): a 2-rank gloo
DDP job where rank 1 blocks on a queue, and a single training whose DataLoader worker stalls in
``__getitem__``. torchwatch attaches (the trainings carry the hook, as under ``torchwatch run``),
names the odd rank / the stuck worker with its frame within ``--hang-after`` + 5 s of the last
step, and leaves the training as it was: alive, not stopped, no signal received. The test ends it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.integration.conftest import REPO, torchwatch
from torchwatch.watch.lifecycle import hook_env

pytest.importorskip("torch.distributed", reason="the trainings need torch")
pytestmark = pytest.mark.integration

SCENARIOS = REPO / "tests" / "scenarios" / "hang"
HANG_AFTER_S = 5.0


def _start(tmp_path: Path, *command: str, stall_s: float | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    """The training, hooked, in a session of its own (the test ends its whole group)."""
    env = hook_env()
    if stall_s is not None:
        env["TORCHWATCH_SCENARIO_STALL_S"] = str(stall_s)
    env["TORCHWATCH_DIR"] = str(tmp_path / "tw")
    env["TORCHWATCH_SCENARIO_HANG_AFTER_S"] = "8"  # steps for 8 s, so the watch sees it step first
    log = tmp_path / "training.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *command], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc, log


def _hooked(tmp_path: Path, n: int) -> None:
    """Wait until ``n`` processes' hooks have published (the ranks, or the training, run)."""
    deadline = time.monotonic() + 90
    base = tmp_path / "tw"
    while time.monotonic() < deadline:
        if base.is_dir() and sum(1 for d in base.rglob("hook.json")) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"{n} hooked processes did not start")


def _attach(tmp_path: Path, pid: int) -> tuple[int, dict[str, Any], str]:
    """``torchwatch attach PID --no-inject --headless --duration 24 --hang-after 5 --fail-on hang``:
    its status, JSON report, and stdout + stderr (the text report and the status lines)."""
    out = tmp_path / "report.json"
    args = ["attach", str(pid), "--no-inject", "--headless", "--duration", "24", "--json", str(out)]
    watched = torchwatch(*args, "--hang-after", str(HANG_AFTER_S), "--fail-on", "hang", json_path=out, timeout=150)
    assert watched.report is not None, watched.stderr[-3000:]
    assert "Traceback" not in watched.stderr, watched.stderr[-3000:]
    return watched.code, watched.report, watched.stdout + watched.stderr


def _watch_hang(tmp_path: Path, proc: subprocess.Popen[bytes], hooked: int) -> tuple[int, dict[str, Any], str]:
    """Once ``hooked`` processes run, :func:`_attach` to the training: its status, the report's
    ``hang`` record (which must be there) and the output."""
    _hooked(tmp_path, hooked)
    code, report, output = _attach(tmp_path, proc.pid)
    h = report["hang"]
    assert h is not None, output[-3000:]
    print(h["summary"])
    return code, h, output


def _untouched(pids: list[int]) -> list[str]:
    """Each process is alive and not stopped (``State``), with no signal pending (``SigPnd``,
    ``ShdPnd``); one line each, for the test's output."""
    lines = []
    for pid in pids:
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        state = status["State"].strip()
        assert state[0] in "SRD", f"PID {pid}: {state}"  # not T (stopped), t (traced), Z (exited)
        assert int(status["SigPnd"], 16) == 0 and int(status["ShdPnd"], 16) == 0, status
        lines.append(f"PID {pid}: {state}, no signal pending")
    return lines


def _end(proc: subprocess.Popen[bytes]) -> None:
    """The test ends the training itself: SIGKILL to its group and to every process below it (a hung
    gloo rank ignores SIGTERM, and torchrun starts each rank in a session of its own, which the
    group's SIGKILL misses: a deadlocked rank 0 outlived the test by hours)."""
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    proc.wait(30)
    psutil.wait_procs(tree, timeout=30)


def _check_timing(h: dict[str, Any]) -> None:
    """Not before --hang-after (a hang claimed early is a wrong finding). How soon after it (the
    acceptance: within --hang-after + 5 s of the last step) is printed by bench/latencies.py."""
    took = h["detected_after_s"] + h["dump_s"]
    print(f"hang recorded {h['detected_after_s']:.2f} s after the last step, dumps {h['dump_s']:.2f} s: {took:.2f} s")
    assert h["detected_after_s"] >= HANG_AFTER_S


def test_a_rank_blocked_on_a_queue_is_named_the_odd_one_out_and_the_job_is_left_as_it_was(tmp_path: Path) -> None:
    run = [str(SCENARIOS / "rank_deadlock.py"), "--seconds", "300"]
    proc, log = _start(tmp_path, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *run)
    try:
        code, h, stderr = _watch_hang(tmp_path, proc, 2)
        assert code == 3 and "a hang was recorded and --fail-on names hang" in stderr
        assert h["state"] == "hang" and h["threshold_from"] == "--hang-after 5 s"
        _check_timing(h)
        odd = h["odd_one_out"]
        assert odd is not None and odd["rank"] == 1 and odd["role"] == "rank", h
        assert odd["top_frame"].startswith("wait_for_token (") and "rank_deadlock.py:" in odd["top_frame"]
        rows = {p["rank"]: p for p in h["processes"] if p["role"] == "rank"}
        assert rows[0]["state"] in ("collective", "backward"), rows  # DDP's all-reduce, or _dist's broadcast
        assert "rank 1 (PID" in h["summary"] and "wait_for_token" in h["summary"]
        text = (tmp_path / "report.hang.txt").read_text()
        assert "wait_for_token" in text and "Thread" in text and "rank 0" in text
        ranks = [c.pid for c in psutil.Process(proc.pid).children() if c.pid in {p["pid"] for p in h["processes"]}]
        assert len(ranks) == 2
        print("\n".join(_untouched([proc.pid, *ranks])))
        assert proc.poll() is None
        assert "done" not in log.read_text()  # no rank saw SIGINT/SIGTERM (they print their final line)
    finally:
        _end(proc)


def test_a_dataloader_worker_stuck_in_getitem_is_named_with_its_frame(tmp_path: Path) -> None:
    proc, log = _start(tmp_path, str(SCENARIOS / "stuck_worker.py"), "--seconds", "300")
    try:
        code, h, _ = _watch_hang(tmp_path, proc, 1)
        assert code == 3
        _check_timing(h)
        odd = h["odd_one_out"]
        assert odd is not None and odd["role"] == "worker" and odd["parent"] == proc.pid, h
        assert odd["top_frame"].startswith("fetch_label (") and "stuck_worker.py:" in odd["top_frame"]
        trainer = next(p for p in h["processes"] if p["pid"] == proc.pid)
        assert trainer["state"] == "dataloader"
        workers = [p for p in h["processes"] if p["role"] == "worker"]
        assert sorted(p["state"] for p in workers) == ["busy", "idle"], workers
        assert f"DataLoader worker PID {odd['pid']} is stuck in the dataset at fetch_label" in h["summary"]
        print("\n".join(_untouched([proc.pid, *(p["pid"] for p in workers)])))
        assert "done" not in log.read_text()
    finally:
        _end(proc)


def test_a_stall_that_ends_is_reported_as_a_stall_of_n_s_and_recorded_once(tmp_path: Path) -> None:
    proc, _ = _start(tmp_path, str(SCENARIOS / "stuck_worker.py"), "--seconds", "300", stall_s=12.0)
    try:
        code, h, stderr = _watch_hang(tmp_path, proc, 1)
        print(f"{h['state']}: {h['stalled_s']} s without a step, resumed at {h['resumed_s']} s; {h['summary']}")
        assert code == 3  # a hang was recorded, though it ended
        assert h["state"] == "stall" and h["number"] == 1, h  # one record for the one stall
        # the scenario stalls 12 s: at least that (a loaded machine may add to it, never take away)
        assert h["resumed_s"] is not None and h["stalled_s"] >= 10.0, h
        assert h["stalled_s"] == pytest.approx(h["resumed_s"] - h["last_step_s"], abs=0.05)
        assert "stall: PID" in stderr and "stepped again at" in stderr  # the text report and the status line
        assert h["odd_one_out"] is not None and h["odd_one_out"]["top_frame"].startswith("fetch_label (")
        assert proc.poll() is None
    finally:
        _end(proc)

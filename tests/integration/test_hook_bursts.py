"""The hook in real trainings started by torchwatch run: measurements, bursts, refusals, --fail-on."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.conftest import DEMO, REPO, headless_run, others_hold_cpus, torchwatch
from torchwatch.sources.hook import HookReader

pytestmark = pytest.mark.integration
SMALL = Path(__file__).with_name("_small_train.py")
FLOP_TRAIN = Path(__file__).with_name("_flop_train.py")
WINDOW_S = 10.0  # torchwatch run's default --window: what the report's always-on numbers cover


def _start(tmp_path: Path, *args: str, duration: float = 40.0) -> tuple[subprocess.Popen[str], Path]:
    out = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchwatch", *headless_run(duration, out, *args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, out


def _hooked_pid(root: int, min_steps: int, timeout: float = 60.0) -> int:
    """The PID below ``root`` whose hook has counted ``min_steps`` optimizer steps."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kids = psutil.Process(root).children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for p in kids:
            rd = HookReader(p.pid)
            snap = rd.counters() if rd.info() is not None else None
            if snap is not None and snap.steps >= min_steps:
                return p.pid
        time.sleep(0.3)
    raise AssertionError(f"no hooked process with {min_steps} steps below {root}")


@pytest.mark.quiet  # the trace's categories against the hook's step time: a thread kept off the CPU by
# other tests' load spends time the trace's spans do not cover (2300 vs 3019 ms in a CI run beside them)
def test_burst_on_the_dataloader_demo_agrees_with_the_always_on_measurements(tmp_path: Path) -> None:
    # The demo outlasts the burst on any machine (on a loaded 2-core machine torch's import, the
    # first 5 steps and the burst's 3 steps took longer than its default 30 s); the watch is ended
    # (SIGINT: torchwatch stops it and reports) one window after the burst, so that the report's
    # always-on numbers are those of unprofiled steps, as when the demo ran its 45 s out.
    proc, out = _start(
        tmp_path, sys.executable, str(DEMO / "dataloader_bound.py"), "--device", "cpu", "--seconds", "240",
        duration=300.0,
    )  # fmt: skip
    try:
        pid = _hooked_pid(proc.pid, min_steps=5)
        burst_json = tmp_path / "burst.json"
        b = torchwatch("burst", str(pid), "--json", str(burst_json), "--wait", "60", timeout=90)
        assert b.code == 0, b.stderr
        summary = json.loads(burst_json.read_text())
        time.sleep(WINDOW_S + 1.0)
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the trace: gzip Chrome JSON with ProfilerStep# spans
    with gzip.open(summary["trace_path"], "rt") as f:
        events = json.load(f)["traceEvents"]
    assert sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#")) == summary["steps"] >= 1
    # categories sum to the step time the hook measured for the same steps, within 5 %
    measured = sum(summary["measured_step_ms"]) / len(summary["measured_step_ms"])
    assert sum(summary["breakdown_ms"].values()) == pytest.approx(measured, rel=0.05)
    report = json.loads(out.read_text())
    hook = report["hook"]
    assert hook["steps"] > 5 and hook["steps_per_s"] > 0
    assert hook["dataloader"]["num_workers"] == 0 and hook["dataloader"]["batch_size"] == 32
    assert hook["last_burst"]["id"] == summary["id"]
    # the burst's DataLoader share agrees with the always-on data-wait fraction within 10 points
    assert abs(summary["breakdown_share"]["dataloader"] - hook["data_wait_fraction"]) <= 0.10
    assert report["features"]["data_wait_fraction"] == pytest.approx(hook["data_wait_fraction"], abs=1e-3)
    if not others_hold_cpus(report):  # on a busy machine the neighbours are named first
        assert report["verdict"]["label"] == "dataloader-bound"
    assert "training loop (measured in the process)" in stdout and "last burst #1" in stdout


def test_no_signal_to_a_plain_python_process() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        r = torchwatch("burst", str(sleeper.pid), timeout=30)
        assert r.code == 1 and r.stderr.count("\n") == 1 and "no hook" in r.stderr
        assert "Traceback" not in r.stderr
        time.sleep(0.5)
        assert sleeper.poll() is None  # still alive
    finally:
        sleeper.kill()
        sleeper.wait()


def test_burst_refused_while_the_users_profiler_runs_and_training_goes_on(tmp_path: Path) -> None:
    stop = tmp_path / "stop"  # made once the refusal is checked: the training then ends its loop itself
    proc, _ = _start(
        tmp_path, sys.executable, str(SMALL), "--user-profiler", "--seconds", "120", "--stop-file", str(stop),
        duration=150.0,
    )  # fmt: skip
    try:
        pid = _hooked_pid(proc.pid, min_steps=5)
        r = torchwatch("burst", str(pid), "--wait", "20", timeout=90)
        assert r.code == 1 and "another profiler" in r.stderr, r.stderr
        before = HookReader(pid).counters()
        time.sleep(1.5)
        after = HookReader(pid).counters()
        assert before is not None and after is not None and after.steps > before.steps  # still training
        stop.touch()
        stdout, _ = proc.communicate(timeout=90)
        assert "small_train:" in stdout  # it finished by itself
    finally:
        if proc.poll() is None:
            proc.kill()


BURST_WITHIN_S = 180.0
# torch and the FLOP counter imported, the hook publishing, 5 steps: 60 s was not enough once in CI
# (four workers on 2 cores, the test 60.2 s); 180 s as for the scheduled burst above
STEPPED_WITHIN_S = 180.0
"""How long the test waits for the scheduled burst: torch's import, 20 steps and the burst's 3 (a
second idle). Measured beside a spinning process on this shared 2-core machine: see
docs/development.md; a fixed 12 s watch ended before the burst there (the report had none)."""


def _burst_seen(trace: Path) -> bool:
    """Whether an analysis of the session's ``--trace`` has a burst's features (``burst_age_s``)."""
    try:
        lines = trace.read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        with contextlib.suppress(ValueError):
            if json.loads(line).get("features", {}).get("burst_age_s") is not None:
                return True
    return False


def test_burst_at_schedules_a_burst_and_fail_on_sets_the_exit_code(tmp_path: Path) -> None:
    stop = tmp_path / "stop"  # made once the burst is done: the training then ends by itself
    out = tmp_path / "r.json"
    trace = tmp_path / "trace.jsonl"  # the session's analyses: burst_age_s once it read the burst
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchwatch", "run", "--headless", "--burst-at", "20",
         "--fail-on", "undetermined,cpu-bound", "--json", str(out), "--trace", str(trace), "--",
         sys.executable, str(SMALL), "--seconds", "600", "--stop-file", str(stop)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pid = _hooked_pid(proc.pid, min_steps=1, timeout=BURST_WITHIN_S)
        deadline = time.monotonic() + BURST_WITHIN_S
        done = None
        while done is None and time.monotonic() < deadline and proc.poll() is None:
            rec = HookReader(pid).record()
            if rec is not None and rec.burst is not None and rec.burst.last is not None and rec.burst.state == "idle":
                done = rec.burst.last
            time.sleep(0.3)
        # the hook removes its files at exit: the training ends only once torchwatch's session has
        # read the burst (its analysis then has burst_age_s), since the report is checked below
        while done is not None and time.monotonic() < deadline and proc.poll() is None and not _burst_seen(trace):
            time.sleep(0.3)
        stop.touch()
        _stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert done is not None, f"no burst within {BURST_WITHIN_S:g} s:\n{stderr[-2000:]}"
    report = json.loads(out.read_text())
    assert report["ended_by"] == "exit", report["ended_by"]  # the training ended at the stop file
    last = report["hook"]["last_burst"]
    assert last is not None and last.get("error") is None and last["steps"] == 3
    label = report["verdict"]["label"]
    assert (proc.returncode == 3) is (label in ("undetermined", "cpu-bound")), (proc.returncode, label)
    assert proc.returncode in (0, 3)
    assert signal.SIGUSR2  # the scheduled burst needed no signal at all


def test_a_burst_leaves_the_dispatch_stack_of_a_training_counting_its_own_flops(tmp_path: Path) -> None:
    # issue 49: one torchwatch burst left a stale _FlopCounterMode on the training's dispatch-mode
    # stack, outside its with block, for the rest of the run (modes=[] before, after: its own)
    stop = tmp_path / "stop"
    env = {
        **os.environ,
        "TORCHWATCH_DIR": str(tmp_path / "hooks"),
        "TORCHWATCH_TRACE_DIR": str(tmp_path / "traces"),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, str(FLOP_TRAIN), str(stop)], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        pid = proc.pid
        reader = HookReader(pid)
        deadline = time.monotonic() + STEPPED_WITHIN_S
        while (snap := reader.counters()) is None or snap.steps < 5:
            assert time.monotonic() < deadline and proc.poll() is None, (
                f"no 5 steps in {STEPPED_WITHIN_S:g} s: {reader.reason} {reader.dir} {snap}"
            )
            time.sleep(0.2)
        burst_json = tmp_path / "burst.json"
        b = torchwatch("burst", str(pid), "--json", str(burst_json), "--wait", "60", timeout=90)
        assert b.code == 0, b.stderr
        summary = json.loads(burst_json.read_text())
        after = reader.counters()
        assert after is not None
        while (snap := reader.counters()) is None or snap.steps < after.steps + 20:  # steps after the burst
            assert time.monotonic() < deadline + STEPPED_WITHIN_S and proc.poll() is None
            time.sleep(0.2)
        stop.touch()
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["stacks"] == [[]], out  # nothing left on the stack outside the training's block
    assert len(out["flop_counts"]) == 1  # its own count the same on every step, the burst's included
    assert summary["trace_path"] and "dispatch mode of its own on the stack" in summary["flops_note"], summary
    assert "_FlopCounterMode" in summary["flops_note"]

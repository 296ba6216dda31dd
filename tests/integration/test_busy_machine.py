"""Real trainings on a machine that is not quiet: beside busy processes, and inside a CPU quota.

The failure these guard against: a training that sleeps most of its step read ``cpu-bound`` at 0.95
with loop-cpu's "vectorize" as soon as one other process was busy, because waiting for a CPU was
counted as computing. Here the cause outside the training is named first, with its numbers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, headless_run, others_hold_cpus, torchwatch

pytestmark = [pytest.mark.integration, pytest.mark.quiet]  # the load each test makes, and no other

SCENARIOS = REPO / "tests" / "scenarios"
WATCH_S = 15.0  # the scenarios step from ~3 s: the last 10 s window is all steady steps


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[list[int]]:
    """``n`` busy processes, ended after the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(n)]
    try:
        time.sleep(0.5)
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_training_beside_busy_processes_names_them_first_not_vectorize(tmp_path: Path) -> None:
    """sleepy_loop sleeps 50 ms a step (quiet: undetermined, 18 steps/s here). Beside one busy
    process per two CPUs (torch's intra-op threads, one per CPU, meet at a barrier in every op: half
    of them share a CPU with a neighbour, and every op waits for those; measured here with one busy
    process on 2 CPUs: 6.6 steps/s, 2.8x slower), it waits for a CPU a large part of its step:
    cpu-contention comes first and names the busy process by PID; loop-cpu, which reads time on a
    CPU only, stays silent. (With a busy process on *every* CPU the sleeper, woken from its sleep,
    preempts them: 16.9 steps/s here, and nothing to name.)"""
    out = tmp_path / "report.json"
    cpus = len(os.sched_getaffinity(0))
    with busy_processes(max(1, cpus // 2)) as pids:
        result = torchwatch(
            *headless_run(WATCH_S, out, sys.executable, str(SCENARIOS / "sleepy_loop.py"), "--seconds", "80"),
            json_path=out,
            timeout=140,
        )
    assert result.report is not None, result.stderr[-2000:]
    findings = result.report["findings"]
    rules = [f["rule"] for f in findings]
    assert rules[:1] == ["cpu-contention"], (rules, result.report["features"])
    assert "loop-cpu" not in rules
    first = findings[0]
    assert any(f"PID {pid} python" in first["summary"] for pid in pids), first["summary"]
    assert first["evidence"]["foreign_cpu_cores"] >= 0.5
    assert first["evidence"]["own_cpu_cores"] < 0.5  # torchwatch's own CPU is apart, and small
    assert result.report["verdict"]["label"] == "cpu-bound"
    fixes = " ".join(fx["detail"] for fx in first["fixes"])
    assert "renice" in fixes


def _quota_group(cpus: float) -> Path | None:
    """A new cgroup with a CPU quota of ``cpus`` (v1 ``cpu`` controller or v2 ``cpu.max``), or
    ``None`` where this user cannot make one."""
    name = f"torchwatch-test-{os.getpid()}-{time.monotonic_ns()}"
    v1 = Path("/sys/fs/cgroup/cpu")
    try:
        if (v1 / "cpu.cfs_quota_us").exists():
            group = v1 / name
            group.mkdir()
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
            return group
        if "cpu" in Path("/sys/fs/cgroup/cgroup.subtree_control").read_text().split():
            group = Path("/sys/fs/cgroup") / name
            group.mkdir()
            (group / "cpu.max").write_text(f"{int(cpus * 100000)} 100000")
            return group
    except OSError:
        return None
    return None


def _remove_group(group: Path) -> None:
    """End what is left in ``group`` (only what this test put there) and remove it."""
    for _ in range(100):
        with contextlib.suppress(OSError):
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def test_a_training_in_a_cpu_quota_below_its_threads_is_named_throttled(tmp_path: Path) -> None:
    """big_cpu_matmul runs one intra-op thread per CPU; in a container-like cgroup whose quota is
    half a CPU per thread it is stopped in most periods: cpu-quota-throttled quotes the quota. It
    comes after loop-cpu: the training's own work spends the quota, and its loop computes nearly
    all the time the quota lets it run (measured: its own relief 8.8x, the quota lifted 2.3x)."""
    threads = len(os.sched_getaffinity(0))
    quota = max(0.5, threads / 2)
    group = _quota_group(quota)
    if group is None:
        pytest.skip("cannot create a cgroup with a CPU quota here (needs root and the cpu controller)")
    out = tmp_path / "report.json"
    try:
        enter = f'echo $$ > {group / "cgroup.procs"} && exec "$@"'
        args = headless_run(WATCH_S, out, sys.executable, str(SCENARIOS / "big_cpu_matmul.py"), "--seconds", "80")
        proc = subprocess.run(
            ["sh", "-c", enter, "sh", sys.executable, "-m", "torchwatch", *args],
            capture_output=True,
            text=True,
            timeout=140,
            cwd=REPO,
        )
    finally:
        _remove_group(group)
    assert out.exists(), proc.stderr[-2000:]
    report = json.loads(out.read_text())
    rules = [f["rule"] for f in report["findings"]]
    if others_hold_cpus(report):  # a busy machine: its neighbours take the CPU the quota would
        assert rules[:1] == ["cpu-contention"], (rules, report["features"])
        return
    assert rules == ["loop-cpu", "cpu-quota-throttled"], (rules, report["features"])
    first = report["findings"][1]
    assert first["evidence"]["cpu_quota_cpus"] == pytest.approx(quota)
    assert first["evidence"]["cpu_throttled_periods_share"] >= 0.25
    assert f"({quota:g} CPUs)" in first["summary"]
    assert report["verdict"]["label"] == "cpu-bound"


def test_a_training_with_more_threads_than_cpus_is_named_oversubscribed(tmp_path: Path) -> None:
    """big_cpu_matmul asking torch for 4 intra-op threads per CPU (torch caps OMP_NUM_THREADS at the
    cores it sees, so the training calls torch.set_num_threads, as users do): its threads wait for a
    CPU, no neighbour and no quota is to blame, and the finding quotes the threads the hook read and
    the setting that fits."""
    cpus = len(os.sched_getaffinity(0))
    code = (
        f"import runpy, sys, torch; torch.set_num_threads({4 * cpus}); "
        "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    out = tmp_path / "report.json"
    script = str(SCENARIOS / "big_cpu_matmul.py")
    result = torchwatch(
        *headless_run(WATCH_S, out, sys.executable, "-c", code, script, "--seconds", "80"), json_path=out, timeout=140
    )
    assert result.report is not None, result.stderr[-2000:]
    found = {f["rule"]: f for f in result.report["findings"]}
    if others_hold_cpus(result.report):  # a busy machine: the neighbours are named, not the threads
        assert list(found)[:1] == ["cpu-contention"], (list(found), result.report["features"])
        return
    assert "cpu-oversubscribed" in found, (list(found), result.report["features"])
    finding = found["cpu-oversubscribed"]
    assert finding["evidence"]["intra_op_threads"] == 4 * cpus
    assert finding["evidence"]["cpu_threads_wanted"] >= 4 * cpus
    assert f"torch.set_num_threads({cpus})" in " ".join(fx["detail"] for fx in finding["fixes"])
    assert "cpu-contention" not in found  # nothing outside the training is to blame
    assert result.report["verdict"]["label"] == "cpu-bound"

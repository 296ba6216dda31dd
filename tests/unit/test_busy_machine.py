"""Readings and rules of a busy machine: neighbours' CPU, cgroup quota throttling, the threads the
training asks for, waiting for a CPU kept apart from computing, and where those findings stand."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from tests.unit.busy import _settled
from tests.unit.rules import RULES, features
from torchwatch import wire
from torchwatch.analysis import diagnosis
from torchwatch.analysis.diagnosis import Diagnoser, finding_order
from torchwatch.analysis.features import compute
from torchwatch.analysis.store import Window
from torchwatch.hook.cpus import read_threads
from torchwatch.model.readings import Role, ThreadSample, Wait
from torchwatch.sources import proc
from torchwatch.wire import cpus

TICK = proc._CLK_TCK


# -- CPU used by others: CpuNeighbours over a made-up /proc ---------------------------------------


def _stat(pid: int, comm: str, ppid: int, ticks: int, start: int) -> str:
    # fields after "(comm) ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority nice num_threads itrealvalue starttime
    rest = ["S", str(ppid)] + ["0"] * 9 + [str(ticks), "0", "0", "0", "20", "0", "1", "0", str(start)]
    return f"{pid} ({comm}) " + " ".join(rest) + " 0 0\n"


class FakeProc:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.busy = 0

    def machine(self, busy: int) -> None:
        self.busy = busy
        # cpu user nice system idle iowait irq softirq steal guest guest_nice
        (self.root / "stat").write_text(f"cpu  {busy} 0 0 999999 5000 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")

    def put(self, pid: int, comm: str, ppid: int, ticks: int, start: int = 0) -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        (d / "stat").write_text(_stat(pid, comm, ppid, ticks, start))

    def drop(self, pid: int) -> None:
        d = self.root / str(pid)
        (d / "stat").unlink()
        d.rmdir()


def test_neighbours_are_what_neither_the_training_nor_torchwatch_uses(tmp_path: Path) -> None:
    me, spy, training, hog, idle, fresh = os.getpid(), 900001, 100, 200, 300, 400
    fake = FakeProc(tmp_path)
    fake.machine(0)
    fake.put(me, "torchwatch", 1, 0)
    fake.put(spy, "py-spy", me, 0)
    fake.put(training, "python", me, 0)  # `run` starts the training: a child, but the tree's
    fake.put(hog, "hog\x1b[31m", 1, 0)  # a name with an escape sequence: shown without it
    fake.put(idle, "sshd", 1, 0)
    scan = proc.CpuNeighbours(tmp_path)
    assert scan.sample(0.0, [training]) == (None, None, ())

    second = int(2 * TICK)  # ticks in the 2 s between scans at one core
    fake.put(me, "torchwatch", 1, second // 10)  # 0.1 core
    fake.put(spy, "py-spy", me, second // 20)  # 0.05 core
    fake.put(training, "python", me, second * 3 // 2)  # 1.5 cores
    fake.put(hog, "hog\x1b[31m", 1, second)  # 1.0 core
    born = int(time.clock_gettime(time.CLOCK_BOOTTIME) * TICK) + 10**6
    fake.put(fresh, "cc1", 1, second // 5, start=born)  # started since the first scan: 0.2 core
    unseen = second // 2  # 0.5 core no visible process explains (another PID namespace, irqs)
    fake.machine(second // 10 + second // 20 + second * 3 // 2 + second + second // 5 + unseen)
    foreign, own, top = scan.sample(2.0, [training])
    assert own == pytest.approx(0.15, abs=0.02)
    assert foreign == pytest.approx(1.0 + 0.2 + 0.5, abs=0.03)
    assert [(n.pid, n.name, n.cores) for n in top] == [(hog, "hog[31m", 1.0), (fresh, "cc1", 0.2)]
    assert top[0].user  # the owner's name (or UID)
    assert scan.sample(2.5, [training]) == (foreign, own, top)  # within the scan period: the last scan

    fake.drop(hog)  # exited: counted at its last rate for the interval it was not seen
    fake.put(me, "torchwatch", 1, 2 * (second // 10))
    fake.put(training, "python", me, 2 * (second * 3 // 2))
    fake.machine(fake.busy + second // 10 + second * 3 // 2 + second)
    foreign, own, top = scan.sample(4.0, [training])
    assert foreign == pytest.approx(1.0, abs=0.03)
    assert top == ()


PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def test_a_real_busy_process_is_named_with_its_cores() -> None:
    # started by a shell that exits at once: the busy process is no child of this one (a child
    # would be torchwatch's own), as a neighbour is not
    spawn = [
        sys.executable,
        "-c",
        "import subprocess, sys\n"
        "hog = subprocess.Popen([sys.executable, '-c', 'while True: pass'], stdin=subprocess.DEVNULL,"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(hog.pid)",
    ]
    # The suite makes its process the subreaper of everything below it (tests/conftest.py): the busy
    # process would become this one's child, torchwatch's own in the scan. Not while it is started.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    try:
        pid = int(subprocess.run(spawn, capture_output=True, text=True, timeout=60, check=True).stdout)
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def ticks() -> int:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    try:
        scan = proc.CpuNeighbours()
        time.sleep(0.3)  # the busy process is running
        t0, before = time.monotonic(), ticks()
        scan.sample(t0, [])
        time.sleep(2.0)
        t1, after = time.monotonic(), ticks()
        foreign, own, top = scan.sample(t1, [])
        # what it used, however busy the machine is (other processes may take most of the CPUs)
        used = (after - before) / TICK / (t1 - t0)
        named = next((n for n in top if n.pid == pid), None)
        if named is not None:
            assert named.cores == pytest.approx(used, abs=0.05)
            assert named.name.startswith("python")
        elif used >= 0.05:
            # left out only when the list is full of processes at least as busy (a loaded machine:
            # the suite beside a benchmark lists other tests' trainings first)
            assert len(top) >= proc.TOP_NEIGHBOURS and min(n.cores for n in top) >= used - 0.05, (used, top)
        assert foreign is not None and foreign >= used - 0.05
        assert own is not None and own < 0.5  # this test's own process sleeps
    finally:
        os.kill(pid, 9)


# -- cgroup CPU quota and throttling --------------------------------------------------------------


def _cgroup_root_like_mine(tmp_path: Path, quota: int | None, stat: str) -> Path:
    """A fake cgroup mount where this process's own cgroup (v1 cpu and/or v2) has ``quota`` us
    per 100 ms period (``None``: unlimited, as each version writes it)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if controllers == "":
            group = tmp_path / rel
            group.mkdir(parents=True, exist_ok=True)
            (group / "cpu.max").write_text(f"{'max' if quota is None else quota} 100000\n")
            (group / "cpu.stat").write_text(stat)
        elif "cpu" in controllers.split(","):
            group = tmp_path / "cpu" / rel
            group.mkdir(parents=True, exist_ok=True)
            (group / "cpu.cfs_quota_us").write_text(f"{-1 if quota is None else quota}\n")
            (group / "cpu.cfs_period_us").write_text("100000\n")
            (group / "cpu.stat").write_text(stat)
    return tmp_path


def test_the_binding_quota_and_its_counters_are_found(tmp_path: Path) -> None:
    root = _cgroup_root_like_mine(tmp_path, 50000, "nr_periods 10\nnr_throttled 4\nthrottled_time 0\n")
    quota = cpus.cpu_quota(os.getpid(), root)
    assert quota is not None and quota.cpus == 0.5
    assert quota.stat.is_file() and quota.stat.parent.is_relative_to(root)
    assert cpus._cgroup_quota(os.getpid(), root) == 0.5
    unlimited = _cgroup_root_like_mine(tmp_path / "free", None, "")
    assert cpus.cpu_quota(os.getpid(), unlimited) is None


@pytest.mark.parametrize(
    ("version", "text", "want"),
    [
        (1, "nr_periods 200\nnr_throttled 150\nthrottled_time 7500000000\n", (200, 150, 7.5)),
        (2, "usage_usec 9\nnr_periods 200\nnr_throttled 50\nthrottled_usec 2500000\n", (200, 50, 2.5)),
        (2, "nr_periods 200\nnr_throttled x\nthrottled_usec 1\n", None),  # malformed
        (1, "nr_periods 200\n", None),  # a kernel without the counters
    ],
)
def test_throttling_counters_are_read_per_cgroup_version(
    tmp_path: Path, version: int, text: str, want: tuple[int, int, float] | None
) -> None:
    (tmp_path / "cpu.stat").write_text(text)
    assert cpus.read_throttling(cpus.CpuQuota(1.0, tmp_path / "cpu.stat", version)) == want
    assert cpus.read_throttling(cpus.CpuQuota(1.0, tmp_path / "gone.stat", version)) is None


# -- the threads the training asks for --------------------------------------------------------------


def test_thread_settings_are_read_without_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "8\n; rm -rf /" + "x" * 40)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)

    def boom() -> int:
        raise RuntimeError("not built with threads")

    fake = types.SimpleNamespace(get_num_threads=lambda: 8, get_num_interop_threads=boom)
    read = read_threads(fake)
    assert (read.intra_op, read.inter_op, read.mkl_num_threads) == (8, None, None)
    assert read.omp_num_threads is not None and len(read.omp_num_threads) <= 32 and "\n" not in read.omp_num_threads
    assert read_threads(types.SimpleNamespace(get_num_threads=lambda: 0)).intra_op is None
    nothing = read_threads(object())
    assert (nothing.intra_op, nothing.inter_op) == (None, None)
    # what the hook publishes, the reader takes back
    assert wire.ThreadSettings.decode(read.to_json(), "threads") == read


def test_reading_the_threads_leaves_them_settable_by_the_training() -> None:
    code = (
        "import torch\n"
        "from torchwatch.hook.cpus import read_threads\n"
        "before = read_threads(torch)\n"
        "torch.set_num_interop_threads(1)\n"  # raises once the inter-op pool has started
        "torch.set_num_threads(1)\n"
        "print(before.intra_op >= 1, before.inter_op >= 1, torch.get_num_threads(), torch.get_num_interop_threads())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True", "True", "1", "1"]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"intra_op": 0}, "outside"),
        ({"intra_op": "8"}, "expected an integer"),
        ({"inter_op": 1 << 20}, "outside"),
        ({"omp_num_threads": 8}, "expected a string"),
        ({"omp_num_threads": "9" * 33}, "at most 32"),
        ([], "expected an object"),
    ],
)
def test_thread_settings_from_a_hostile_hook_file_are_refused(value: object, error: str) -> None:
    with pytest.raises(wire.WireError, match=error):
        wire.ThreadSettings.decode(value, "hook.json.threads")


def test_a_hook_record_carries_the_threads() -> None:
    rec = wire.HookRecord(wire.Instance(1, 2, 3), "3.11", "2.13", 1.0, 0, False, threads=wire.ThreadSettings(8, 2))
    back = wire.HookRecord.decode(json.loads(json.dumps(rec.to_json())))
    assert back.threads == wire.ThreadSettings(8, 2)


# -- waiting for a CPU, thread by thread -----------------------------------------------------------

MAIN = 4242


def _thread(tid: int, t: float, run_per_s: float, queued_per_s: float) -> ThreadSample:
    return ThreadSample(
        t=t,
        pid=MAIN,
        tid=tid,
        role=Role.MAIN,
        is_main_thread=tid == MAIN,
        state="R",
        wait=Wait.RUNNING,
        run_s=1.0 + t * run_per_s,
        runq_s=0.5 + t * queued_per_s,
    )


def test_the_intra_op_thread_that_waits_for_a_cpu_is_the_loops_wait() -> None:
    """The barrier: the loop's thread spins on a CPU (0.95) while the second intra-op thread waits
    for one 45 % of the time: the loop's own run-queue share says little, the thread's says it."""
    threads = [_thread(MAIN, i / 10, 0.95, 0.02) for i in range(100)]
    threads += [_thread(MAIN + 1, float(i), 0.5, 0.45) for i in range(10)]  # read once a second
    threads += [_thread(MAIN + 2, float(i), 0.02, 0.01) for i in range(10)]  # an idle helper thread
    f = compute(Window(0.0, 10.0, threads=sorted(threads, key=lambda s: s.t)), MAIN)
    assert f["main_runqueue_share"] == pytest.approx(0.02, abs=0.005)
    assert f["threads_runqueue_share"] == pytest.approx(0.45, abs=0.01)
    assert f["cpu_wait_share"] == pytest.approx(0.45, abs=0.01)
    quiet = [s for s in threads if s.tid != MAIN + 1]
    assert compute(Window(0.0, 10.0, threads=quiet), MAIN)["cpu_wait_share"] == pytest.approx(0.02, abs=0.005)


# -- where the CPU findings stand -----------------------------------------------------------------------


_BUSY_NEIGHBOUR = {"cpu_wait_share": 0.45, "threads_runqueue_share": 0.45, "foreign_cpu_cores": 1.0, "usable_cpus": 2.0}


def test_beside_a_busy_process_a_dataloader_bound_loop_keeps_its_label_with_the_neighbour_first() -> None:
    values = {**_BUSY_NEIGHBOUR, "worker_count": 2.0, "data_wait_queue_share": 0.6, "workers_running_fraction": 0.9}
    found, label, _ = _settled(["loader-cpu-in-workers", "cpu-contention"], **values)
    assert label == "dataloader-bound"
    assert found == ["cpu-contention", "loader-cpu-in-workers"]


def test_a_cpu_bound_loop_beside_a_neighbour_gets_the_neighbour_first_and_loop_cpu_second() -> None:
    found, label, confidence = _settled(["loop-cpu", "cpu-contention"], loop_cpu_share=0.55, **_BUSY_NEIGHBOUR)
    assert (found, label) == (["cpu-contention", "loop-cpu"], "cpu-bound")
    assert confidence >= 0.9  # the neighbours' finding explains its own reading: not blurred


def test_waiting_for_a_cpu_others_hold_blurs_the_loops_own_finding() -> None:
    _, label, sharp = _settled(["loop-cpu"], loop_cpu_share=0.8)
    _, _, blurred = _settled(["loop-cpu"], loop_cpu_share=0.8, threads_runqueue_share=0.4, foreign_cpu_cores=1.0)
    _, _, tiny = _settled(["loop-cpu"], loop_cpu_share=0.8, threads_runqueue_share=0.05, foreign_cpu_cores=1.0)
    _, _, own = _settled(["loop-cpu"], loop_cpu_share=0.8, threads_runqueue_share=0.4, foreign_cpu_cores=0.1)
    assert label == "cpu-bound"
    assert blurred == pytest.approx(sharp * 0.6, abs=0.01)
    assert tiny == sharp  # below the floor: a quiet machine's few percent change nothing
    assert own == sharp  # its own threads beyond its CPUs: the wait is the loop's own work


def test_a_quota_or_extra_threads_come_after_the_loops_own_findings() -> None:
    """Under its own quota the training's work spends the quota: a cheaper loop is also less
    throttled, so the loop's own finding comes first even where the throttling explains more of the
    step (measured: big_cpu_matmul in a 1-CPU quota, 2.3x with the quota lifted, 8.8x with its
    relief; its loop on a CPU about half the time, throttled about half)."""
    quota = {"cpu_quota_cpus": 1.0, "cpu_throttled_periods_share": 0.9, "cpu_throttled_share": 0.6}
    found, label, _ = _settled(["loop-cpu", "cpu-quota-throttled"], loop_cpu_share=0.51, **quota)
    assert (found, label) == (["loop-cpu", "cpu-quota-throttled"], "cpu-bound")
    threads = {"cpu_threads_wanted": 8.0, "intra_op_threads": 8.0, "usable_cpus": 2.0, "threads_runqueue_share": 0.7}
    found, _, _ = _settled(["cpu-oversubscribed", "loop-cpu"], loop_cpu_share=0.51, **threads)
    assert found == ["loop-cpu", "cpu-oversubscribed"]
    found, _, _ = _settled(["loop-cpu", "cpu-quota-throttled"], loop_cpu_share=0.15, main_sleep_share=0.3, **quota)
    assert found == ["cpu-quota-throttled"]  # on a CPU 0.15 of the 0.4 the quota left: not the loop's CPU
    loader = {"worker_count": 2.0, "data_wait_queue_share": 0.6, "workers_running_fraction": 0.9}
    found, label, _ = _settled(["loader-cpu-in-workers", "cpu-quota-throttled"], **loader, **quota)
    assert (found, label) == (["loader-cpu-in-workers", "cpu-quota-throttled"], "dataloader-bound")


def test_under_a_quota_the_loops_cpu_share_is_of_the_time_the_quota_lets_it_run() -> None:
    """On a CPU 30 % of the wall time but throttled 47 %: 57 % of the time it may run, loop-cpu's
    line is crossed; the same 30 % without a quota is not."""
    throttled = {"cpu_quota_cpus": 1.0, "cpu_throttled_periods_share": 0.9, "cpu_throttled_share": 0.47}
    assert _settled(["loop-cpu"], loop_cpu_share=0.3, **throttled)[0] == ["loop-cpu"]
    assert _settled(["loop-cpu"], loop_cpu_share=0.3)[0] == []


def test_finding_order_puts_the_neighbours_first_and_info_last() -> None:
    d = Diagnoser(list(RULES.values()))
    values = features(
        **_BUSY_NEIGHBOUR, main_sleep_share=0.5, gpu_mem_ratio=0.95, storage_wait_share=0.5, disk_tree_share=1.0
    )
    d.evaluate(values, 0.0)
    a = d.evaluate(values, 10.0)
    order = [f.rule for f in a.findings]
    assert order[0] == "cpu-contention"
    assert order.index("storage-wait") < order.index("loop-sleeps") < order.index("gpu-memory-pressure")
    assert a.verdict.label == "io-bound"
    assert [f.rule for f in sorted(a.findings, key=finding_order)] == order


def test_the_fixes_quote_the_users_threads_and_the_cpus_left() -> None:
    rule = RULES["cpu-contention"]
    d = Diagnoser([rule])
    f = features(**_BUSY_NEIGHBOUR, intra_op_threads=2.0, local_ranks=1.0, workers_cpu_pct=0.0)
    texts = {"thread_env": "OMP_NUM_THREADS unset", "cpu_neighbours": "PID 812 python (alice) 1.0 cores"}
    d.evaluate(f, 0.0, texts)
    finding = d.evaluate(f, 10.0, texts).findings[0]
    assert "PID 812 python (alice) 1.0 cores" in finding.summary
    details = " ".join(fx.detail for fx in finding.fixes)
    assert "torch.set_num_threads(1)" in details and "(OMP_NUM_THREADS unset)" in details
    # others' few percent (torchwatch's neighbours on a quiet machine) take no CPU from the count
    assert diagnosis.template_values(features(usable_cpus=2.0, foreign_cpu_cores=0.1))["suggested_threads"] == 2.0
    assert diagnosis.template_values(features(usable_cpus=2.0, foreign_cpu_cores=0.6))["suggested_threads"] == 1.0
    # one thread already: nothing to lower, that fix is left out
    d = Diagnoser([rule])
    one = features(**_BUSY_NEIGHBOUR, intra_op_threads=1.0, local_ranks=1.0)
    d.evaluate(one, 0.0, texts)
    assert [fx.title for fx in d.evaluate(one, 10.0, texts).findings[0].fixes] == ["Give the training its CPUs"]


def test_throttled_time_is_shared_over_the_cpus_the_group_runs_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The kernel sums a group's throttled time over its run queue on each CPU: 2 threads stopped
    half of each period on 2 CPUs add up to 1.0 s per s, which is 0.5 of the wall time."""
    quota = cpus.CpuQuota(1.0, tmp_path / "cpu.stat", 1)
    reads = iter([(100, 0, 0.0), (110, 9, 2.0)])  # 10 periods, 9 throttled, 2.0 s of throttled time
    monkeypatch.setattr(proc, "cpu_quota", lambda pid: quota)
    monkeypatch.setattr(proc, "read_throttling", lambda q: next(reads))
    monkeypatch.setattr(proc.os, "sched_getaffinity", lambda pid: {0, 1})
    source = proc.ProcSource.__new__(proc.ProcSource)
    source._prev_throttle = None
    assert source._throttling(1, 10.0) == (1.0, None, None)
    assert source._throttling(1, 12.0) == (1.0, pytest.approx(0.9), pytest.approx(0.5))

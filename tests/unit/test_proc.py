"""torchwatch.sources.proc: wait classification and process roles, on synthetic inputs."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tests.unit.procs import PY, TRAIN, _named_thread, node
from torchwatch.analysis.views import process_rows
from torchwatch.model.readings import ProcessSample, Role, ThreadSample, Wait
from torchwatch.sources.proc import ProcessTree, ThreadStateSource, assign_roles, classify_wait

X86 = "x86_64"
ARM = "aarch64"


@pytest.mark.parametrize(
    ("state", "syscall", "fd", "arch", "want"),
    [
        ("R", None, None, X86, Wait.RUNNING),
        ("R", "202 0x1 0x2", None, X86, Wait.RUNNING),  # state wins over a stale syscall
        ("D", None, None, X86, Wait.DISK),
        ("D", "0 0x3 0x7f", "pipe:[1]", X86, Wait.DISK),
        (
            "S",
            "230 0x1 0x0 0x7ffd 0x0 0x0 0x0 0x7ffd 0x7f",
            None,
            X86,
            Wait.SLEEP,
        ),  # clock_nanosleep
        ("S", "35 0x7ffd 0x0", None, X86, Wait.SLEEP),  # nanosleep
        ("S", "202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f", None, X86, Wait.SYNC),  # futex
        ("S", "7 0x7f 0x1 0xffffffff", None, X86, Wait.SYNC),  # poll
        ("S", "0 0x1 0x7f 0x4", "pipe:[1]", X86, Wait.SYNC),  # read on a pipe
        ("S", "0 0x5 0x7f 0x4", "socket:[2]", X86, Wait.NET),
        ("S", "0 0x6 0x7f 0x4", "/data/file", X86, Wait.FILE),
        ("S", "0 0x6 0x7f 0x4", None, X86, Wait.OTHER),  # fd target unknown
        ("S", "45 0x5 0x7f", None, X86, Wait.NET),  # recvfrom
        ("S", "running", None, X86, Wait.OTHER),
        ("S", "-1 0x7ffd 0x7f", None, X86, Wait.OTHER),
        ("S", None, None, X86, Wait.OTHER),
        ("S", "", None, X86, Wait.OTHER),
        ("S", "garbage 0x1", None, X86, Wait.OTHER),
        ("S", "999 0x1", None, X86, Wait.OTHER),
        ("S", "202 0x1", None, "riscv64", Wait.OTHER),  # unknown architecture
        ("S", "115 0x1 0x0", None, ARM, Wait.SLEEP),  # clock_nanosleep on aarch64
        ("S", "101 0x1 0x0", None, ARM, Wait.SLEEP),  # nanosleep on aarch64
        ("S", "98 0x1 0x80", None, ARM, Wait.SYNC),  # futex on aarch64
        ("S", "63 0x3 0x7f", "pipe:[9]", ARM, Wait.SYNC),  # read on aarch64
        ("S", "63 0x3 0x7f", "/data/f.bin", ARM, Wait.FILE),
        ("S", "230 0x1", None, ARM, Wait.OTHER),  # 230 is not a sleep on aarch64
    ],
)
def test_classify_wait(state: str, syscall: str | None, fd: str | None, arch: str, want: Wait) -> None:
    assert classify_wait(state, syscall, fd, arch=arch) is want


def test_python_main_with_forked_workers() -> None:
    nodes = {100: node(1, TRAIN), 101: node(100, TRAIN), 102: node(100, TRAIN)}
    assert assign_roles(nodes, 100) == {100: Role.MAIN, 101: Role.WORKER, 102: Role.WORKER}


def test_pyenv_shim_root_is_launcher() -> None:
    shim = ("bash", "/home/u/.pyenv/shims/python", "train.py")
    real = ("/home/u/.pyenv/versions/3.11.7/bin/python", "train.py")
    nodes = {
        10: node(1, shim, name="bash", exe="/usr/bin/bash"),
        11: node(10, real, exe=real[0]),
        12: node(11, real, exe=real[0]),
    }
    assert assign_roles(nodes, 10) == {10: Role.LAUNCHER, 11: Role.MAIN, 12: Role.WORKER}


def test_torchrun_ranks_are_mains_with_their_workers() -> None:
    launcher = (PY, "/usr/local/bin/torchrun", "--nproc_per_node=2", "train.py")
    rank = (PY, "-u", "train.py", "--epochs", "1")
    nodes = {
        50: node(1, launcher, name="torchrun"),
        51: node(50, rank),
        52: node(50, rank),
        53: node(51, rank),
        54: node(52, rank),
    }
    roles = assign_roles(nodes, 50)
    assert roles == {
        50: Role.LAUNCHER,
        51: Role.MAIN,
        52: Role.MAIN,
        53: Role.WORKER,
        54: Role.WORKER,
    }


def test_python_m_torch_distributed_run_is_launcher() -> None:
    nodes = {
        60: node(1, (PY, "-m", "torch.distributed.run", "--nproc_per_node=1", "train.py")),
        61: node(60, TRAIN),
    }
    assert assign_roles(nodes, 60) == {60: Role.LAUNCHER, 61: Role.MAIN}


def test_spawn_worker_and_resource_tracker() -> None:
    spawn = (
        PY,
        "-c",
        "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
        "--multiprocessing-fork",
    )
    tracker = (PY, "-c", "from multiprocessing.resource_tracker import main;main(4)")
    nodes = {
        200: node(1, TRAIN),
        201: node(200, tracker),
        202: node(200, spawn),
        203: node(200, spawn),
    }
    assert assign_roles(nodes, 200) == {
        200: Role.MAIN,
        201: Role.HELPER,
        202: Role.WORKER,
        203: Role.WORKER,
    }


def test_other_python_child_is_a_candidate_main_not_a_worker() -> None:
    """A wrapper may start the real training with subprocess: both are mains, the session picks the busiest."""
    nodes = {300: node(1, (PY, "launch.py")), 301: node(300, TRAIN), 302: node(301, TRAIN)}
    assert assign_roles(nodes, 300) == {300: Role.MAIN, 301: Role.MAIN, 302: Role.WORKER}


def test_forkserver_children_are_workers() -> None:
    fs = (PY, "-c", "from multiprocessing.forkserver import main; main(5, 6, ['__main__'])")
    nodes = {500: node(1, TRAIN), 501: node(500, fs), 502: node(501, fs), 503: node(501, fs)}
    roles = assign_roles(nodes, 500)
    assert roles[501] is Role.HELPER
    assert roles[502] is Role.WORKER and roles[503] is Role.WORKER


def test_a_dying_worker_whose_cmdline_reads_empty_stays_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process being OOM-killed has released its memory before it is a zombie: its
    ``/proc/PID/cmdline`` reads empty for that while. The tree keeps its last read, so the worker
    is not taken for a second main (the OOM record named the killed worker ``main`` once in 5 runs)."""
    import subprocess
    import sys

    import psutil

    code = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nelse:\n    time.sleep(60)\n"
    main = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(main.pid).children() and time.monotonic() < deadline:
            time.sleep(0.02)
        worker = psutil.Process(main.pid).children()[0].pid
        tree = ProcessTree(main.pid)
        assert tree.nodes()[worker].role is Role.WORKER
        real = psutil.Process.cmdline
        monkeypatch.setattr(psutil.Process, "cmdline", lambda p: [] if p.pid == worker else real(p))
        for _ in range(2):  # and it stays so, read after read
            tree.refresh()
            assert tree.nodes()[worker].role is Role.WORKER
        assert tree.mains() == [main.pid]
    finally:
        os.killpg(main.pid, 9)  # the worker too
        main.wait()


def test_non_python_tree_has_no_main() -> None:
    nodes = {
        400: node(1, ("sleep", "30"), exe="/usr/bin/sleep"),
        401: node(400, ("cat",), exe="/usr/bin/cat"),
    }
    roles = assign_roles(nodes, 400)
    assert Role.MAIN not in roles.values()
    assert roles[400] is Role.LAUNCHER
    assert set(roles) == {400, 401}


def test_unknown_root_gives_no_roles() -> None:
    assert assign_roles({1: node(0, TRAIN)}, 999) == {}


def _io(rbytes: int, count: int, rtime_ms: int, busy_ms: int) -> object:
    """One device's counters, with the attributes psutil's ``sdiskio`` has on Linux."""
    from types import SimpleNamespace

    return SimpleNamespace(read_bytes=rbytes, read_count=count, read_time=rtime_ms, busy_time=busy_ms)


def test_disk_rates_follow_the_whole_device_that_read_most(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    from torchwatch.sources import proc as proc_mod

    vda = _io(8 << 20, 2048, 200, 1500)
    # vda1 is not a whole device (no /sys/block/vda1): ignored even with the most bytes
    after = {"vda": vda, "vda1": _io(16 << 20, 9, 9, 9), "sdb": _io(1 << 20, 8, 40, 40)}
    readings = iter(
        [
            {"vda": _io(0, 0, 0, 0), "vda1": _io(0, 0, 0, 0), "sdb": _io(0, 0, 0, 0)},
            # in 2 s: vda read 8 MiB in 2048 reads taking 0.2 s in all, busy 1.5 s; sdb read 1 MiB.
            after,
            after,
        ]
    )
    monkeypatch.setattr(psutil, "disk_io_counters", lambda perdisk, nowrap: next(readings))
    monkeypatch.setattr(proc_mod.os, "access", lambda path, mode: not path.endswith("vda1"))
    rates = proc_mod.DiskRates()
    assert rates.sample(10.0) == proc_mod.DiskRate()  # first call: a baseline only
    r = rates.sample(12.0)
    assert r.name == "vda"
    assert r.read_bytes_per_s == pytest.approx(4 << 20)
    assert r.reads_per_s == pytest.approx(1024)
    assert r.read_inflight == pytest.approx(0.1)
    assert r.busy == pytest.approx(0.75)
    assert rates.sample(13.0) == proc_mod.DiskRate(read_bytes_per_s=0.0)  # counters read, nothing read


def test_disk_rates_without_diskstats_stop_trying(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    from torchwatch.sources import proc as proc_mod

    calls = []

    def refuse(perdisk: bool, nowrap: bool) -> None:
        calls.append(1)
        raise NotImplementedError("no /proc/diskstats")

    monkeypatch.setattr(psutil, "disk_io_counters", refuse)
    rates = proc_mod.DiskRates()
    assert rates.sample(1.0) == proc_mod.DiskRate() and rates.sample(2.0) == proc_mod.DiskRate()
    assert not rates.available and len(calls) == 1


def test_psi_rate_is_the_growth_of_some_total(tmp_path: object) -> None:
    from pathlib import Path

    from torchwatch.sources.proc import _PsiRate

    path = Path(str(tmp_path)) / "memory"
    line = "some avg10=0.00 avg60=0.00 avg300=0.00 total={}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=9\n"
    path.write_text(line.format(1_000_000))
    psi = _PsiRate(path)
    assert psi.sample(5.0) is None
    path.write_text(line.format(1_300_000))  # 0.3 s of stall in 2 s
    assert psi.sample(7.0) == pytest.approx(15.0)
    path.unlink()
    assert psi.sample(8.0) is None  # PSI gone (no CONFIG_PSI): None, no error


def test_thread_rounds_read_main_threads_and_every_thread_once_per_all_interval() -> None:
    """Most rounds read each process's main thread only (the features read nothing else); every
    thread is read once every ``all_interval`` s, for the Processes panel."""
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    helper.start()
    try:
        tree = ProcessTree(os.getpid())
        assert tree.nodes()[os.getpid()].role is Role.MAIN
        src = ThreadStateSource(tree, interval=0.1, all_interval=1.0)
        every = {s.tid for s in src.sample(100.0) if isinstance(s, ThreadSample)}
        assert os.getpid() in every and helper.native_id in every
        for t in (100.1, 100.2, 100.9):
            main_only = [s for s in src.sample(t) if isinstance(s, ThreadSample)]
            assert [s.tid for s in main_only] == [os.getpid()]
        # a full round due within half a round is taken now, not one round late
        assert {s.tid for s in src.sample(100.96) if isinstance(s, ThreadSample)} >= {os.getpid(), helper.native_id}
    finally:
        stop.set()


def test_main_threads_carry_their_scheduler_counters() -> None:
    """The main thread's on-CPU and run-queue times come from schedstat and grow as it computes."""
    tree = ProcessTree(os.getpid())
    src = ThreadStateSource(tree, interval=0.1, all_interval=1.0)
    (first,) = [s for s in src.sample(100.0) if isinstance(s, ThreadSample) and s.tid == os.getpid()]
    end = time.thread_time() + 0.05
    while time.thread_time() < end:  # 50 ms on a CPU
        pass
    (second,) = [s for s in src.sample(100.1) if isinstance(s, ThreadSample)]
    assert first.run_s is not None and second.run_s is not None and first.runq_s is not None
    assert second.run_s - first.run_s >= 0.045


def _cpu_s(tid: int) -> float:
    """Seconds thread ``tid`` of this process has run on a CPU (schedstat's first field, ns)."""
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def test_the_autograd_engine_thread_is_read_every_round_with_its_counters() -> None:
    """PyTorch's engine thread for a device (pt_autograd_0) is found in a full round and read, with
    its schedstat counters, in every round after it, like the main thread; other threads are not."""
    spin, stop = threading.Event(), threading.Event()
    engine = threading.Thread(target=_named_thread, args=(b"pt_autograd_0", spin, stop), daemon=True)
    other = threading.Thread(target=_named_thread, args=(b"pt_autograd", threading.Event(), stop), daemon=True)
    engine.start()
    other.start()
    try:
        time.sleep(0.1)
        src = ThreadStateSource(ProcessTree(os.getpid()), interval=0.1, all_interval=1.0)
        full = [s for s in src.sample(100.0) if isinstance(s, ThreadSample)]
        (found,) = [s for s in full if s.autograd]
        assert found.tid == engine.native_id and found.run_s is not None
        assert not any(s.autograd for s in full if s.tid == other.native_id)  # "pt_autograd" alone is no engine
        spin.set()
        # until the engine thread has run 0.1 s on a CPU (schedstat), however long a loaded machine
        # takes to give it that (0.2 s of wall time gave it < 0.05 s beside 8 busy processes)
        deadline = time.monotonic() + 60.0
        while _cpu_s(engine.native_id) - found.run_s < 0.1 and time.monotonic() < deadline:
            time.sleep(0.02)
        spin.clear()
        rounds = [s for s in src.sample(100.1) if isinstance(s, ThreadSample)]
        assert {s.tid for s in rounds} == {os.getpid(), engine.native_id}  # main + engine, not all threads
        (again,) = [s for s in rounds if s.autograd]
        assert again.run_s is not None and again.run_s - found.run_s >= 0.05
    finally:
        stop.set()
        spin.set()
        engine.join(5)
        other.join(5)


def _thread(t: float, tid: int, wait: Wait) -> ThreadSample:
    return ThreadSample(t, 10, tid, Role.MAIN, tid == 10, "R" if wait is Wait.RUNNING else "S", wait)


def test_process_table_counts_the_last_round_of_every_thread() -> None:
    """Rounds of the main thread alone after a full round: the state letters still count all."""
    threads = [
        _thread(1.0, 10, Wait.RUNNING),
        _thread(1.0, 11, Wait.SYNC),
        _thread(1.0, 12, Wait.SYNC),
        _thread(1.1, 10, Wait.SYNC),
        _thread(1.2, 10, Wait.RUNNING),
    ]
    procs = [ProcessSample(1.2, 10, 1, Role.MAIN, "python", ("python",), 50.0, 1 << 20, None, None, num_threads=3)]
    (row,) = process_rows(procs, threads)
    assert row.threads == "R1 W2"
    assert process_rows(procs, threads[3:])[0].threads == "R1"  # one thread seen: its latest round

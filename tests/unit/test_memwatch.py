"""The memory watch (torchwatch.watch.memwatch): forecasts, who grows, and the out-of-memory record,
from readings built by hand (the integration test and bench/memory_forecast.py use real ones)."""

from __future__ import annotations

import pytest

from torchwatch.analysis.features import WATCH_FEATURES
from torchwatch.analysis.store import Store
from torchwatch.model.memory import KillEvent, LimitReading, MemorySample, ProcMemory
from torchwatch.model.readings import HookState, ProcessSample, Role
from torchwatch.watch.memwatch import MemoryWatch
from torchwatch.wire import DeviceMemory, HookRecord, Instance, OomRecord

MIB = 1 << 20
MAIN, WORKER = 100, 101


def proc(t: float, pid: int, role: Role) -> ProcessSample:
    return ProcessSample(t, pid, 1, role, "python", ("python",), 10.0, 500 * MIB, 0.0, 0.0, 4)


def feed(store: Store, w: MemoryWatch, t0: float, t1: float, worker_alive=lambda t: True, kills=lambda t: (),
         oom_kills=lambda t: 0, grow: float = 6.0) -> None:  # fmt: skip
    t = t0
    while t <= t1:
        ps = [proc(t, MAIN, Role.MAIN)] + ([proc(t, WORKER, Role.WORKER)] if worker_alive(t) else [])
        store.add(ps)
        used = int(800 * MIB + grow * MIB * t)
        procs = ()
        if int(t) % 5 == 0:
            procs = (
                ProcMemory(MAIN, 900 * MIB, 500 * MIB, 300 * MIB, 600 * MIB, 0, 300 * MIB, 600 * MIB, t),
                ProcMemory(WORKER, 900 * MIB, 300 * MIB, int(40 * MIB + grow * MIB * t),
                           int(860 * MIB - grow * MIB * t), 0, 40 * MIB, 860 * MIB, t),
            )  # fmt: skip
        lim = LimitReading(
            2048 * MIB, used, "cgroup v1 memory limit of /sys/fs/cgroup/memory/job", oom_kills=oom_kills(t)
        )
        store.add([MemorySample(t, lim, procs, tuple(kills(t)))])
        w.update(store, t, MAIN)
        t += 1.0


def test_a_steady_copy_by_the_workers_is_forecast_and_named_and_every_feature_is_in_the_catalogue():
    store, w = Store(keep=3600), MemoryWatch()
    feed(store, w, 0, 100)
    f = w.features()
    assert set(f) == WATCH_FEATURES
    # (2048 - 800 - 600) MiB left at 6 MiB/s at t=100: 108 s
    assert f["mem_forecast_s"] == pytest.approx(108, rel=0.1)
    assert f["worker_private_growth_bytes_per_s"] == pytest.approx(6 * MIB, rel=0.1)
    assert f["worker_cow_share"] == pytest.approx(1.0, rel=0.05)
    view = w.view()
    assert view.forecasts and view.forecasts[0].what == "host"
    assert f"worker {WORKER}" in view.forecasts[0].grower and "copy-on-write" in view.forecasts[0].grower
    assert w.texts()["mem_limit_source"].startswith("cgroup v1")


def test_a_flat_tree_gets_no_forecast_and_says_why():
    store, w = Store(keep=3600), MemoryWatch()
    feed(store, w, 0, 120, grow=0.0)
    assert w.features()["mem_forecast_s"] is None and w.features()["worker_private_growth_bytes_per_s"] is None
    assert w.view().why_not


def test_the_kernels_line_names_the_killed_worker_once():
    store, w = Store(keep=3600), MemoryWatch()
    feed(store, w, 0, 90, worker_alive=lambda t: t < 80,
         kills=lambda t: [KillEvent(t, WORKER, "python", 700 * MIB)] if t in (80.0, 81.0) else [])  # fmt: skip
    records = w.view().records
    assert len(records) == 1
    r = records[0]
    assert (r.kind, r.pid, r.role) == ("host", WORKER, "worker") and "Killed process 101" in r.how
    assert r.forecast is not None and any(p.pid == WORKER and p.ended for p in r.processes)


def test_without_the_kernel_log_the_cgroups_count_and_the_vanished_worker_make_the_record():
    store, w = Store(keep=3600), MemoryWatch()
    feed(store, w, 0, 90, worker_alive=lambda t: t < 80, oom_kills=lambda t: 1 if t >= 81 else 0)
    records = w.view().records
    assert len(records) == 1 and records[0].pid == WORKER and "oom_kill count rose from 0 to 1" in records[0].how


def test_a_kill_of_a_process_outside_the_tree_is_not_recorded():
    store, w = Store(keep=3600), MemoryWatch()
    feed(store, w, 0, 40, kills=lambda t: [KillEvent(t, 999, "other", None)] if t == 20.0 else [],
         oom_kills=lambda t: 1 if t >= 20 else 0)  # fmt: skip
    assert w.view().records == ()


def test_a_cuda_out_of_memory_error_from_the_hook_is_recorded_once():
    store, w = Store(keep=3600), MemoryWatch()
    oom = OomRecord(t=5.0, count=1, device=0, requested_bytes=2 << 30, stack=("train.py:10 step",), step_ms=(100.0,))
    rec = HookRecord(Instance(MAIN, 1, 1), "3.11", "2.13", 0.0, 0, False, cuda_initialized=False,
                     device_memory=DeviceMemory(0, 70 << 30, 75 << 30, 79 << 30, 80 << 30), oom=oom)  # fmt: skip
    for t in (5.0, 6.0):
        store.add([HookState(t, MAIN, 10, 10, 0.0, 0.0, record=rec)])
        w.update(store, t, MAIN)
    records = w.view().records
    assert len(records) == 1 and records[0].kind == "cuda" and records[0].cuda == oom
    assert records[0].stacks == ("train.py:10 step",)

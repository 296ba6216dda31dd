"""Recorded readings and fake sessions for the TUI tests (and a check that they diagnose as recorded).

The stacks are py-spy's own output for a DataLoader training with two workers
(``tests/fixtures/pyspy/dataloader_nw2_subprocesses.raw``), replayed as four 3 s chunks; the
process, thread and GPU readings follow the same run's shape (the loop waits on two busy
workers). The clock is frozen at :data:`NOW`: nothing on screen depends on the wall clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from torchwatch.analysis import features as feats
from torchwatch.analysis.diagnosis import Analysis, Diagnoser
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.analysis.store import Store
from torchwatch.model.readings import (
    GpuSample,
    ProcessSample,
    Role,
    SourceStatus,
    StackSample,
    SystemSample,
    ThreadSample,
    Wait,
)
from torchwatch.sources.pyspy import parse_raw

NOW = 60.0
MAIN, WORKERS, HELPER = 4236, (4279, 4280), 4250
PYSPY = Path(__file__).resolve().parent.parent / "fixtures" / "pyspy" / "dataloader_nw2_subprocesses.raw"
A100_NO_GPM = "GPM needs a Hopper or newer GPU (this is NVIDIA A100-SXM4-40GB)"
NVML_MISSING = SourceStatus.unavailable(
    "NVML library not found (no NVIDIA driver)", "install the NVIDIA driver, or ignore on a CPU-only machine"
)


def _role(pid: int) -> Role:
    return Role.MAIN if pid == MAIN else Role.HELPER if pid == HELPER else Role.WORKER


def recorded_store(gpus: bool = False) -> Store:
    """Sixty seconds of readings of a DataLoader-bound training with two workers."""
    store = Store(keep=1e9)
    out: list[object] = []
    for i in range(1, int(NOW) + 1):
        t = float(i)
        wobble = (i * 37) % 11  # deterministic variation, no randomness
        out.append(SystemSample(t, 97.0, 0.5, 2.0))
        out.append(
            ProcessSample(
                t,
                MAIN,
                4230,
                Role.MAIN,
                "python",
                ("python", "train.py"),
                38.0 + wobble,
                900_000_000 + i * 1_000_000,
                0.0,
                0.0,
                9,
            )
        )
        for k, pid in enumerate(WORKERS):
            out.append(
                ProcessSample(
                    t,
                    pid,
                    MAIN,
                    Role.WORKER,
                    "python",
                    ("python", "train.py"),
                    78.0 + wobble + k,
                    410_000_000 + k * 5_000_000,
                    2_000_000.0 + 100_000 * wobble,
                    0.0,
                    3,
                )
            )
        out.append(
            ProcessSample(
                t,
                HELPER,
                MAIN,
                Role.HELPER,
                "python",
                ("python", "-c", "resource_tracker"),
                0.0,
                12_000_000,
                None,
                0.0,
                1,
            )
        )
        if gpus:
            util = 30.0 + 25.0 * (0.5 + 0.5 * math.sin(i / 4.0))
            out.append(
                GpuSample(
                    t,
                    0,
                    "NVIDIA A100-SXM4-40GB",
                    util,
                    12_000_000_000 + i * 10_000_000,
                    40_000_000_000,
                    120.0 + util,
                    400.0,
                    1410.0,
                    1e9,
                    2e8,
                    (MAIN,),
                    gpm_reason=A100_NO_GPM,
                    proc_sm_pct=util,
                )
            )
            out.append(
                GpuSample(
                    t,
                    1,
                    "NVIDIA A100-SXM4-40GB",
                    0.0,
                    500_000_000,
                    40_000_000_000,
                    58.0,
                    400.0,
                    210.0,
                    0.0,
                    0.0,
                    (),
                    gpm_reason=A100_NO_GPM,
                )
            )
    for r in range(0, 41):  # thread states at 4 Hz over the last 10 s
        t = NOW - 10.0 + r * 0.25
        out.append(
            ThreadSample(
                t,
                MAIN,
                MAIN,
                Role.MAIN,
                True,
                "S" if r % 10 < 7 else "R",
                Wait.SYNC if r % 10 < 7 else Wait.RUNNING,
                0.3 * t,
                0.01 * t,
                0.0,
            )
        )
        out.append(ThreadSample(t, MAIN, MAIN + 1, Role.MAIN, False, "S", Wait.SYNC))
        out.append(ThreadSample(t, MAIN, MAIN + 2, Role.MAIN, False, "S", Wait.NET))
        for pid in WORKERS:
            busy = r % 10 != 0
            out.append(
                ThreadSample(
                    t,
                    pid,
                    pid,
                    Role.WORKER,
                    True,
                    "R" if busy else "S",
                    Wait.RUNNING if busy else Wait.SYNC,
                    0.8 * t,
                    0.02 * t,
                )
            )
            out.append(ThreadSample(t, pid, pid + 1, Role.WORKER, False, "S", Wait.SYNC))
    text = PYSPY.read_text()
    # The recording named the workers' PIDs the other way round; the main training is 4236.
    for t in (NOW - 9.0, NOW - 6.0, NOW - 3.0, NOW):
        out.extend(parse_raw(text, t, MAIN, _role))
    store.add(out)
    return store


def analyse(store: Store) -> Analysis:
    """Features and rules over the store's last 10 s, evaluated twice so hold times pass."""
    window = store.window(NOW - 10.0, NOW)
    f = feats.compute(window, MAIN)
    d = Diagnoser(load_rules())
    d.evaluate(f, NOW - 20.0)
    return d.evaluate(f, NOW)


@dataclass
class _Node:
    cmdline: tuple[str, ...]


@dataclass
class _Tree:
    root: int = MAIN

    def nodes(self) -> dict[int, _Node]:
        return {MAIN: _Node(("python", "train.py"))}


def _sources(gpus: bool) -> dict[str, SourceStatus]:
    return {
        "psutil": SourceStatus.ok(),
        "threads": SourceStatus.ok(),
        "py-spy": SourceStatus.ok(),
        "nvml": SourceStatus.ok() if gpus else NVML_MISSING,
        "gpm": SourceStatus.unavailable(A100_NO_GPM if gpus else "needs NVML: NVML library not found"),
    }


@dataclass
class FakeSession:
    """What WatchApp reads from today's Session (no hook): recorded readings, canned analyses."""

    store: Store = field(default_factory=recorded_store)
    latest: Analysis | None = None
    last_alive: Analysis | None = None
    target_gone: bool = False
    ended_at: float | None = None
    main_pid: int | None = MAIN
    tree: _Tree = field(default_factory=_Tree)
    options: Any = field(default_factory=lambda: SimpleNamespace(window_s=10.0))
    history: list[tuple[float, str]] = field(default_factory=lambda: [(2.0, "undetermined"), (8.0, "dataloader-bound")])
    sources: dict[str, SourceStatus] = field(default_factory=lambda: _sources(False))

    def statuses(self) -> dict[str, SourceStatus]:
        return dict(self.sources)

    def own_usage(self) -> dict[str, float]:
        return {"torchwatch_cpu_s": 1.0, "pyspy_cpu_s": 0.5, "wall_s": 60.0, "cpu_pct_of_core": 2.5}


def hook_summary(burst: bool = True) -> dict[str, Any]:
    """A hook summary as the session publishes it, with a finished burst."""
    last = {
        "id": 3,
        "steps": 5,
        "step_time_ms": 312.5,
        "breakdown_share": {
            "kernel": 0.08,
            "memcpy": 0.02,
            "memset": 0.0,
            "communication": 0.0,
            "runtime": 0.05,
            "dataloader": 0.61,
            "cpu_exec": 0.2,
            "other": 0.04,
        },
        "phases_share": {"data": 0.62, "forward": 0.14, "backward": 0.17, "optimizer": 0.05, "other": 0.02},
        "gpu_idle_share": 0.71,
        "top_cpu_ops": [
            {"name": "aten::conv2d", "self_ms": 41.2, "calls": 40},
            {"name": "aten::addmm", "self_ms": 12.5, "calls": 20},
        ],
        "top_kernels": [{"name": "sm80_xmma_fprop_implicit_gemm", "total_ms": 18.3, "calls": 40}],
        "trace_path": "/tmp/torchwatch-0/4236/burst-3.pt.trace.json",
        "events": 18234,
        "rss_before_bytes": 950_000_000,
        "rss_after_bytes": 1_010_000_000,
    }
    return {
        "status": "ok",
        "reason": None,
        "steps": 1234,
        "steps_per_s": 3.2,
        "step_time_ms": {"p50": 290.0, "p95": 340.0},
        "data_wait_fraction": 0.62,
        "dataloader": {
            "num_workers": 2,
            "batch_size": 32,
            "pin_memory": False,
            "prefetch_factor": 2,
            "persistent_workers": True,
            "batch_bytes": 1_572_864,
        },
        "usable_cpus": 2.0,
        "amp": {"autocast": False, "dtype": None, "grad_scaler": False},
        "burst": {"state": "idle"},
        "last_burst": last if burst else None,
        "errors": [],
    }


@dataclass
class HookedSession(FakeSession):
    """A session with the in-process hook: summary, burst check and request."""

    hook: dict[str, Any] | None = field(default_factory=hook_summary)
    can_burst: tuple[bool, str] = (True, "SIGUSR2 to PID 4236")
    burst_requests: int = 0

    def hook_summary(self) -> dict[str, Any] | None:
        return self.hook

    def burst_possible(self) -> tuple[bool, str]:
        return self.can_burst

    def request_burst(self) -> tuple[bool, str]:
        self.burst_requests += 1
        return True, "burst requested: SIGUSR2 sent to PID 4236"


def recorded_session(gpus: bool = False, hooked: bool = False) -> FakeSession:
    """A fake session over the recorded readings, its analysis computed from them."""
    store = recorded_store(gpus=gpus)
    analysis = analyse(store)
    cls = HookedSession if hooked else FakeSession
    return cls(store=store, latest=analysis, last_alive=analysis, sources=_sources(gpus))


def test_recorded_readings_are_dataloader_bound() -> None:
    analysis = analyse(recorded_store())
    assert analysis.verdict.label == "dataloader-bound", analysis.verdict
    assert {f.rule for f in analysis.findings} == {"loader-cpu-contention", "loader-cpu-in-workers"}
    assert any(isinstance(s, StackSample) for s in recorded_store().window(0, NOW).stacks)

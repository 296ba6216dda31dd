"""Host and device memory of a training: the readings, the forecast and the out-of-memory record.

Readings come from :mod:`torchwatch.sources.memory` (``/proc/PID/smaps_rollup``, the cgroup's
memory files, ``/proc/meminfo``, ``/dev/kmsg``); the forecast and the record are made by
:mod:`torchwatch.watch.memwatch`; faces show :class:`MemoryView`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from torchwatch.wire import OomRecord

__all__ = [
    "KillEvent",
    "LimitReading",
    "MemoryForecastView",
    "MemoryRecord",
    "MemorySample",
    "MemoryView",
    "ProcMemory",
    "ProcSeries",
]


@dataclass(frozen=True)
class ProcMemory:
    """One process's memory from ``/proc/PID/smaps_rollup`` (bytes).

    Attributes:
        pid: the process. rss: resident. pss: proportional set size (each shared page divided by
            the processes sharing it). uss: unique set size, ``Private_Clean + Private_Dirty``.
        shared: ``Shared_Clean + Shared_Dirty``. swap: swapped out.
        uss_start / shared_start: the first values read for this process (a DataLoader worker's
            are those of the parent it forked from, shared: copy-on-write turns shared pages
            private as the worker writes to them, reference counts included).
        age_s: seconds since the first read.
    """

    pid: int
    rss: int
    pss: int
    uss: int
    shared: int
    swap: int
    uss_start: int
    shared_start: int
    age_s: float


@dataclass(frozen=True)
class LimitReading:
    """The memory limit that applies to the training, and what counts against it (bytes).

    Attributes:
        limit: the limit. used: the working set counted against it (a cgroup: usage minus its
            inactive file cache, which the kernel reclaims before it kills, as cAdvisor and the
            kubelet count it; the machine: ``MemTotal - MemAvailable`` plus swap in use).
        source: where the limit comes from, one line (``cgroup v2 memory.max of /sys/fs/cgroup/x``,
            ``cgroup v1 memory.limit_in_bytes of ...``, ``the machine: MemTotal + SwapTotal``).
        high: cgroup v2 ``memory.high`` (throttling starts), when set below the limit.
        oom_kills: the cgroup's ``oom_kill`` count (v2 ``memory.events``, v1
            ``memory.oom_control``); ``None`` where not readable (the machine: ``/proc/vmstat``
            ``oom_kill``).
        psi_some_pct: PSI memory ``some`` avg10 of the cgroup or the machine, %.
    """

    limit: int
    used: int
    source: str
    high: int | None = None
    oom_kills: int | None = None
    psi_some_pct: float | None = None


@dataclass(frozen=True)
class KillEvent:
    """A process the kernel's OOM killer ended, from ``/dev/kmsg`` ("Killed process PID (name)").

    Attributes:
        t: when torchwatch read the message, monotonic s. pid: the process (a PID of the kernel's
            initial namespace). name: its command name. anon_bytes: its ``anon-rss`` when printed.
    """

    t: float
    pid: int
    name: str
    anon_bytes: int | None = None


@dataclass(frozen=True)
class MemorySample:
    """One round of the memory source.

    Attributes:
        t: monotonic s. limit: the limit and use (``None``: not readable). procs: the tree's
            processes read this round (smaps_rollup is read every few rounds: empty between).
        kills: OOM kills the kernel logged since the last round (root only).
    """

    STORE_KIND: ClassVar[str] = "memory"  # its list in the store (:class:`~torchwatch.analysis.store.Window`)

    t: float
    limit: LimitReading | None
    procs: tuple[ProcMemory, ...] = ()
    kills: tuple[KillEvent, ...] = ()


@dataclass(frozen=True)
class MemoryForecastView:
    """When memory reaches its limit, at the pace of the window.

    Attributes:
        what: ``host`` (the limit of :class:`LimitReading`) or ``device`` (a GPU's memory).
        seconds / soonest / latest: time left and its 95 % interval, s (``latest`` may be inf).
        level / limit: bytes now (the window's latest peak) and the limit. slope: bytes/s.
        window_s: seconds of readings behind it. source: what the limit is (one line).
        grower: who grows, one line ("worker 1234: +3.0 MiB/s private, shared -2.9 MiB/s").
        tree_share: the watched tree's share of the growth (0-1; ``None``: not known).
    """

    what: str
    seconds: float
    soonest: float
    latest: float
    level: float
    limit: float
    slope: float
    window_s: float
    source: str
    grower: str = ""
    tree_share: float | None = None


@dataclass(frozen=True)
class ProcSeries:
    """One process's memory over the last minutes (for the out-of-memory record).

    Attributes:
        pid / role / name: the process. points: ``(t monotonic s, rss, uss)`` bytes, oldest first.
        ended: it was gone at the record.
    """

    pid: int
    role: str
    name: str
    points: tuple[tuple[float, int, int], ...]
    ended: bool = False


@dataclass(frozen=True)
class MemoryRecord:
    """The black box written when the training runs out of memory.

    Attributes:
        t: when, monotonic s. kind: ``host`` (the kernel's OOM killer ended a process of the
            tree) or ``cuda`` (``torch.cuda.OutOfMemoryError``).
        pid / role / name: the process that was killed or raised.
        how: how it was known, one line (``/dev/kmsg: Killed process 123 (python)``, ``the cgroup's
            oom_kill count rose from 0 to 1 as PID 123 vanished``, ``the hook's out-of-memory observer``).
        limit: the limit and use at the last reading before. forecast: the forecast shown before, if any.
        processes: every process's memory over the last minutes.
        steps_ms: the last steps' durations, ms. stacks: the killed process's (or the focus
            process's) Python stack at the last sample, innermost last.
        cuda: the hook's record of the allocator (``cuda`` only).
    """

    t: float
    kind: str
    pid: int
    role: str
    name: str
    how: str
    limit: LimitReading | None = None
    forecast: MemoryForecastView | None = None
    processes: tuple[ProcSeries, ...] = ()
    steps_ms: tuple[float, ...] = ()
    stacks: tuple[str, ...] = ()
    cuda: OomRecord | None = None


@dataclass(frozen=True)
class MemoryView:
    """What the faces show of memory beyond the resident-memory trend.

    Attributes:
        limit: the last limit reading. forecasts: host and device forecasts shown now.
        why_not: why no host forecast is shown (the trend's first failing condition), one line.
        workers: the DataLoader workers' memory (the copy-on-write signature: uss up, shared down).
        records: the out-of-memory records made so far (oldest first).
    """

    limit: LimitReading | None = None
    forecasts: tuple[MemoryForecastView, ...] = ()
    why_not: str = ""
    workers: tuple[ProcMemory, ...] = ()
    records: tuple[MemoryRecord, ...] = field(default_factory=tuple)

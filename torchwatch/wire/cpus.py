"""Usable CPUs of a process: its affinity, capped by its cgroup's CPU quota; and the CPU threads
the training asks for, as ``hook.json`` carries them (:class:`ThreadSettings`).

Used by the hook (inside the training) and by the monitor (sources, diagnosis advice, doctor).
``os.cpu_count()`` alone is wrong in containers and under ``taskset``: advice such as
"num_workers=8" must come from here. The hook reads the threads from torch
(:func:`torchwatch.hook.cpus.read_threads`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import _Obj

__all__ = ["MAX_THREADS", "CpuQuota", "ThreadSettings", "cpu_quota", "read_throttling", "usable_cpus"]


MAX_THREADS = 1 << 16  # an intra-op or inter-op pool larger than this is not a real setting


@dataclass(frozen=True)
class ThreadSettings:
    """The CPU threads the training asks for, as the hook read them (``None``: not read).

    Attributes:
        intra_op: ``torch.get_num_threads()``: threads each op may use (OpenMP / ATen pool; by
            default the physical cores, or ``OMP_NUM_THREADS``).
        inter_op: ``torch.get_num_interop_threads()``: threads running independent ops at once.
        omp_num_threads / mkl_num_threads: the training's ``OMP_NUM_THREADS`` /
            ``MKL_NUM_THREADS`` as set (``None``: not set), verbatim, cut to 32 characters.
    """

    intra_op: int | None = None
    inter_op: int | None = None
    omp_num_threads: str | None = None
    mkl_num_threads: str | None = None

    @classmethod
    def decode(cls, value: object, where: str) -> ThreadSettings:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(
            o.integer("intra_op", 1, MAX_THREADS, optional=True),
            o.integer("inter_op", 1, MAX_THREADS, optional=True),
            o.text("omp_num_threads", 32, optional=True),
            o.text("mkl_num_threads", 32, optional=True),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class CpuQuota:
    """The cgroup CPU quota that binds a process: the smallest of its group's and its ancestors'.

    Attributes:
        cpus: the quota in CPUs (``2.5`` = 250 ms of CPU per 100 ms period).
        stat: that group's ``cpu.stat`` (its throttling counters: cgroup v2 ``nr_periods``,
            ``nr_throttled``, ``throttled_usec``; v1 ``nr_periods``, ``nr_throttled``,
            ``throttled_time`` in ns).
        version: 1 or 2.
    """

    cpus: float
    stat: Path
    version: int


def cpu_quota(pid: int | str, root: Path = Path("/sys/fs/cgroup")) -> CpuQuota | None:
    """The quota that binds ``pid`` (see :class:`CpuQuota`), or ``None`` if unlimited or unreadable.

    Raises:
        Nothing: unreadable files count as no quota.
    """
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    best: CpuQuota | None = None

    def keep(found: CpuQuota) -> None:
        nonlocal best
        if best is None or found.cpus < best.cpus:
            best = found

    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.lstrip("/")
        if controllers == "":  # cgroup v2: check the group and every ancestor
            group = root / rel
            while True:
                quota = _read_v2_quota(group / "cpu.max")
                if quota is not None:
                    keep(CpuQuota(quota, group / "cpu.stat", 2))
                if group == root or root not in group.parents:
                    break
                group = group.parent
        elif "cpu" in controllers.split(","):
            for base in (root / "cpu,cpuacct", root / "cpu"):
                quota = _read_v1_quota(base / rel)
                if quota is not None:
                    keep(CpuQuota(quota, base / rel / "cpu.stat", 1))
                    break
    return best


def _cgroup_quota(pid: int | str, root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPU quota of ``pid``'s cgroup in CPUs (``2.5`` = 250 ms per 100 ms), or ``None`` if unlimited."""
    quota = cpu_quota(pid, root)
    return None if quota is None else quota.cpus


def read_throttling(quota: CpuQuota) -> tuple[int, int, float] | None:
    """``(periods, throttled periods, throttled seconds)`` so far, from the quota's ``cpu.stat``;
    ``None`` when unreadable or malformed. Counters only grow while the group lives."""
    try:
        with open(quota.stat, "rb") as f:
            text = f.read(4096).decode("ascii", "replace")
    except OSError:
        return None
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[key] = int(value)
    try:
        periods, throttled = values["nr_periods"], values["nr_throttled"]
        seconds = values["throttled_usec"] / 1e6 if quota.version == 2 else values["throttled_time"] / 1e9
    except KeyError:
        return None
    return periods, throttled, seconds


def _read_v2_quota(path: Path) -> float | None:
    try:
        fields = path.read_text().split()
    except OSError:
        return None
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read_v1_quota(group: Path) -> float | None:
    try:
        quota = int((group / "cpu.cfs_quota_us").read_text())
        period = int((group / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cpus(pid: int | str = "self") -> float:
    """CPUs ``pid`` may use: ``min(len(affinity), cgroup quota)``.

    Returns:
        CPUs as a float (a quota of 1.5 CPUs gives 1.5); at least 1.0.

    Raises:
        Nothing: unreadable files fall back to ``os.cpu_count()``.
    """
    try:
        affinity = float(len(os.sched_getaffinity(0 if pid == "self" else int(pid))))
    except (AttributeError, OSError, ValueError):
        affinity = float(os.cpu_count() or 1)
    quota = _cgroup_quota(pid)
    cpus = affinity if quota is None else min(affinity, quota)
    return max(1.0, cpus)

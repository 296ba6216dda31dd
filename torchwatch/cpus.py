"""Usable CPUs of a process: its affinity, capped by its cgroup's CPU quota.

Standard library only, so the in-process hook can use it too. ``os.cpu_count()`` alone is
wrong in containers and under ``taskset``: advice such as "num_workers=8" must come from here
(FIELD.md: num_workers advice must respect the cgroup quota and affinity).
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def _cgroup_quota(pid: int | str, root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPU quota of ``pid``'s cgroup in CPUs (``2.5`` = 250 ms per 100 ms), or ``None`` if unlimited."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    best: float | None = None
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
                    best = quota if best is None else min(best, quota)
                if group == root or root not in group.parents:
                    break
                group = group.parent
        elif "cpu" in controllers.split(","):
            for base in (root / "cpu,cpuacct", root / "cpu"):
                quota = _read_v1_quota(base / rel)
                if quota is not None:
                    best = quota if best is None else min(best, quota)
                    break
    return best


def _read_v2_quota(path: Path) -> float | None:
    try:
        fields = path.read_text().split()
    except OSError:
        return None
    if len(fields) != 2 or fields[0] == "max":
        return None
    return int(fields[0]) / int(fields[1])


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


def suggested_workers(cpus: float, reserved: int = 1) -> int:
    """DataLoader workers to suggest on ``cpus`` usable CPUs: all but ``reserved`` for the main loop."""
    return max(1, math.floor(cpus) - reserved)


def io_bound_workers(cpus: float, workers: float, workers_cpu_pct: float, cap_per_cpu: int = 4) -> int:
    """DataLoader workers the CPUs can carry when workers mostly wait on storage, not on CPU.

    The CPU budget is :func:`suggested_workers` cores; each worker now uses
    ``workers_cpu_pct / 100 / workers`` of a core (floored at 0.05), so the budget carries
    ``budget / per_worker`` of them. Capped at ``cap_per_cpu`` per usable CPU (each worker
    holds ``prefetch_factor`` batches in memory) and never below ``workers``.

    Args:
        cpus: usable CPUs. workers: DataLoader workers alive. workers_cpu_pct: their CPU
            together, % of one core.
    """
    if workers <= 0:
        return suggested_workers(cpus)
    per_worker = max(0.05, workers_cpu_pct / 100.0 / workers)
    carried = math.floor(suggested_workers(cpus) / per_worker)
    return int(max(workers, min(carried, cap_per_cpu * max(1, math.floor(cpus)))))

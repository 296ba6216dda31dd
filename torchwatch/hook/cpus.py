"""Usable CPUs of a process: its affinity, capped by its cgroup's CPU quota.

Part of the hook (standard library only, it runs inside the training) and used by the monitor
too (sources, diagnosis advice, doctor). ``os.cpu_count()`` alone is wrong in containers and under
``taskset``: advice such as "num_workers=8" must come from here.
"""

from __future__ import annotations

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

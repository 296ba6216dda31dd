"""DataLoader worker counts to suggest, from the usable CPUs.

The usable CPUs (affinity and cgroup quota) come from :func:`torchwatch.wire.cpus.usable_cpus`
(standard library only: the hook runs it inside the training too). ``os.cpu_count()`` alone is
wrong in containers and under ``taskset``: num_workers advice must respect the quota and affinity.
"""

from __future__ import annotations

import math

__all__ = ["io_bound_workers", "suggested_workers"]


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

"""The process tree and the machine: CPU of the main process and the DataLoader workers, RSS,
ranks on this host, storage reads of the tree and of the busiest device, memory, usable CPUs
and the training's share of them."""

from __future__ import annotations

from collections import Counter, defaultdict

from torchwatch.analysis.features.catalogue import Features
from torchwatch.analysis.features.common import _mean
from torchwatch.analysis.features.steps import Step, step
from torchwatch.analysis.store import Window
from torchwatch.model.readings import Role


def _process_features(window: Window, main_pid: int | None) -> Features:
    out: Features = {}
    if not window.processes:
        return {
            k: None
            for k in ("main_cpu_pct", "workers_cpu_pct", "read_bytes_per_s", "rss_bytes", "worker_count", "local_ranks")
        }
    last_t = window.processes[-1].t
    latest = [p for p in window.processes if p.t == last_t]
    by_t: dict[float, list[float]] = defaultdict(list)
    main_cpu: list[float | None] = []
    reads: dict[float, float] = defaultdict(float)
    for p in window.processes:
        if p.role is Role.MAIN and (main_pid is None or p.pid == main_pid):
            main_cpu.append(p.cpu_pct)
        elif p.role is Role.WORKER and p.cpu_pct is not None:
            by_t[p.t].append(p.cpu_pct)
        if p.read_bytes_per_s is not None:
            reads[p.t] += p.read_bytes_per_s
    out["main_cpu_pct"] = _mean(main_cpu)
    out["workers_cpu_pct"] = _mean(sum(v) for v in by_t.values()) if by_t else (0.0 if main_cpu else None)
    out["read_bytes_per_s"] = _mean(reads.values())
    out["rss_bytes"] = float(sum(p.rss_bytes or 0 for p in latest))
    out["worker_count"] = float(sum(1 for p in latest if p.role is Role.WORKER))
    # Ranks counted from the job: a training process that started others (a
    # torch.multiprocessing.spawn launcher, a Hogwild main joining its trainers, a wrapper script)
    # is not one of them (issue 47: the launcher of 4 spawned ranks made 5).
    parents = {p.ppid for p in latest if p.role is Role.MAIN}
    out["local_ranks"] = float(sum(1 for p in latest if p.role is Role.MAIN and p.pid not in parents))
    return out


MIN_DISK_READS = 20  # read requests in the window below which request size, await and queue are None


def _system_features(window: Window) -> Features:
    avail = [s.mem_available_bytes for s in window.system if s.mem_available_bytes is not None]
    out: Features = {
        "system_cpu_pct": _mean(s.cpu_pct for s in window.system),
        "io_pressure_pct": _mean(s.io_some_pct for s in window.system),
        "usable_cpus": window.system[-1].usable_cpus if window.system else None,
        "swap_in_bytes_per_s": _mean(s.swap_in_bytes_per_s for s in window.system),
        "memory_pressure_pct": _mean(s.mem_some_pct for s in window.system),
        "mem_available_bytes": float(min(avail)) if avail else None,
        "foreign_cpu_cores": _mean(s.foreign_cpu_cores for s in window.system),
        "own_cpu_cores": _mean(s.own_cpu_cores for s in window.system),
        "cpu_pressure_pct": _mean(s.cpu_some_pct for s in window.system),
        "cpu_quota_cpus": window.system[-1].cpu_quota_cpus if window.system else None,
        "cpu_throttled_periods_share": _mean(s.throttled_periods_share for s in window.system),
        "cpu_throttled_share": _mean(s.throttled_share for s in window.system),
    }
    out.update(_disk_features(window))
    return out


def _disk_features(window: Window) -> Features:
    """The busiest device's reads over the window, as ratios of window means (iostat's way).

    Each sample names the device that read the most in its second; the window keeps the device
    with the most bytes in all, and seconds in which another device led count as no reads.
    """
    out: Features = dict.fromkeys(
        ("disk_read_bytes_per_s", "disk_read_request_bytes", "disk_read_await_ms", "disk_read_queue", "disk_busy_share")
    )
    timed = [s for s in window.system if s.disk_read_bytes_per_s is not None]
    if not timed:
        return out
    by_disk: Counter[str] = Counter()
    for s in timed:
        if s.disk is not None:
            by_disk[s.disk] += int(s.disk_read_bytes_per_s or 0)
    top = by_disk.most_common(1)[0][0] if by_disk else None
    own = [s for s in timed if s.disk == top and top is not None]
    n = len(timed)

    def mean(attr: str) -> float:
        return sum(getattr(s, attr) or 0.0 for s in own) / n

    rbytes, reads, inflight, busy = (
        mean("disk_read_bytes_per_s"),
        mean("disk_reads_per_s"),
        mean("disk_read_inflight"),
        mean("disk_busy"),
    )
    out["disk_read_bytes_per_s"] = rbytes
    if top is None:
        return out
    out["disk_busy_share"] = busy
    if reads * n >= MIN_DISK_READS:  # n samples of about 1 s each
        out["disk_read_request_bytes"] = rbytes / reads
        out["disk_read_await_ms"] = 1000.0 * inflight / reads
        out["disk_read_queue"] = inflight / busy if busy > 0 else None
    return out


def _disk_tree_share(f: Features) -> Features:
    """The tree's storage reads over the busiest device's, not clipped: above 1 the training reads
    more than that device serves (another device, or a network file system counted in read_bytes)."""
    tree, disk = f.get("read_bytes_per_s"), f.get("disk_read_bytes_per_s")
    return {"disk_tree_share": None if tree is None or not disk else tree / disk}


def _cpu_budget(f: Features) -> Features:
    """How much of the usable CPUs the training takes, and the DataLoader workers' part of it."""
    main, workers, cpus = f.get("main_cpu_pct"), f.get("workers_cpu_pct"), f.get("usable_cpus")
    intra, ranks = f.get("intra_op_threads"), f.get("local_ranks")
    # DataLoader workers run torch with 1 thread each (torch.utils.data._utils.worker sets it);
    # as set (hook) or alive, whichever is more: workers between two epochs come back.
    workers_n = max(f.get("worker_count") or 0.0, f.get("dl_num_workers") or 0.0)
    wanted = intra * max(1.0, ranks or 0.0) + workers_n if intra is not None else None
    if main is None or workers is None:
        return {"workers_cpu_fraction": None, "tree_cpu_saturation": None, "cpu_threads_wanted": wanted}
    total = main + workers
    return {
        "workers_cpu_fraction": workers / total if total > 0 else None,
        "tree_cpu_saturation": total / (100.0 * cpus) if cpus else None,
        "cpu_threads_wanted": wanted,
    }


PROCESS_FEATURES = ("main_cpu_pct", "workers_cpu_pct", "read_bytes_per_s", "rss_bytes", "worker_count", "local_ranks")
SYSTEM_FEATURES = (
    "system_cpu_pct", "io_pressure_pct", "memory_pressure_pct", "cpu_pressure_pct", "mem_available_bytes",
    "swap_in_bytes_per_s", "usable_cpus", "foreign_cpu_cores", "own_cpu_cores", "cpu_quota_cpus",
    "cpu_throttled_periods_share", "cpu_throttled_share", "disk_read_bytes_per_s", "disk_read_request_bytes",
    "disk_read_await_ms", "disk_read_queue", "disk_busy_share",
)  # fmt: skip

STEPS: tuple[Step, ...] = (
    step("process", lambda w, pid, f: _process_features(w, pid), PROCESS_FEATURES),
    step("system", lambda w, pid, f: _system_features(w), SYSTEM_FEATURES),
    step(
        "disk_tree",
        lambda w, pid, f: _disk_tree_share(f),
        ("disk_tree_share",),
        needs=("read_bytes_per_s", "disk_read_bytes_per_s"),
    ),
    step(
        "cpu_budget",
        lambda w, pid, f: _cpu_budget(f),
        ("workers_cpu_fraction", "tree_cpu_saturation", "cpu_threads_wanted"),
        needs=(
            "main_cpu_pct",
            "workers_cpu_pct",
            "usable_cpus",
            "intra_op_threads",
            "local_ranks",
            "worker_count",
            "dl_num_workers",
        ),
    ),
)
"""The process tree, the machine (CPU, pressure, memory, quota, storage), and the shares of the
machine's storage and CPUs the training takes."""

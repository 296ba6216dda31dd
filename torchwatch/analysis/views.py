"""Rows and series for the faces, aggregated from readings (pure: readings in, model rows out).

The :class:`~torchwatch.model.observation.Observation` builder calls these once per tick; the
faces draw what they return and nothing else. Absence stays ``None`` ("n/a" on screen), never 0.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from torchwatch.analysis import stacks
from torchwatch.analysis.features import gpus_in_use
from torchwatch.model.observation import GpuRow, MemoryTrend, ProcessRow, StackRow
from torchwatch.model.readings import Frame, GpuSample, ProcessSample, Role, StackSample, ThreadSample
from torchwatch.model.text import escape
from torchwatch.model.units import WAIT_LETTERS


def base_name(filename: str) -> str:
    """The file name without its directory (``dataloader.py``)."""
    return filename.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def _thread_states(threads: Iterable[ThreadSample]) -> dict[int, str]:
    """``{pid: "R1 W3"}`` from each process's latest round of every thread: most rounds read the
    main thread only (:class:`~torchwatch.sources.proc.ThreadStateSource`), so the round counted
    is the latest with another thread in it (the latest of all for a process of one thread)."""
    last: dict[int, float] = {}
    last_any: dict[int, float] = {}
    by_pid: dict[int, list[ThreadSample]] = defaultdict(list)
    for th in threads:
        by_pid[th.pid].append(th)
        last_any[th.pid] = max(last_any.get(th.pid, th.t), th.t)
        if not th.is_main_thread:
            last[th.pid] = max(last.get(th.pid, th.t), th.t)
    for pid, t in last_any.items():
        last.setdefault(pid, t)
    out: dict[int, str] = {}
    for pid, samples in by_pid.items():
        counts = Counter(th.wait for th in samples if th.t == last[pid])
        out[pid] = " ".join(f"{WAIT_LETTERS[w]}{counts[w]}" for w in WAIT_LETTERS if counts[w])
    return out


def process_rows(
    processes: Sequence[ProcessSample], threads: Sequence[ThreadSample], cpu_span_s: float = 3.0
) -> list[ProcessRow]:
    """The processes seen in the last round (main, workers, launchers, helpers), unsorted.

    Args:
        processes: process samples, oldest first.
        threads: thread samples, oldest first (for the state column).
        cpu_span_s: CPU % is averaged over this many seconds before the last round, so the
            table does not flicker with each 1 s sample.
    """
    if not processes:
        return []
    last_t = processes[-1].t
    states = _thread_states(threads)
    cpu: dict[int, list[float]] = defaultdict(list)
    for p in processes:
        if p.t >= last_t - cpu_span_s and p.cpu_pct is not None:
            cpu[p.pid].append(p.cpu_pct)
    rows = []
    for p in processes:
        if p.t != last_t:
            continue
        vals = cpu.get(p.pid)
        rows.append(
            ProcessRow(
                pid=p.pid,
                role="trainer" if p.trainer else p.role.value,  # a training process that runs its own steps
                name=escape(p.name),  # the process's own text (prctl, argv[0]): never a line or an escape of its own
                cpu_pct=sum(vals) / len(vals) if vals else None,
                rss_bytes=p.rss_bytes,
                read_bytes_per_s=p.read_bytes_per_s,
                threads=states.get(p.pid, ""),
                num_threads=p.num_threads,
            )
        )
    return rows


_WORKER_FETCH = ("torch/utils/data/_utils/fetch.py", "torch/utils/data/_utils/collate.py")


def worker_category(frames: Sequence[Frame]) -> str:
    """What a DataLoader worker's main thread does: ``fetch`` (dataset, collate), ``idle``
    (waiting for the next index), ``send`` (putting a batch on the result queue) or ``other``."""
    files = [f.filename.replace("\\", "/") for f in frames]
    if any(part in fn for fn in files for part in _WORKER_FETCH) or any(
        f.name.endswith(("__getitem__", "__getitems__")) for f in frames
    ):
        return "fetch"
    in_loop = any(f.name == "_worker_loop" for f in frames)
    sending = any(
        fn.endswith("multiprocessing/queues.py") and f.name.endswith("put") for fn, f in zip(files, frames, strict=True)
    )
    if in_loop and sending:
        return "send"
    if in_loop:
        return "idle"
    return "other"


def worker_frame(frames: Sequence[Frame]) -> Frame | None:
    """The frame a worker's time goes to: the innermost user frame below ``_worker_loop`` (the
    dataset's ``__getitem__``), else the leaf. Frames above it are the parent's, inherited by fork."""
    start = next((i for i, f in enumerate(frames) if f.name == "_worker_loop"), -1)
    inner = frames[start + 1 :]
    if not inner:
        return frames[-1] if frames else None
    top = stacks.top_frame(inner)
    return top


def stack_rows(samples: Iterable[StackSample], main_pid: int | None, limit: int = 30) -> list[StackRow]:
    """Hottest frames of the loop's thread and of the workers' main threads over the window.

    Args:
        samples: py-spy stack samples.
        main_pid: the diagnosed training process; ``None`` takes every main process.
        limit: most rows returned, hottest first.
    """
    counts: Counter[tuple[str, str, str, str]] = Counter()
    example: dict[tuple[str, str, str, str], tuple[Frame, ...]] = {}
    totals: Counter[str] = Counter()
    for s in samples:
        if not s.is_main_thread:
            continue
        if s.role is Role.MAIN and (main_pid is None or s.pid == main_pid):
            who, category = "main", stacks.phase(s.frames)
            if category == "data":
                category = f"data/{stacks.data_part(s.frames) or 'other'}"
        elif s.role is Role.WORKER:
            who, category = "worker", worker_category(s.frames)
        else:
            continue
        top = stacks.top_frame(s.frames) if who == "main" else worker_frame(s.frames)
        function, location = (top.name, f"{base_name(top.filename)}:{top.line}") if top else ("?", "?")
        key = (who, category, function, location)
        counts[key] += s.count
        totals[who] += s.count
        example.setdefault(key, s.frames)
    rows = [
        StackRow(who, cat, fn, loc, n, n / totals[who], example[(who, cat, fn, loc)])
        for (who, cat, fn, loc), n in counts.items()
    ]
    rows.sort(key=lambda r: (-r.share, r.who, r.function))
    return rows[:limit]


def gpu_rows(gpus: Sequence[GpuSample]) -> list[GpuRow]:
    """One card per GPU index seen, in index order."""
    by_index: dict[int, list[GpuSample]] = defaultdict(list)
    for g in gpus:
        by_index[g.index].append(g)
    cards = []
    for index in sorted(by_index):
        series = by_index[index]
        last = series[-1]
        cards.append(
            GpuRow(
                index=index,
                name=last.name,
                util_pct=last.util_pct,
                power_w=last.power_w,
                power_limit_w=last.power_limit_w,
                mem_used_bytes=last.mem_used_bytes,
                mem_total_bytes=last.mem_total_bytes,
                used_by_target=bool(last.target_pids),
                util_series=tuple(g.util_pct for g in series if g.util_pct is not None),
                mem_series=tuple(float(g.mem_used_bytes) for g in series if g.mem_used_bytes is not None),
                last=last,
                sm_series=tuple(g.sm_active_pct for g in series if g.sm_active_pct is not None),
            )
        )
    return cards


def memory_trend(processes: Sequence[ProcessSample], gpus: Sequence[GpuSample]) -> MemoryTrend:
    """Sum resident memory per round, and device memory per NVML round."""
    rss: dict[float, float] = defaultdict(float)
    for p in processes:
        if p.rss_bytes is not None:
            rss[p.t] += p.rss_bytes
    series = tuple(rss[t] for t in sorted(rss))
    by_role: dict[str, int] = defaultdict(int)
    if processes:
        last_t = processes[-1].t
        for p in processes:
            if p.t == last_t and p.rss_bytes is not None:
                by_role[p.role.value] += p.rss_bytes
    dev: dict[float, list[GpuSample]] = defaultdict(list)
    for g in gpus_in_use(gpus):
        if g.mem_used_bytes is not None:
            dev[g.t].append(g)
    dev_series = tuple(float(sum(g.mem_used_bytes or 0 for g in dev[t])) for t in sorted(dev))
    last_dev = dev[max(dev)] if dev else []
    totals = [g.mem_total_bytes for g in last_dev if g.mem_total_bytes is not None]
    return MemoryTrend(
        rss_series=series,
        rss_bytes=series[-1] if series else None,
        rss_peak_bytes=max(series) if series else None,
        rss_by_role=tuple(sorted(by_role.items())),
        device_series=dev_series,
        device_used_bytes=dev_series[-1] if dev_series else None,
        device_total_bytes=float(sum(totals)) if totals else None,
    )

"""Pure aggregation for the TUI: readings in, rows and series out.

Nothing here imports Textual or touches a source; every function takes readings from a
:class:`~torchwatch.analysis.store.Window` (or plain values) and returns frozen dataclasses that the
widgets draw as they are. Absence stays ``None`` ("n/a" on screen), never 0.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from torchwatch.analysis import stacks
from torchwatch.model.readings import Frame, GpuSample, ProcessSample, Role, StackSample, ThreadSample, Wait

# One letter per thread state in the processes table (legend under the table).
WAIT_LETTERS: dict[Wait, str] = {
    Wait.RUNNING: "R",
    Wait.DISK: "D",
    Wait.FILE: "F",
    Wait.SYNC: "W",
    Wait.SLEEP: "S",
    Wait.NET: "N",
    Wait.OTHER: "?",
}
SORT_KEYS = ("cpu", "rss", "read", "pid")


# -- units ------------------------------------------------------------------------------------
def fmt_bytes(n: float | None) -> str:
    """Bytes for people: ``412 MB``, ``1.5 GB``, ``n/a``."""
    if n is None:
        return "n/a"
    if abs(n) >= 1e9:
        return f"{n / 1e9:.1f} GB"
    if abs(n) >= 1e6:
        return f"{n / 1e6:.0f} MB"
    return f"{n / 1e3:.0f} kB"


def fmt_rate(bytes_per_s: float | None) -> str:
    """Storage throughput in MB/s (``0.0`` is a real zero; ``n/a`` when unread)."""
    return "n/a" if bytes_per_s is None else f"{bytes_per_s / 1e6:.1f}"


def fmt_pct(pct: float | None, digits: int = 0) -> str:
    """A percentage already in % units: ``35%`` or ``n/a``."""
    return "n/a" if pct is None else f"{pct:.{digits}f}%"


def fmt_share(share: float | None) -> str:
    """A 0..1 share as a percentage: ``62%`` or ``n/a``."""
    return "n/a" if share is None else f"{100 * share:.0f}%"


def ellipsize(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the cut marked with ``…``."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def base_name(filename: str) -> str:
    """The file name without its directory (``dataloader.py``)."""
    return filename.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


def short_path(filename: str) -> str:
    """The last two parts of a path (``data/dataloader.py``), enough to recognise a file."""
    parts = filename.replace("\\", "/").rstrip("/").split("/")
    return "/".join(parts[-2:])


# -- processes --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessRow:
    """One process of the watched tree as the processes table shows it.

    Attributes:
        cpu_pct: CPU, % of one core, mean over the last ``cpu_span_s`` seconds.
        rss_bytes: resident memory, bytes.
        read_bytes_per_s: storage reads, bytes/s (``None`` when ``/proc/PID/io`` is unreadable).
        threads: thread states at the last round, e.g. ``R1 W3`` (see :data:`WAIT_LETTERS`).
    """

    pid: int
    role: str
    name: str
    cpu_pct: float | None
    rss_bytes: int | None
    read_bytes_per_s: float | None
    threads: str
    num_threads: int


def _thread_states(threads: Iterable[ThreadSample]) -> dict[int, str]:
    """``{pid: "R1 W3"}`` from each process's latest round of thread samples."""
    last: dict[int, float] = {}
    by_pid: dict[int, list[ThreadSample]] = defaultdict(list)
    for th in threads:
        by_pid[th.pid].append(th)
        last[th.pid] = max(last.get(th.pid, th.t), th.t)
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
                role=p.role.value,
                name=p.name,
                cpu_pct=sum(vals) / len(vals) if vals else None,
                rss_bytes=p.rss_bytes,
                read_bytes_per_s=p.read_bytes_per_s,
                threads=states.get(p.pid, ""),
                num_threads=p.num_threads,
            )
        )
    return rows


def sort_rows(rows: Iterable[ProcessRow], key: str) -> list[ProcessRow]:
    """Rows by ``key`` (one of :data:`SORT_KEYS`): biggest first, unknown values last; pid ascending."""
    if key == "pid":
        return sorted(rows, key=lambda r: r.pid)
    attr = {"cpu": "cpu_pct", "rss": "rss_bytes", "read": "read_bytes_per_s"}[key]

    def value(r: ProcessRow) -> tuple[bool, float, int]:
        v = getattr(r, attr)
        return (v is None, -(v or 0.0), r.pid)

    return sorted(rows, key=value)


# -- stacks -----------------------------------------------------------------------------------
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


@dataclass(frozen=True)
class StackRow:
    """Samples of one hot frame in one category, for the main thread or the workers.

    Attributes:
        who: ``main`` (the training loop's thread) or ``worker`` (DataLoader workers' main threads).
        category: what the samples were counted as: for the loop its phase
            (:func:`torchwatch.analysis.stacks.phase`; in the DataLoader with the part,
            ``data/queue`` waiting on workers, ``data/fetch`` computing samples itself, ...),
            for workers :func:`worker_category`.
        function / location: the innermost frame outside the standard library and
            site-packages (``dl.py:7``), else the leaf.
        samples: py-spy samples; share: of that thread group's samples in the window, 0..1.
        frames: one full stack of the row (outermost first), for the drill-down.
    """

    who: str
    category: str
    function: str
    location: str
    samples: int
    share: float
    frames: tuple[Frame, ...]


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


def category_shares(rows: Iterable[StackRow], who: str) -> dict[str, float]:
    """``{category: share}`` of one thread group's samples (rows of :func:`stack_rows`)."""
    out: dict[str, float] = defaultdict(float)
    for r in rows:
        if r.who == who:
            out[r.category] += r.share
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# Categories of stacks that back a finding, by the evidence it shows.
_EVIDENCE_PHASES: tuple[tuple[tuple[str, ...], frozenset[str]], ...] = (
    (("data_wait", "fetch_", "input_", "storage_", "workers_", "worker_"), frozenset({"data"})),
    (("forward_share",), frozenset({"forward"})),
    (("backward_share",), frozenset({"backward"})),
    (("optimizer_share",), frozenset({"optimizer"})),
    (("other_code_share",), frozenset({"other"})),
    (
        ("loop_cpu_share", "main_running_share", "main_cpu_pct"),
        frozenset({"forward", "backward", "optimizer", "other"}),
    ),
)


def phases_for(evidence: Iterable[str]) -> frozenset[str] | None:
    """Loop phases whose stacks back a finding with this evidence; ``None`` means all of them.

    The first matching group decides (a finding's evidence lists its main feature first).
    """
    for name in evidence:
        for prefixes, phases in _EVIDENCE_PHASES:
            if name.startswith(prefixes):
                return phases
    return None


def rows_behind(rows: Iterable[StackRow], evidence: Sequence[str]) -> list[StackRow]:
    """The stack rows behind a finding: the loop's rows in its phases, and the workers' rows
    when the finding is about data loading."""
    phases = phases_for(evidence)
    out = []
    for r in rows:
        if r.who == "main":
            keep = phases is None or r.category.partition("/")[0] in phases
        else:  # workers only produce data
            keep = phases is None or "data" in phases
        if keep:
            out.append(r)
    return out


def state_shares(threads: Iterable[ThreadSample], role: Role, pid: int | None = None) -> dict[str, float]:
    """Share of samples in each state (``running``, ``sync``, ...) of the main threads of one role.

    Args:
        threads: thread samples of the window.
        role: ``Role.MAIN`` for the loop, ``Role.WORKER`` for DataLoader workers.
        pid: only this process (the diagnosed training), or every process of the role.
    """
    counts = Counter(
        th.wait.value
        for th in threads
        if th.is_main_thread and th.role is role and (pid is None or role is not Role.MAIN or th.pid == pid)
    )
    total = sum(counts.values())
    return {k: v / total for k, v in counts.most_common()} if total else {}


# -- GPUs and memory --------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuCard:
    """One GPU: the last reading and its series over the history.

    Attributes:
        util_pct: time with a kernel running, %; power_w / power_limit_w: W;
        mem_used_bytes / mem_total_bytes: device memory, bytes;
        used_by_target: a process of the watched tree holds a context on it;
        util_series: util %, one value per reading, oldest first;
        mem_series: memory used, bytes, one value per reading;
        last: the last reading itself, for its GPM fields (``sm_active_pct`` ... or ``gpm_reason``)
            and the training's own SM % (``proc_sm_pct``);
        sm_series: GPM SM activity %, one value per reading that had one.
    """

    index: int
    name: str
    util_pct: float | None
    power_w: float | None
    power_limit_w: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    used_by_target: bool
    util_series: tuple[float, ...]
    mem_series: tuple[float, ...]
    last: GpuSample | None = None
    sm_series: tuple[float, ...] = ()


def gpu_cards(gpus: Sequence[GpuSample]) -> list[GpuCard]:
    """One card per GPU index seen, in index order."""
    by_index: dict[int, list[GpuSample]] = defaultdict(list)
    for g in gpus:
        by_index[g.index].append(g)
    cards = []
    for index in sorted(by_index):
        series = by_index[index]
        last = series[-1]
        cards.append(
            GpuCard(
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


@dataclass(frozen=True)
class MemoryTrend:
    """Host and device memory of the watched tree.

    Attributes:
        rss_series: the tree's total resident memory, bytes, one value per process round.
        rss_bytes / rss_peak_bytes: the last and the highest of them.
        rss_by_role: last round's resident memory by role (main, worker, ...), bytes.
        device_series: device memory used on the GPUs the tree uses (all GPUs when it uses
            none yet), bytes, one value per NVML round; empty without NVML.
        device_used_bytes / device_total_bytes: the last round.
    """

    rss_series: tuple[float, ...]
    rss_bytes: float | None
    rss_peak_bytes: float | None
    rss_by_role: tuple[tuple[str, int], ...]
    device_series: tuple[float, ...]
    device_used_bytes: float | None
    device_total_bytes: float | None


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
    used = {g.index for g in gpus if g.target_pids}
    dev: dict[float, list[GpuSample]] = defaultdict(list)
    for g in gpus:
        if (not used or g.index in used) and g.mem_used_bytes is not None:
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


# -- history of live values -------------------------------------------------------------------
class Trends:
    """Bounded series of live values the session does not keep (steps/s, data wait, ...).

    Thread-safe: the app's reader thread adds, the UI thread reads copies.

    Args:
        keep: most points kept per series (one point per refresh: 300 = 5 min at 1 s).
    """

    def __init__(self, keep: int = 300) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._series: dict[str, deque[tuple[float, float]]] = {}

    def add(self, t: float, values: Mapping[str, float | None]) -> None:
        """Append ``values`` measured at ``t`` (monotonic s); ``None`` is skipped, and a point
        at the same ``t`` as the last one replaces it."""
        with self._lock:
            for name, value in values.items():
                if value is None:
                    continue
                buf = self._series.setdefault(name, deque(maxlen=self.keep))
                if buf and buf[-1][0] == t:
                    buf.pop()
                buf.append((t, float(value)))

    def extend(self, name: str, points: Iterable[tuple[float, float]]) -> None:
        """Append recorded ``(t, value)`` points to one series (replays, tests)."""
        for t, v in points:
            self.add(t, {name: v})

    def series(self, name: str) -> tuple[float, ...]:
        """The values of one series, oldest first (empty when never measured)."""
        with self._lock:
            return tuple(v for _, v in self._series.get(name, ()))


# -- burst breakdown --------------------------------------------------------------------------
BREAKDOWN_ORDER = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")


def bar_widths(
    shares: Mapping[str, float], width: int, order: Sequence[str] = BREAKDOWN_ORDER
) -> list[tuple[str, int]]:
    """Split ``width`` cells between named shares (largest remainder), in ``order``.

    Shares need not sum to 1; they are normalised. A share too small for one cell gets none.

    Returns:
        ``[(name, cells)]`` for the names with at least one cell; the cells sum to ``width``
        (or 0 when every share is 0).
    """
    names = [n for n in order if shares.get(n, 0.0) > 0] + [n for n in shares if n not in order and shares[n] > 0]
    total = sum(shares[n] for n in names)
    if total <= 0 or width <= 0:
        return []
    exact = {n: shares[n] / total * width for n in names}
    cells = {n: int(exact[n]) for n in names}
    left = width - sum(cells.values())
    for n in sorted(names, key=lambda n: -(exact[n] - cells[n]))[:left]:
        cells[n] += 1
    return [(n, cells[n]) for n in names if cells[n] > 0]

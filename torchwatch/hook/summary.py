"""Summarise a ``torch.profiler`` Chrome/Perfetto trace into a step-time breakdown.

The input is the dict that ``json.load`` returns for a file written by ``prof.export_chrome_trace(path)``
(see :func:`load_trace`); :func:`summarize_trace` turns it into a small JSON-serialisable dict: step times,
the share of each step spent in each category and phase, how long the device sat idle, the heaviest CPU ops
and kernels, and the host-device sync points.

This module runs inside the user's training process, in a background thread, so:

- it imports the standard library only (no torch, no numpy);
- odd input never raises anything but :class:`ValueError`: events of unknown categories, with missing or
  non-numeric fields, or of zero length are skipped;
- it is linear-ish in the number of events: each interval list is sorted once and swept; nothing is
  quadratic (a trace can hold 10^5–10^6 events).

Trace times are microseconds (``ts``, ``dur``); they are turned into integer nanoseconds on reading, so that
the categories of a step add up to the step exactly. The summary reports milliseconds.

Where the rules come from:

- The step-time breakdown and its category priority are those of the PyTorch Profiler TensorBoard plugin
  (pytorch/kineto ``tb_plugin/torch_tb_profiler/profiler/event_parser.py``, ``overall_parser.py`` and
  ``trace.py``).
- Short kernels and host-device sync as launch-overhead and stall signals come from Holistic Trace Analysis
  (``hta/analyzers/breakdown_analysis.py``); the 10 µs threshold is ours (HTA uses 50 µs).
- The split of GPU idle time into host wait and kernel wait follows HTA's idle-time breakdown
  (``BreakdownAnalysis._analyze_idle_time_for_stream``): a gap before a kernel whose launch call began after
  the previous kernel ended is host wait (the CPU did not enqueue work in time); a short gap before a kernel
  that was already queued is kernel wait (the overhead of launching back-to-back kernels); the rest is other
  (waiting on an event, another stream, ...). Unlike HTA, which splits per stream, the split here is of the
  device's idle time (no kernel, memcpy or memset on any stream), so its parts add up to ``gpu_idle_share``;
  and the kernel-wait threshold is :data:`KERNEL_WAIT_US`, not HTA's 30 ns default.
- The phases (data, forward, backward, optimizer) are torchwatch's own, built with the same priority-union
  method from the annotations ``torch`` writes: ``ProfilerStep#N`` (``prof.step()``),
  ``enumerate(DataLoader)#...`` (``torch.utils.data.DataLoader``), ``Optimizer.step#...`` and
  ``Optimizer.zero_grad#...`` (``torch.optim.Optimizer``) and ``autograd::engine::evaluate_function: ...``
  (the autograd engine).
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..wire import CATEGORIES, IDLE_PARTS, NAME, PHASES  # one home: the wire format both sides share

__all__ = ["CATEGORIES", "IDLE_PARTS", "PHASES", "load_trace", "summarize_trace"]


def short_name(name: str, limit: int = NAME) -> str:
    """``name`` in at most ``limit`` characters, for the summary's op and kernel lists.

    CUDA kernel names are demangled C++ signatures: on an H200 (torch 2.11, 2026-11-26) a third of a
    gpu_bound step's distinct kernel names were over 256 characters, the longest 3,009 (templates and
    argument lists spelled out twice). Kept whole, such a name fails the wire format's name limit
    and the burst's whole summary with it. The leading ``void`` and every ``(anonymous namespace)::``
    go first; a name still too long is cut, ending in ``…``.
    """
    if len(name) <= limit:
        return name
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    return name if len(name) <= limit else name[: max(0, limit - 1)] + "…"


SHORT_KERNEL_US = 10.0
"""A kernel shorter than this (µs) counts as short in ``short_kernel_share`` (HTA flags < 50 µs)."""

KERNEL_WAIT_US = 10.0
"""A device idle gap shorter than this (µs) before work that was already queued is kernel wait (launch overhead).

HTA's default threshold is 30 ns; a kernel queued behind another starts a few µs after it on current GPUs (the
device-side launch latency), so gaps of that size are launch overhead too; longer ones with work queued are
waits on something else (an event, another stream) and count as ``other``.
"""

PAGEABLE_H2D = "Memcpy HtoD (Pageable -> Device)"
"""kineto's name for a host-to-device copy from pageable (not pinned) host memory."""

_NS_PER_US = 1000
_NS_PER_MS = 1_000_000
_DECIMALS = 10_000  # every float in the summary is rounded to 4 decimals
_MAX_ABS_US = 1e17  # larger timestamps or durations are not a clock reading: the event is skipped

# Event kinds, from the trace's ``cat`` (lower-cased), as the TensorBoard plugin's ``trace.EventTypeMap``
# maps them; the capitalised names ("Kernel", "Memcpy", "Runtime", "Operator") are those of older traces.
_KERNEL, _MEMCPY, _MEMSET, _RUNTIME, _CPU_OP, _ANNOTATION = range(6)
_KINDS = {
    "kernel": _KERNEL,
    "gpu_memcpy": _MEMCPY,
    "memcpy": _MEMCPY,
    "gpu_memset": _MEMSET,
    "memset": _MEMSET,
    "cuda_runtime": _RUNTIME,
    "cuda_driver": _RUNTIME,
    "hip_runtime": _RUNTIME,
    "hip_driver": _RUNTIME,
    "runtime": _RUNTIME,
    "xpu_runtime": _RUNTIME,
    "mtia_runtime": _RUNTIME,
    "privateuse1_runtime": _RUNTIME,
    "cpu_op": _CPU_OP,
    "operator": _CPU_OP,
    "user_annotation": _ANNOTATION,
}
# Everything else is skipped: "python_function", "ac2g" and "fwdbwd" (flows), "Trace", "gpu_user_annotation",
# instant/metadata events ("ph" other than "X"), and categories this module does not know.

_STEP_PREFIX = "ProfilerStep#"  # torch.profiler.profile.step() -> record_function("ProfilerStep#N")
_DATALOADER_PREFIXES = ("enumerate(DataLoader)", "enumerate(DataPipe)")  # tb_plugin event_parser.py
_OPTIMIZER_PREFIXES = ("Optimizer.step#", "Optimizer.zero_grad#")  # torch.optim.Optimizer's profile hooks
_BACKWARD_PREFIX = "autograd::engine::evaluate_function"  # one per autograd node the engine runs
# c10d's dispatcher ops (``c10d::allreduce_``: on the CPU with gloo, the caller's thread blocks in
# it while the transfer runs), the functional collectives of torch.compile and DTensor
# (``_c10d_functional::all_reduce``), and the backends' own spans: ``gloo:all_reduce`` on gloo's
# worker threads, ``nccl:all_reduce`` (tb_plugin trace.py NcclOpNameSet / GlooOpNameSet).
# ``record_param_comms`` (NCCL) only records a launch's parameters: CPU exec, as for tb_plugin.
_COMM_OP_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")
_COMM_OP_PARTS = ("nccl:", "gloo:")
_SYNC_RUNTIME = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "hipDeviceSynchronize",
        "hipStreamSynchronize",
        "hipEventSynchronize",
        "hipMemcpy",
    }
)
_SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})

Interval = tuple[int, int]  # [start, end) in integer nanoseconds
Thread = tuple[object, object]  # (pid, tid) as the trace writes them


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a Chrome trace written by ``torch.profiler`` (``prof.export_chrome_trace``), plain or gzipped.

    Whether the file is gzipped is told by its first two bytes (``1f 8b``), not by its name, so both
    ``trace.json`` and ``trace.json.gz`` (``tensorboard_trace_handler(..., use_gzip=True)``) load.

    Args:
        path: the trace file.

    Returns:
        The trace: a dict with a ``traceEvents`` list.

    Raises:
        OSError: the file cannot be read (passed through unchanged).
        ValueError: the content is not gzip/JSON, or not a JSON object with a ``traceEvents`` list. The
            message starts with ``"not a Chrome trace: "``.
    """
    with open(path, "rb") as f:
        raw = f.read()
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        trace = json.loads(raw)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(f"not a Chrome trace: {os.fspath(path)!r} is not valid gzip ({e})") from None
    except (ValueError, RecursionError) as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"not a Chrome trace: {os.fspath(path)!r} is not valid JSON ({e})") from None
    _check_trace(trace)
    return trace  # type: ignore[no-any-return]


def _check_trace(trace: object) -> None:
    if not isinstance(trace, dict):
        raise ValueError(f"not a Chrome trace: expected a JSON object, got {type(trace).__name__}")
    if not isinstance(trace.get("traceEvents"), list):
        raise ValueError("not a Chrome trace: no 'traceEvents' list")


@dataclass
class _Parsed:
    """The events of a trace, sorted into the interval lists the summary needs (integer ns)."""

    complete_events: int = 0
    steps: list[tuple[int, int, Thread]] = field(default_factory=list)
    # breakdown layers, in CATEGORIES order (without "other")
    kernel: list[Interval] = field(default_factory=list)
    memcpy: list[Interval] = field(default_factory=list)
    memset: list[Interval] = field(default_factory=list)
    communication: list[Interval] = field(default_factory=list)
    runtime: list[Interval] = field(default_factory=list)
    dataloader: list[Interval] = field(default_factory=list)
    cpu_exec: list[Interval] = field(default_factory=list)
    # phases and device activity
    optimizer: list[Interval] = field(default_factory=list)
    backward: list[Interval] = field(default_factory=list)
    device: list[Interval] = field(default_factory=list)
    # per-thread cpu_op events: (start, -end, name), sorted later for the self-time sweep
    ops: defaultdict[Thread, list[tuple[int, int, str]]] = field(default_factory=lambda: defaultdict(list))
    sync: defaultdict[Thread, list[Interval]] = field(default_factory=lambda: defaultdict(list))
    # kernels: (start, end, name, correlation id or None); runtime start by correlation id
    kernels: list[tuple[int, int, str, object]] = field(default_factory=list)
    launch_start: dict[object, int] = field(default_factory=dict)
    # every device event (kernel, memcpy, memset): (start, end, correlation id or None), for the idle split
    device_events: list[tuple[int, int, object]] = field(default_factory=list)
    # pageable host-to-device copies: (start, end, correlation id or None, bytes)
    pageable_h2d: list[tuple[int, int, object, int]] = field(default_factory=list)


def _key(value: object) -> object:
    """A hashable stand-in for a pid, tid or correlation id (JSON gives str/int/float; anything else is odd)."""
    return value if value is None or isinstance(value, (str, int, float)) else repr(value)


def _span(event: dict[Any, Any]) -> Interval | None:
    """The event's [start, end) in integer ns, or None when ``ts``/``dur`` are missing, odd or ``dur`` <= 0."""
    ts = event.get("ts")
    dur = event.get("dur")
    if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
        return None
    if isinstance(ts, bool) or isinstance(dur, bool):  # JSON true/false is not a time
        return None
    if not (-_MAX_ABS_US < ts < _MAX_ABS_US and 0 < dur < _MAX_ABS_US):  # also rejects NaN
        return None
    start = round(ts * _NS_PER_US)
    end = start + round(dur * _NS_PER_US)
    return (start, end) if end > start else None


def _parse(events: list[Any]) -> _Parsed:
    p = _Parsed()
    kinds: dict[str, int | None] = {}  # cache of cat -> kind; traces use a handful of distinct cats
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        p.complete_events += 1
        cat = ev.get("cat")
        if not isinstance(cat, str):
            continue
        if cat in kinds:
            kind = kinds[cat]
        else:
            kind = kinds[cat] = _KINDS.get(cat.lower())
        if kind is None:
            continue
        span = _span(ev)
        if span is None:
            continue
        name = ev.get("name")
        if not isinstance(name, str):
            name = ""
        if kind >= _CPU_OP:
            _parse_host(p, kind, name, span, (_key(ev.get("pid")), _key(ev.get("tid"))))
            continue
        args = ev.get("args")
        corr = _key(args.get("correlation")) if isinstance(args, dict) else None
        if kind != _RUNTIME:
            p.device.append(span)
            p.device_events.append((span[0], span[1], corr))
        if kind == _KERNEL:
            p.kernels.append((span[0], span[1], name, corr))
            (p.communication if "nccl" in name.lower() else p.kernel).append(span)
        elif kind == _MEMCPY:
            p.memcpy.append(span)
            if name == PAGEABLE_H2D:
                size = args.get("bytes") if isinstance(args, dict) else None
                nbytes = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else 0
                p.pageable_h2d.append((span[0], span[1], corr, nbytes))
        elif kind == _MEMSET:
            p.memset.append(span)
        else:  # _RUNTIME
            p.runtime.append(span)
            if corr is not None:
                p.launch_start[corr] = span[0]
            if name in _SYNC_RUNTIME:
                p.sync[(_key(ev.get("pid")), _key(ev.get("tid")))].append(span)
    return p


def _parse_host(p: _Parsed, kind: int, name: str, span: Interval, thread: Thread) -> None:
    """File one host event (``cpu_op`` or ``user_annotation``) under its layers."""
    if name.startswith(_STEP_PREFIX):  # user_annotation since torch 1.11; cpu_op in older traces
        p.steps.append((span[0], span[1], thread))
        return
    is_op = kind == _CPU_OP
    if is_op:
        p.ops[thread].append((span[0], -span[1], name))
        if name.startswith(_BACKWARD_PREFIX):
            p.backward.append(span)
        if name in _SYNC_OPS:
            p.sync[thread].append(span)
    if name.startswith(_DATALOADER_PREFIXES):
        p.dataloader.append(span)
    elif name.startswith(_OPTIMIZER_PREFIXES):
        p.optimizer.append(span)
    elif name.startswith(_COMM_OP_PREFIXES) or any(part in name for part in _COMM_OP_PARTS):
        p.communication.append(span)
    else:
        p.cpu_exec.append(span)


def _merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of the intervals, as sorted disjoint intervals (touching ones joined)."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def _exclusive_time(spans: Sequence[Interval], layers: Sequence[Iterable[Interval]]) -> list[list[int]]:
    """Split each span's time among layers by priority, as the TensorBoard plugin's ``OverallParser`` does.

    Each layer's intervals are unioned; within a span, a layer gets the time it covers that no earlier
    (higher-priority) layer covers; the last entry is the time no layer covers. One sweep over the sorted
    boundaries: O(n log n) in the number of intervals.

    Args:
        spans: the step spans, [start, end) in ns (may overlap; each is accounted on its own).
        layers: interval lists, highest priority first.

    Returns:
        For each span, ``len(layers) + 1`` durations in ns that add up to the span's length.
    """
    n_layers = len(layers)
    points: list[tuple[int, int, int]] = []
    for li, intervals in enumerate(layers):
        for start, end in _merge(intervals):
            points.append((start, 1, li))
            points.append((end, -1, li))
    for si, (start, end) in enumerate(spans):
        points.append((start, 1, n_layers + si))
        points.append((end, -1, n_layers + si))
    points.sort()  # runs of already-sorted boundaries: timsort merges them cheaply

    acc = [[0] * (n_layers + 1) for _ in spans]
    depth = [0] * n_layers
    active: set[int] = set()
    prev = 0
    for t, delta, idx in points:
        if active and t > prev:
            owner = n_layers
            for li in range(n_layers):
                if depth[li] > 0:
                    owner = li
                    break
            for si in active:
                acc[si][owner] += t - prev
        prev = t
        if idx < n_layers:
            depth[idx] += delta
        elif delta > 0:
            active.add(idx - n_layers)
        else:
            active.discard(idx - n_layers)
    return acc


def _idle_gaps(
    events: Sequence[tuple[int, int, object]], launch_start: dict[object, int], kernel_wait_ns: int
) -> tuple[list[Interval], list[Interval]]:
    """The device's idle gaps that are host wait, and those that are kernel wait (HTA's rules, see the module doc).

    The device's busy time is the union of its events; each gap in it ends where the next busy interval
    begins. Of the events that begin it, the earliest launch (the runtime call with the same correlation id)
    decides: launched at or after the gap's start, the device waited for the host (host wait); launched before
    it, the work was queued, and a gap shorter than ``kernel_wait_ns`` is launch overhead (kernel wait). A gap
    whose next event has no known launch, or none at all (the trace's end), is neither (``other``). The time
    before the first event is host wait when that event's launch is known (nothing was queued yet). As in HTA,
    a launch exactly at the gap's start is not host wait.

    Args:
        events: (start, end, correlation id or None) of every kernel, memcpy and memset, ns.
        launch_start: start of the runtime call by correlation id, ns.
        kernel_wait_ns: the kernel-wait threshold, ns.

    Returns:
        (host-wait gaps, kernel-wait gaps): disjoint [start, end) intervals, ns; the first may begin at
        ``-2**62`` (before the trace).
    """
    host: list[Interval] = []
    kernel: list[Interval] = []
    busy_end = -(2**62)
    ordered = sorted(events, key=lambda e: e[0])
    i = 0
    while i < len(ordered):
        start = ordered[i][0]
        j = i
        while j < len(ordered) and ordered[j][0] == start:
            j += 1
        group = ordered[i:j]
        if start > busy_end:
            launches = [launch_start[c] for _, _, c in group if c is not None and c in launch_start]
            if launches and min(launches) > busy_end:  # HTA: ts_runtime > prev_end_ts
                host.append((busy_end, start))
            elif launches and start - busy_end < kernel_wait_ns:
                kernel.append((busy_end, start))
        busy_end = max(busy_end, max(end for _, end, _ in group))
        i = j
    return host, kernel


class _InSpans:
    """Whether a time (ns) lies in the union of some [start, end) spans: binary search over the union."""

    def __init__(self, spans: Iterable[Interval]) -> None:
        merged = _merge(spans)
        self._starts = [s for s, _ in merged]
        self._ends = [e for _, e in merged]

    def __call__(self, t: int) -> bool:
        i = bisect.bisect_right(self._starts, t) - 1
        return i >= 0 and t < self._ends[i]


def _self_times(
    ops: dict[Thread, list[tuple[int, int, str]]], in_steps: _InSpans
) -> tuple[dict[str, int], dict[str, int]]:
    """Total self time (ns) and calls per cpu_op name, for the ops that start within a step.

    Per thread, the ops are sorted by (start, -duration) and a stack sweep finds each op's direct children;
    self time = duration - the children's durations (clipped to the parent), floored at 0 (as the TensorBoard
    plugin's op tree and ``torch.autograd.profiler``'s ``self_cpu_time_total`` define it).
    """
    self_ns: dict[str, int] = defaultdict(int)
    calls: dict[str, int] = defaultdict(int)

    def close(frame: list[Any]) -> None:
        end, children, start, name = frame
        if in_steps(start):
            self_ns[name] += max(0, end - start - children)
            calls[name] += 1

    for thread_ops in ops.values():
        thread_ops.sort()
        stack: list[list[Any]] = []  # [end, children_ns, start, name]
        for start, neg_end, name in thread_ops:
            end = -neg_end
            while stack and stack[-1][0] <= start:
                close(stack.pop())
            if stack:
                stack[-1][1] += min(end, stack[-1][0]) - start
            stack.append([end, 0, start, name])
        while stack:
            close(stack.pop())
    return self_ns, calls


def _sync_points(sync: dict[Thread, list[Interval]], in_steps: _InSpans) -> tuple[int, int]:
    """Host-device sync points that start within a step: (count, total ns).

    Nested sync events on one thread (``aten::item`` → ``aten::_local_scalar_dense`` → ``cudaMemcpyAsync``
    + ``cudaStreamSynchronize``) are one sync point: the overlapping events are unioned per thread, and each
    union counts once, with its length.
    """
    count = 0
    total = 0
    for intervals in sync.values():
        group: Interval | None = None
        for start, end in sorted(intervals):
            if group is not None and start < group[1]:
                group = (group[0], max(group[1], end))
                continue
            if group is not None and in_steps(group[0]):
                count += 1
                total += group[1] - group[0]
            group = (start, end)
        if group is not None and in_steps(group[0]):
            count += 1
            total += group[1] - group[0]
    return count, total


def _column_sums(rows: Sequence[Sequence[int]], width: int) -> list[int]:
    """Per-column sums of equally long rows."""
    return [sum(row[i] for row in rows) for i in range(width)]


def _ratio(num: int, denom: int) -> float:
    """``num / denom`` rounded half-up to 4 decimals, in exact integer arithmetic (``denom`` > 0)."""
    return ((2 * num * _DECIMALS + denom) // (2 * denom)) / _DECIMALS


def _split(parts: Sequence[int], denom: int) -> list[float]:
    """Each ``part / denom`` rounded to 4 decimals so that the rounded values add up to ``_ratio(sum, denom)``.

    Largest-remainder rounding: every value is rounded down, then the units still missing go to the values
    with the largest remainders. So shares that add up to 1 before rounding still add up to 1 after it.
    """
    scaled = [p * _DECIMALS for p in parts]
    floors = [s // denom for s in scaled]
    target = (2 * sum(scaled) + denom) // (2 * denom)
    missing = max(0, min(len(parts), target - sum(floors)))
    by_remainder = sorted(range(len(parts)), key=lambda i: (-(scaled[i] % denom), i))
    for i in by_remainder[:missing]:
        floors[i] += 1
    return [f / _DECIMALS for f in floors]


def summarize_trace(trace: dict[str, Any], top: int = 10) -> dict[str, Any]:
    """Summarise a ``torch.profiler`` trace into a step-time breakdown.

    Steps are the ``ProfilerStep#N`` spans (``cat`` ``user_annotation``; ``cpu_op`` in traces of torch < 1.11)
    that ``prof.step()`` writes; the summary covers those spans only. Times are ms; shares are fractions of
    the total step time; "per step" values are means over the steps; every float is rounded to 4 decimals.

    Breakdown (the PyTorch Profiler TensorBoard plugin's overview, ``event_parser.py`` /
    ``overall_parser.py``): within each step, the union of each category's intervals is taken; a category
    counts only the time no higher-priority one covers (kernel > memcpy > memset > communication > runtime >
    dataloader > cpu_exec), and ``other`` is the rest, so the categories add up to the step. Events are filed
    by ``cat`` (case-insensitive):

    - ``kernel``: ``kernel`` events, except those whose name contains "nccl" (communication);
    - ``memcpy`` / ``memset``: ``gpu_memcpy`` / ``gpu_memset``;
    - ``communication``: NCCL kernels, and ``cpu_op``/``user_annotation`` events named ``c10d::...`` or
      ``_c10d_functional::...``, or containing ``nccl:`` or ``gloo:`` (a CPU gloo DDP trace has
      ``c10d::allreduce_`` on the training's thread and ``gloo:all_reduce`` on gloo's threads);
    - ``runtime``: ``cuda_runtime``, ``cuda_driver``, ``hip_runtime`` (and the plugin's other ``*_runtime``);
    - ``dataloader``: ``cpu_op``/``user_annotation`` named ``enumerate(DataLoader)...`` (or
      ``enumerate(DataPipe)...``, as in the plugin);
    - ``cpu_exec``: other ``cpu_op`` events, and ``user_annotation`` events other than the step,
      DataLoader and ``Optimizer.*`` ones (the plugin counts ``Optimizer.*`` as CPU exec; here the host time
      in an optimizer call that no op covers is ``other``, like the time between ops anywhere else).

    Device events sit on their own pid/tid; they are clipped to the host step span by timestamp (kineto
    writes host and device times on one clock). Unlike the plugin, steps are not stretched to the end of
    their last kernel.

    Phases (host side, same priority union, data > optimizer > backward > forward, ``other`` the rest):
    ``data`` the dataloader intervals; ``optimizer`` events named ``Optimizer.step#...`` or
    ``Optimizer.zero_grad#...``; ``backward`` ``cpu_op`` events named
    ``autograd::engine::evaluate_function...`` on any thread (CPU backward runs on the calling thread,
    CUDA backward on an autograd device thread); ``forward`` every other ``cpu_op`` on a thread that holds a
    ``ProfilerStep#`` annotation.

    Counts (ops, kernels, sync points) include the events that start within a step span; a kernel's start is
    that of the runtime call that launched it (same ``args.correlation``) when the trace has it, so kernels
    that run after their host step ended still count for it.

    Args:
        trace: the dict ``json.load`` returns for a file from ``prof.export_chrome_trace``.
        top: how many ops and kernels to list in ``top_cpu_ops`` / ``top_kernels`` (negative counts as 0).

    Returns:
        A JSON-serialisable dict:

        - ``steps`` (int): number of ``ProfilerStep#`` spans;
        - ``step_time_ms`` (float): their mean duration; ``step_times_ms`` (list of float): each one, by start;
        - ``events`` (int): complete (``"ph": "X"``) events in the trace;
        - ``breakdown_ms`` ({category: float}): mean ms per step, adds up to ``step_time_ms``;
        - ``breakdown_share`` ({category: float}): fraction of step time, adds up to 1;
        - ``phases_share`` ({phase: float}): fraction of step time, adds up to 1;
        - ``gpu_idle_ms`` / ``gpu_idle_share`` (float or None): step time (mean ms per step / fraction) that
          no device activity (kernel, memcpy, memset, NCCL kernels included) covers; None when the trace has
          no device events;
        - ``gpu_idle_split_ms`` / ``gpu_idle_split_share`` ({"host_wait", "kernel_wait", "other"} or None): that
          idle time split by HTA's rules (mean ms per step / fraction of step time; the parts add up to
          ``gpu_idle_ms`` / ``gpu_idle_share``): ``host_wait`` the device waited for the host to launch the next
          work (the CPU is too slow), ``kernel_wait`` gaps shorter than :data:`KERNEL_WAIT_US` before work
          already queued (launch overhead of many small kernels), ``other`` the rest (see :func:`_idle_gaps`);
          None without device events;
        - ``kernel_share_per_step`` (list of float or None): each step's ``kernel`` share of the breakdown (time
          a compute kernel ran / step time), by step start; None without device events;
        - ``pageable_h2d`` ({"copies_per_step", "ms_per_step", "bytes_per_step"} or None): host-to-device copies
          from pageable memory (kineto's ``Memcpy HtoD (Pageable -> Device)``; such a copy goes through a
          staging buffer and blocks the host, whatever ``non_blocking`` says): copies, device ms and bytes (the
          event's ``args.bytes``) per step, counted by launch like kernels; None without device events;
        - ``top_cpu_ops`` (list of {"name", "self_ms", "calls"}): ``cpu_op`` names by total self time (ms,
          summed over all steps), at most ``top``;
        - ``top_kernels`` (list of {"name", "total_ms", "calls"}): kernel names by total duration (ms, all
          steps), at most ``top``; ``[]`` without kernels;
        - ``cpu_ops_per_step`` / ``kernels_per_step`` (float): ``cpu_op`` events (all depths) and kernels per
          step;
        - ``short_kernel_share`` (float or None): fraction of kernels shorter than :data:`SHORT_KERNEL_US`
          (launch-overhead signal, after HTA); None without kernels;
        - ``sync`` ({"calls_per_step", "ms_per_step"}): host-device sync points per step and their mean ms per
          step: ``cuda_runtime`` ``cudaDeviceSynchronize`` / ``cudaStreamSynchronize`` /
          ``cudaEventSynchronize`` / ``cudaMemcpy`` (not ``...Async``), and ``cpu_op`` ``aten::item`` /
          ``aten::_local_scalar_dense``; nested ones count once (see :func:`_sync_points`). On a CPU trace
          ``aten::item`` is no device sync, only a hint that the loop reads a scalar back.

    Raises:
        ValueError: ``trace`` is not a dict with a ``traceEvents`` list (message ``"not a Chrome trace: ..."``),
            or it has no events or no ``ProfilerStep#`` span of positive length (message
            ``"empty trace: ..."``).
    """
    _check_trace(trace)
    p = _parse(trace["traceEvents"])
    if p.complete_events == 0:
        raise ValueError("empty trace: no complete ('ph': 'X') events")
    if not p.steps:
        raise ValueError(
            "empty trace: no ProfilerStep# span (call prof.step() once per iteration, and let the profiler's "
            "schedule reach an active step)"
        )
    p.steps.sort(key=lambda s: (s[0], s[1]))
    spans = [(s, e) for s, e, _ in p.steps]
    n = len(spans)
    step_ns = [e - s for s, e in spans]
    total_ns = sum(step_ns)
    per_step = n * _NS_PER_MS  # denominator: ns summed over the steps -> mean ms per step
    in_steps = _InSpans(spans)

    layers = (p.kernel, p.memcpy, p.memset, p.communication, p.runtime, p.dataloader, p.cpu_exec)
    per_span = _exclusive_time(spans, layers)
    breakdown = _column_sums(per_span, len(CATEGORIES))

    step_threads = {thread for _, _, thread in p.steps}
    forward = [(s, -ne) for thread in step_threads for s, ne, _ in p.ops.get(thread, ())]
    phase_layers = (p.dataloader, p.optimizer, p.backward, forward)
    data_ns, optimizer_ns, backward_ns, forward_ns, other_ns = _column_sums(_exclusive_time(spans, phase_layers), 5)
    phases = _split([data_ns, forward_ns, backward_ns, optimizer_ns, other_ns], total_ns)

    gpu_idle_ms: float | None = None
    gpu_idle_share: float | None = None
    idle_split_ms: dict[str, float] | None = None
    idle_split_share: dict[str, float] | None = None
    kernel_share_per_step: list[float] | None = None
    pageable: dict[str, float] | None = None
    if p.device:
        host_gaps, kernel_gaps = _idle_gaps(p.device_events, p.launch_start, round(KERNEL_WAIT_US * _NS_PER_US))
        # device first: the gaps lie outside it by construction, and what none of the three covers is "other"
        _, host_ns, kernel_wait_ns, other_ns = _column_sums(
            _exclusive_time(spans, (p.device, host_gaps, kernel_gaps)), 4
        )
        idle_parts = [host_ns, kernel_wait_ns, other_ns]
        idle_ns = sum(idle_parts)
        gpu_idle_ms = _ratio(idle_ns, per_step)
        gpu_idle_share = _ratio(idle_ns, total_ns)
        idle_split_ms = dict(zip(IDLE_PARTS, _split(idle_parts, per_step), strict=True))
        idle_split_share = dict(zip(IDLE_PARTS, _split(idle_parts, total_ns), strict=True))
        kernel_share_per_step = [_ratio(row[0], d) for row, d in zip(per_span, step_ns, strict=True)]
        copies = [c for c in p.pageable_h2d if in_steps(p.launch_start.get(c[2], c[0]) if c[2] is not None else c[0])]
        pageable = {
            "copies_per_step": _ratio(len(copies), n),
            "ms_per_step": _ratio(sum(e - s for s, e, _, _ in copies), per_step),
            "bytes_per_step": _ratio(sum(b for _, _, _, b in copies), n),
        }

    self_ns, op_calls = _self_times(p.ops, in_steps)
    top = max(0, top)
    top_ops = sorted(self_ns, key=lambda k: (-self_ns[k], k))[:top]

    kernel_ns: dict[str, int] = defaultdict(int)
    kernel_calls: dict[str, int] = defaultdict(int)
    short = 0
    for start, end, name, corr in p.kernels:
        if in_steps(p.launch_start.get(corr, start) if corr is not None else start):
            kernel_ns[name] += end - start
            kernel_calls[name] += 1
            short += end - start < SHORT_KERNEL_US * _NS_PER_US
    n_kernels = sum(kernel_calls.values())
    top_kernels = sorted(kernel_ns, key=lambda k: (-kernel_ns[k], k))[:top]
    sync_calls, sync_ns = _sync_points(p.sync, in_steps)

    return {
        "steps": n,
        "step_time_ms": _ratio(total_ns, per_step),
        "step_times_ms": [_ratio(d, _NS_PER_MS) for d in step_ns],
        "events": p.complete_events,
        "breakdown_ms": dict(zip(CATEGORIES, _split(breakdown, per_step), strict=True)),
        "breakdown_share": dict(zip(CATEGORIES, _split(breakdown, total_ns), strict=True)),
        "phases_share": dict(zip(PHASES, phases, strict=True)),
        "gpu_idle_ms": gpu_idle_ms,
        "gpu_idle_share": gpu_idle_share,
        "gpu_idle_split_ms": idle_split_ms,
        "gpu_idle_split_share": idle_split_share,
        "kernel_share_per_step": kernel_share_per_step,
        "pageable_h2d": pageable,
        "top_cpu_ops": [
            {"name": short_name(k), "self_ms": _ratio(self_ns[k], _NS_PER_MS), "calls": op_calls[k]} for k in top_ops
        ],
        "top_kernels": [
            {"name": short_name(k), "total_ms": _ratio(kernel_ns[k], _NS_PER_MS), "calls": kernel_calls[k]}
            for k in top_kernels
        ],
        "cpu_ops_per_step": _ratio(sum(op_calls.values()), n),
        "kernels_per_step": _ratio(n_kernels, n),
        "short_kernel_share": _ratio(short, n_kernels) if n_kernels else None,
        "sync": {"calls_per_step": _ratio(sync_calls, n), "ms_per_step": _ratio(sync_ns, per_step)},
    }

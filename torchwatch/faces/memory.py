"""Memory as the faces write it: the forecast line, the out-of-memory record, the report's
``memory`` section (:class:`torchwatch.model.report.MemoryReport`, made from the
:class:`torchwatch.model.memory.MemoryView` of :mod:`torchwatch.watch.memwatch`) and
``<report stem>.memory.txt``."""

from __future__ import annotations

import math
from pathlib import Path

from torchwatch.model.memory import MemoryForecastView, MemoryRecord, MemoryView
from torchwatch.model.report import (
    MemoryForecastReport,
    MemoryRecordReport,
    MemoryReport,
    ProcMemoryReport,
    json_rounded,
)
from torchwatch.model.text import escape
from torchwatch.model.units import fmt_bytes, fmt_mib_rate, human_duration

__all__ = [
    "forecast_line",
    "forecast_report",
    "memory_file_text",
    "memory_lines",
    "memory_path",
    "memory_report",
    "record_lines",
]

_MIB = float(1 << 20)


def memory_path(report: Path) -> Path:
    """``<report stem>.memory.txt`` beside ``report``."""
    return report.with_name(f"{report.stem}.memory.txt")


def forecast_report(f: MemoryForecastView) -> MemoryForecastReport:
    """The saved form of a forecast (floats as written)."""
    return json_rounded(
        MemoryForecastReport(
            what=f.what,
            seconds=f.seconds,
            soonest_s=f.soonest,
            latest_s=f.latest if math.isfinite(f.latest) else None,
            level_bytes=int(f.level),
            limit_bytes=int(f.limit),
            bytes_per_s=f.slope,
            window_s=f.window_s,
            limit_source=f.source,
            grower=f.grower,
            tree_share=f.tree_share,
        )
    )


def _record_report(r: MemoryRecord, started: float) -> MemoryRecordReport:
    return MemoryRecordReport(
        kind=r.kind,
        at_s=round(r.t - started, 2),
        pid=r.pid,
        role=r.role,
        name=r.name,
        how=r.how,
        limit_bytes=r.limit.limit if r.limit else None,
        limit_source=r.limit.source if r.limit else None,
        forecast=forecast_report(r.forecast) if r.forecast else None,
        steps_ms=tuple(round(s, 3) for s in r.steps_ms),
        stack=r.stacks,
        cuda=r.cuda,
        processes=tuple(
            ProcMemoryReport(p.pid, p.role, p.ended, tuple(x[1] for x in p.points), tuple(x[2] for x in p.points))
            for p in r.processes
        ),
    )


def memory_report(view: MemoryView, started: float) -> MemoryReport | None:
    """The report's ``memory`` section, ``None`` when nothing was read (no memory source).

    Args:
        view: the session's last memory view. started: when watching started, monotonic s
            (a record's ``at_s`` counts from it).
    """
    lim = view.limit
    if lim is None and not view.records and not view.forecasts:
        return None
    return MemoryReport(
        limit_bytes=lim.limit if lim else None,
        used_bytes=lim.used if lim else None,
        limit_source=lim.source if lim else None,
        forecasts=tuple(forecast_report(f) for f in view.forecasts),
        no_forecast=view.why_not or None,
        records=tuple(_record_report(r, started) for r in view.records),
    )


def forecast_line(f: MemoryForecastReport) -> str:
    """One line: ``host memory reaches its limit (1.0 GiB) in ~2 min 10 s (95%: 1 min 50 s -
    2 min 40 s), +3.1 MiB/s over 75 s``."""
    what = "host memory" if f.what == "host" else "device memory"
    latest = human_duration(f.latest_s) if f.latest_s is not None else "later"
    return (
        f"{what} reaches its limit ({fmt_bytes(f.limit_bytes)}) in ~{human_duration(f.seconds)} "
        f"(95%: {human_duration(f.soonest_s)} - {latest}), {fmt_mib_rate(f.bytes_per_s)} over {f.window_s:.0f} s"
    )


def _kind(kind: str) -> str:
    return "killed by the kernel's OOM killer" if kind == "host" else "CUDA out of memory"


def record_lines(r: MemoryRecordReport) -> list[str]:
    """An out-of-memory record in full (``<report stem>.memory.txt``). The training's text in it
    (names, stack frames) is escaped."""
    lines = [f"{r.role} {r.pid} ({escape(r.name) or '?'}): {_kind(r.kind)}, {r.at_s:.0f} s after watching started"]
    lines.append(f"  how: {escape(r.how)}")
    if r.limit_bytes is not None and r.kind == "host":
        lines.append(f"  limit: {fmt_bytes(r.limit_bytes)} ({escape(r.limit_source or '?')})")
    if r.forecast is not None:
        lines.append(f"  forecast shown before: {forecast_line(r.forecast)}")
    c = r.cuda
    if c is not None:
        lines.append(
            f"  the allocation that failed: {fmt_bytes(c.requested_bytes)} on cuda:{c.device}; CUDA said "
            f"{fmt_bytes(c.device_free_bytes)} free of {fmt_bytes(c.device_total_bytes)}"
        )
        lines.append(
            f"  allocator: {fmt_bytes(c.allocated_bytes)} allocated, {fmt_bytes(c.reserved_bytes)} reserved, peak "
            f"{fmt_bytes(c.peak_bytes)}; {fmt_bytes(c.inactive_split_bytes)} free inside split segments "
            "(fragmentation); "
            f"{c.alloc_retries} allocation retries, {c.ooms} out-of-memory errors"
        )
        if c.segments is not None:
            blocks = ", ".join(fmt_bytes(b) for b in c.largest_active) or "none"
            lines.append(
                f"  snapshot (taken at the error in {c.snapshot_ms} ms): {c.segments} segments, largest free block "
                f"{fmt_bytes(c.largest_free_bytes)}; largest blocks in use: {blocks}"
            )
        if c.step is not None:
            lines.append(f"  after {c.step} optimizer steps (out-of-memory error {c.count} of this process)")
    if r.steps_ms:
        lines.append("  last steps, ms: " + ", ".join(f"{s:.0f}" for s in r.steps_ms[-10:]))
    if r.stack:
        lines.append("  Python stack (innermost last):")
        lines.extend(f"    {escape(s)}" for s in r.stack)
    if r.processes:
        lines.append("  every process's memory over the last minutes, RSS/private MiB every 5 s (oldest first):")
        for p in r.processes:
            pairs = list(zip(p.rss_bytes, p.uss_bytes, strict=False))[-24:]
            series = " ".join(f"{rss / _MIB:.0f}/{uss / _MIB:.0f}" for rss, uss in pairs)
            lines.append(f"    {p.role} {p.pid}{' (ended)' if p.ended else ''}: {series}")
    return lines


def memory_lines(m: MemoryReport | None) -> list[str]:
    """The text report's memory lines: the limit, the forecasts, and one line per record (the
    record in full is in ``<report stem>.memory.txt``)."""
    if m is None:
        return []
    out = []
    if m.limit_bytes is not None:
        out.append(
            f"memory: {fmt_bytes(m.used_bytes)} of {fmt_bytes(m.limit_bytes)} in use ({escape(m.limit_source or '?')})"
        )
    out.extend(f"  {forecast_line(f)}" + (f"; fastest: {escape(f.grower)}" if f.grower else "") for f in m.forecasts)
    for r in m.records:
        out.append(f"  OUT OF MEMORY: {r.role} {r.pid} ({escape(r.name) or '?'}): {_kind(r.kind)} at {r.at_s:.0f} s")
        if r.stack:
            out.append(f"    at {escape(r.stack[-1])}")
    return out


def memory_file_text(m: MemoryReport, report_name: str) -> str:
    """``<report stem>.memory.txt``: every out-of-memory record in full (beside ``report_name``)."""
    out = [f"torchwatch memory record (report: {report_name})", ""]
    for r in m.records:
        out.extend(record_lines(r))
        out.append("")
    return "\n".join(out).rstrip() + "\n"

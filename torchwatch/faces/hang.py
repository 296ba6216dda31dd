"""The stall / hang recorder in words: the report's lines, the one-line notice of the status
line and the TUI, and the hang file (``<report stem>.hang.txt``: every thread of every process).

Reads :class:`~torchwatch.model.hang.HangView` (the live one) and
:class:`~torchwatch.model.report.HangRecord` (a report's) only: both hold the headline's fields
and the processes' rows.
"""

from __future__ import annotations

from pathlib import Path

from torchwatch.model.hang import HangView, frame_text
from torchwatch.model.report import HangRecord
from torchwatch.model.text import escape

__all__ = ["hang_file_text", "hang_lines", "hang_path", "notice"]


def _headline(h: HangView | HangRecord) -> str:
    who = f"rank {h.rank} (PID {h.pid})" if h.rank is not None else f"PID {h.pid}"
    if h.state == "stall":
        resumed = "?" if h.resumed_s is None else f"{h.resumed_s:.0f}"
        return (
            f"stall: {who} made no step for {h.stalled_s:.0f} s from {h.last_step_s:.0f} s "
            f"(recorded as a hang at {h.fired_s:.0f} s, {h.threshold_from}); it stepped again at "
            f"{resumed} s"
        )
    return (
        f"HANG: {who} has made no step for {h.stalled_s:.0f} s (since {h.last_step_s:.0f} s; "
        f"threshold {h.threshold_s:g} s from {h.threshold_from}; recorded {h.detected_after_s:.1f} s "
        "after the last step)"
    )


def notice(view: HangView | None) -> str | None:
    """One line for the status line and the TUI: the hang (or stall) and its likely cause."""
    if view is None:
        return None
    head = _headline(view)
    if view.state == "dumping":
        return f"{head}: dumping every thread"
    return f"{head}: {view.summary}" if view.summary else head


def hang_lines(h: HangView | HangRecord | None) -> list[str]:
    """The text report's lines for a hang (a report's ``hang``, or the live one): the headline,
    the summary, one row per process dumped; nothing when none was recorded."""
    if h is None:
        return []
    lines = [_headline(h), f"  {h.summary}" if h.summary else "  (no thread dump)"]
    if h.progress:
        lines.append(f"  its training then: {h.progress}")
    for p in h.processes:
        who = f"rank {p.rank}" if p.rank is not None and p.role == "rank" else p.role
        # an idle worker's own code is where it was forked from: where it waits says more
        first = p.where if p.state == "idle" else p.top_frame
        at = first or p.where or p.error or "-"
        lines.append(f"  {who:<9} PID {p.pid:<8} {p.state:<10} {at}")
    return lines


def hang_file_text(view: HangView, report_name: str) -> str:
    """The hang file: the headline, the summary, then every thread of every process dumped
    (innermost frame first, as py-spy prints them)."""
    lines = [f"torchwatch hang record (report: {report_name})", *hang_lines(view), ""]
    for d in view.dumps:
        who = f"rank {d.rank}" if d.rank is not None and d.role == "rank" else d.role
        parent = f", worker of PID {d.parent}" if d.parent is not None else ""
        lines.append(f"Process {d.pid} ({who}{parent}), dumped in {d.dump_s * 1000:.0f} ms")
        if d.error:
            lines.append(f"  no dump: {d.error}")
        for t in d.threads:
            lines.append(f'  Thread {t.tid} ({"active" if t.active else "idle"}): "{escape(t.name)}"')
            lines += [f"      {frame_text(f)}" for f in reversed(t.frames)]
        lines.append("")
    return "\n".join(lines)


def hang_path(report: Path) -> Path:
    """``<report stem>.hang.txt`` beside ``report``."""
    return report.with_name(f"{report.stem}.hang.txt")

"""torch.compile's health and the model's FLOP rate, for people: the lines the text report, the
headless status line and the TUI show.

Functions of the typed readings a rank carries (:class:`~torchwatch.wire.CompileInfo`,
:class:`~torchwatch.model.peaks.FlopRate`), or of their form in a report
(:class:`~torchwatch.model.report.FlopsReport`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torchwatch.model.peaks import FlopRate, fmt_flops
from torchwatch.model.report import FlopsReport, RankRow
from torchwatch.model.units import fmt_share
from torchwatch.wire import CompileEvent, CompileInfo

__all__ = ["compile_lines", "compile_news", "compile_summary", "event_line", "flop_line", "flop_lines", "flops_report"]

_KIND = {"recompile": "recompiled", "graph_break": "graph break", "cache_limit": "recompile limit"}


def event_line(e: CompileEvent) -> str:
    """``recompiled ×3: shape of x changed 32→17 (dim 0) at train.py:88 (`out = model(x)`)``."""
    where = f" at {e.where}" if e.where else ""
    code = f" (`{e.code}`)" if e.code else ""
    count = f" ×{e.count}" if e.count > 1 else ""
    return f"{_KIND.get(e.kind, e.kind)}{count}: {e.words}{where}{code}"


_RULE_KIND = {
    "compile-recompiles": "recompile",
    "compile-graph-breaks": "graph_break",
    "compile-cache-limit": "cache_limit",
}


def compile_news(rule: str, info: CompileInfo | None) -> str:
    """A torch.compile finding for the status line: its rule id and its latest event in words,
    ``compile-recompiles: shape of x changed 32→17 (dim 0) at train.py:88``."""
    kind = _RULE_KIND.get(rule)
    events = [e for e in (info.events if info is not None else ()) if e.kind == kind]
    if not events:
        return rule
    e = max(events, key=lambda e: e.t)
    return f"{rule}: {e.words}" + (f" at {e.where}" if e.where else "")


def compile_summary(info: CompileInfo | None) -> str | None:
    """One short line: ``torch.compile: 2 frames, 1 recompile, 1 graph break, 3.1 s compiling``;
    ``None`` before anything compiled."""
    if info is None:
        return None
    parts = [f"{info.frames} frame{'s' if info.frames != 1 else ''}"]
    for n, word in ((info.recompiles, "recompile"), (info.graph_breaks, "graph break")):
        if n:
            parts.append(f"{n} {word}{'s' if n != 1 else ''}")
    if info.cache_limit_hits:
        parts.append(f"recompile limit hit ×{info.cache_limit_hits} (eager from then on)")
    parts.append(f"{info.compile_s:.1f} s compiling")
    return "torch.compile: " + ", ".join(parts)


def compile_lines(info: CompileInfo | None, indent: str = "  ") -> list[str]:
    """The summary line and each event (newest last), for the text report (nothing before
    anything compiled)."""
    head = compile_summary(info)
    if info is None or head is None:
        return []
    return [indent + head] + [f"{indent}  {event_line(e)}" for e in info.events]


def flop_line(rate: FlopRate | None) -> str | None:
    """``FLOPs 6.63 T/step · 507 TFLOP/s · MFU 51% of the dense bf16 peak of the H100 SXM, 989
    TFLOP/s (...)``; ``None`` without a count."""
    if rate is None:
        return None
    mfu = "n/a" if rate.mfu is None else fmt_share(rate.mfu)
    return (
        f"FLOPs {rate.flops_per_step / 1e12:.3g} T/step ({rate.dtype or '?'}) over {rate.step_ms:.1f} ms"
        f" ({rate.step_source}) · {fmt_flops(rate.achieved_flops_per_s)} · MFU {mfu} vs {rate.peak_text}"
    )


def flop_lines(rates: Mapping[int, FlopRate | None], indent: str = "  ") -> list[str]:
    """One :func:`flop_line` per rank (``rank N:`` before it when there are several)."""
    shown = {r: flop_line(rate) for r, rate in sorted(rates.items())}
    lines = [(r, text) for r, text in shown.items() if text]
    if len(rates) <= 1:
        return [indent + text for _, text in lines]
    return [f"{indent}rank {r}: {text}" for r, text in lines]


def flops_report(rate: FlopRate | None) -> FlopsReport | None:
    """The report's ``flops``: the rate as :meth:`FlopRate.to_json` has it, and ``text``
    (:func:`flop_line`); ``None`` without a count."""
    return None if rate is None else FlopsReport.of(rate, flop_line(rate))


def rank_flop_lines(ranks: Sequence[RankRow]) -> list[str]:
    """``  rank N: FLOPs ...`` for each rank of the report's ``ranks`` that has a count."""
    return [f"  rank {r.rank}: {r.flops.text}" for r in ranks if r.flops is not None]

"""torch.compile as the hook saw it (recompiles, graph breaks, compile time), the events in words
that rule templates quote, and FLOP/s and MFU from the last burst."""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence

from torchwatch.analysis.features.catalogue import Features
from torchwatch.analysis.features.common import _num
from torchwatch.analysis.features.steps import Step, step
from torchwatch.analysis.store import Window
from torchwatch.model.peaks import flop_rate
from torchwatch.wire import CompileEvent, CompileInfo


def _overlap(t0: float, t1: float, spans: Sequence[tuple[float, float]]) -> float:
    """Seconds of ``[t0, t1]`` covered by ``spans`` (compile intervals do not overlap: one thread)."""
    return sum(max(0.0, min(t1, b) - max(t0, a)) for a, b in spans)


def _compile_features(window: Window, main_pid: int | None) -> Features:
    """What torch.compile did, from the hook's :class:`~torchwatch.wire.CompileInfo`.

    Recompiles in the window are the growth of the hook's count from the window's first reading
    (the last one before the window when :func:`loop_window` kept it) to its last. A step is a
    compiling step when a compile interval of the hook's overlaps it (step ``[end - duration,
    end]``); the rest are compiled steps. Counts of graph breaks and limit hits are totals: both
    last as long as the compiled code does."""
    reads = [h for h in window.hook if (main_pid is None or h.pid == main_pid) and h.record is not None]
    infos = [h.record.compile if h.record is not None else None for h in reads]
    last = infos[-1] if infos else None
    if last is None:
        return {}
    first = infos[0]
    span = window.end - window.start
    compiling = _overlap(window.start, window.end, last.spans)
    steps = [e for h in reads for e in h.new_steps if window.start <= e[0] <= window.end]
    hot = [e[1] * 1000.0 for e in steps if _overlap(e[0] - e[1], e[0], last.spans) > 0]
    cold = [e[1] * 1000.0 for e in steps if _overlap(e[0] - e[1], e[0], last.spans) <= 0]
    recompiles = [e for e in last.events if e.kind == "recompile"]
    return {
        "compile_recompiles": float(max(0, last.recompiles - (first.recompiles if first is not None else 0))),
        "compile_recompiles_total": float(last.recompiles),
        "compile_time_share": min(1.0, compiling / span) if span > 0 else None,
        "compile_total_s": last.compile_s,
        "compile_graph_breaks_total": float(last.graph_breaks),
        "compile_cache_limit_hits": float(last.cache_limit_hits),
        "compile_recompile_limit": _num(last.recompile_limit),
        "compile_recompile_shape": float(recompiles[-1].cause in ("shape", "stride")) if recompiles else None,
        "compiling_step_p50_ms": statistics.median(hot) if hot else None,
        "compiled_step_p50_ms": statistics.median(cold) if cold else None,
    }


def _flop_features(window: Window, main_pid: int | None, f: Features) -> Features:
    """FLOP/s and MFU from the last burst's FLOP count (:func:`torchwatch.model.peaks.flop_rate`)
    over the window's median step time."""
    reads = [h for h in window.hook if (main_pid is None or h.pid == main_pid) and h.record is not None]
    rec = reads[-1].record if reads else None
    last = rec.burst.last if rec is not None and rec.burst is not None else None
    tf32 = f.get("tf32_matmul")
    rate = flop_rate(last, f.get("step_time_p50_ms"), None if tf32 is None else bool(tf32))
    if rate is None:
        return {"burst_flops_per_step": None if last is None else last.flops_per_step}
    return {
        "burst_flops_per_step": rate.flops_per_step,
        "achieved_tflop_per_s": rate.achieved_flops_per_s / 1e12,
        "peak_tflop_per_s": None if rate.peak is None else rate.peak.flops_per_s / 1e12,
        "mfu": rate.mfu,
    }


COMPILE_TEXTS = {
    "compile_recompile_words": "its reason not read",
    "compile_mark_dynamic": "torch._dynamo.mark_dynamic(tensor, dim)",
    "compile_break_words": "its reason not read",
    "compile_break_hint": "none",
    "compile_limit_words": "hit the recompile limit",
}
"""The texts of torch.compile events that rule templates quote (:func:`compile_texts`), and what
each reads when the hook has not published one."""


def event_text(event: CompileEvent) -> str:
    """An event in words with its place: ``shape of x changed 32→17 (dim 0) at train.py:88
    (`out = model(x)`)``."""
    where = event.where
    text = event.words + (f" at {where}" if where else "")
    return text + (f" (`{event.code}`)" if event.code else "")


def compile_texts(info: CompileInfo) -> dict[str, str]:
    """The latest recompile, graph break and recompile-limit hit in words (:data:`COMPILE_TEXTS`),
    each only when there is one; ``compile_mark_dynamic`` is the call that marks the changing
    dimension dynamic (``torch._dynamo.mark_dynamic(x, 0)``) for a shape recompile."""
    out: dict[str, str] = {}
    latest: dict[str, CompileEvent] = {}
    for e in sorted(info.events, key=lambda e: e.t):
        latest[e.kind] = e
    rec = latest.get("recompile")
    if rec is not None:
        out["compile_recompile_words"] = event_text(rec)
        m = re.match(r"^shape of (.+?) changed.*\(dim (-?\d+)\)$", rec.words)
        if m is not None:
            out["compile_mark_dynamic"] = f"torch._dynamo.mark_dynamic({m.group(1)}, {m.group(2)})"
    brk = latest.get("graph_break")
    if brk is not None:
        out["compile_break_words"] = event_text(brk)
        out["compile_break_hint"] = brk.hint or "none"
    hit = latest.get("cache_limit")
    if hit is not None:
        out["compile_limit_words"] = event_text(hit)
    return out


COMPILE_FEATURES = (
    "compile_recompiles", "compile_recompiles_total", "compile_time_share", "compile_total_s",
    "compile_graph_breaks_total", "compile_cache_limit_hits", "compile_recompile_limit", "compile_recompile_shape",
    "compiling_step_p50_ms", "compiled_step_p50_ms",
)  # fmt: skip
FLOP_FEATURES = ("burst_flops_per_step", "achieved_tflop_per_s", "peak_tflop_per_s", "mfu")

STEPS: tuple[Step, ...] = (
    step("compile", lambda w, pid, f: _compile_features(w, pid), COMPILE_FEATURES),
    step("flops", _flop_features, FLOP_FEATURES, needs=("tf32_matmul", "step_time_p50_ms")),
)
"""torch.compile's work, then FLOP/s and MFU from the last burst and the step time."""

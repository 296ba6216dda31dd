"""Rich text of each panel, from a :class:`~torchwatch.faces.tui.snapshot.Snapshot` (pure formatting).

Widgets call these and display the result; nothing here knows about Textual. Units are
written out (``MB``, ``ms``, ``W``, ``%``) and a missing value reads ``n/a``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from rich.table import Table
from rich.text import Text

from torchwatch.analysis.diagnosis import Analysis, Finding
from torchwatch.analysis.features import CATALOGUE
from torchwatch.faces.report import format_value
from torchwatch.faces.tui import views
from torchwatch.faces.tui.snapshot import BurstView, Snapshot, StepsView
from torchwatch.model.readings import Frame, SourceStatus, Status

LABEL_STYLES = {
    "gpu-bound": "bold green",
    "io-bound": "bold magenta",
    "dataloader-bound": "bold red",
    "cpu-bound": "bold yellow",
    "undetermined": "bold",
}
SEVERITY_STYLES = {"critical": "bold red", "warning": "bold yellow", "info": "bold blue"}
BREAKDOWN_STYLES = {
    "kernel": "green",
    "memcpy": "cyan",
    "memset": "bright_cyan",
    "communication": "magenta",
    "runtime": "yellow",
    "dataloader": "red",
    "cpu_exec": "blue",
    "other": "bright_black",
}


def feature_text(name: str, value: float | None) -> str:
    """A feature value with its unit (``62%``, ``1.5 MB/s``), ``n/a`` when missing."""
    return format_value(name, value)


def vitals_text(features: Mapping[str, float | None], steps: StepsView, memory: views.MemoryTrend) -> Text:
    """The few numbers a user looks at first: steps/s, data wait, loop CPU, workers, GPU, RSS."""
    wait = steps.data_wait
    parts = [
        ("steps/s", "n/a" if steps.steps_per_s is None else f"{steps.steps_per_s:.1f}"),
        ("data wait", views.fmt_share(wait)),
        ("loop CPU", feature_text("main_running_share", features.get("main_running_share"))),
        ("workers", feature_text("worker_count", features.get("worker_count"))),
        ("GPU", feature_text("gpu_util_mean", features.get("gpu_util_mean"))),
        ("RSS", views.fmt_bytes(memory.rss_bytes)),
    ]
    text = Text()
    for i, (name, value) in enumerate(parts):
        if i:
            text.append("  ")
        text.append(f"{name} ", style="dim")
        text.append(value, style="bold" if value != "n/a" else "dim")
    return text


def verdict_text(snap: Snapshot | None) -> Text:
    """The verdict: label, confidence and the window, the one-sentence summary, the vitals, the exit line."""
    text = Text()
    analysis = snap.analysis if snap else None
    if analysis is None:
        text.append("starting", style="bold")
        text.append(": waiting for the first readings (a verdict needs about 3 s of samples)", style="dim")
    else:
        v = analysis.verdict
        text.append(v.label, style=LABEL_STYLES.get(v.label, "bold"))
        text.append(f"  confidence {v.confidence:.2f}", style="bold")
        text.append(f"  over the last {snap.window_s:g} s\n" if snap else "\n", style="dim")
        text.append(v.summary)
    if snap is not None:
        text.append("\n")
        text.append_text(vitals_text(analysis.features if analysis else {}, snap.steps, snap.memory))
        if snap.exited:
            text.append(f"\n■ {snap.exited}", style="bold yellow")
    return text


def series_range(values: Sequence[float]) -> str:
    """Lowest and highest value: ``30–55``, ``0.9–1.2 GB`` (values from 1e6 up are bytes), or one
    value when the series is flat."""
    lo, hi = min(values), max(values)
    if hi >= 1e6:
        scale, unit, digits = (1e9, "GB", 1) if hi >= 1e9 else (1e6, "MB", 0)
        lo_text, hi_text = f"{lo / scale:.{digits}f}", f"{hi / scale:.{digits}f}"
        return f"{hi_text} {unit}" if lo_text == hi_text else f"{lo_text}–{hi_text} {unit}"
    lo_text, hi_text = f"{lo:.3g}", f"{hi:.3g}"
    return hi_text if lo_text == hi_text else f"{lo_text}–{hi_text}"


def evidence_line(finding: Finding) -> str:
    """``name=value`` pairs of a finding's evidence, with units."""
    return ", ".join(f"{k}={feature_text(k, v)}" for k, v in finding.evidence.items())


def finding_text(finding: Finding, verdict_summary: str | None = None) -> Table:
    """One finding as a list entry: severity, rule → label, summary, fixes, and the evidence
    on one line (the drill-down shows all of it). A grid, so wrapped lines keep their indent."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, width=8)
    grid.add_column(ratio=1)
    head = Text.assemble(
        (finding.rule, "bold"), (" → ", "dim"), (finding.label, LABEL_STYLES.get(finding.label, "bold"))
    )
    grid.add_row(Text(finding.severity, style=SEVERITY_STYLES.get(finding.severity, "bold")), head)
    if finding.summary != verdict_summary:
        grid.add_row("", finding.summary)
    for fx in finding.fixes:
        grid.add_row(Text("fix", style="bold green"), Text.assemble((f"{fx.title}: ", "green"), fx.detail))
    grid.add_row(
        Text("evidence", style="dim"), Text(evidence_line(finding), style="dim", no_wrap=True, overflow="ellipsis")
    )
    return grid


def sources_text(statuses: Iterable[tuple[str, SourceStatus]]) -> Text:
    """``psutil ok · nvml unavailable: reason`` with the state coloured."""
    colours = {Status.OK: "green", Status.STARTING: "yellow", Status.UNAVAILABLE: "red", Status.GONE: "yellow"}
    text = Text()
    for i, (name, st) in enumerate(statuses):
        if i:
            text.append(" · ", style="dim")
        text.append(f"{name} ")
        text.append(st.status.value, style=colours.get(st.status, ""))
        if st.reason and st.status is not Status.OK:
            text.append(f": {st.reason}", style="dim")
    return text


def evidence_table(finding: Finding, features: Mapping[str, float | None]) -> Table:
    """Each evidence feature: value with unit, what it measures, where it comes from."""
    table = Table(box=None, show_header=True, header_style="bold", expand=True, padding=(0, 1))
    table.add_column("feature", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("meaning", ratio=1)
    table.add_column("source", no_wrap=True, style="dim")
    for name in finding.evidence:
        spec = CATALOGUE.get(name)
        value = finding.evidence.get(name, features.get(name))
        table.add_row(name, feature_text(name, value), spec.doc if spec else "", spec.source if spec else "")
    return table


def finding_header(finding: Finding) -> Text:
    """Headline and summary of a finding for the drill-down."""
    text = Text()
    text.append(f"{finding.severity} ", style=SEVERITY_STYLES.get(finding.severity, "bold"))
    text.append(finding.rule, style="bold")
    text.append(" → ", style="dim")
    text.append(finding.label, style=LABEL_STYLES.get(finding.label, "bold"))
    text.append(f"\n{finding.summary}")
    return text


def fixes_text(finding: Finding) -> Text:
    """The fixes of a finding, and where its threshold comes from."""
    text = Text()
    for fx in finding.fixes:
        text.append("fix: ", style="bold green")
        text.append(f"{fx.title}\n", style="green")
        text.append(f"  {fx.detail}\n")
    if not finding.fixes:
        text.append("no fix: this finding explains, it does not prescribe\n", style="dim")
    text.append(f"threshold source: {finding.source}", style="dim")
    return text


def states_text(name: str, shares: Sequence[tuple[str, float]]) -> Text:
    """``loop thread (/proc, 10 Hz): running 62% · sync 30%`` or ``n/a``."""
    text = Text()
    text.append(f"{name}: ", style="bold")
    if not shares:
        text.append("n/a (no thread sample in the window)", style="dim")
    for i, (state, share) in enumerate(shares):
        if i:
            text.append(" · ", style="dim")
        text.append(f"{state} {views.fmt_share(share)}")
    return text


def readings_text(snap: Snapshot, evidence: Iterable[str]) -> Text:
    """The latest process (and, for GPU evidence, GPU) readings a finding's numbers come from."""
    text = Text()
    text.append("processes (psutil, last reading): ", style="bold")
    rows = views.sort_rows(snap.processes, "cpu")
    if not rows:
        text.append("n/a (no reading yet)", style="dim")
    for i, r in enumerate(rows):
        if i:
            text.append(" · ", style="dim")
        text.append(f"{r.role} {r.pid} {views.fmt_pct(r.cpu_pct)} CPU {views.fmt_bytes(r.rss_bytes)}")
    if any(name.startswith("gpu_") for name in evidence):
        for card in snap.gpus:
            text.append("\n").append_text(gpu_card_text(card))
        if snap.gpu_note:
            text.append(f"\nGPU: {snap.gpu_note}", style="dim")
    return text


def frames_text(frames: Sequence[Frame]) -> Text:
    """A stack, innermost first, one frame a line: ``function  file:line``."""
    text = Text()
    for i, f in enumerate(reversed(frames)):
        if i:
            text.append("\n")
        text.append(f"{f.name}", style="bold" if i == 0 else "")
        text.append(f"  {views.short_path(f.filename)}:{f.line}", style="dim")
    return text


def gpu_card_text(card: views.GpuCard) -> Text:
    """``GPU 0 NVIDIA H100 · util 97% (training 95%) · power 620/700 W · memory 20/80 GB``, then the GPM line:
    ``SM active 91% · occupancy 21% · tensor 64% · DRAM bw 31% (GPM)`` or ``SM activity n/a: why``."""
    text = Text()
    text.append(f"GPU {card.index} ", style="bold")
    text.append(card.name)
    if card.used_by_target:
        text.append("  (used by the training)", style="green")
    text.append("\nutil ", style="dim")
    text.append(views.fmt_pct(card.util_pct), style="bold")
    last = card.last
    if last is not None and last.proc_sm_pct is not None:
        text.append(f" (training {views.fmt_pct(last.proc_sm_pct)})", style="dim")
    text.append(" · power ", style="dim")
    if card.power_w is None:
        text.append("n/a")
    else:
        limit = "n/a" if card.power_limit_w is None else f"{card.power_limit_w:.0f}"
        text.append(f"{card.power_w:.0f} / {limit} W")
        if card.power_limit_w:
            text.append(f" ({card.power_w / card.power_limit_w:.0%})", style="dim")
    text.append(" · memory ", style="dim")
    text.append(f"{views.fmt_bytes(card.mem_used_bytes)} / {views.fmt_bytes(card.mem_total_bytes)}")
    if last is None:
        return text
    gpm = (last.sm_active_pct, last.sm_occupancy_pct, last.tensor_active_pct, last.dram_bw_pct)
    if any(v is not None for v in gpm):
        for i, (label, value) in enumerate(zip(("SM active", "occupancy", "tensor", "DRAM bw"), gpm, strict=True)):
            text.append(("\n" if i == 0 else " · ") + f"{label} ", style="dim")
            text.append(views.fmt_pct(value), style="bold" if i == 0 else "")
        text.append(" (GPM)", style="dim")
    elif last.gpm_reason:
        text.append("\nSM activity n/a: ", style="dim")
        text.append(last.gpm_reason, style="dim")
    return text


def steps_text(steps: StepsView) -> Text:
    """The hook's step counters, DataLoader settings and AMP; why they are missing otherwise."""
    text = Text()
    if steps.status is None or steps.status != "ok":
        why = steps.reason or (
            "the hook is starting" if steps.status == "starting" else "no hook in the process (torchwatch run adds it)"
        )
        text.append("steps: n/a: ", style="bold")
        text.append(why, style="dim")
    else:
        text.append("steps ", style="dim")
        text.append("n/a" if steps.steps is None else str(steps.steps), style="bold")
        text.append(" · ", style="dim")
        text.append("n/a" if steps.steps_per_s is None else f"{steps.steps_per_s:.2f}", style="bold")
        text.append(" steps/s · step time p50 ", style="dim")
        text.append("n/a" if steps.p50_ms is None else f"{steps.p50_ms:.0f} ms", style="bold")
        text.append(", p95 ", style="dim")
        text.append("n/a" if steps.p95_ms is None else f"{steps.p95_ms:.0f} ms", style="bold")
    if steps.data_wait is not None:
        where = "measured in-process" if steps.data_wait_source == "hook" else "py-spy estimate"
        text.append("\ndata wait ", style="dim")
        text.append(views.fmt_share(steps.data_wait), style="bold")
        text.append(f" ({where})", style="dim")
    if steps.dataloader:
        text.append("\nDataLoader: ", style="dim")
        text.append(" · ".join(f"{k}={v}" for k, v in steps.dataloader))
    extra = []
    if steps.usable_cpus is not None:
        extra.append(f"usable CPUs {steps.usable_cpus:g}")
    if steps.amp is not None:
        extra.append(f"AMP {steps.amp}")
    if extra:
        text.append("\n" + " · ".join(extra), style="dim")
    if steps.storage:
        text.append("\n" + steps.storage, style="dim")
    for err in steps.errors:
        text.append(f"\nhook error: {err}", style="red")
    return text


def burst_text(burst: BurstView) -> Text:
    """Whether ``b`` works, the burst's state, and the last summary's headline."""
    text = Text()
    if burst.possible:
        text.append("b", style="bold")
        text.append(": profile a few steps with torch.profiler (a burst)", style="dim")
    else:
        text.append("burst unavailable: ", style="bold")
        text.append(burst.reason, style="dim")
    if burst.state is not None:
        text.append(f"\nstate: {burst.state}")
    if burst.error:
        text.append(f"\nlast burst failed: {burst.error}", style="red")
    last = burst.last
    if last is None:
        if not burst.error:
            text.append("\nno burst yet", style="dim")
        return text
    text.append(f"\nburst #{last.id if last.id is not None else '?'}: ", style="bold")
    parts = [
        f"{last.steps if last.steps is not None else 'n/a'} steps",
        "n/a ms/step" if last.step_time_ms is None else f"{last.step_time_ms:.1f} ms/step",
        f"GPU idle {views.fmt_share(last.gpu_idle_share)}"
        + ("" if last.host_wait_share is None else f" (host wait {views.fmt_share(last.host_wait_share)})"),
        f"{last.events if last.events is not None else 'n/a'} events",
        f"RSS {views.fmt_bytes(last.rss_before_bytes)} → {views.fmt_bytes(last.rss_after_bytes)}",
    ]
    text.append(" · ".join(parts))
    if last.phases:
        text.append("\nphases: ", style="dim")
        text.append(" · ".join(f"{n} {views.fmt_share(s)}" for n, s in last.phases))
    text.append("\ntrace: ", style="dim")
    text.append(last.trace_path or "n/a (not written)")
    return text


def breakdown_bar(shares: Sequence[tuple[str, float]], width: int) -> Text:
    """A one-line bar of the step-time breakdown and its legend on a second line."""
    text = Text()
    for name, cells in views.bar_widths(dict(shares), width):
        text.append("█" * cells, style=BREAKDOWN_STYLES.get(name, "white"))
    if not shares:
        text.append("no breakdown", style="dim")
        return text
    text.append("\n")
    for i, (name, share) in enumerate(s for s in shares if s[1] > 0):
        if i:
            text.append("  ")
        text.append("■ ", style=BREAKDOWN_STYLES.get(name, "white"))
        text.append(f"{name} {'<1%' if share < 0.005 else views.fmt_share(share)}")
    return text


def memory_text(memory: views.MemoryTrend) -> Text:
    """Host RSS now and at its peak, and by role (main, worker, ...)."""
    text = Text()
    text.append("host RSS ", style="dim")
    text.append(views.fmt_bytes(memory.rss_bytes), style="bold")
    text.append(f" (peak {views.fmt_bytes(memory.rss_peak_bytes)})", style="dim")
    if memory.rss_by_role:
        text.append(" · " + " · ".join(f"{role} {views.fmt_bytes(b)}" for role, b in memory.rss_by_role))
    return text


def device_memory_text(memory: views.MemoryTrend, allocator: Mapping[str, float | None] | None = None) -> Text:
    """``device used 12 GB / 40 GB (NVML) · allocated / reserved n/a (...)``."""
    text = Text()
    text.append("device used ", style="dim")
    if memory.device_used_bytes is None:
        text.append("n/a (no NVML reading)", style="dim")
    else:
        text.append(views.fmt_bytes(memory.device_used_bytes), style="bold")
        text.append(f" / {views.fmt_bytes(memory.device_total_bytes)} (NVML)", style="dim")
    text.append(" · allocator ", style="dim")
    if allocator and (allocator.get("allocated_bytes") is not None or allocator.get("reserved_bytes") is not None):
        text.append(
            f"{views.fmt_bytes(allocator.get('allocated_bytes'))} allocated"
            f" / {views.fmt_bytes(allocator.get('reserved_bytes'))} reserved"
        )
    else:
        text.append("n/a (not reported by the hook)", style="dim")
    return text


def exit_or_starting(analysis: Analysis | None) -> str:
    """Placeholder of the findings list when there is no finding."""
    if analysis is None:
        return "No finding yet: collecting evidence."
    return "No finding: no rule's threshold is crossed in this window."


def help_table(rows: Iterable[tuple[str, str]]) -> Table:
    """Keys and what they do, descriptions wrapping."""
    table = Table(box=None, show_header=False, expand=True, padding=(0, 2, 0, 0))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(ratio=1)
    for keys, what in rows:
        table.add_row(keys, what)
    return table

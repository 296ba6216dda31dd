"""Rich text of each panel, from an :class:`~torchwatch.model.observation.Observation` (pure formatting).

Widgets call these and display the result; nothing here knows about Textual. Units are written
out (``MiB``, ``ms``, ``W``, ``%``: :mod:`torchwatch.model.units`) and a missing value reads ``n/a``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from rich.markup import escape as escape_markup
from rich.table import Table
from rich.text import Text

from torchwatch.faces import memory as memfaces
from torchwatch.faces.compile import compile_summary, event_line, flop_line
from torchwatch.faces.tui import views
from torchwatch.model.findings import Finding
from torchwatch.model.observation import BurstView, DeviceMemory, FeatureSpec, GpuRow, MemoryTrend, Observation
from torchwatch.model.readings import Frame, SourceStatus, Status
from torchwatch.model.units import fmt_bytes, fmt_pct, fmt_share, fmt_value
from torchwatch.wire import LOADER_SETTINGS

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


def feature_text(name: str, value: float | None, catalogue: Mapping[str, FeatureSpec]) -> str:
    """A feature value with its unit from the catalogue (``62%``, ``1.5 MiB/s``), ``n/a`` when missing."""
    spec = catalogue.get(name)
    return fmt_value(value, spec.unit if spec is not None else "")


def vitals_text(obs: Observation) -> Text:
    """The few numbers a user looks at first: steps/s, data wait, loop CPU, workers, GPU, RSS."""
    steps, f, cat = obs.focus.steps, obs.features, obs.catalogue
    parts = [
        ("steps/s", "n/a" if steps.steps_per_s is None else f"{steps.steps_per_s:.1f}"),
        ("data wait", fmt_share(steps.data_wait)),
        ("loop CPU", feature_text("main_running_share", f.get("main_running_share"), cat)),
        ("workers", feature_text("worker_count", f.get("worker_count"), cat)),
        ("GPU", feature_text("gpu_util_mean", f.get("gpu_util_mean"), cat)),
        ("RSS", fmt_bytes(obs.memory.rss_bytes)),
    ]
    text = Text()
    for i, (name, value) in enumerate(parts):
        if i:
            text.append("  ")
        text.append(f"{name} ", style="dim")
        text.append(value, style="bold" if value != "n/a" else "dim")
    return text


def verdict_text(obs: Observation | None) -> Text:
    """The verdict: label, confidence and the window, the one-sentence summary, the vitals, the exit line."""
    text = Text()
    verdict = obs.verdict if obs else None
    if obs is None or verdict is None:
        text.append("starting", style="bold")
        text.append(": waiting for the first readings (a verdict needs about 3 s of samples)", style="dim")
    else:
        text.append(verdict.label, style=LABEL_STYLES.get(verdict.label, "bold"))
        text.append(f"  confidence {verdict.confidence:.2f}", style="bold")
        text.append(f"  over the last {obs.window_s:g} s\n", style="dim")
        text.append(verdict.summary)
    if obs is not None:
        text.append("\n")
        text.append_text(vitals_text(obs))
        if obs.target.exited:
            text.append(f"\n■ {obs.target.exited}", style="bold yellow")
    return text


def evidence_line(finding: Finding, catalogue: Mapping[str, FeatureSpec]) -> str:
    """``name=value`` pairs of a finding's evidence, with units."""
    return ", ".join(f"{k}={feature_text(k, v, catalogue)}" for k, v in finding.evidence.items())


def finding_text(finding: Finding, catalogue: Mapping[str, FeatureSpec], verdict_summary: str | None = None) -> Table:
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
        grid.add_row("", escape_markup(finding.summary))  # it may quote a process's name: never markup
    for fx in finding.fixes:
        live = ((f"  [t: try {fx.trial} live]", "bold cyan"),) if fx.trial else ()
        grid.add_row(Text("fix", style="bold green"), Text.assemble((f"{fx.title}: ", "green"), fx.detail, *live))
    grid.add_row(
        Text("evidence", style="dim"),
        Text(evidence_line(finding, catalogue), style="dim", no_wrap=True, overflow="ellipsis"),
    )
    return grid


def sources_text(
    statuses: Iterable[tuple[str, SourceStatus]], hang: str | None = None, sampling: str | None = None
) -> Text:
    """``sampling: steady · psutil ok · nvml unavailable: reason`` with the states coloured
    (``sampling``: the samplers' cadence, left out when ``None``); a recorded hang's notice
    (``hang``) on a line of its own above."""
    colours = {Status.OK: "green", Status.STARTING: "yellow", Status.UNAVAILABLE: "red", Status.GONE: "yellow"}
    text = Text()
    if hang:
        text.append(hang + "\n", style="bold red")
    first = True
    if sampling is not None:
        text.append("sampling: ")
        text.append(sampling, style="cyan" if sampling == "fast" else "green")
        first = False
    for name, st in statuses:
        if not first:
            text.append(" · ", style="dim")
        first = False
        text.append(f"{name} ")
        text.append(st.status.value, style=colours.get(st.status, ""))
        if st.reason and st.status is not Status.OK:
            text.append(f": {st.reason}", style="dim")
    return text


def evidence_table(finding: Finding, obs: Observation) -> Table:
    """Each evidence feature: value with unit, what it measures, where it comes from."""
    table = Table(box=None, show_header=True, header_style="bold", expand=True, padding=(0, 1))
    table.add_column("feature", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("meaning", ratio=1)
    table.add_column("source", no_wrap=True, style="dim")
    for name in finding.evidence:
        spec = obs.catalogue.get(name)
        value = finding.evidence.get(name, obs.features.get(name))
        text = feature_text(name, value, obs.catalogue)
        # a value may be the target's text (a neighbour's process name): shown, never read as markup
        table.add_row(
            escape_markup(name),
            escape_markup(text),
            escape_markup(spec.doc if spec else ""),
            escape_markup(spec.source if spec else ""),
        )
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
        if fx.trial:
            text.append(f"  try it live: t on the finding, or torchwatch trial PID {fx.trial}\n", style="cyan")
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
        text.append(f"{state} {fmt_share(share)}")
    return text


def readings_text(obs: Observation, evidence: Iterable[str]) -> Text:
    """The latest process (and, for GPU evidence, GPU) readings a finding's numbers come from."""
    text = Text()
    text.append("processes (psutil, last reading): ", style="bold")
    rows = views.sort_rows(obs.processes, "cpu")
    if not rows:
        text.append("n/a (no reading yet)", style="dim")
    for i, r in enumerate(rows):
        if i:
            text.append(" · ", style="dim")
        text.append(f"{r.role} {r.pid} {fmt_pct(r.cpu_pct)} CPU {fmt_bytes(r.rss_bytes)}")
    if any(name.startswith("gpu_") for name in evidence):
        for card in obs.gpus:
            text.append("\n").append_text(gpu_card_text(card))
        if obs.gpu_note:
            text.append(f"\nGPU: {obs.gpu_note}", style="dim")
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


def gpu_card_text(card: GpuRow) -> Text:
    """``GPU 0 NVIDIA H100 · util 97% (training 95%) · power 620/700 W · memory 20/80 GB``, then the GPM line:
    ``SM active 91% · occupancy 21% · tensor 64% · DRAM bw 31% (GPM)`` or ``SM activity n/a: why``."""
    text = Text()
    text.append(f"GPU {card.index} ", style="bold")
    text.append(card.name)
    if card.used_by_target:
        text.append("  (used by the training)", style="green")
    text.append("\nutil ", style="dim")
    text.append(fmt_pct(card.util_pct), style="bold")
    last = card.last
    if last is not None and last.proc_sm_pct is not None:
        text.append(f" (training {fmt_pct(last.proc_sm_pct)})", style="dim")
    text.append(" · power ", style="dim")
    if card.power_w is None:
        text.append("n/a")
    else:
        limit = "n/a" if card.power_limit_w is None else f"{card.power_limit_w:.0f}"
        text.append(f"{card.power_w:.0f} / {limit} W")
        if card.power_limit_w:
            text.append(f" ({card.power_w / card.power_limit_w:.0%})", style="dim")
    text.append(" · memory ", style="dim")
    text.append(f"{fmt_bytes(card.mem_used_bytes)} / {fmt_bytes(card.mem_total_bytes)}")
    if last is None:
        return text
    gpm = (last.sm_active_pct, last.sm_occupancy_pct, last.tensor_active_pct, last.dram_bw_pct)
    if any(v is not None for v in gpm):
        for i, (label, value) in enumerate(zip(("SM active", "occupancy", "tensor", "DRAM bw"), gpm, strict=True)):
            text.append(("\n" if i == 0 else " · ") + f"{label} ", style="dim")
            text.append(fmt_pct(value), style="bold" if i == 0 else "")
        text.append(" (GPM)", style="dim")
    elif last.gpm_reason:
        text.append("\nSM activity n/a: ", style="dim")
        text.append(last.gpm_reason, style="dim")
    return text


SPARKS = "▁▂▃▄▅▆▇█"
LOSS_CELLS = 24
"""Cells of the loss's sparkline on its line: the last 2 minutes of 5 s medians (the trend's window),
which fit beside the loss's words at 80 columns; the Steps panel's full loss row is below it, off an
80×24 screen."""


def sparkline(values: Sequence[float]) -> str:
    """One character per value, from the lowest (``▁``) to the highest (``█``) shown; ``""`` for
    fewer than 2 finite values; a value that is not finite is a space."""
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < 2:
        return ""
    lo, hi = min(finite), max(finite)
    span = hi - lo
    top = len(SPARKS) - 1
    return "".join(
        " " if not math.isfinite(v) else SPARKS[round((v - lo) / span * top) if span > 0 else 0] for v in values
    )


def steps_text(obs: Observation) -> Text:
    """The focus rank's step counters, its epoch and loss (when the hook read them), DataLoader
    settings and AMP, and the storage readings; why the hook's numbers are missing otherwise."""
    steps = obs.focus.steps
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
    prog = obs.focus.progress
    if prog is not None:
        text.append("\n")
        text.append(prog.epoch_words(), style="bold")
        if bar := prog.bar_words():
            text.append("\n")
            text.append(bar, style="bold")
        text.append("\n")
        text.append(prog.loss_words(), style="bold red" if prog.nonfinite_step is not None else "bold")
        if spark := sparkline(prog.loss_series[-LOSS_CELLS:]):
            text.append(f"  {spark}", style="cyan")
    if steps.data_wait is not None:
        where = "measured in-process" if steps.data_wait_source == "hook" else "py-spy estimate"
        text.append("\ndata wait ", style="dim")
        text.append(fmt_share(steps.data_wait), style="bold")
        text.append(f" ({where})", style="dim")
    if steps.loader is not None:
        loader = steps.loader
        settings = [f"{name}={getattr(loader, name)}" for name in LOADER_SETTINGS]
        if loader.batch_bytes is not None:
            settings.append(f"batch={fmt_bytes(loader.batch_bytes)}")
        text.append("\nDataLoader: ", style="dim")
        text.append(" · ".join(settings))
    extra = []
    cpus = steps.usable_cpus if steps.usable_cpus is not None else obs.features.get("usable_cpus")
    if cpus is not None:
        extra.append(f"usable CPUs {cpus:g}")
    if steps.amp_text is not None:
        extra.append(f"AMP {steps.amp_text}")
    if extra:
        text.append("\n" + " · ".join(extra), style="dim")
    storage = storage_line(obs.features)
    if storage:
        text.append("\n" + storage, style="dim")
    flops = flop_line(obs.focus.flop_rate)
    if flops:
        text.append("\n" + flops)
    head = compile_summary(obs.focus.compile)
    if head and obs.focus.compile is not None:
        text.append("\n" + head, style="dim")
        for event in obs.focus.compile.events[-3:]:
            text.append("\n  " + event_line(event), style="yellow")
    for err in steps.errors:
        text.append(f"\nhook error: {err}", style="red")
    return text


def storage_line(features: Mapping[str, float | None]) -> str | None:
    """The storage readings in words, iostat's way: ``disk reads 78 MiB/s · 4.0 KiB per request ·
    0.06 ms each · 1.8 in flight · busy 72%``, then ``swap-in 30 MiB/s · memory stalls 40%`` when
    the machine swaps; ``None`` when no device served enough reads and nothing is swapped in."""
    parts = []
    request = features.get("disk_read_request_bytes")
    rate, wait_ms = features.get("disk_read_bytes_per_s"), features.get("disk_read_await_ms")
    queue, busy = features.get("disk_read_queue"), features.get("disk_busy_share")
    if request is not None and rate is not None:
        parts.append(f"disk reads {fmt_bytes(rate)}/s · {fmt_bytes(request)} per request")
        if wait_ms is not None:
            parts.append(f"{wait_ms:.2f} ms each")
        if queue is not None:
            parts.append(f"{queue:.1f} in flight")
        if busy is not None:
            parts.append(f"busy {fmt_share(busy)}")
    swap = features.get("swap_in_bytes_per_s")
    if swap:
        parts.append(f"swap-in {fmt_bytes(swap)}/s")
        stalls = features.get("memory_pressure_pct")
        if stalls is not None:
            parts.append(f"memory stalls {fmt_pct(stalls)}")
    return " · ".join(parts) or None


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
    last = burst.last if not burst.error else None
    if last is None:
        if not burst.error:
            text.append("\nno burst yet", style="dim")
        return text
    host_wait = dict(last.gpu_idle_split_share).get("host_wait")
    idle = f"GPU idle {fmt_share(last.gpu_idle_share)}"
    text.append(f"\nburst #{last.id}: ", style="bold")
    parts = [
        f"{last.steps if last.steps is not None else 'n/a'} steps",
        "n/a ms/step" if last.step_time_ms is None else f"{last.step_time_ms:.1f} ms/step",
        idle + ("" if host_wait is None else f" (host wait {fmt_share(host_wait)})"),
        f"{last.events if last.events is not None else 'n/a'} events",
        f"RSS {fmt_bytes(last.rss_before_bytes)} → {fmt_bytes(last.rss_after_bytes)}",
    ]
    text.append(" · ".join(parts))
    if last.phases_share:
        text.append("\nphases: ", style="dim")
        text.append(" · ".join(f"{n} {fmt_share(s)}" for n, s in last.phases_share))
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
        text.append(f"{name} {'<1%' if share < 0.005 else fmt_share(share)}")
    return text


def memory_text(memory: MemoryTrend) -> Text:
    """Host RSS now and at its peak, and by role (main, worker, ...)."""
    text = Text()
    text.append("host RSS ", style="dim")
    text.append(fmt_bytes(memory.rss_bytes), style="bold")
    text.append(f" (peak {fmt_bytes(memory.rss_peak_bytes)})", style="dim")
    if memory.rss_by_role:
        text.append(" · " + " · ".join(f"{role} {fmt_bytes(b)}" for role, b in memory.rss_by_role))
    return text


def memory_limit_text(memory: MemoryTrend) -> Text:
    """The limit, the forecasts and the out-of-memory records, one line each::

        limit 1.0 GiB (cgroup v1 memory limit of /sys/fs/cgroup/memory/job) · in use 612 MiB (60%)
        host memory reaches its limit (1.0 GiB) in ~2 min 10 s (95%: 1 min 50 s - 2 min 40 s), +3.1 MiB/s over 75 s
          fastest: worker 4312: private +3.0 MiB/s, shared -2.9 MiB/s (copy-on-write ...)
        OUT OF MEMORY: worker 4312 (pt_data_worker): killed by the kernel's OOM killer (see the memory record)

    Without a forecast, why (dim): ``no forecast: 40 s of steady readings since the last reset, 60 s needed``.
    """
    view = memory.view
    text = Text()
    lim = view.limit
    if lim is None:
        text.append("limit n/a (the training's cgroup and /proc/meminfo are not readable)", style="dim")
    else:
        text.append("limit ", style="dim")
        text.append(fmt_bytes(lim.limit), style="bold")
        text.append(f" ({lim.source})", style="dim")
        text.append(f" · in use {fmt_bytes(lim.used)} ({fmt_share(lim.used / lim.limit if lim.limit else 0)})")
    for f in view.forecasts:
        text.append("\n")
        text.append(
            memfaces.forecast_line(memfaces.forecast_report(f)), style="bold red" if f.seconds < 600 else "bold yellow"
        )
        if f.grower:
            text.append(f"\n  fastest: {f.grower}", style="dim")
    if not view.forecasts and view.why_not:
        text.append(f"\nno forecast: {view.why_not}", style="dim")
    for r in view.records:
        kind = "killed by the kernel's OOM killer" if r.kind == "host" else "CUDA out of memory"
        text.append(f"\nOUT OF MEMORY: {r.role} {r.pid} ({r.name or '?'}): {kind} (the memory record is in the report)",
                    style="bold red")  # fmt: skip
    return text


def device_memory_text(memory: MemoryTrend, allocator: DeviceMemory) -> Text:
    """``device used 12.0 GiB / 40.0 GiB (NVML) · allocator 9.1 GiB allocated / 10.0 GiB reserved
    (peak 9.8 GiB) of 40.0 GiB (peak 25%, reserved 25%)``, or why the allocator's numbers are
    missing (``n/a (no hook ...)``, ``n/a (the training has not initialised CUDA ...)``)."""
    text = Text()
    text.append("device used ", style="dim")
    if memory.device_used_bytes is None:
        text.append("n/a (no NVML reading)", style="dim")
    else:
        text.append(fmt_bytes(memory.device_used_bytes), style="bold")
        text.append(f" / {fmt_bytes(memory.device_total_bytes)} (NVML)", style="dim")
    text.append(" · allocator ", style="dim")
    if allocator.allocated_bytes is not None or allocator.reserved_bytes is not None:
        text.append(f"{fmt_bytes(allocator.allocated_bytes)} allocated", style="bold")
        text.append(f" / {fmt_bytes(allocator.reserved_bytes)} reserved")
        if allocator.peak_bytes is not None:
            text.append(f" (peak {fmt_bytes(allocator.peak_bytes)})", style="dim")
        cap = allocator.capacity_bytes
        if cap:
            text.append(f" of {fmt_bytes(cap)} on cuda:{allocator.device}")
            peak = max(allocator.peak_bytes or 0, allocator.reserved_bytes or 0)
            text.append(f" ({fmt_share(peak / cap)} at most)", style="bold red" if peak > 0.9 * cap else "dim")
        if allocator.alloc_retries:
            text.append(f" · {allocator.alloc_retries} allocation retries", style="bold red")
        if allocator.devices > 1:
            text.append(f" · memory on {allocator.devices} devices", style="dim")
    else:
        text.append(f"n/a ({allocator.why or 'not reported by the hook'})", style="dim")
    return text


def exit_or_starting(obs: Observation | None) -> str:
    """Placeholder of the findings list when there is no finding."""
    if obs is None or obs.verdict is None:
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

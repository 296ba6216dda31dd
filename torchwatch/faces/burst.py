"""A profiler burst's summary for people: the lines ``torchwatch burst`` and the text report print.

A function of the typed result the hook publishes (:class:`~torchwatch.wire.BurstResult`):
the step-time breakdown, the GPU's idle time and its split, pageable copies, the heaviest
operators and kernels, and where the trace is.
"""

from __future__ import annotations

from torchwatch.model.units import fmt_bytes, fmt_ms, fmt_share
from torchwatch.wire import BurstResult


def burst_lines(burst: BurstResult | None) -> list[str]:
    """A burst summary for people: breakdown, GPU idle, top operators, trace path (indented two
    spaces, to sit under the report's loop section); a failed burst in one line."""
    if burst is None:
        return []
    if burst.error:
        return [f"  last burst #{burst.id}: failed: {burst.error}"]
    parts = ", ".join(f"{k} {v:.0%}" for k, v in burst.breakdown_share if v >= 0.005)
    lines = [f"  last burst #{burst.id}: {burst.steps} steps of {fmt_ms(burst.step_time_ms)}: {parts}"]
    if burst.gpu_idle_share is not None:
        idle = f"    GPU idle {fmt_share(burst.gpu_idle_share)} of the step"
        split = dict(burst.gpu_idle_split_share)
        if split:
            idle += (
                f": waiting for the host {fmt_share(split.get('host_wait'))}, "
                f"between queued kernels {fmt_share(split.get('kernel_wait'))}, other {fmt_share(split.get('other'))}"
            )
        lines.append(idle)
    copies = burst.pageable_h2d_copies_per_step
    if copies is not None and copies > 0:
        lines.append(
            f"    pageable host-to-device copies: {copies:.3g} per step, "
            f"{fmt_bytes(burst.pageable_h2d_bytes_per_step or 0)} per step (pin_memory=True avoids them)"
        )
    if burst.top_cpu_ops:
        lines.append("    top CPU ops (self): " + ", ".join(f"{o.name} {o.ms:.1f} ms" for o in burst.top_cpu_ops[:5]))
    if burst.top_kernels:
        lines.append("    top kernels: " + ", ".join(f"{k.name[:40]} {k.ms:.1f} ms" for k in burst.top_kernels[:5]))
    if burst.trace_path:
        lines.append(f"    trace: {burst.trace_path} (opens in ui.perfetto.dev)")
        if burst.trace_dir:
            lines.append(f"    its folder: {burst.trace_dir} (HolisticTraceAnalysis; TensorBoard: its parent)")
    elif burst.trace_note:
        lines.append(f"    trace: {burst.trace_note}")
    return lines

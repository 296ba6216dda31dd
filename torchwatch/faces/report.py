"""The final report: JSON (``torchwatch.report/1``, DESIGN.md contract) and text, and the live status line."""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchwatch.analysis.diagnosis import Analysis
from torchwatch.analysis.features import CATALOGUE
from torchwatch.analysis.rules_engine import human_bytes
from torchwatch.model.errors import TorchwatchError
from torchwatch.model.readings import SourceStatus

SCHEMA = "torchwatch.report/1"
ENDINGS = {
    "exit": "the target exited",
    "duration": "--duration ran out",
    "quit": "quit from the TUI",
    "left running": "quit from the TUI, the training left running",
    "SIGINT": "torchwatch got SIGINT",
    "SIGTERM": "torchwatch got SIGTERM",
    "SIGHUP": "torchwatch got SIGHUP (its terminal closed)",
}


def _num(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 4)


def build(
    analysis: Analysis,
    statuses: Mapping[str, SourceStatus],
    *,
    pid: int,
    cmdline: Sequence[str],
    exit_code: int | None,
    window_s: float,
    watched_s: float,
    history: Sequence[tuple[float, str]] = (),
    own_usage: Mapping[str, float] | None = None,
    hook: Mapping[str, Any] | None = None,
    ended_by: str | None = None,
) -> dict[str, Any]:
    """The report as a JSON-ready dict.

    Keys (contract): ``schema``, ``target`` {pid, cmdline, exit_code}, ``window`` {seconds},
    ``verdict`` {label, confidence, summary}, ``findings`` [...], ``sources`` {name: {status,
    reason?, hint?}}, ``features`` {name: number | null}. Added: ``not_applicable``,
    ``watched_seconds``, ``verdict_history``, ``feature_units`` and ``self`` (torchwatch's own
    CPU and memory, see :meth:`Session.own_usage`) and ``hook`` (what the in-process hook
    measured: steps/s, step time, data-wait fraction, DataLoader settings, the last burst's
    summary; see :meth:`Session.hook_summary`; ``null`` without a hook), and ``ended_by``:
    what ended the watch (:data:`ENDINGS`; ``null`` when not known).
    """
    return {
        "schema": SCHEMA,
        "target": {"pid": pid, "cmdline": list(cmdline), "exit_code": exit_code},
        "ended_by": ended_by,
        "window": {"seconds": float(window_s)},
        "verdict": analysis.verdict.to_json(),
        "findings": [f.to_json() for f in analysis.findings],
        "not_applicable": [n.to_json() for n in analysis.not_applicable],
        "sources": {name: st.to_json() for name, st in statuses.items()},
        "features": {k: _num(v) for k, v in analysis.features.items()},
        "feature_units": {k: spec.unit for k, spec in CATALOGUE.items()},
        "watched_seconds": round(watched_s, 1),
        "verdict_history": [{"t": t, "label": label} for t, label in history],
        "self": dict(own_usage or {}),
        "hook": _clean(hook) if hook is not None else None,
    }


def _clean(value: Any) -> Any:
    """Round floats and drop non-finite ones, recursively (the hook's dicts go to JSON)."""
    if isinstance(value, float):
        return _num(value)
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def format_value(name: str, value: float | None) -> str:
    """A feature value with its unit for people: ``62%``, ``1.5 MiB/s``, ``4.0 KiB``, ``0.065 ms``, ``n/a``."""
    if value is None:
        return "n/a"
    unit = CATALOGUE[name].unit if name in CATALOGUE else ""
    if unit == "share":
        return f"{value:.0%}"
    if unit == "%":
        return f"{value:.0f}%"
    if unit == "bytes/s":
        return f"{human_bytes(value)}/s"
    if unit == "bytes":
        return human_bytes(value)
    if unit == "ms":
        return f"{value:.3g} ms" if abs(value) < 100 else f"{value:.0f} ms"
    if unit == "steps/s":
        return f"{value:.2f} steps/s"
    if unit == "s":
        return f"{value:.0f} s"
    if unit == "flag":
        return "yes" if value else "no"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def _pct(v: Any) -> str:
    return "n/a" if not isinstance(v, (int, float)) else f"{v:.0%}"


def hook_lines(hook: Mapping[str, Any] | None) -> list[str]:
    """The hook's measurements for people: steps, step time, data wait, settings, AMP, last burst."""
    if not hook:
        return []
    if hook.get("status") != "ok" and "steps" not in hook:
        return [f"hook: {hook.get('status')}" + (f": {hook['reason']}" if hook.get("reason") else "")]
    st = hook.get("step_time_ms") or {}
    sps = hook.get("steps_per_s")
    lines = [
        "training loop (measured in the process):",
        f"  {hook.get('steps', 0)} steps, "
        + ("n/a steps/s" if sps is None else f"{sps:.2f} steps/s")
        + f", step time p50 {_ms(st.get('p50'))} / p95 {_ms(st.get('p95'))}"
        + f", data wait {_pct(hook.get('data_wait_fraction'))}",
    ]
    dl = hook.get("dataloader")
    if dl:
        lines.append(
            f"  DataLoader: num_workers={dl.get('num_workers')}, batch_size={dl.get('batch_size')}, "
            f"pin_memory={dl.get('pin_memory')}, prefetch_factor={dl.get('prefetch_factor')}, "
            f"persistent_workers={dl.get('persistent_workers')}; usable CPUs {hook.get('usable_cpus')}"
        )
    amp = hook.get("amp") or {}
    if amp:
        lines.append(
            "  AMP: "
            + (
                f"autocast {amp.get('dtype')} on {amp.get('device_type')}"
                if amp.get("autocast")
                else "autocast not seen"
            )
            + (", GradScaler" if amp.get("grad_scaler") else "")
        )
    lines += burst_lines(hook.get("last_burst"))
    for err in hook.get("errors") or []:
        lines.append(f"  hook error: {err}")
    return lines


def _ms(v: Any) -> str:
    return "n/a" if not isinstance(v, (int, float)) else f"{v:.1f} ms"


def burst_lines(burst: Mapping[str, Any] | None) -> list[str]:
    """A burst summary for people: breakdown, GPU idle, top operators, trace path."""
    if not burst:
        return []
    if burst.get("error"):
        return [f"  last burst #{burst.get('id')}: failed: {burst['error']}"]
    share = burst.get("breakdown_share") or {}
    parts = ", ".join(f"{k} {v:.0%}" for k, v in share.items() if isinstance(v, (int, float)) and v >= 0.005)
    lines = [
        f"  last burst #{burst.get('id')}: {burst.get('steps')} steps of {_ms(burst.get('step_time_ms'))}: {parts}",
    ]
    if burst.get("gpu_idle_share") is not None:
        idle = f"    GPU idle {_pct(burst.get('gpu_idle_share'))} of the step"
        split = burst.get("gpu_idle_split_share") or {}
        if split:
            idle += (
                f": waiting for the host {_pct(split.get('host_wait'))}, "
                f"between queued kernels {_pct(split.get('kernel_wait'))}, other {_pct(split.get('other'))}"
            )
        lines.append(idle)
    pageable = burst.get("pageable_h2d") or {}
    copies = pageable.get("copies_per_step")
    if isinstance(copies, (int, float)) and copies > 0:
        lines.append(
            f"    pageable host-to-device copies: {copies:.3g} per step, "
            f"{human_bytes(float(pageable.get('bytes_per_step') or 0))} per step (pin_memory=True avoids them)"
        )
    ops = burst.get("top_cpu_ops") or []
    if ops:
        lines.append("    top CPU ops (self): " + ", ".join(f"{o['name']} {o['self_ms']:.1f} ms" for o in ops[:5]))
    kernels = burst.get("top_kernels") or []
    if kernels:
        lines.append("    top kernels: " + ", ".join(f"{k['name'][:40]} {k['total_ms']:.1f} ms" for k in kernels[:5]))
    if burst.get("trace_path"):
        lines.append(f"    trace: {burst['trace_path']} (opens in ui.perfetto.dev)")
        if burst.get("trace_dir"):
            lines.append(f"    its folder: {burst['trace_dir']} (HolisticTraceAnalysis; TensorBoard: its parent)")
    elif burst.get("trace_note"):
        lines.append(f"    trace: {burst['trace_note']}")
    return lines


def status_text(name: str, st: SourceStatus) -> str:
    """``name ok`` or ``name unavailable: reason``."""
    text = f"{name} {st.status.value}"
    return f"{text}: {st.reason}" if st.reason else text


def render_text(report: Mapping[str, Any]) -> str:
    """The report for a terminal: verdict, findings with evidence and fixes, sources."""
    target, verdict = report["target"], report["verdict"]
    cmd = " ".join(target["cmdline"]) or "?"
    exit_part = "" if target["exit_code"] is None else f", exit {target['exit_code']}"
    ended = ENDINGS.get(str(report.get("ended_by")))
    ended_part = f"; {ended}" if ended else ""
    lines = [
        f"torchwatch report: {cmd} (PID {target['pid']}{exit_part}), watched {report['watched_seconds']:.0f} s"
        f"{ended_part}",
        f"verdict: {verdict['label']} (confidence {verdict['confidence']:.2f})",
        f"  {verdict['summary']}",
    ]
    if report["findings"]:
        lines.append("findings:")
    for f in report["findings"]:
        lines.append(f"  [{f['severity']}] {f['rule']} -> {f['label']}: {f['summary']}")
        ev = ", ".join(f"{k}={format_value(k, v)}" for k, v in f["evidence"].items())
        lines.append(f"      evidence: {ev}")
        for fx in f["fixes"]:
            lines.append(f"      fix: {fx['title']}: {fx['detail']}")
    srcs = "; ".join(
        f"{name} {st['status']}" + (f": {st['reason']}" if st.get("reason") else "")
        for name, st in report["sources"].items()
    )
    lines += hook_lines(report.get("hook"))
    lines.append(f"sources: {srcs}")
    return "\n".join(lines)


def status_line(analysis: Analysis | None, elapsed_s: float) -> str:
    """One line for ``--headless`` live output on stderr."""
    if analysis is None:
        return f"torchwatch [{elapsed_s:4.0f}s] starting"
    f, v = analysis.features, analysis.verdict
    parts = [
        f"torchwatch [{elapsed_s:4.0f}s] {v.label} ({v.confidence:.2f})",
        f"data wait {format_value('data_wait_share', f.get('data_wait_share'))}",
        f"loop CPU {format_value('main_running_share', f.get('main_running_share'))}",
        f"disk wait {format_value('storage_wait_share', f.get('storage_wait_share'))}",
        f"workers {format_value('worker_count', f.get('worker_count'))}",
        *([f"{f['hook_steps_per_s']:.2f} steps/s"] if f.get("hook_steps_per_s") is not None else []),
        f"GPU {format_value('gpu_util_mean', f.get('gpu_util_mean'))}"
        + (
            f" (SM {format_value('gpu_sm_active_mean', f['gpu_sm_active_mean'])})"
            if f.get("gpu_sm_active_mean") is not None
            else ""
        ),
    ]
    return " | ".join(parts)


def dumps(report: Mapping[str, Any]) -> str:
    """JSON text of the report (indented, UTF-8 safe)."""
    return json.dumps(report, indent=2, ensure_ascii=False)


def default_name(pid: int, kind: str = "report") -> str:
    """The file name of a report written into a directory: ``torchwatch-KIND-PID-YYYYmmdd-HHMMSS.json``."""
    return f"torchwatch-{kind}-{pid}-{time.strftime('%Y%m%d-%H%M%S')}.json"


def check_json_path(path: str | None) -> None:
    """Check, before watching, that ``--json PATH`` can be written: a file in a writable directory,
    or a writable directory (the report is then written into it under :func:`default_name`).

    Raises:
        TorchwatchError: the directory does not exist or is not writable.
    """
    if path in (None, "-"):
        return
    target = Path(path).expanduser()
    folder = target if target.is_dir() else target.parent
    if path.endswith(os.sep) and not target.is_dir():
        folder = target
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise TorchwatchError(
            f"cannot write the JSON report to {path}: {folder} is not a writable directory",
            "give --json a path in an existing, writable directory",
        )


def json_target(path: str, pid: int, kind: str = "report") -> Path:
    """Where ``--json PATH`` writes: PATH, or ``PATH/torchwatch-KIND-PID-TIME.json`` for a directory."""
    target = Path(path).expanduser()
    return target / default_name(pid, kind) if target.is_dir() else target


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the whole new one, never a part.

    The text goes to a new file beside ``path`` (created exclusively, never through a symlink,
    mode 0666 less the umask as ``open`` would give), is flushed to disk, then renamed over
    ``path`` (rename(2) is atomic within a file system and replaces a symlink, never follows it).

    Raises:
        OSError: the directory is not writable, the disk is full, ... (the temporary file is removed).
    """
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

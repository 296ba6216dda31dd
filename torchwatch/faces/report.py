"""The report: JSON (``torchwatch.report/1``, a contract: keys are added, never renamed) and text.

Both are functions of one :class:`~torchwatch.model.observation.Observation`: :func:`build` makes
the JSON, :func:`render_text` prints it (so a saved report prints the same).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from torchwatch import __version__
from torchwatch.faces.burst import burst_lines
from torchwatch.faces.compile import compile_lines, flop_json, rank_flop_lines
from torchwatch.faces.hang import hang_lines
from torchwatch.faces.trial import report_lines
from torchwatch.hook.trialspec import TrialState
from torchwatch.hook.wire import LOADER_SETTINGS, BurstResult, WireError
from torchwatch.model import files
from torchwatch.model.errors import TorchwatchError
from torchwatch.model.findings import Verdict
from torchwatch.model.observation import Observation
from torchwatch.model.readings import SourceStatus
from torchwatch.model.text import escape, json_safe, terminal_safe
from torchwatch.model.trials import verdict
from torchwatch.model.units import amp_words, fmt_bytes, fmt_ms, fmt_share, fmt_value

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
    obs: Observation,
    *,
    ended_by: str | None = None,
    exit_code: int | None = None,
    watched_s: float | None = None,
    injection: dict[str, Any] | None = None,
    created: datetime | None = None,
) -> dict[str, Any]:
    """The report as a JSON-ready dict.

    Args:
        obs: the Observation to report (the session's final one, or what the TUI shows).
        ended_by: what ended the watch, a key of :data:`ENDINGS` (``None``: not ended, or not known).
        exit_code: the training's exit status when the caller knows it better than ``obs``
            (``None``: the Observation's).
        watched_s: seconds watched (``None``: the Observation's ``elapsed_s``).
        injection: what ``attach`` did to get the hook inside (``injected``, ``method``,
            ``pause_ms``, ``reason``); ``None`` when it did not try (``run``, ``--no-inject``).
        created: when the report was made (``None``: now).

    Keys (contract): ``schema``, ``target`` {pid, cmdline, exit_code}, ``window`` {seconds},
    ``verdict`` {label, confidence, summary}, ``findings`` [...], ``sources`` {name: {status,
    reason?, hint?}}, ``features`` {name: number | null}. Added: ``not_applicable``,
    ``watched_seconds``, ``verdict_history``, ``feature_units`` and ``self`` (torchwatch's own
    CPU and memory, :class:`~torchwatch.model.observation.SelfUsage`), ``hook`` (what the
    in-process hook of the focus rank measured, :func:`hook_json`; ``null`` without a hook),
    ``ended_by``: what ended the watch (:data:`ENDINGS`; ``null`` when not known), ``injection``
    (``injection`` above; ``null`` when not tried), ``ranks`` (one object per rank of a job of
    several processes, :func:`ranks_json`; ``[]`` for one process) and ``straggler`` (the rank
    that paces the job, :func:`straggler_json`; ``null`` when none does), ``hang`` (the stall /
    hang recorder's last record, :meth:`~torchwatch.model.hang.HangView.to_json`; ``null`` when
    none was recorded), ``torchwatch_version``, ``created`` (ISO-8601 UTC, seconds:
    ``2026-11-23T17:55:03Z``) and ``host`` (the machine's name), so that ``torchwatch compare``
    can say what it compares; ``sampling`` (the samplers' cadence, :func:`sampling_json`).
    """
    verdict = obs.verdict or Verdict("undetermined", 0.0, "Collecting evidence.")
    code = exit_code if exit_code is not None else obs.target.exit_code
    when = (created or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return {
        "schema": SCHEMA,
        "torchwatch_version": __version__,
        "created": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": socket.gethostname(),
        "target": {"pid": obs.target.pid, "cmdline": list(obs.target.cmdline), "exit_code": code},
        "ended_by": ended_by,
        "window": {"seconds": float(obs.window_s)},
        "verdict": verdict.to_json(),
        "findings": [f.to_json() for f in obs.findings],
        "not_applicable": [n.to_json() for n in obs.not_applicable],
        "sources": {name: st.to_json() for name, st in obs.statuses},
        "features": {k: _num(v) for k, v in obs.features.items()},
        "feature_units": {k: spec.unit for k, spec in obs.catalogue.items()},
        "watched_seconds": round(obs.elapsed_s if watched_s is None else watched_s, 1),
        "verdict_history": [{"t": h.t, "label": h.label} for h in obs.history],
        "self": asdict(obs.own_usage),
        "hook": _clean(hook_json(obs)),
        "injection": None if injection is None else _clean(injection),
        "ranks": ranks_json(obs),
        "straggler": straggler_json(obs),
        "hang": None if obs.hang is None else _clean(obs.hang.to_json()),
        "sampling": sampling_json(obs),
        "trials": [trial_json(st) for st in obs.trials],
    }


def trial_json(state: TrialState) -> dict[str, Any]:
    """One live trial as the report's ``trials`` entry: the hook's state
    (:class:`~torchwatch.hook.trialspec.TrialState` as JSON) and ``verdict`` (``result``:
    faster, slower, no difference, undecided, refused or failed; ``text``; ``speedup``, ``lo``,
    ``hi``: the step-time ratio without / with the setting and its 95 % interval; ``pm``)."""
    return {**state.to_json(), "verdict": verdict(state)}


def sampling_json(obs: Observation) -> dict[str, Any]:
    """The samplers' cadence: ``mode`` (``fast`` or ``steady``), ``reason`` (why, one line),
    ``steady_s`` (seconds spent steady), ``returns_to_fast`` (times the cadence went back to fast
    after settling), ``changes`` (``[{t, mode, reason}]``: seconds since watching started, at most
    the last 50)."""
    out = asdict(obs.sampling)
    out["changes"] = list(out["changes"])
    return out


def sampling_line(sampling: Mapping[str, Any] | None) -> str | None:
    """``sampling: steady (why; N s steady, back to fast K times)`` for the text report."""
    if not sampling:
        return None
    back = sampling.get("returns_to_fast") or 0
    return (
        f"sampling: {sampling.get('mode')} ({sampling.get('reason')}; {sampling.get('steady_s', 0):.0f} s steady"
        + (f", back to fast {back} time{'s' if back != 1 else ''}" if back else "")
        + ")"
    )


def ranks_json(obs: Observation) -> list[dict[str, Any]]:
    """Every rank compared, ordered by rank: ``rank``, ``pid``, ``world_size``, ``steps`` (in the
    window), ``step_ms``, ``data_wait_ms``, ``compute_ms`` (forward and other host work before the
    all-reduce), ``collective_wait_ms`` (medians over the window's steps, ms), ``cpu_pct`` (% of one
    core), ``runqueue_share``, ``label``, ``summary``, ``top_finding`` (its first finding's rule),
    ``focus`` (the rank the verdict and panels are about); added: ``flops`` (the rank's FLOP rate
    and MFU, as ``hook.flops``; ``None`` without a burst's count)."""
    out = []
    for rank in sorted(obs.ranks):
        r = obs.ranks[rank].reading
        if r is None:
            continue
        row = asdict(r)
        for key in ("step_ms", "data_wait_ms", "compute_ms", "collective_wait_ms", "cpu_pct", "runqueue_share"):
            value = _num(row[key])
            row[key] = None if value is None else round(value, 3)
        row["focus"] = rank == obs.focus_rank
        row["flops"] = flop_json(obs.ranks[rank].flop_rate)
        out.append(row)
    return out


def straggler_json(obs: Observation) -> dict[str, Any] | None:
    """The straggler: ``rank``, ``pid``, ``victim_rank``, ``score`` (TraceML's: the victim's
    collective wait minus the straggler's, over the step time), ``severity``, ``part`` (``data``
    or ``compute``: where its extra time goes), ``extra_ms``, and its cause: ``label``,
    ``summary``, ``top_finding``; ``None`` when no rank paces the job."""
    return None if obs.straggler is None else asdict(obs.straggler)


def hook_json(obs: Observation) -> dict[str, Any] | None:
    """What the hook of the focus rank measured, as the report's ``hook`` object; ``None`` when the
    session reads no hook, or the hook is still starting and has published nothing.

    Keys: ``status``, ``reason``, ``pid``, ``torch``, ``steps``, ``first_step_after_s`` (seconds from
    the start of watching to the first optimizer step), ``steps_per_s``, ``step_time_ms`` (``p50``,
    ``p95``), ``data_wait_fraction``, ``dataloader`` (the most-used loader's settings),
    ``dataloaders``, ``usable_cpus``, ``shm_bytes``, ``amp``, ``cuda_initialized``, ``signal``,
    ``signal_owned``, ``burst`` (``state``, ``mode``, ``count``, ``last_refusal``), ``last_burst``
    (the burst summary, or ``{"id", "error", ...}``), ``errors``; added: ``device_memory``
    (``allocated_bytes``, ``reserved_bytes``, ``peak_bytes``, ``why``, and added: ``device``,
    ``capacity_bytes``, ``alloc_retries``, ``devices``, ``allocated_series``, ``reserved_series``),
    ``gpu_settings`` (TF32, cuDNN, compile, optimizer ``foreach``/``fused``, ``alloc_conf``, as
    the hook read them; ``None``: not read); ``compile`` (what torch.compile did:
    :class:`~torchwatch.hook.wire.CompileInfo`, ``None`` before it compiled) and ``flops``
    (FLOPs per step, achieved FLOP/s and MFU: :meth:`~torchwatch.model.peaks.FlopRate.to_json`
    and ``text``; ``None`` without a burst's count).
    """
    rank = obs.focus
    steps, burst = rank.steps, rank.burst
    if steps.status is None:
        return None
    if steps.pid is None:  # no reading of the hook: only its status
        return None if steps.status == "starting" else {"status": steps.status, "reason": steps.reason}
    return {
        "status": steps.status,
        "reason": steps.reason,
        "pid": steps.pid,
        "torch": steps.torch,
        "steps": steps.steps,
        "first_step_after_s": steps.first_step_after_s,
        "steps_per_s": steps.steps_per_s,
        "step_time_ms": {"p50": steps.p50_ms, "p95": steps.p95_ms},
        "data_wait_fraction": steps.data_wait if steps.data_wait_source == "hook" else None,
        "dataloader": steps.loader.to_json() if steps.loader else None,
        "dataloaders": [d.to_json() for d in steps.loaders],
        "usable_cpus": steps.usable_cpus,
        "shm_bytes": steps.shm_bytes,
        "amp": steps.amp.to_json() if steps.amp else None,
        "cuda_initialized": steps.cuda_initialized,
        "signal": steps.signal,
        "signal_owned": steps.signal_owned,
        "burst": {
            "state": burst.state,
            "mode": burst.mode,
            "count": burst.count,
            "last_refusal": burst.last_refusal.to_json() if burst.last_refusal else None,
        },
        "last_burst": burst.last.to_json() if burst.last else None,
        "errors": list(steps.errors),
        "device_memory": asdict(rank.device_memory),
        "gpu_settings": rank.gpu_settings.to_json() if rank.gpu_settings else None,
        "compile": rank.compile.to_json() if rank.compile else None,
        "flops": flop_json(rank.flop_rate),
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


def _pct(v: Any) -> str:
    return fmt_share(v) if isinstance(v, (int, float)) else "n/a"


def _ms(v: Any) -> str:
    return fmt_ms(v) if isinstance(v, (int, float)) else "n/a"


def hook_lines(hook: Mapping[str, Any] | None) -> list[str]:
    """The hook's measurements for people (the report's ``hook`` object): steps, step time, data
    wait, the DataLoader's settings, AMP, the last burst, the hook's errors."""
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
        settings = ", ".join(f"{name}={dl.get(name)}" for name in LOADER_SETTINGS)
        lines.append(f"  DataLoader: {settings}; usable CPUs {hook.get('usable_cpus')}")
    amp = hook.get("amp") or {}
    if amp:
        words = amp_words(
            bool(amp.get("autocast")), amp.get("dtype"), amp.get("device_type"), bool(amp.get("grad_scaler"))
        )
        lines.append(f"  AMP: {words}")
    lines += _gpu_lines(hook.get("device_memory"), hook.get("gpu_settings"))
    last = hook.get("last_burst")
    if isinstance(last, Mapping):
        try:
            lines += burst_lines(BurstResult.decode(dict(last), "last_burst"))
        except WireError as exc:
            lines.append(f"  last burst: unreadable ({exc})")
    flops = hook.get("flops")
    if isinstance(flops, Mapping) and flops.get("text"):
        lines.append(f"  {flops['text']}")
    lines += compile_lines(hook.get("compile"))
    for err in hook.get("errors") or []:
        lines.append(f"  hook error: {err}")
    return lines


def _gpu_lines(memory: Any, settings: Any) -> list[str]:
    """The hook's device memory (or why it is not known) and, in a training that uses CUDA, the
    GPU settings it read."""
    lines: list[str] = []
    if isinstance(memory, Mapping):
        if memory.get("allocated_bytes") is None:
            lines.append(f"  device memory: n/a: {memory.get('why') or 'not published'}")
        else:
            cap = memory.get("capacity_bytes")
            lines.append(
                f"  device memory (cuda:{memory.get('device')}): {fmt_bytes(memory.get('allocated_bytes'))} allocated"
                f" / {fmt_bytes(memory.get('reserved_bytes'))} reserved, peak {fmt_bytes(memory.get('peak_bytes'))}"
                + (f" of {fmt_bytes(cap)}" if cap else "")
                + (f", {memory['alloc_retries']} allocation retries" if memory.get("alloc_retries") else "")
            )
    # GPU settings only matter to a training on a GPU (the JSON report has them always)
    if isinstance(settings, Mapping) and isinstance(memory, Mapping) and memory.get("allocated_bytes") is not None:
        shown = [f"{k}={v}" for k, v in settings.items() if v is not None]
        lines.append("  GPU settings: " + (", ".join(shown) if shown else "none read"))
    return lines


def status_text(name: str, st: SourceStatus) -> str:
    """``name ok`` or ``name unavailable: reason``."""
    text = f"{name} {st.status.value}"
    return f"{text}: {st.reason}" if st.reason else text


def render_text(report: Mapping[str, Any]) -> str:
    """The report for a terminal: verdict, findings with evidence and fixes, sources. The target's
    text in it (its command line, frames, names) has every character that is not printable
    escaped (:mod:`torchwatch.model.text`): no escape sequence reaches the terminal, no line is forged."""
    target, verdict = report["target"], report["verdict"]
    units: Mapping[str, str] = report.get("feature_units") or {}
    cmd = " ".join(escape(str(a)) for a in target["cmdline"]) or "?"
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
        ev = ", ".join(f"{k}={fmt_value(v, units.get(k, ''))}" for k, v in f["evidence"].items())
        lines.append(f"      evidence: {ev}")
        for fx in f["fixes"]:
            lines.append(f"      fix: {fx['title']}: {fx['detail']}")
            if fx.get("trial"):
                lines.append(f"           try it live: torchwatch trial {target['pid']} {fx['trial']}")
    srcs = "; ".join(
        f"{name} {st['status']}" + (f": {st['reason']}" if st.get("reason") else "")
        for name, st in report["sources"].items()
    )
    lines += hang_lines(report.get("hang"))
    lines += rank_lines(report.get("ranks") or [], report.get("straggler"))
    lines += rank_flop_lines(report.get("ranks") or [])
    lines += hook_lines(report.get("hook"))
    trials = report.get("trials") or []
    if trials:
        lines.append("live trials (torchwatch trial):")
        lines += report_lines(trials)
    lines.append(f"sources: {srcs}")
    line = sampling_line(report.get("sampling"))
    if line:
        lines.append(line)
    return terminal_safe("\n".join(lines))


def rank_lines(ranks: list[Mapping[str, Any]], straggler: Mapping[str, Any] | None) -> list[str]:
    """The ranks table of the text report (nothing for one process) and the straggler line."""
    if not ranks:
        return []
    lines = ["ranks:   rank  step ms  data wait ms  compute ms  collective wait ms  CPU %  label"]
    for r in ranks:
        mark = "*" if straggler is not None and r["rank"] == straggler["rank"] else " "
        lines.append(
            f"        {mark}{r['rank']:>4}  {r['step_ms']:7.1f}  {r['data_wait_ms']:12.1f}  {r['compute_ms']:10.1f}"
            f"  {r['collective_wait_ms']:18.1f}  {fmt_value(r['cpu_pct'], '%'):>5}  {r['label']}"
        )
    lines.append(straggler_text(straggler))
    return lines


def straggler_text(straggler: Mapping[str, Any] | None) -> str:
    """One line naming the straggler and its cause, or saying that no rank paces the job."""
    if straggler is None:
        return "straggler: none (no rank makes the others wait 10 % of a step or more)"
    cause = straggler["top_finding"] or straggler["label"]
    return (
        f"straggler: rank {straggler['rank']} (PID {straggler['pid']}), score {straggler['score']:.2f} "
        f"({straggler['severity']}), {straggler['label']} ({cause}); rank {straggler['victim_rank']} waits for it"
    )


def dumps(report: Mapping[str, Any]) -> str:
    """JSON text of the report (indented, UTF-8; every character that is not printable, the target's
    text included, as a ``\\u`` escape: the same JSON, and nothing a terminal would act on)."""
    return json_safe(json.dumps(report, indent=2, ensure_ascii=False))


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
    # os.access says yes to root everywhere, /proc and read-only mounts included: the report is
    # written as a new file renamed into place, so make one (exclusively, never through a link),
    # in the directory reached as the report will be (files.open_dir: no other user can redirect it).
    try:
        fd = files.open_dir(folder)
        try:
            probe = f".torchwatch-check-{secrets.token_hex(4)}"
            os.close(
                os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
            )
            with contextlib.suppress(OSError):
                os.unlink(probe, dir_fd=fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise TorchwatchError(
            f"cannot write the JSON report to {path}: {folder}: {exc.strerror or exc}",
            files.UNSAFE_HINT.format(option="--json")
            if isinstance(exc, files.UnsafePath)
            else "give --json a path in an existing, writable directory",
        ) from None


def json_target(path: str, pid: int, kind: str = "report") -> Path:
    """Where ``--json PATH`` writes: PATH, or ``PATH/torchwatch-KIND-PID-TIME.json`` for a directory."""
    target = Path(path).expanduser()
    return target / default_name(pid, kind) if target.is_dir() else target


def write_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the whole new one, never a part.

    The text goes to a new file beside ``path`` (created exclusively, never through a symlink,
    in a directory no other user can change: :func:`torchwatch.model.files.write_atomic`), is
    flushed to disk, then renamed over ``path`` (rename(2) replaces a symlink, never follows it).

    Args:
        mode: the file's mode (``None``: 0666 less the umask, as ``open`` would give).

    Raises:
        OSError: the directory is not writable or another user could change it
            (:class:`~torchwatch.model.files.UnsafePath`), the disk is full, ... (the temporary
            file is removed).
    """
    files.write_atomic(path, text, mode)

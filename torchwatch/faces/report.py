"""The report: JSON (``torchwatch.report/1``, a contract: keys are added, never renamed) and text.

:func:`build` makes the typed :class:`~torchwatch.model.report.Report` of one
:class:`~torchwatch.model.observation.Observation` (Observation to Report, no JSON between);
:func:`dumps` writes its JSON and :func:`render_text` prints it. A saved report decoded by
:meth:`Report.from_json <torchwatch.model.report.Report.from_json>` prints the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import fields
from datetime import datetime, timezone
from pathlib import Path

from torchwatch import __version__
from torchwatch.faces.burst import burst_lines
from torchwatch.faces.compile import compile_lines, flops_report, rank_flop_lines
from torchwatch.faces.hang import hang_lines
from torchwatch.faces.memory import memory_lines, memory_report
from torchwatch.faces.trial import report_lines
from torchwatch.model import files
from torchwatch.model.errors import TorchwatchError
from torchwatch.model.findings import Verdict
from torchwatch.model.observation import DeviceMemory, Observation, SamplingView, Straggler
from torchwatch.model.readings import SourceStatus
from torchwatch.model.report import (
    SCHEMA,
    BurstCounts,
    HangRecord,
    HookReport,
    InjectionReport,
    RankRow,
    Report,
    ReportFinding,
    ReportTarget,
    ReportWindow,
    StepTimes,
    json_rounded,
)
from torchwatch.model.text import escape, json_safe, terminal_safe
from torchwatch.model.units import amp_words, fmt_bytes, fmt_ms, fmt_share, fmt_value
from torchwatch.wire import LOADER_SETTINGS, GpuSettings

__all__ = [
    "ENDINGS",
    "SCHEMA",
    "build",
    "check_json_path",
    "default_name",
    "dumps",
    "hook_lines",
    "hook_section",
    "json_target",
    "rank_lines",
    "rank_rows",
    "render_text",
    "sampling_line",
    "status_text",
    "straggler_text",
    "write_atomic",
]

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
    return json_rounded(v)


def build(
    obs: Observation,
    *,
    ended_by: str | None = None,
    exit_code: int | None = None,
    watched_s: float | None = None,
    injection: InjectionReport | None = None,
    created: datetime | None = None,
) -> Report:
    """The report of ``obs``, its numbers as they are written (floats rounded to 4 digits, those
    that are not finite ``None``; :meth:`Report.to_json <torchwatch.model.report.Report.to_json>`
    gives the JSON, :func:`dumps` its text).

    Args:
        obs: the Observation to report (the session's final one, or what the TUI shows).
        ended_by: what ended the watch, a key of :data:`ENDINGS` (``None``: not ended, or not known).
        exit_code: the training's exit status when the caller knows it better than ``obs``
            (``None``: the Observation's).
        watched_s: seconds watched, s (``None``: the Observation's ``elapsed_s``).
        injection: what ``attach`` did to get the hook inside (``None`` when it did not try:
            ``run``, ``--no-inject``).
        created: when the report was made (``None``: now).

    Keys (contract): ``schema``, ``target`` {pid, cmdline, exit_code}, ``window`` {seconds},
    ``verdict`` {label, confidence, summary}, ``findings`` [...], ``sources`` {name: {status,
    reason?, hint?}}, ``features`` {name: number | null}. Added: ``not_applicable``,
    ``watched_seconds``, ``verdict_history``, ``feature_units`` and ``self`` (torchwatch's own
    CPU and memory, :class:`~torchwatch.model.observation.SelfUsage`), ``hook`` (what the
    in-process hook of the focus rank measured, :func:`hook_section`; ``null`` without a hook),
    ``ended_by``: what ended the watch (:data:`ENDINGS`; ``null`` when not known), ``injection``
    (``injection`` above; ``null`` when not tried), ``ranks`` (one object per rank of a job of
    several processes, :func:`rank_rows`; ``[]`` for one process) and ``straggler`` (the rank
    that paces the job, :class:`~torchwatch.model.observation.Straggler`; ``null`` when none
    does), ``hang`` (the stall / hang recorder's last record,
    :class:`~torchwatch.model.report.HangRecord`; ``null`` when none was recorded),
    ``torchwatch_version``, ``created`` (ISO-8601 UTC, seconds: ``2026-11-23T17:55:03Z``) and
    ``host`` (the machine's name), so that ``torchwatch compare`` can say what it compares;
    ``sampling`` (the samplers' cadence, :class:`~torchwatch.model.observation.SamplingView`);
    ``trials`` (each live trial's state and its ``verdict``); ``memory`` (the limit, the forecasts
    and the out-of-memory records, :class:`~torchwatch.model.report.MemoryReport`; no key when
    nothing was read); ``progress`` (the focus rank's epoch, its time left and the loss,
    :class:`~torchwatch.model.progress.ProgressView`; no key without them). The types, and how a key is added:
    :mod:`torchwatch.model.report`.
    """
    verdict = obs.verdict or Verdict("undetermined", 0.0, "Collecting evidence.")
    code = exit_code if exit_code is not None else obs.target.exit_code
    when = (created or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return Report(
        schema=SCHEMA,
        torchwatch_version=__version__,
        created=when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        host=socket.gethostname(),
        target=ReportTarget(
            pid=obs.target.pid, cmdline=tuple(obs.target.cmdline), exit_code=code, ns_pid=obs.target.ns_pid
        ),
        ended_by=ended_by,
        window=ReportWindow(seconds=float(obs.window_s)),
        verdict=Verdict(verdict.label, round(verdict.confidence, 2), verdict.summary),
        findings=tuple(ReportFinding.of(f) for f in obs.findings),
        not_applicable=tuple(obs.not_applicable),
        sources=dict(obs.statuses),
        features={k: _num(v) for k, v in obs.features.items()},
        feature_units={k: spec.unit for k, spec in obs.catalogue.items()},
        watched_seconds=round(obs.elapsed_s if watched_s is None else watched_s, 1),
        verdict_history=tuple(obs.history),
        own_usage=obs.own_usage,
        hook=json_rounded(hook_section(obs)),
        injection=json_rounded(injection),
        ranks=rank_rows(obs),
        straggler=obs.straggler,
        hang=None if obs.hang is None else json_rounded(HangRecord.of(obs.hang)),
        sampling=obs.sampling,
        trials=tuple(obs.trials),
        memory=memory_report(obs.memory.view, obs.t - obs.elapsed_s),
        progress=json_rounded(obs.focus.progress),
    )


def sampling_line(sampling: SamplingView | None) -> str | None:
    """``sampling: steady (why; N s steady, back to fast K times)`` for the text report."""
    if sampling is None:
        return None
    back = sampling.returns_to_fast or 0
    return (
        f"sampling: {sampling.mode} ({sampling.reason}; {sampling.steady_s:.0f} s steady"
        + (f", back to fast {back} time{'s' if back != 1 else ''}" if back else "")
        + ")"
    )


def _round3(v: float | None) -> float | None:
    value = _num(v)
    return None if value is None else round(value, 3)


def rank_rows(obs: Observation) -> tuple[RankRow, ...]:
    """Every rank compared, ordered by rank (the report's ``ranks``): ``rank``, ``pid``,
    ``world_size``, ``steps`` (in the window), ``step_ms``, ``data_wait_ms``, ``compute_ms``
    (forward and other host work before the all-reduce), ``collective_wait_ms`` (medians over
    the window's steps, ms, 3 digits), ``cpu_pct`` (% of one core), ``runqueue_share``,
    ``label``, ``summary``, ``top_finding`` (its first finding's rule), ``focus`` (the rank the
    verdict and panels are about); added: ``flops`` (the rank's FLOP rate and MFU, as
    ``hook.flops``; ``None`` without a burst's count). Ranks without a reading are left out."""
    out = []
    for rank in sorted(obs.ranks):
        view = obs.ranks[rank]
        r = view.reading
        if r is None:
            continue
        out.append(
            RankRow(
                rank=r.rank,
                pid=r.pid,
                world_size=r.world_size,
                steps=r.steps,
                step_ms=_round3(r.step_ms),
                data_wait_ms=_round3(r.data_wait_ms),
                compute_ms=_round3(r.compute_ms),
                collective_wait_ms=_round3(r.collective_wait_ms),
                cpu_pct=_round3(r.cpu_pct),
                runqueue_share=_round3(r.runqueue_share),
                label=r.label,
                summary=r.summary,
                top_finding=r.top_finding,
                focus=rank == obs.focus_rank,
                flops=flops_report(view.flop_rate),
            )
        )
    return tuple(out)


def hook_section(obs: Observation) -> HookReport | None:
    """What the hook of the focus rank measured, as the report's ``hook``; ``None`` when the
    session reads no hook, or the hook is still starting and has published nothing; only the
    status and its reason when it has published no reading (:class:`~torchwatch.model.report.HookReport`
    says what each field holds, in which unit). Its floats are not rounded yet (:func:`build` does).
    """
    rank = obs.focus
    steps, burst = rank.steps, rank.burst
    if steps.status is None:
        return None
    if steps.pid is None:  # no reading of the hook: only its status
        return None if steps.status == "starting" else HookReport(status=steps.status, reason=steps.reason)
    return HookReport(
        status=steps.status,
        reason=steps.reason,
        pid=steps.pid,
        torch=steps.torch,
        steps=steps.steps,
        first_step_after_s=steps.first_step_after_s,
        steps_per_s=steps.steps_per_s,
        step_time_ms=StepTimes(p50=steps.p50_ms, p95=steps.p95_ms),
        data_wait_fraction=steps.data_wait if steps.data_wait_source == "hook" else None,
        dataloader=steps.loader,
        dataloaders=tuple(steps.loaders),
        usable_cpus=steps.usable_cpus,
        shm_bytes=steps.shm_bytes,
        amp=steps.amp,
        cuda_initialized=steps.cuda_initialized,
        signal=steps.signal,
        signal_owned=steps.signal_owned,
        burst=BurstCounts(state=burst.state, mode=burst.mode, count=burst.count, last_refusal=burst.last_refusal),
        last_burst=burst.last,
        errors=tuple(steps.errors),
        device_memory=rank.device_memory,
        gpu_settings=rank.gpu_settings,
        compile=rank.compile,
        flops=flops_report(rank.flop_rate),
    )


def _pct(v: float | None) -> str:
    return "n/a" if v is None else fmt_share(v)


def _ms(v: float | None) -> str:
    return "n/a" if v is None else fmt_ms(v)


def hook_lines(hook: HookReport | None) -> list[str]:
    """The hook's measurements for people (the report's ``hook``): steps, step time, data wait,
    the DataLoader's settings, AMP, device memory, the last burst, FLOPs, torch.compile, the
    hook's errors; only its status when it measured nothing."""
    if hook is None:
        return []
    if hook.status != "ok" and not hook.measured:
        return [f"hook: {hook.status}" + (f": {hook.reason}" if hook.reason else "")]
    st = hook.step_time_ms or StepTimes()
    sps = hook.steps_per_s
    lines = [
        "training loop (measured in the process):",
        f"  {hook.steps or 0} steps, "
        + ("n/a steps/s" if sps is None else f"{sps:.2f} steps/s")
        + f", step time p50 {_ms(st.p50)} / p95 {_ms(st.p95)}"
        + f", data wait {_pct(hook.data_wait_fraction)}",
    ]
    dl = hook.dataloader
    if dl is not None:
        settings = ", ".join(f"{name}={getattr(dl, name)}" for name in LOADER_SETTINGS)
        lines.append(f"  DataLoader: {settings}; usable CPUs {hook.usable_cpus}")
    amp = hook.amp
    if amp is not None:
        lines.append(f"  AMP: {amp_words(amp.autocast, amp.dtype, amp.device_type, amp.grad_scaler)}")
    lines += _gpu_lines(hook.device_memory, hook.gpu_settings)
    lines += burst_lines(hook.last_burst)
    if hook.flops is not None and hook.flops.text:
        lines.append(f"  {hook.flops.text}")
    lines += compile_lines(hook.compile)
    for err in hook.errors:
        lines.append(f"  hook error: {err}")
    return lines


def _gpu_lines(memory: DeviceMemory | None, settings: GpuSettings | None) -> list[str]:
    """The hook's device memory (or why it is not known) and, in a training that uses CUDA, the
    GPU settings it read."""
    lines: list[str] = []
    if memory is not None:
        if memory.allocated_bytes is None:
            lines.append(f"  device memory: n/a: {memory.why or 'not published'}")
        else:
            cap = memory.capacity_bytes
            lines.append(
                f"  device memory (cuda:{memory.device}): {fmt_bytes(memory.allocated_bytes)} allocated"
                f" / {fmt_bytes(memory.reserved_bytes)} reserved, peak {fmt_bytes(memory.peak_bytes)}"
                + (f" of {fmt_bytes(cap)}" if cap else "")
                + (f", {memory.alloc_retries} allocation retries" if memory.alloc_retries else "")
            )
    # GPU settings only matter to a training on a GPU (the JSON report has them always)
    if settings is not None and memory is not None and memory.allocated_bytes is not None:
        shown = [f"{f.name}={v}" for f in fields(settings) if (v := getattr(settings, f.name)) is not None]
        lines.append("  GPU settings: " + (", ".join(shown) if shown else "none read"))
    return lines


def status_text(name: str, st: SourceStatus) -> str:
    """``name ok`` or ``name unavailable: reason``."""
    text = f"{name} {st.status.value}"
    return f"{text}: {st.reason}" if st.reason else text


def render_text(report: Report) -> str:
    """The report for a terminal: verdict, findings with evidence and fixes, the hang, the ranks,
    the hook's measurements, live trials, sources and the cadence. The target's text in it (its
    command line, frames, names) has every character that is not printable escaped
    (:mod:`torchwatch.model.text`): no escape sequence reaches the terminal, no line is forged."""
    target, verdict = report.target, report.verdict
    units = report.feature_units
    cmd = " ".join(escape(a) for a in target.cmdline) or "?"
    exit_part = "" if target.exit_code is None else f", exit {target.exit_code}"
    if target.ns_pid is not None:  # a container's process: both sides, torchwatch's PID first
        exit_part = f", PID {target.ns_pid} in its own PID namespace{exit_part}"
    ended = None if report.ended_by is None else ENDINGS.get(report.ended_by)
    ended_part = f"; {ended}" if ended else ""
    watched = "?" if report.watched_seconds is None else f"{report.watched_seconds:.0f}"
    lines = [
        f"torchwatch report: {cmd} (PID {target.pid}{exit_part}), watched {watched} s{ended_part}",
        f"verdict: {verdict.label} (confidence {verdict.confidence:.2f})",
        f"  {verdict.summary}",
    ]
    if report.progress is not None:
        lines.append(f"progress: {report.progress.line()}")
    if report.findings:
        lines.append("findings:")
    for f in report.findings:
        lines.append(f"  [{f.severity}] {f.rule} -> {f.label}: {f.summary}")
        ev = ", ".join(f"{k}={fmt_value(v, units.get(k, ''))}" for k, v in f.evidence.items())
        lines.append(f"      evidence: {ev}")
        for fx in f.fixes:
            lines.append(f"      fix: {fx.title}: {fx.detail}")
            if fx.predicted is not None:
                lines.append(f"           steps/s {fx.predicted.text()}")
            if fx.trial:
                lines.append(f"           try it live: torchwatch trial {target.pid} {fx.trial}")
    srcs = "; ".join(status_text(name, st) for name, st in report.sources.items())
    lines += hang_lines(report.hang)
    lines += rank_lines(report.ranks, report.straggler)
    lines += rank_flop_lines(report.ranks)
    lines += hook_lines(report.hook)
    lines += memory_lines(report.memory)
    if report.trials:
        lines.append("live trials (torchwatch trial):")
        lines += report_lines(report.trials)
    lines.append(f"sources: {srcs}")
    line = sampling_line(report.sampling)
    if line:
        lines.append(line)
    return terminal_safe("\n".join(lines))


def _column(value: float | None, width: int) -> str:
    return "n/a".rjust(width) if value is None else f"{value:{width}.1f}"


def rank_lines(ranks: Sequence[RankRow], straggler: Straggler | None) -> list[str]:
    """The ranks table of the text report (nothing for one process), ms and % of one core, and
    the straggler line."""
    if not ranks:
        return []
    lines = ["ranks:   rank  step ms  data wait ms  compute ms  collective wait ms  CPU %  label"]
    for r in ranks:
        mark = "*" if straggler is not None and r.rank == straggler.rank else " "
        lines.append(
            f"        {mark}{r.rank:>4}  {_column(r.step_ms, 7)}  {_column(r.data_wait_ms, 12)}"
            f"  {_column(r.compute_ms, 10)}  {_column(r.collective_wait_ms, 18)}  {fmt_value(r.cpu_pct, '%'):>5}"
            f"  {r.label}"
        )
    lines.append(straggler_text(straggler))
    return lines


def straggler_text(straggler: Straggler | None) -> str:
    """One line naming the straggler and its cause, or saying that no rank paces the job."""
    if straggler is None:
        return "straggler: none (no rank makes the others wait 10 % of a step or more)"
    cause = straggler.top_finding or straggler.label
    return (
        f"straggler: rank {straggler.rank} (PID {straggler.pid}), score {straggler.score:.2f} "
        f"({straggler.severity}), {straggler.label} ({cause}); rank {straggler.victim_rank} waits for it"
    )


def dumps(report: Report) -> str:
    """JSON text of the report (indented, UTF-8; every character that is not printable, the target's
    text included, as a ``\\u`` escape: the same JSON, and nothing a terminal would act on)."""
    return json_safe(json.dumps(report.to_json(), indent=2, ensure_ascii=False))


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

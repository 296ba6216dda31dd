"""``torchwatch compare A.json B.json``: did the change help? Two JSON reports side by side.

A pure function of two reports (:func:`compare`, on the typed
:class:`~torchwatch.model.report.Report`) and two renderings of its result, text for a terminal
and Markdown for a pull-request comment. :func:`load_report` reads a report file as torchwatch
wrote it, decodes and checks it once (:meth:`Report.from_json
<torchwatch.model.report.Report.from_json>`), and refuses anything else with one line (exit 2).

What it says:

- throughput: steps/s of A and B (the hook's, over each report's last window), the speedup
  (B / A, ×) and the change in %; the median step time beside it;
- both verdicts with their summaries;
- the settings: the command line, the DataLoader's (num_workers, batch_size, pin_memory, ...),
  usable CPUs, AMP, the GPU settings the hook read, torch's version, the ranks; those that differ
  first, then those the two runs share (so ``num_workers=0 in both`` is said too);
- the features that moved most: shares and percentages by how many points they moved, other
  values by their relative change; counts of samples and the settings above are left out.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, fields
from pathlib import Path

from torchwatch.faces.trial import report_lines
from torchwatch.model.errors import UsageError
from torchwatch.model.report import SCHEMA, Report, ReportError
from torchwatch.model.text import escape, terminal_safe
from torchwatch.model.units import MIB, amp_words, fmt_value
from torchwatch.wire import LOADER_SETTINGS

__all__ = [
    "MAX_REPORT_BYTES",
    "Comparison",
    "compare",
    "compare_files",
    "load_report",
    "render_markdown",
    "render_text",
    "settings",
]

MAX_REPORT_BYTES = 64 << 20  # a report is a few hundred KiB at most; anything bigger is not one
MAX_TRIALS = 16  # trials listed per report (the report keeps at most 16)
TOP_FEATURES = 8
MIN_MOVE = 0.05  # below 5 points (shares) or 5 % (other values) a feature did not move
# Below these magnitudes a relative change means nothing: 10 KiB/s of reads going to 0 is not a move.
_FLOORS = {"bytes/s": float(MIB), "bytes": float(MIB)}
# Features that are settings (shown as such) or sample counts (not a property of the training).
# Throughput and step time are said above the moves.
_NOT_MOVES = (
    "stack_samples",
    "thread_samples",
    "dl_",
    "amp_enabled",
    "usable_cpus",
    "shm_bytes",
    "burst_age_s",
    "hook_steps_per_s",
    "step_time_p",
)
_FIX = "give two JSON reports written by torchwatch run/attach --json PATH"
_FIX_VERSION = f"compare reports of one major version: this torchwatch writes and reads {SCHEMA}"


def load_report(path: str) -> Report:
    """Read, decode and check a torchwatch JSON report.

    The file must be a regular file (a FIFO or device is refused before it is read) of at most
    :data:`MAX_REPORT_BYTES` bytes, hold a JSON object with ``schema`` ``torchwatch.report/1``
    (or a newer minor version of it: keys it does not know are skipped) and every key of
    :class:`~torchwatch.model.report.Report` with its type.

    Raises:
        UsageError: missing, unreadable, too large, not JSON, not a torchwatch report, another
            major version (the message names both), or a key missing or of the wrong type (the
            message names it and the version) (exit 2).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}", _FIX) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path} is not a regular file", _FIX)
        if st.st_size > MAX_REPORT_BYTES:
            raise UsageError(f"{path} is {st.st_size} bytes: too large for a torchwatch report", _FIX)
        raw = f.read(MAX_REPORT_BYTES + 1)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f" (line {exc.lineno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise UsageError(f"{path} is not JSON{where}", _FIX) from None
    except RecursionError:
        raise UsageError(f"{path} is JSON nested too deeply for a torchwatch report", _FIX) from None
    except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise UsageError(f"{path} holds a number too long for a torchwatch report", _FIX) from None
    try:
        return Report.from_json(data)
    except ReportError as exc:
        raise UsageError(f"{path} is {exc}", _FIX_VERSION if exc.other_major else _FIX) from None


@dataclass(frozen=True)
class Move:
    """One feature in both reports: name, unit, A's and B's value, and how far it moved (0..1+)."""

    name: str
    unit: str
    a: float
    b: float
    score: float


@dataclass(frozen=True)
class Comparison:
    """A against B.

    Attributes:
        names: what A and B are (file name, command, host, time).
        steps_per_s: A's and B's steps/s (``None``: not measured, no hook).
        speedup: B / A steps/s (``None`` when either is missing or A's is 0).
        step_ms: A's and B's median step time, ms.
        verdicts: ``(label, confidence, summary)`` of A and of B.
        differ: ``(setting, A's value, B's value)`` of the settings that differ, in order.
        same: ``(setting, value)`` of those the two share.
        moves: the features that moved most, largest first.
        trials: the live trials of A and of B, one line each.
    """

    names: tuple[str, str]
    steps_per_s: tuple[float | None, float | None]
    speedup: float | None
    step_ms: tuple[float | None, float | None]
    verdicts: tuple[tuple[str, float, str], tuple[str, float, str]]
    differ: tuple[tuple[str, str, str], ...]
    same: tuple[tuple[str, str], ...]
    moves: tuple[Move, ...]
    trials: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())

    @property
    def change_pct(self) -> float | None:
        """The steps/s change, % (+ is faster)."""
        return None if self.speedup is None else 100 * (self.speedup - 1)


def _steps_per_s(report: Report) -> float | None:
    value = None if report.hook is None else report.hook.steps_per_s
    return value if value is not None else report.features.get("hook_steps_per_s")


def _step_ms(report: Report) -> float | None:
    times = None if report.hook is None else report.hook.step_time_ms
    value = None if times is None else times.p50
    return value if value is not None else report.features.get("step_time_p50_ms")


def _text(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def settings(report: Report) -> dict[str, str]:
    """The settings a report carries, ``{name: value as text}`` in a stable order: the command,
    the DataLoader's, usable CPUs, AMP, the GPU settings, torch, the ranks, the window (s)."""
    hook = report.hook
    out: dict[str, str] = {"command": " ".join(escape(a) for a in report.target.cmdline)}
    if hook is not None:
        if hook.dataloader is not None:
            out.update({name: _text(getattr(hook.dataloader, name)) for name in LOADER_SETTINGS})
        if hook.measured:
            out["usable CPUs"] = _text(hook.usable_cpus)
        if hook.amp is not None:
            amp = hook.amp
            out["AMP"] = amp_words(amp.autocast, amp.dtype, amp.device_type, amp.grad_scaler)
        if hook.gpu_settings is not None:
            out.update({f.name: _text(getattr(hook.gpu_settings, f.name)) for f in fields(hook.gpu_settings)})
        if hook.torch:
            out["torch"] = hook.torch
    out["ranks"] = str(len(report.ranks)) if report.ranks else "1"
    out["window s"] = _text(report.window.seconds)
    return out


def _moves(a: Report, b: Report) -> list[Move]:
    units = {**a.feature_units, **b.feature_units}
    out = []
    for name, x in a.features.items():
        y = b.features.get(name)
        unit = units.get(name, "")
        if x is None or y is None or unit in ("count", "flag") or name.startswith(_NOT_MOVES):
            continue
        x, y = float(x), float(y)
        if unit == "share":
            score = abs(y - x)
        elif unit == "%":
            score = abs(y - x) / 100
        else:
            biggest = max(abs(x), abs(y))
            score = abs(y - x) / biggest if biggest >= _FLOORS.get(unit, 0.0) and biggest else 0.0
        if score >= MIN_MOVE:
            out.append(Move(name, unit, x, y, score))
    return sorted(out, key=lambda m: (-m.score, m.name))[:TOP_FEATURES]


def _name(path: str, report: Report) -> str:
    cmd = " ".join(escape(a) for a in report.target.cmdline) or "?"
    parts = [cmd, *(v for v in (report.host, report.created) if v)]
    return f"{path} ({', '.join(parts)})"


def compare(a: Report, b: Report, names: tuple[str, str] = ("A", "B")) -> Comparison:
    """Compare report ``a`` (before) with ``b`` (after), as :func:`load_report` returns them.

    Args:
        names: what to call them (their file paths).
    """
    sa, sb = _steps_per_s(a), _steps_per_s(b)
    speedup = sb / sa if sa and sb is not None else None
    seta, setb = settings(a), settings(b)
    differ = tuple((k, seta.get(k, "n/a"), setb.get(k, "n/a")) for k in {**seta, **setb} if seta.get(k) != setb.get(k))
    same = tuple((k, v) for k, v in seta.items() if setb.get(k) == v)

    def verdict(r: Report) -> tuple[str, float, str]:
        return r.verdict.label, float(r.verdict.confidence), r.verdict.summary

    return Comparison(
        names=(_name(names[0], a), _name(names[1], b)),
        steps_per_s=(sa, sb),
        speedup=speedup,
        step_ms=(_step_ms(a), _step_ms(b)),
        verdicts=(verdict(a), verdict(b)),
        differ=differ,
        same=same,
        moves=tuple(_moves(a, b)),
        trials=(tuple(report_lines(a.trials[:MAX_TRIALS])), tuple(report_lines(b.trials[:MAX_TRIALS]))),
    )


def _throughput(c: Comparison) -> str:
    sa, sb = c.steps_per_s
    text = f"{fmt_value(sa, 'steps/s')} -> {fmt_value(sb, 'steps/s')}"
    if c.speedup is None:
        return text + " (no speedup: steps/s not measured in both; the hook measures them)"
    word = "faster" if c.speedup >= 1 else "slower"
    return text + f": {c.speedup:.2f}x {word} ({c.change_pct:+.0f}%)"


def _delta(m: Move) -> str:
    if m.unit == "share":
        return f"{100 * (m.b - m.a):+.0f} pts"
    if m.unit == "%":
        return f"{m.b - m.a:+.0f} pts"
    return f"{100 * (m.b - m.a) / abs(m.a):+.0f}%" if m.a else "new"


def render_text(c: Comparison) -> str:
    """The comparison for a terminal."""
    ma, mb = c.step_ms
    lines = [
        f"A: {c.names[0]}",
        f"B: {c.names[1]}",
        f"steps/s: {_throughput(c)}",
        f"step time p50: {fmt_value(ma, 'ms')} -> {fmt_value(mb, 'ms')}",
    ]
    for side, (label, conf, summary) in zip("AB", c.verdicts, strict=True):
        lines.append(f"verdict {side}: {label} ({conf:.2f}) {summary}")
    lines.append("settings that differ:" if c.differ else "settings that differ: none")
    lines += [f"  {k}: {va} -> {vb}" for k, va, vb in c.differ]
    if c.same:
        lines.append("settings the same: " + ", ".join(f"{k}={v}" for k, v in c.same if k != "command"))
    lines.append("features that moved most:" if c.moves else "features that moved most: none moved 5 % or more")
    width = max((len(m.name) for m in c.moves), default=0)
    lines += [
        f"  {m.name:<{width}}  {fmt_value(m.a, m.unit):>10} -> {fmt_value(m.b, m.unit):<10} ({_delta(m)})"
        for m in c.moves
    ]
    for side, lines_ in zip("AB", c.trials, strict=True):
        if lines_:
            lines.append(f"live trials in {side}:")
            lines += list(lines_)
    return "\n".join(lines)


def _md(text: str) -> str:
    """A table cell: pipes escaped, on one line."""
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(c: Comparison) -> str:
    """The comparison as GitHub-flavoured Markdown, for a pull-request comment."""
    ma, mb = c.step_ms
    speed = "n/a" if c.speedup is None else f"**{c.speedup:.2f}×** ({c.change_pct:+.0f}%)"
    (la, ca, sa), (lb, cb, sb) = c.verdicts
    lines = [
        "### torchwatch: A → B",
        "",
        "| | A | B | change |",
        "|---|---|---|---|",
        f"| steps/s | {fmt_value(c.steps_per_s[0], 'steps/s')} | {fmt_value(c.steps_per_s[1], 'steps/s')} | {speed} |",
        f"| step time p50 | {fmt_value(ma, 'ms')} | {fmt_value(mb, 'ms')} | |",
        f"| verdict | {_md(la)} ({ca:.2f}) | {_md(lb)} ({cb:.2f}) | |",
        "",
        f"- **A**: {_md(sa)}",
        f"- **B**: {_md(sb)}",
        "",
        "**Settings that differ**" + ("" if c.differ else ": none"),
    ]
    if c.differ:
        lines += ["", "| setting | A | B |", "|---|---|---|"]
        lines += [f"| {_md(k)} | `{_md(va)}` | `{_md(vb)}` |" for k, va, vb in c.differ]
    if c.same:
        lines += ["", "Same in both: " + ", ".join(f"`{_md(k)}={_md(v)}`" for k, v in c.same if k != "command")]
    lines += ["", "**Features that moved most**" + ("" if c.moves else ": none moved 5 % or more")]
    if c.moves:
        lines += ["", "| feature | A | B | change |", "|---|---|---|---|"]
        lines += [
            f"| `{m.name}` | {fmt_value(m.a, m.unit)} | {fmt_value(m.b, m.unit)} | {_delta(m)} |" for m in c.moves
        ]
    for side, lines_ in zip("AB", c.trials, strict=True):
        if lines_:
            lines += ["", f"**Live trials in {side}**", ""] + [f"- {_md(t.strip())}" for t in lines_]
    lines += ["", f"<sub>A: {_md(c.names[0])}<br>B: {_md(c.names[1])}</sub>"]
    return "\n".join(lines)


def compare_files(path_a: str, path_b: str, markdown: bool = False) -> str:
    """``torchwatch compare``'s output for two report files.

    Raises:
        UsageError: either file is not a torchwatch report (see :func:`load_report`).
    """
    c = compare(load_report(path_a), load_report(path_b), (Path(path_a).name, Path(path_b).name))
    # a report may come from another user: nothing in it may act on the terminal
    return terminal_safe(render_markdown(c) if markdown else render_text(c))

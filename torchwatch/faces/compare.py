"""``torchwatch compare A.json B.json``: did the change help? Two JSON reports side by side.

A pure function of two reports (:func:`compare`) and two renderings of its result, text for a
terminal and Markdown for a pull-request comment. :func:`load_report` reads a report file as
torchwatch wrote it and refuses anything else with one line (exit 2).

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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchwatch.faces.report import SCHEMA
from torchwatch.faces.trial import report_lines
from torchwatch.hook.wire import LOADER_SETTINGS
from torchwatch.model.errors import UsageError
from torchwatch.model.text import escape, terminal_safe
from torchwatch.model.units import MIB, amp_words, fmt_value

__all__ = [
    "MAX_REPORT_BYTES",
    "REPORT_FIELDS",
    "Comparison",
    "compare",
    "load_report",
    "render_markdown",
    "render_text",
]

MAX_REPORT_BYTES = 64 << 20  # a report is a few hundred KiB at most; anything bigger is not one
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


def load_report(path: str) -> dict[str, Any]:
    """Read a torchwatch JSON report.

    The file must be a regular file (a FIFO or device is refused before it is read) of at most
    :data:`MAX_REPORT_BYTES`, hold a JSON object with ``schema`` ``torchwatch.report/1`` and the
    keys :func:`compare` reads with their types.

    Raises:
        UsageError: missing, unreadable, too large, not JSON, not a torchwatch report, or a field
            compare reads is missing or of the wrong type (:data:`REPORT_FIELDS`; the message
            names the field) (exit 2).
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
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise UsageError(f"{path} is not a torchwatch report (schema {found!r}, expected {SCHEMA!r})", _FIX)
    problem = _field_problem(data)
    if problem:
        raise UsageError(f"{path} is a malformed torchwatch report: {problem}", _FIX)
    return data


# Every field compare reads, with its JSON type: (dotted name, type, required). A field that is
# not required may be missing or null; a field under a missing or null object is not looked at.
REPORT_FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("target", "object", True),
    ("target.cmdline", "list of strings", False),
    ("verdict", "object", True),
    ("verdict.label", "string", True),
    ("verdict.confidence", "number", True),
    ("verdict.summary", "string", False),
    ("features", "object", True),
    ("feature_units", "object of strings", False),
    ("findings", "list", True),
    ("hook", "object", False),
    ("hook.steps_per_s", "number", False),
    ("hook.step_time_ms", "object", False),
    ("hook.step_time_ms.p50", "number", False),
    ("hook.dataloader", "object", False),
    ("hook.amp", "object", False),
    ("hook.amp.autocast", "boolean", False),
    ("hook.amp.dtype", "string", False),
    ("hook.amp.device_type", "string", False),
    ("hook.amp.grad_scaler", "boolean", False),
    ("hook.gpu_settings", "object", False),
    ("ranks", "list", False),
    ("window", "object", False),
    ("window.seconds", "number", False),
    ("host", "string", False),
    ("created", "string", False),
)


def _json_kind(value: Any) -> str:
    """``value``'s JSON type, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def _is(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "list":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "list of strings":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    assert kind == "object of strings", kind
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _field_problem(data: Mapping[str, Any]) -> str:
    """The first field of :data:`REPORT_FIELDS` that is missing or of the wrong type, in words
    (``'verdict.label' is a number, expected a string``); ``""`` when all are right."""
    for name, kind, required in REPORT_FIELDS:
        *parents, key = name.split(".")
        holder: Any = data
        for part in parents:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if not isinstance(holder, dict):
            continue  # its object is optional and absent (a wrong type is said at the object)
        value = holder.get(key)
        if value is None:
            if required:
                return f"{name!r} is missing, expected {_article(kind)}"
            continue
        if not _is(value, kind):
            return f"{name!r} is {_json_kind(value)}, expected {_article(kind)}"
    return ""


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


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


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _hook(report: Mapping[str, Any]) -> Mapping[str, Any]:
    hook = report.get("hook")
    return hook if isinstance(hook, Mapping) else {}


def _steps_per_s(report: Mapping[str, Any]) -> float | None:
    value = _number(_hook(report).get("steps_per_s"))
    return value if value is not None else _number(report["features"].get("hook_steps_per_s"))


def _step_ms(report: Mapping[str, Any]) -> float | None:
    times = _hook(report).get("step_time_ms")
    value = _number(times.get("p50")) if isinstance(times, Mapping) else None
    return value if value is not None else _number(report["features"].get("step_time_p50_ms"))


def _text(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def settings(report: Mapping[str, Any]) -> dict[str, str]:
    """The settings a report carries, ``{name: value as text}`` in a stable order: the command,
    the DataLoader's, usable CPUs, AMP, the GPU settings, torch, the ranks, the window."""
    hook = _hook(report)
    out: dict[str, str] = {"command": " ".join(escape(str(a)) for a in report["target"].get("cmdline") or [])}
    loader = hook.get("dataloader")
    if isinstance(loader, Mapping):
        out.update({name: _text(loader.get(name)) for name in LOADER_SETTINGS})
    if "usable_cpus" in hook:
        out["usable CPUs"] = _text(hook.get("usable_cpus"))
    amp = hook.get("amp")
    if isinstance(amp, Mapping):
        out["AMP"] = amp_words(
            bool(amp.get("autocast")), amp.get("dtype"), amp.get("device_type"), bool(amp.get("grad_scaler"))
        )
    gpu = hook.get("gpu_settings")
    if isinstance(gpu, Mapping):
        out.update({str(k): _text(v) for k, v in gpu.items()})
    if hook.get("torch"):
        out["torch"] = _text(hook.get("torch"))
    ranks = report.get("ranks")
    out["ranks"] = str(len(ranks)) if isinstance(ranks, list) and ranks else "1"
    window = report.get("window")
    if isinstance(window, Mapping):
        out["window s"] = _text(window.get("seconds"))
    return out


def _moves(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Move]:
    units: Mapping[str, str] = {**(a.get("feature_units") or {}), **(b.get("feature_units") or {})}
    out = []
    for name, va in a["features"].items():
        x, y = _number(va), _number(b["features"].get(name))
        unit = str(units.get(name, ""))
        if x is None or y is None or unit in ("count", "flag") or name.startswith(_NOT_MOVES):
            continue
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


def _name(path: str, report: Mapping[str, Any]) -> str:
    cmd = " ".join(escape(str(a)) for a in report["target"].get("cmdline") or []) or "?"
    parts = [cmd, *(str(report[k]) for k in ("host", "created") if report.get(k))]
    return f"{path} ({', '.join(parts)})"


def compare(a: Mapping[str, Any], b: Mapping[str, Any], names: tuple[str, str] = ("A", "B")) -> Comparison:
    """Compare report ``a`` (before) with ``b`` (after); both as :func:`load_report` returns them.

    Args:
        names: what to call them (their file paths).
    """
    sa, sb = _steps_per_s(a), _steps_per_s(b)
    speedup = sb / sa if sa and sb is not None else None
    seta, setb = settings(a), settings(b)
    differ = tuple((k, seta.get(k, "n/a"), setb.get(k, "n/a")) for k in {**seta, **setb} if seta.get(k) != setb.get(k))
    same = tuple((k, v) for k, v in seta.items() if setb.get(k) == v)

    def verdict(r: Mapping[str, Any]) -> tuple[str, float, str]:
        v = r["verdict"]
        return str(v["label"]), float(v["confidence"]), str(v.get("summary") or "")

    return Comparison(
        names=(_name(names[0], a), _name(names[1], b)),
        steps_per_s=(sa, sb),
        speedup=speedup,
        step_ms=(_step_ms(a), _step_ms(b)),
        verdicts=(verdict(a), verdict(b)),
        differ=differ,
        same=same,
        moves=tuple(_moves(a, b)),
        trials=(tuple(report_lines(_trials(a))), tuple(report_lines(_trials(b)))),
    )


def _trials(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The report's live trials (a report from before trials has none)."""
    trials = report.get("trials")
    return [t for t in trials if isinstance(t, Mapping)][:16] if isinstance(trials, list) else []


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

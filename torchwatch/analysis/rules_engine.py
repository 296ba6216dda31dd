"""Load declarative rules from TOML files: one rule per file.

A rule file::

    id = "workers-cpu-saturated"
    label = "dataloader-bound"          # cpu-bound | gpu-bound | io-bound | dataloader-bound | undetermined
    severity = "critical"               # info | warning | critical (info never decides the label)
    summary = "The loop waits {data_wait_queue_share:.0%} of its time on workers busy on CPU."
    when = "data_wait_queue_share * workers_running_fraction >= 0.2"
    measure = "data_wait_queue_share * workers_running_fraction"   # loop-time share explained, 0..1
    for = 2.0                           # seconds the condition must hold (and be false to release)
    evidence = ["data_wait_share", "workers_running_fraction", "worker_count"]
    source = "XProf input-pipeline analyzer: input share >= 20 % is highly input-bound"
    scope = "loop"                      # optional: loop (default) | machine (other processes
                                        # hold the CPUs: listed first) | demand (the training's
                                        # own demand beyond its CPUs: after its label's others)
                                        # | health (the training's health, not its speed: never
                                        # the label, its confidence or its summary; label
                                        # "undetermined", severity info or warning)

    [[fixes]]
    title = "Use more DataLoader workers"
    detail = "num_workers={worker_count:.0f} on {usable_cpus:.0f} usable CPUs: try {suggested_workers}."
    when = "worker_count < suggested_workers"      # optional

Expressions use :mod:`torchwatch.analysis.expr` (no ``eval``); templates are ``str.format`` fields
naming features or :data:`TEMPLATE_VALUES`, with a number format spec (``{x:.0%}``) or the
spec ``bytes`` (``{rss_bytes:bytes}`` prints ``3.2 GiB``) or ``duration`` (``{mem_forecast_s:duration}`` prints
``3 min 10 s``), no attribute or index access.
"""

from __future__ import annotations

import re
import string
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from torchwatch.analysis import expr
from torchwatch.analysis.features import CATALOGUE
from torchwatch.model.errors import RuleError, UsageError
from torchwatch.model.labels import LABELS
from torchwatch.model.units import human_bytes, human_duration

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

SEVERITIES = ("info", "warning", "critical")
TEMPLATE_VALUES = {
    "suggested_workers": "DataLoader workers to suggest: usable CPUs minus one for the loop",
    "io_workers": "DataLoader workers the CPUs carry when workers mostly wait on storage (cpus.io_bound_workers)",
    "num_workers": "DataLoader num_workers as set (hook), else the workers alive (psutil)",
    "loader_settings": "text: the DataLoader's settings as set, e.g. 'num_workers=0, batch_size=32, pin_memory=False'",
    "amp_state": "text: 'bf16 autocast on', 'no autocast seen' or 'unknown (no hook)'",
    "shm_needed_bytes": "bytes in flight through /dev/shm: num_workers x prefetch_factor x batch bytes",
    "memory_pressure_state": "text: allocator peak and reserved / device capacity, NVML share",
    "optimizer_state": "text: the optimizer as built, e.g. 'AdamW(foreach=None, fused=None)' (None: left to torch)",
    "alloc_conf_state": "text: \"PYTORCH_CUDA_ALLOC_CONF='...'\" or 'PYTORCH_CUDA_ALLOC_CONF is not set'",
    "thread_env": "text: 'OMP_NUM_THREADS=8' or 'OMP_NUM_THREADS unset', as the training's hook read it",
    "cpu_neighbours": "text: the largest CPU users outside the training, e.g. 'PID 812 python (alice) 1.0 cores'",
    "suggested_threads": "intra-op threads per rank that fit the CPUs left: (usable - foreign - workers) / ranks, >= 1",
    "compile_recompile_words": "text: the last torch.compile recompile in words, e.g. 'shape of x changed 32→17 "
    "(dim 0) at train.py:88 (`out = model(x)`)'",
    "compile_mark_dynamic": "text: the call that marks that dimension dynamic, e.g. 'torch._dynamo.mark_dynamic(x, 0)'",
    "compile_break_words": "text: the last graph break in words, with its file:line and source line",
    "compile_break_hint": "text: torch's own hint for that graph break ('none' when it gives none)",
    "compile_limit_words": "text: the last recompile-limit hit in words, with the last recompile's reason",
    "mem_limit_source": "text: where the memory limit comes from, e.g. 'cgroup v2 memory.max of /sys/fs/cgroup/x'",
    "mem_grower": "text: the process whose private memory grows fastest, e.g. 'worker 123: private +3.0 MiB/s, "
    "shared -2.9 MiB/s (copy-on-write ...)'",
    "producer_frame": "text: the hottest frame of user code of the producer threads, e.g. 'augment (train.py:42)'",
    "stall_state": "text: why the model is not learning: its optimizer steps changed no parameter (and why),"
    " or the loss has not moved in 2 minutes",
    "producer_processes": "text: the tree's busiest processes beside the training, e.g. 'PID 812 python 0.9 cores'",
}
_KEYS = {"id", "label", "severity", "summary", "when", "measure", "for", "evidence", "source", "fixes", "scope"}
SCOPES = ("loop", "machine", "demand", "health")
"""Where a finding's cause lies, which sets its place among the findings (``diagnosis.finding_order``)."""
_FIX_KEYS = {"title", "detail", "when", "trial"}
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
_MAX_FILE_BYTES = 64 * 1024


@dataclass(frozen=True)
class FixTemplate:
    """A fix: its title and detail templates, and an optional condition."""

    title: str
    detail: str
    when: expr.Expression | None
    trial: str | None = None  # "SETTING=VALUE" template: the fix can be tried live (torchwatch trial)


@dataclass(frozen=True)
class Rule:
    """One loaded rule (see the module docstring for the file format)."""

    id: str
    label: str
    severity: str
    summary: str
    when: expr.Expression
    measure: expr.Expression | None
    hold_s: float
    evidence: tuple[str, ...]
    source: str
    fixes: tuple[FixTemplate, ...]
    path: str
    scope: str = "loop"

    @property
    def inputs(self) -> frozenset[str]:
        """Features the condition reads."""
        return self.when.names


def _line_of(text: str, key: str, nth: int = 0) -> int | None:
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=", re.MULTILINE)
    matches = list(pattern.finditer(text))
    if len(matches) <= nth:
        return None
    return text.count("\n", 0, matches[nth].start()) + 1


_FORMATTER = string.Formatter()


def _check_template(template: Any, what: str) -> str:
    if not isinstance(template, str) or not template.strip():
        raise ValueError(f"{what} must be a non-empty string")
    try:
        fields = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise ValueError(f"{what}: bad template: {exc}") from None
    for _, field, spec, conv in fields:
        if field is None:
            continue
        if field not in CATALOGUE and field not in TEMPLATE_VALUES:
            raise ValueError(f"{what}: unknown field {{{field}}}")
        if conv:
            raise ValueError(f"{what}: conversion !{conv} not allowed")
        if spec and "{" in spec:
            raise ValueError(f"{what}: nested fields not allowed")
        if spec in ("bytes", "duration"):
            continue
        try:
            format(0.5, spec or "")
        except ValueError:
            raise ValueError(f"{what}: bad format spec {spec!r} for a number") from None
    return template


def fill(template: str, values: Mapping[str, Any]) -> str:
    """Fill a checked template; a missing value prints as ``n/a``, spec ``bytes`` as :func:`human_bytes`."""
    out = []
    for literal, field, spec, _ in _FORMATTER.parse(template):
        out.append(literal)
        if field is None:
            continue
        value = values.get(field)
        if value is None:
            out.append("n/a")
        elif spec == "bytes" and isinstance(value, (int, float)):
            out.append(human_bytes(value))
        elif spec == "duration" and isinstance(value, (int, float)):
            out.append(human_duration(value))
        else:
            out.append(format(value, spec or ""))
    return "".join(out)


def parse_rule(text: str, path: str) -> Rule:
    """Parse one rule file's text.

    Raises:
        RuleError: naming ``path``, the line (when known) and the problem.
    """
    if len(text.encode("utf-8", "replace")) > _MAX_FILE_BYTES:
        raise RuleError(path, None, f"file larger than {_MAX_FILE_BYTES} bytes")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise RuleError(path, int(m.group(1)) if m else None, f"invalid TOML: {exc}") from None
    except (RecursionError, ValueError) as exc:
        raise RuleError(path, None, f"invalid TOML: {exc}") from None

    def fail(key: str, problem: str, nth: int = 0) -> RuleError:
        return RuleError(path, _line_of(text, key, nth), problem)

    unknown = set(data) - _KEYS
    if unknown:
        key = sorted(unknown)[0]
        raise fail(key, f"unknown key {key!r} (allowed: {', '.join(sorted(_KEYS))})")
    for key in ("id", "label", "severity", "summary", "when", "source"):
        if key not in data:
            raise RuleError(path, None, f"missing key {key!r}")
        if not isinstance(data[key], str):
            raise fail(key, f"{key!r} must be a string")
    if not _ID_RE.fullmatch(data["id"]):
        raise fail("id", "id must be lowercase letters, digits and dashes")
    if data["label"] not in LABELS:
        raise fail("label", f"label must be one of {', '.join(LABELS)}")
    if data["severity"] not in SEVERITIES:
        raise fail("severity", f"severity must be one of {', '.join(SEVERITIES)}")

    def expression(key: str, source: Any, nth: int = 0) -> expr.Expression:
        if not isinstance(source, str):
            raise fail(key, f"{key!r} must be a string expression", nth)
        try:
            return expr.parse(source, CATALOGUE.keys() | TEMPLATE_VALUES.keys())
        except expr.ExprError as exc:
            raise fail(key, f"{key}: {exc}", nth) from None

    when = expression("when", data["when"])
    measure = expression("measure", data["measure"]) if "measure" in data else None
    hold = data.get("for", 0.0)
    if isinstance(hold, bool) or not isinstance(hold, (int, float)) or not 0 <= hold <= 3600:
        raise fail("for", "'for' must be a number of seconds from 0 to 3600")
    evidence = data.get("evidence", [])
    if not isinstance(evidence, list) or not all(isinstance(e, str) for e in evidence):
        raise fail("evidence", "'evidence' must be a list of feature names")
    for name in evidence:
        if name not in CATALOGUE:
            raise fail("evidence", f"evidence names unknown feature {name!r}")
    scope = data.get("scope", "loop")
    if scope not in SCOPES:
        raise fail("scope", f"scope must be one of {', '.join(SCOPES)}")
    if scope == "health" and (data["label"] != "undetermined" or data["severity"] == "critical"):
        raise fail("scope", 'a health rule has label "undetermined" and severity info or warning')
    try:
        summary = _check_template(data["summary"], "summary")
    except ValueError as exc:
        raise fail("summary", str(exc)) from None
    fixes_raw = data.get("fixes", [])
    if not isinstance(fixes_raw, list):
        raise fail("fixes", "'fixes' must be an array of tables ([[fixes]])")
    fixes = []
    for i, fx in enumerate(fixes_raw):
        if not isinstance(fx, dict):
            raise RuleError(path, None, f"fix #{i + 1} must be a table")
        bad = set(fx) - _FIX_KEYS
        if bad:
            raise fail(sorted(bad)[0], f"fix #{i + 1}: unknown key {sorted(bad)[0]!r}")
        templates = []
        for key in ("title", "detail"):
            try:
                templates.append(_check_template(fx.get(key), f"fix #{i + 1} {key}"))
            except ValueError as exc:
                nth = sum(1 for f in fixes_raw[:i] if isinstance(f, dict) and key in f)
                raise fail(key, str(exc), nth) from None
        title, detail = templates
        cond = (
            expression("when", fx["when"], 1 + sum(1 for f in fixes_raw[:i] if "when" in f)) if "when" in fx else None
        )
        trial = None
        if "trial" in fx:
            try:
                trial = _check_trial(fx["trial"], f"fix #{i + 1} trial")
            except ValueError as exc:
                nth = sum(1 for f in fixes_raw[:i] if isinstance(f, dict) and "trial" in f)
                raise fail("trial", str(exc), nth) from None
        fixes.append(FixTemplate(title, detail, cond, trial))
    return Rule(
        id=data["id"],
        label=data["label"],
        severity=data["severity"],
        summary=summary,
        when=when,
        measure=measure,
        hold_s=float(hold),
        evidence=tuple(evidence),
        source=data["source"],
        fixes=tuple(fixes),
        path=path,
        scope=scope,
    )


def _check_trial(value: object, where: str) -> str:
    """A fix's ``trial``: ``SETTING={template}`` naming a setting a live trial may change
    (:data:`torchwatch.wire.SETTINGS`, not one it refuses).

    Raises:
        ValueError: not a string, no ``=``, an unknown or refused setting, a bad template.
    """
    from torchwatch.wire import find_setting

    text = _check_template(value, where)
    name, sep, rest = text.partition("=")
    setting = find_setting(name)
    if not sep or not rest:
        raise ValueError(f"{where} must be SETTING=VALUE, e.g. threads={{suggested_threads:.0f}}")
    if setting is None or setting.refused is not None:
        raise ValueError(f"{where}: {name!r} is not a setting a live trial changes")
    return text


def load_file(path: Path) -> Rule:
    """Load one rule file: a regular file of at most 64 KiB (``_MAX_FILE_BYTES``: a rule is a
    few hundred bytes) of UTF-8 TOML.

    The file is opened without following a symbolic link and without blocking
    (``O_NOFOLLOW | O_NONBLOCK``: a FIFO opens at once), checked on its descriptor (a regular
    file, within the cap) and read up to the cap plus one byte, so ``rules check`` on a
    directory another user filled can neither hang on a FIFO nor read ``/dev/zero`` forever.

    Raises:
        RuleError: a symbolic link, not a regular file, larger than the cap, unreadable, not
            UTF-8, or not a valid rule (exit 2).
    """
    # imported here: this function is the only part of the module that opens files
    import errno
    import os
    import stat

    shown = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RuleError(shown, None, "is a symbolic link: rule files are read only as regular files") from None
        raise RuleError(shown, None, f"cannot read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RuleError(shown, None, "not a regular file")
        if st.st_size > _MAX_FILE_BYTES:
            raise RuleError(shown, None, f"file larger than {_MAX_FILE_BYTES} bytes")
        chunks: list[bytes] = []
        size = 0
        while size <= _MAX_FILE_BYTES:
            chunk = os.read(fd, _MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > _MAX_FILE_BYTES:  # it grew after the check
            raise RuleError(shown, None, f"file larger than {_MAX_FILE_BYTES} bytes")
        text = b"".join(chunks).decode("utf-8")
    except OSError as exc:
        raise RuleError(shown, None, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise RuleError(shown, None, "not UTF-8 text") from None
    finally:
        os.close(fd)
    return parse_rule(text, shown)


def load_dir(directory: Path) -> list[Rule]:
    """Every ``*.toml`` rule of ``directory``, sorted by file name.

    Raises:
        UsageError: the directory is missing.
        RuleError: a file is malformed, or two rules share an id.
    """
    if not directory.is_dir():
        raise UsageError(
            f"rules directory {directory}: no such directory", "give --rules (or rules check) an existing directory"
        )
    rules = [load_file(p) for p in sorted(directory.glob("*.toml"))]
    _check_unique(rules)
    return rules


def _check_unique(rules: Iterable[Rule]) -> None:
    seen: dict[str, str] = {}
    for r in rules:
        if r.id in seen:
            raise RuleError(
                r.path, _line_of(Path(r.path).read_text(), "id"), f"rule id {r.id!r} is also used by {seen[r.id]}"
            )
        seen[r.id] = r.path


def builtin_dir() -> Path:
    """The shipped ``rules/`` directory (installed as the package ``torchwatch.rules``)."""
    try:
        return Path(str(resources.files("torchwatch.rules")))
    except ModuleNotFoundError:  # running from a source tree that was not installed: <repo>/rules
        return Path(__file__).resolve().parents[2] / "rules"


def load_rules(extra_dirs: Iterable[Path] = ()) -> list[Rule]:
    """Built-in rules, then each extra directory's; a rule with the same id replaces the earlier one."""
    by_id = {r.id: r for r in load_dir(builtin_dir())}
    for d in extra_dirs:
        for r in load_dir(Path(d)):
            by_id[r.id] = r
    return list(by_id.values())

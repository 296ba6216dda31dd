"""The saved report as types: :class:`Report`, the schema of ``torchwatch.report/1``, decoded once.

The JSON report (``torchwatch run/attach --json``, ``e`` in the TUI) is a contract: keys are
added, never renamed (``tests/unit/report_schema.json`` states it). This module is its one typed
home. The writer (:func:`torchwatch.faces.report.build`) makes a :class:`Report` from an
Observation and :meth:`Report.to_json` writes it; every reader of a saved report (the text
report, ``torchwatch compare``, the hang lines) takes the :class:`Report` that
:meth:`Report.from_json` decoded and checked once, and reads attributes, never string keys.

Versions: ``schema`` is ``torchwatch.report/MAJOR`` or ``torchwatch.report/MAJOR.MINOR``; this
torchwatch writes ``torchwatch.report/1`` (major 1, minor 0). Within a major version keys are only
added, so a reader skips the keys it does not know (a newer minor's, or one added without a
bump, as every key added to version 1 was); a report of another major version is refused with one
line naming both versions (:class:`ReportError`).

How a section is read and written: a section is a frozen dataclass whose fields are in the order
the JSON has them, annotated with JSON types: ``bool``, ``int``, ``float`` (an integer is a number
too, kept as written), ``str``, ``X | None`` (may be null), ``tuple[X, ...]`` (a list),
``Mapping[str, X]`` (an object), a ``Literal`` or an ``Enum`` (one of its values), or another
such dataclass (an object). :func:`decode_section` reads the annotations: a field without a
default is a required key, one with a default may be missing; a wrong type is a
:class:`ReportError` that names the key (``'verdict.label' is a number, expected a string``). A
dataclass with a ``to_json`` method writes itself (the hook's wire types,
:class:`~torchwatch.model.findings.Fix`, :class:`~torchwatch.model.readings.SourceStatus`); the
others write their fields in order (``metadata={"json": "self"}`` names a key that is not a
field name; :data:`OMIT_NONE` leaves out a ``None``). Three wire types of the hook have a shape
of their own and decode through their own decoders: a burst's summary
(:class:`~torchwatch.wire.BurstResult`), torch.compile's record
(:class:`~torchwatch.wire.CompileInfo`) and a live trial's state
(:class:`~torchwatch.wire.TrialState`, written with its ``verdict``).

Adding a section (the memory forecast and the OOM record, say):

1. a frozen, slotted dataclass here, fields in the JSON's order and typed as above, e.g.
   ``MemoryReport(forecast: MemoryForecast | None = None, oom: OomRecord | None = None)``;
2. a field at the end of :class:`Report`, optional so that the reports written before it still
   load: ``memory: MemoryReport | None = None`` (written as ``null`` when ``None``, as ``hang``
   is; ``field(default=None, metadata=OMIT_NONE)`` writes no key instead, so reports without
   one keep today's bytes). No decoder or encoder to write: both follow from the annotations;
3. fill it in :func:`torchwatch.faces.report.build` from the Observation (round its floats with
   :func:`json_rounded`), and describe it in ``tests/unit/report_schema.json``;
4. faces read ``report.memory``; a test decodes a report with the section and one without.
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass, replace
from enum import Enum
from typing import Any, Literal, TypeVar, Union, cast

from torchwatch.model.findings import Finding, Fix, NotApplicable, Verdict
from torchwatch.model.hang import HangProcess, HangView
from torchwatch.model.observation import DeviceMemory, SamplingView, SelfUsage, Straggler, VerdictChange
from torchwatch.model.peaks import FlopRate
from torchwatch.model.progress import ProgressView
from torchwatch.model.readings import SourceStatus
from torchwatch.model.text import escape
from torchwatch.model.trials import verdict
from torchwatch.wire import AmpInfo, BurstResult, CompileInfo, GpuSettings, LoaderInfo, OomRecord, Refusal, TrialState

__all__ = [
    "MAJOR",
    "MINOR",
    "OMIT_NONE",
    "SCHEMA",
    "BurstCounts",
    "DumpCount",
    "FlopsReport",
    "FoundRank",
    "HangRecord",
    "HookReport",
    "InjectionReport",
    "JobReport",
    "MemoryForecastReport",
    "MemoryRecordReport",
    "MemoryReport",
    "ProcMemoryReport",
    "RankInjection",
    "RankRow",
    "Report",
    "ReportError",
    "ReportFinding",
    "ReportTarget",
    "ReportWindow",
    "StepTimes",
    "decode_section",
    "json_rounded",
    "schema_version",
    "to_json_value",
]

MAJOR = 1
MINOR = 0
SCHEMA = f"torchwatch.report/{MAJOR}"  # minor 0 is written without its ".0" (the contract's spelling)
OMIT_NONE: Mapping[str, bool] = types.MappingProxyType({"omit_none": True})
"""A field's metadata: write no key when the value is ``None`` (``injection.ranks``)."""

_VERSION = re.compile(r"^torchwatch\.report/([0-9]{1,6})(?:\.([0-9]{1,6}))?$")
_S = TypeVar("_S")
_T = TypeVar("_T")


class ReportError(ValueError):
    """A JSON value that is not a report this torchwatch reads. The message is one line that
    completes ``FILE is ...``: ``not a torchwatch report (schema 'x', expected
    'torchwatch.report/1')``, ``a torchwatch.report/2 report, and this torchwatch reads
    torchwatch.report/1 (another major version)``, or ``a malformed torchwatch.report/1 report:
    'verdict.label' is a number, expected a string`` (what is wrong, where, and the version).

    Attributes:
        schema: the report's ``schema`` when it names a report version, else ``None``.
        other_major: the report is of another major version (it may be well formed).
    """

    def __init__(self, message: str, schema: str | None = None, other_major: bool = False) -> None:
        super().__init__(message)
        self.schema = schema
        self.other_major = other_major


class _Bad(Exception):
    """One problem found while decoding (``'path' is ..., expected ...``), before the version is added."""


def schema_version(schema: object) -> tuple[int, int] | None:
    """``(major, minor)`` of a ``schema`` value (``torchwatch.report/1`` is ``(1, 0)``), ``None``
    when it names no torchwatch report version."""
    m = _VERSION.match(schema) if isinstance(schema, str) else None
    return None if m is None else (int(m.group(1)), int(m.group(2) or 0))


# -- the sections -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class ReportTarget:
    """``target``: the process torchwatch was given: its PID, command line and shell-style exit
    status (``None``: still running, or not known), and its PID inside its own PID namespace
    (``ns_pid``: a container's; not written when it shares torchwatch's, where ``pid`` is the same).
    ``pid`` and every other PID of the report are torchwatch's (the host's, on the node)."""

    pid: int
    cmdline: tuple[str, ...]
    exit_code: int | None
    ns_pid: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportWindow:
    """``window``: the seconds of readings the verdict is computed over, s."""

    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportFinding:
    """One of ``findings``: a rule that fired, as :meth:`~torchwatch.model.findings.Finding.to_json`
    writes it (evidence values rounded to 4 digits, ``None`` when not measured)."""

    rule: str
    label: str
    severity: str
    summary: str = ""
    evidence: Mapping[str, float | None]
    fixes: tuple[Fix, ...]
    source: str = ""

    @classmethod
    def of(cls, finding: Finding) -> ReportFinding:
        """The report's form of a finding of the Observation."""
        return cls(
            rule=finding.rule,
            label=finding.label,
            severity=finding.severity,
            summary=finding.summary,
            evidence={k: _round4(v) for k, v in finding.evidence.items()},
            fixes=finding.fixes,
            source=finding.source,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTimes:
    """``hook.step_time_ms``: step time percentiles over the window, ms (``None``: too few steps)."""

    p50: float | None = None
    p95: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BurstCounts:
    """``hook.burst``: the burst machinery: ``state`` (idle, armed, running, summarizing),
    ``mode`` (steps, window, ``""``), bursts asked so far, and the last request it refused."""

    state: str | None = None
    mode: str | None = None
    count: int | None = None
    last_refusal: Refusal | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FlopsReport:
    """``hook.flops`` and ``ranks[].flops``: the FLOP rate and MFU
    (:meth:`~torchwatch.model.peaks.FlopRate.to_json`) and ``text``, the line the text report shows.

    Attributes:
        flops_per_step: FLOPs of one step. step_ms: the step time they are divided by, ms.
        achieved_flops_per_s / peak_flops_per_s: FLOP/s. mfu: achieved / peak, 0..1.
    """

    flops_per_step: float
    step_ms: float
    step_source: str
    achieved_flops_per_s: float
    peak_flops_per_s: float | None
    peak_math: str | None
    peak_device: str | None
    peak_source: str | None
    mfu: float | None
    dtype: str | None
    device: str | None
    device_name: str | None
    why: str | None
    text: str | None = None

    @classmethod
    def of(cls, rate: FlopRate, text: str | None) -> FlopsReport:
        """The report's form of a :class:`~torchwatch.model.peaks.FlopRate` (as its ``to_json``)."""
        p = rate.peak
        return cls(
            flops_per_step=rate.flops_per_step,
            step_ms=round(rate.step_ms, 4),
            step_source=rate.step_source,
            achieved_flops_per_s=round(rate.achieved_flops_per_s, 1),
            peak_flops_per_s=None if p is None else p.flops_per_s,
            peak_math=None if p is None else p.math,
            peak_device=None if p is None else p.device,
            peak_source=None if p is None else ("measured on this CPU" if rate.measured_peak else p.source),
            mfu=None if rate.mfu is None else round(rate.mfu, 4),
            dtype=rate.dtype,
            device=rate.device,
            device_name=rate.device_name,
            why=rate.why,
            text=text,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class HookReport:
    """``hook``: what the in-process hook of the focus rank measured; only ``status`` and
    ``reason`` when it published no reading (:attr:`measured` false).

    Attributes:
        status: the hook source's status (ok, unavailable, gone, starting); reason: why not ok.
        pid / torch: the process it runs in, its torch version. steps: optimizer steps so far.
        first_step_after_s: seconds from the start of watching to the first step, s.
        steps_per_s: over the window. step_time_ms: p50 / p95, ms.
        data_wait_fraction: share of the loop blocked in DataLoader ``next()``, 0..1 (``None``
            unless the hook measured it). dataloader: the most-used loader; dataloaders: all.
        usable_cpus: CPUs the training may use. shm_bytes: ``/dev/shm``'s size, bytes.
        signal / signal_owned: the burst signal and whether the hook holds its handler.
        burst / last_burst: the burst machinery and the last burst's summary.
        device_memory: the caching allocator, bytes (or why not known). gpu_settings: TF32,
            cuDNN, compile, optimizer, allocator. compile: what torch.compile did. flops: the
            FLOP rate and MFU (``None`` without a burst's count).
    """

    status: str
    reason: str | None = None
    pid: int | None = None
    torch: str | None = None
    steps: int | None = None
    first_step_after_s: float | None = None
    steps_per_s: float | None = None
    step_time_ms: StepTimes | None = None
    data_wait_fraction: float | None = None
    dataloader: LoaderInfo | None = None
    dataloaders: tuple[LoaderInfo, ...] = ()
    usable_cpus: float | None = None
    shm_bytes: int | None = None
    amp: AmpInfo | None = None
    cuda_initialized: bool | None = None
    signal: int | None = None
    signal_owned: bool | None = None
    burst: BurstCounts | None = None
    last_burst: BurstResult | None = None
    errors: tuple[str, ...] = ()
    device_memory: DeviceMemory | None = None
    gpu_settings: GpuSettings | None = None
    compile: CompileInfo | None = None
    flops: FlopsReport | None = None

    @property
    def measured(self) -> bool:
        """The hook published readings (not only its status)."""
        return self.pid is not None or self.steps is not None

    def to_json(self) -> dict[str, object]:
        """The JSON object: every key, or ``{status, reason}`` alone when nothing was measured."""
        if not self.measured:
            return {"status": self.status, "reason": self.reason}
        return _fields_json(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankInjection:
    """One of ``injection.ranks``: what ``attach`` did in one rank of a job."""

    pid: int
    injected: bool
    hooked: bool
    method: str | None
    pause_ms: float | None
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class FoundRank:
    """One of ``injection.job.ranks_found``: a rank ``attach`` found, and how."""

    pid: int
    rank: int | None
    how: str


@dataclass(frozen=True, slots=True, kw_only=True)
class JobReport:
    """``injection.job``: the job ``attach`` found: the PID named, its launcher (torchrun,
    mp.spawn) and the ranks found."""

    named_pid: int
    launcher_pid: int | None
    launcher: str | None
    ranks_found: tuple[FoundRank, ...]
    note: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class InjectionReport:
    """``injection``: what ``attach`` did to get the hook inside.

    Attributes:
        injected: torchwatch put the hook in now. hooked: a hook publishes (or will).
        method: ``ptrace`` or ``remote_exec`` (``None``: none used).
        pause_ms: how long the training's main thread was held, ms (the longest of a job's).
        reason: the line said about it. ranks / job: for a job of several ranks only.
    """

    injected: bool
    hooked: bool
    method: str | None
    pause_ms: float | None
    reason: str
    ranks: tuple[RankInjection, ...] | None = field(default=None, metadata=OMIT_NONE)
    job: JobReport | None = field(default=None, metadata=OMIT_NONE)

    @classmethod
    def from_json(cls, value: object) -> InjectionReport:
        """Decode ``attach``'s JSON form (``Injected.report``, ``job_report``).

        Raises:
            ReportError: a key is missing or of the wrong type.
        """
        return decode_section(cls, value, "injection")


@dataclass(frozen=True, slots=True, kw_only=True)
class RankRow:
    """One of ``ranks`` (a job of several processes): the rank's step over the window, medians
    of its steps, ms (rounded to 3 digits; ``None`` when not finite), its CPU (% of one core),
    its main thread's run-queue share (0..1), its own verdict, and whether it is the focus."""

    rank: int
    pid: int
    world_size: int | None
    steps: int
    step_ms: float | None
    data_wait_ms: float | None
    compute_ms: float | None
    collective_wait_ms: float | None
    cpu_pct: float | None
    runqueue_share: float | None
    label: str
    summary: str
    top_finding: str | None
    focus: bool
    flops: FlopsReport | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DumpCount:
    """One of ``hang.dumps``: a process dumped, with its threads counted (the frames are in the
    hang file), and the dump's wall time, s."""

    pid: int
    role: str
    rank: int | None
    threads: int
    error: str | None
    dump_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class HangRecord:
    """``hang``: the stall / hang recorder's last record (:class:`~torchwatch.model.hang.HangView`
    less the dumped frames). Times are seconds since watching started."""

    state: str
    pid: int
    rank: int | None
    threshold_s: float
    threshold_from: str
    last_step_s: float
    fired_s: float
    detected_after_s: float
    stalled_s: float
    resumed_s: float | None
    processes: tuple[HangProcess, ...]
    odd_one_out: HangProcess | None
    summary: str
    dump_s: float
    dumps: tuple[DumpCount, ...]
    number: int
    progress: str = ""

    @classmethod
    def of(cls, view: HangView) -> HangRecord:
        """The report's form of a hang of the Observation."""
        return cls(
            state=view.state,
            pid=view.pid,
            rank=view.rank,
            threshold_s=view.threshold_s,
            threshold_from=view.threshold_from,
            last_step_s=view.last_step_s,
            fired_s=view.fired_s,
            detected_after_s=view.detected_after_s,
            stalled_s=view.stalled_s,
            resumed_s=view.resumed_s,
            processes=view.processes,
            odd_one_out=view.odd_one_out,
            summary=view.summary,
            dump_s=view.dump_s,
            dumps=tuple(
                DumpCount(pid=d.pid, role=d.role, rank=d.rank, threads=len(d.threads), error=d.error, dump_s=d.dump_s)
                for d in view.dumps
            ),
            number=view.number,
            progress=view.progress,
        )


@dataclass(frozen=True, slots=True)
class MemoryForecastReport:
    """A memory forecast (:class:`torchwatch.model.memory.MemoryForecastView`) as saved: ``what``
    ``host`` or ``device``; ``seconds`` left with its 95 % interval (``soonest_s``, ``latest_s``:
    ``None`` when unbounded), s; bytes, bytes/s; the window fitted, s; where the limit comes from,
    who grows, and the watched tree's share of the growth (0-1)."""

    what: str
    seconds: float
    soonest_s: float
    latest_s: float | None
    level_bytes: int
    limit_bytes: int
    bytes_per_s: float
    window_s: float
    limit_source: str
    grower: str
    tree_share: float | None


@dataclass(frozen=True, slots=True)
class ProcMemoryReport:
    """One process's memory over the last minutes of an out-of-memory record: RSS and private
    (USS) bytes, one value per ``smaps_rollup`` read (every 5 s), oldest first."""

    pid: int
    role: str
    ended: bool
    rss_bytes: tuple[int, ...]
    uss_bytes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MemoryRecordReport:
    """An out-of-memory record (:class:`torchwatch.model.memory.MemoryRecord`) as saved: ``kind``
    ``host`` (the kernel's OOM killer) or ``cuda``; ``at_s``: seconds after watching started."""

    kind: str
    at_s: float
    pid: int
    role: str
    name: str
    how: str
    limit_bytes: int | None
    limit_source: str | None
    forecast: MemoryForecastReport | None
    steps_ms: tuple[float, ...]
    stack: tuple[str, ...]
    cuda: OomRecord | None
    processes: tuple[ProcMemoryReport, ...]


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """The report's ``memory`` section: the limit and use at the end (bytes), the forecasts shown
    at the end, why none was (``no_forecast``), and every out-of-memory record."""

    limit_bytes: int | None
    used_bytes: int | None
    limit_source: str | None
    forecasts: tuple[MemoryForecastReport, ...]
    no_forecast: str | None
    records: tuple[MemoryRecordReport, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """A torchwatch report (``torchwatch.report/1``), every key in the order it is written.

    Attributes:
        schema: ``torchwatch.report/1`` (a report of a newer minor version keeps its own).
        torchwatch_version / created (ISO-8601 UTC, seconds) / host: who wrote it, when, where.
        target: the process watched. ended_by: what ended the watch (``None``: not known).
        window: the verdict's window. verdict / findings / not_applicable: the diagnosis.
        sources: each source's status. features: each feature's value (``None``: not measured).
        feature_units: each feature's unit. watched_seconds: s watched.
        verdict_history: the verdict's changes. own_usage (key ``self``): what watching cost.
        hook: what the focus rank's hook measured. injection: what ``attach`` did inside.
        ranks: one row per rank of a job (``()`` for one process). straggler: the rank that
            paces the job. hang: the last hang recorded. sampling: the samplers' cadence.
        trials: the live trials seen while watching, oldest first.
        progress: the focus rank's epoch, the time left in it and its loss
            (:class:`~torchwatch.model.progress.ProgressView`; a loss that is not finite is
            ``null`` with ``nonfinite_step`` set); no key without a hook reading that carries them.
    """

    schema: str = SCHEMA
    torchwatch_version: str
    created: str
    host: str
    target: ReportTarget
    ended_by: str | None = None
    window: ReportWindow
    verdict: Verdict
    findings: tuple[ReportFinding, ...]
    not_applicable: tuple[NotApplicable, ...] = ()
    sources: Mapping[str, SourceStatus]
    features: Mapping[str, float | None]
    feature_units: Mapping[str, str] = field(default_factory=dict)
    watched_seconds: float | None = None
    verdict_history: tuple[VerdictChange, ...] = ()
    own_usage: SelfUsage | None = field(default=None, metadata={"json": "self"})
    hook: HookReport | None = None
    injection: InjectionReport | None = None
    ranks: tuple[RankRow, ...]
    straggler: Straggler | None
    hang: HangRecord | None
    sampling: SamplingView
    trials: tuple[TrialState, ...] = ()
    memory: MemoryReport | None = field(default=None, metadata=OMIT_NONE)
    progress: ProgressView | None = field(default=None, metadata=OMIT_NONE)

    @classmethod
    def from_json(cls, value: object) -> Report:
        """Decode and check a report (``json.loads`` of the file).

        Raises:
            ReportError: not an object, no torchwatch report ``schema``, another major version,
                or a key missing or of the wrong type (the message names it).
        """
        if not isinstance(value, dict):
            raise ReportError(f"not a torchwatch report ({_found(value)}, expected an object with schema {SCHEMA!r})")
        schema = value.get("schema")
        version = schema_version(schema)
        if version is None or not isinstance(schema, str):
            shown = escape(schema, 60) if isinstance(schema, str) else schema
            raise ReportError(f"not a torchwatch report (schema {shown!r}, expected {SCHEMA!r})")
        if version[0] != MAJOR:
            raise ReportError(
                f"a {schema} report, and this torchwatch reads {SCHEMA} (another major version)", schema, True
            )
        try:
            return _decode_object(cls, value, "")
        except _Bad as bad:
            raise ReportError(f"a malformed {schema} report: {bad}", schema) from None

    def to_json(self) -> dict[str, object]:
        """The JSON object, ready for ``json.dumps`` (keys in the contract's order)."""
        return _fields_json(self)


# -- decoding -------------------------------------------------------------------------------------------
def decode_section(cls: type[_S], value: object, where: str) -> _S:
    """Decode one section of a report (``where``: its key, as errors name it) into ``cls``, a
    dataclass annotated as the module docstring says.

    Raises:
        ReportError: a key is missing or of the wrong type.
    """
    try:
        return _decode_object(cls, value, where)
    except _Bad as bad:
        raise ReportError(f"a malformed {SCHEMA} report: {bad}", SCHEMA) from None


_WIRE: Mapping[type, Callable[[object, str], object]] = {
    BurstResult: BurstResult.decode,
    CompileInfo: CompileInfo.decode,
    TrialState: TrialState.decode,
    OomRecord: OomRecord.decode,
}
"""Wire types of the hook with a JSON shape of their own: decoded by their own decoders."""


_FIELDS: dict[type, tuple[tuple[Field[Any], object], ...]] = {}


def _fields(cls: type) -> tuple[tuple[Field[Any], object], ...]:
    """``(field, its resolved annotation)`` of a dataclass, in order (resolved once per class)."""
    known = _FIELDS.get(cls)
    if known is None:
        hints = typing.get_type_hints(cls)
        known = _FIELDS[cls] = tuple((f, hints[f.name]) for f in fields(cls) if f.init)
    return known


def _has_default(f: Field[Any]) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


def _decode_object(cls: type[_S], value: object, where: str) -> _S:
    if not isinstance(value, dict):
        raise _Bad(f"{_at(where)} is {_found(value)}, expected an object")
    kwargs: dict[str, object] = {}
    for f, annotation in _fields(cls):
        key = f.metadata.get("json", f.name)
        path = f"{where}.{key}" if where else key
        if key not in value:
            if _has_default(f):
                continue
            raise _Bad(f"{_at(path)} is missing, expected {_kind(annotation)}")
        kwargs[f.name] = _decode(annotation, value[key], path)
    return cls(**kwargs)


def _decode(annotation: object, value: object, path: str) -> object:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Union or origin is types.UnionType:
        options = [a for a in args if a is not type(None)]
        if value is None:
            if len(options) < len(args):
                return None
            raise _Bad(f"{_at(path)} is null, expected {_kind(annotation)}")
        if len(options) == 1:
            return _decode(options[0], value, path)
        for option in options:
            try:
                return _decode(option, value, path)
            except _Bad:
                continue
        raise _Bad(f"{_at(path)} is {_found(value)}, expected {_kind(annotation)}")
    if origin is Literal:
        if any(type(value) is type(a) and value == a for a in args):
            return value
        raise _Bad(f"{_at(path)} is {_shown(value)}, expected {_kind(annotation)}")
    if origin is tuple:
        if not isinstance(value, list):
            raise _Bad(f"{_at(path)} is {_found(value)}, expected {_kind(annotation)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise _Bad(f"{_at(path)} has {len(value)} items, expected {len(args)}")
        return tuple(_decode(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))
    if origin is dict or origin is Mapping:
        if not isinstance(value, dict):
            raise _Bad(f"{_at(path)} is {_found(value)}, expected {_kind(annotation)}")
        return {str(k): _decode(args[1], v, f"{path}.{escape(str(k), 40)}") for k, v in value.items()}
    if annotation is bool or annotation is int or annotation is float or annotation is str:
        if not _is_scalar(annotation, value):
            raise _Bad(f"{_at(path)} is {_found(value)}, expected {_kind(annotation)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise _Bad(f"{_at(path)} is {value!r}, expected a finite number")
        return value
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        try:
            return annotation(value)
        except ValueError:
            raise _Bad(f"{_at(path)} is {_shown(value)}, expected {_kind(annotation)}") from None
    if isinstance(annotation, type) and annotation in _WIRE:
        try:
            return _WIRE[annotation](value, path)
        except ValueError as exc:  # WireError: "path.key: what is wrong"
            raise _Bad(str(exc)) from None
    if isinstance(annotation, type) and is_dataclass(annotation):
        return _decode_object(annotation, value, path)
    raise TypeError(f"{path}: {annotation!r} is not a type a report section may hold")


def _is_scalar(annotation: object, value: object) -> bool:
    if annotation is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if annotation is int:
        return isinstance(value, int)
    if annotation is float:
        return isinstance(value, (int, float))
    return isinstance(value, str)


def _at(path: str) -> str:
    return f"'{path}'" if path else "the report"


def _found(value: object) -> str:
    """``value``'s JSON type, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


def _shown(value: object) -> str:
    return repr(escape(value, 40)) if isinstance(value, str) else _found(value)


def _kind(annotation: object) -> str:
    """The JSON type an annotation asks for, in words (``a list of strings``)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Union or origin is types.UnionType:
        options = [a for a in args if a is not type(None)]
        return " or ".join(_kind(a) for a in options)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin is tuple:
        return "a list of strings" if args and args[0] is str else "a list"
    if origin is dict or origin is Mapping:
        return "an object of strings" if args[1] is str else "an object"
    words = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    if isinstance(annotation, type) and annotation in words:
        return words[annotation]
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "one of " + ", ".join(str(m.value) for m in annotation)
    return "an object"


# -- writing ----------------------------------------------------------------------------------------------
def to_json_value(value: object) -> object:
    """``value`` (a section, a tuple, a mapping, an enum, a scalar) as JSON-ready Python values.

    A live trial's state is written with its ``verdict`` (:func:`~torchwatch.model.trials.verdict`);
    a dataclass with a ``to_json`` method as that returns; other dataclasses field by field.
    """
    if isinstance(value, TrialState):
        return {**value.to_json(), "verdict": verdict(value)}
    if is_dataclass(value) and not isinstance(value, type):
        own = getattr(value, "to_json", None)
        return own() if callable(own) else _fields_json(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [to_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_json_value(v) for k, v in value.items()}
    return value


def _fields_json(obj: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for f, _annotation in _fields(type(obj)):
        v = getattr(obj, f.name)
        if v is None and f.metadata.get("omit_none"):
            continue
        out[f.metadata.get("json", f.name)] = to_json_value(v)
    return out


def _round4(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 4)


def json_rounded(value: _T) -> _T:
    """``value`` (a section, or what it holds) with every float rounded to 4 digits and every
    NaN or infinity made ``None`` (JSON has none), through dataclasses, tuples and mappings:
    the report's numbers as written."""
    return cast(_T, _rounded(value))


def _rounded(value: object) -> object:
    if isinstance(value, float):
        return _round4(value)
    if isinstance(value, tuple):
        return tuple(_rounded(v) for v in value)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _rounded(v) for k, v in value.items()}
    if is_dataclass(value) and not isinstance(value, type):
        changed = {f.name: _rounded(getattr(value, f.name)) for f in fields(value) if f.init}
        return replace(value, **changed)
    return value

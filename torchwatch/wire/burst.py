"""A profiler burst as ``hook.json`` carries it: the burst machinery's state (:class:`BurstState`),
the last result (:class:`BurstResult`, its summary's step-time categories and phases) and the last
refusal (:class:`Refusal`). What asks for a burst is :mod:`~torchwatch.wire.request`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import _BIG, _TIME_MAX, _U63, NAME, TEXT, WireError, _Obj, _opt
from .ranks import MAX_RANKS
from .request import group_name_ok

__all__ = [
    "BURST_MODES",
    "BURST_STATES",
    "CATEGORIES",
    "FLOP_FIELDS",
    "IDLE_PARTS",
    "MAX_STEPS_LISTED",
    "MAX_TOP",
    "PHASES",
    "BurstResult",
    "BurstState",
    "OpTime",
    "Refusal",
]


CATEGORIES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")
"""Step-time categories of a burst summary, highest priority first (TensorBoard plugin ``ProfileRole``)."""

PHASES = ("data", "forward", "backward", "optimizer", "other")
"""Host-side phases of a step (the priority is data > optimizer > backward > forward > other)."""

IDLE_PARTS = ("host_wait", "kernel_wait", "other")
"""The parts of GPU idle time in ``gpu_idle_split_ms`` / ``gpu_idle_split_share``."""

BURST_STATES = ("idle", "armed", "running", "summarizing")
BURST_MODES = ("", "steps", "window")
MAX_TOP = 50
MAX_STEPS_LISTED = 100


@dataclass(frozen=True)
class Refusal:
    """A burst the hook refused: when (monotonic s), why, and who asked (signal / scheduled)."""

    t: float
    reason: str
    source: str

    @classmethod
    def decode(cls, value: object, where: str) -> Refusal:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(o.number("t", 0.0, _TIME_MAX), o.text("reason", TEXT), o.text("source", 32))

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class OpTime:
    """An operator or kernel in a burst summary: name, ms over the burst, calls."""

    name: str
    ms: float
    calls: int

    @classmethod
    def decode(cls, value: object, where: str, ms_key: str) -> OpTime:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(o.text("name", NAME), o.number(ms_key, 0.0, _BIG), o.integer("calls", 0, _U63))


@dataclass(frozen=True)
class BurstResult:
    """The result of one burst (see :func:`torchwatch.hook.summary.summarize_trace` for the
    summary's fields); a failed burst has ``error`` and little else. Times in ms unless named
    ``_s``; shares are fractions of the step time; bytes are bytes.

    ``start_step`` is the step the request named, ``first_step`` the step the profiler started
    at (the warmup step; the trace's ``ProfilerStep#N`` annotations carry the hook's own step
    numbers, so the traces of several ranks line up step for step); ``group`` and ``rank`` name
    the multi-rank burst this trace belongs to.

    ``trace_path`` is the gzip trace, ``trace_dir`` the folder that holds it (the one to give
    HolisticTraceAnalysis or TensorBoard).

    The FLOP count of the burst's warmup step (:data:`FLOP_FIELDS`, :mod:`torchwatch.hook.flops`):
    ``flops_per_step``, its dominant ``flops_dtype``, ``flops_device`` (``cuda``, ``cpu``) and
    ``device_name``, ``flop_step_ms`` (that step's duration), on a CPU ``cpu_peak_flops`` (FLOP/s
    of a matmul measured once in the training) and ``cpu_peak_ms``; ``flops_note`` says why not.
    """

    id: int
    error: str | None = None
    mode: str | None = None
    started_at: float | None = None
    duration_s: float | None = None
    measured_step_ms: tuple[float, ...] = ()
    steps: int | None = None
    step_time_ms: float | None = None
    step_times_ms: tuple[float, ...] = ()
    events: int | None = None
    breakdown_ms: tuple[tuple[str, float], ...] = ()
    breakdown_share: tuple[tuple[str, float], ...] = ()
    phases_share: tuple[tuple[str, float], ...] = ()
    gpu_idle_ms: float | None = None
    gpu_idle_share: float | None = None
    gpu_idle_split_ms: tuple[tuple[str, float], ...] = ()
    gpu_idle_split_share: tuple[tuple[str, float], ...] = ()
    kernel_share_per_step: tuple[float, ...] = ()
    pageable_h2d_copies_per_step: float | None = None
    pageable_h2d_ms_per_step: float | None = None
    pageable_h2d_bytes_per_step: float | None = None
    top_cpu_ops: tuple[OpTime, ...] = ()
    top_kernels: tuple[OpTime, ...] = ()
    cpu_ops_per_step: float | None = None
    kernels_per_step: float | None = None
    short_kernel_share: float | None = None
    sync_calls_per_step: float | None = None
    sync_ms_per_step: float | None = None
    trace_bytes: int | None = None
    trace_gz_bytes: int | None = None
    trace_path: str | None = None
    trace_dir: str | None = None
    trace_note: str | None = None
    summary_s: float | None = None
    rss_before_bytes: int | None = None
    rss_after_bytes: int | None = None
    rss_growth_since_first_bytes: int | None = None
    start_step: int | None = None
    first_step: int | None = None
    group: str | None = None
    rank: int | None = None
    flops_per_step: float | None = None
    flops_dtype: str | None = None
    flops_device: str | None = None
    device_name: str | None = None
    flop_step_ms: float | None = None
    cpu_peak_flops: float | None = None
    cpu_peak_ms: float | None = None
    flops_note: str | None = None

    @classmethod
    def decode(cls, value: object, where: str) -> BurstResult:
        """Raises: WireError."""
        o = _Obj(value, where)
        sync = _Obj(o.d.get("sync") or {}, f"{where}.sync")
        pageable = _Obj(o.d.get("pageable_h2d") or {}, f"{where}.pageable_h2d")
        return cls(
            id=o.integer("id", 0, _U63),
            error=o.text("error", TEXT, optional=True),
            mode=o.text("mode", 16, optional=True, choices=BURST_MODES),
            started_at=o.number("started_at", 0.0, _TIME_MAX, optional=True),
            duration_s=o.number("duration_s", 0.0, _TIME_MAX, optional=True),
            measured_step_ms=o.floats("measured_step_ms", MAX_STEPS_LISTED, 0.0, _BIG),
            steps=o.integer("steps", 0, 1 << 20, optional=True),
            step_time_ms=o.number("step_time_ms", 0.0, _BIG, optional=True),
            step_times_ms=o.floats("step_times_ms", MAX_STEPS_LISTED, 0.0, _BIG),
            events=o.integer("events", 0, _U63, optional=True),
            breakdown_ms=o.shares("breakdown_ms", CATEGORIES, 0.0, _BIG),
            breakdown_share=o.shares("breakdown_share", CATEGORIES, 0.0, 1.0),
            phases_share=o.shares("phases_share", PHASES, 0.0, 1.0),
            gpu_idle_ms=o.number("gpu_idle_ms", 0.0, _BIG, optional=True),
            gpu_idle_share=o.number("gpu_idle_share", 0.0, 1.0, optional=True),
            gpu_idle_split_ms=o.shares("gpu_idle_split_ms", IDLE_PARTS, 0.0, _BIG),
            gpu_idle_split_share=o.shares("gpu_idle_split_share", IDLE_PARTS, 0.0, 1.0),
            kernel_share_per_step=o.floats("kernel_share_per_step", MAX_STEPS_LISTED, 0.0, 1.0),
            pageable_h2d_copies_per_step=pageable.number("copies_per_step", 0.0, _BIG, optional=True),
            pageable_h2d_ms_per_step=pageable.number("ms_per_step", 0.0, _BIG, optional=True),
            pageable_h2d_bytes_per_step=pageable.number("bytes_per_step", 0.0, _BIG, optional=True),
            top_cpu_ops=tuple(OpTime.decode(v, w, "self_ms") for v, w in o.items("top_cpu_ops", MAX_TOP)),
            top_kernels=tuple(OpTime.decode(v, w, "total_ms") for v, w in o.items("top_kernels", MAX_TOP)),
            cpu_ops_per_step=o.number("cpu_ops_per_step", 0.0, _BIG, optional=True),
            kernels_per_step=o.number("kernels_per_step", 0.0, _BIG, optional=True),
            short_kernel_share=o.number("short_kernel_share", 0.0, 1.0, optional=True),
            sync_calls_per_step=sync.number("calls_per_step", 0.0, _BIG, optional=True),
            sync_ms_per_step=sync.number("ms_per_step", 0.0, _BIG, optional=True),
            trace_bytes=o.integer("trace_bytes", 0, _U63, optional=True),
            trace_gz_bytes=o.integer("trace_gz_bytes", 0, _U63, optional=True),
            trace_path=o.text("trace_path", 4096, optional=True),
            trace_dir=o.text("trace_dir", 4096, optional=True),
            trace_note=o.text("trace_note", TEXT, optional=True),
            summary_s=o.number("summary_s", 0.0, _TIME_MAX, optional=True),
            rss_before_bytes=o.integer("rss_before_bytes", 0, _U63, optional=True),
            rss_after_bytes=o.integer("rss_after_bytes", 0, _U63, optional=True),
            rss_growth_since_first_bytes=o.integer("rss_growth_since_first_bytes", -_U63, _U63, optional=True),
            start_step=o.integer("start_step", 0, _U63, optional=True),
            first_step=o.integer("first_step", 0, _U63, optional=True),
            group=_group(o.text("group", 64, optional=True), f"{where}.group"),
            rank=o.integer("rank", 0, MAX_RANKS, optional=True),
            flops_per_step=o.number("flops_per_step", 0.0, _BIG, optional=True),
            flops_dtype=o.text("flops_dtype", 32, optional=True),
            flops_device=o.text("flops_device", 16, optional=True),
            device_name=o.text("device_name", NAME, optional=True),
            flop_step_ms=o.number("flop_step_ms", 0.0, _BIG, optional=True),
            cpu_peak_flops=o.number("cpu_peak_flops", 0.0, _BIG, optional=True),
            cpu_peak_ms=o.number("cpu_peak_ms", 0.0, _BIG, optional=True),
            flops_note=o.text("flops_note", TEXT, optional=True),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object, in the shape ``summarize_trace`` and the burst write it.

        ``error`` and ``trace_note`` are present only when set (readers test ``"error" in``).
        """
        out: dict[str, Any] = {"id": self.id}
        if self.error is not None:
            out["error"] = self.error
        out.update(
            mode=self.mode,
            started_at=self.started_at,
            duration_s=self.duration_s,
            measured_step_ms=list(self.measured_step_ms),
        )
        if self.steps is not None:
            out.update(
                steps=self.steps,
                step_time_ms=self.step_time_ms,
                step_times_ms=list(self.step_times_ms),
                events=self.events,
                breakdown_ms=dict(self.breakdown_ms),
                breakdown_share=dict(self.breakdown_share),
                phases_share=dict(self.phases_share),
                gpu_idle_ms=self.gpu_idle_ms,
                gpu_idle_share=self.gpu_idle_share,
                gpu_idle_split_ms=dict(self.gpu_idle_split_ms) or None,
                gpu_idle_split_share=dict(self.gpu_idle_split_share) or None,
                kernel_share_per_step=list(self.kernel_share_per_step) or None,
                pageable_h2d=None
                if self.pageable_h2d_copies_per_step is None
                else {
                    "copies_per_step": self.pageable_h2d_copies_per_step,
                    "ms_per_step": self.pageable_h2d_ms_per_step,
                    "bytes_per_step": self.pageable_h2d_bytes_per_step,
                },
                top_cpu_ops=[{"name": t.name, "self_ms": t.ms, "calls": t.calls} for t in self.top_cpu_ops],
                top_kernels=[{"name": t.name, "total_ms": t.ms, "calls": t.calls} for t in self.top_kernels],
                cpu_ops_per_step=self.cpu_ops_per_step,
                kernels_per_step=self.kernels_per_step,
                short_kernel_share=self.short_kernel_share,
                sync={"calls_per_step": self.sync_calls_per_step, "ms_per_step": self.sync_ms_per_step},
            )
        out.update(
            trace_bytes=self.trace_bytes,
            trace_gz_bytes=self.trace_gz_bytes,
            trace_path=self.trace_path,
            trace_dir=self.trace_dir,
        )
        if self.trace_note is not None:
            out["trace_note"] = self.trace_note
        out.update(
            summary_s=self.summary_s,
            rss_before_bytes=self.rss_before_bytes,
            rss_after_bytes=self.rss_after_bytes,
            rss_growth_since_first_bytes=self.rss_growth_since_first_bytes,
        )
        for key in ("start_step", "first_step", "group", "rank", *FLOP_FIELDS):  # only when set (older readers)
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


FLOP_FIELDS = (
    "flops_per_step",
    "flops_dtype",
    "flops_device",
    "device_name",
    "flop_step_ms",
    "cpu_peak_flops",
    "cpu_peak_ms",
    "flops_note",
)
"""The :class:`BurstResult` fields of the FLOP count (:mod:`torchwatch.hook.flops`): FLOPs of one
step (its warmup step, counted with a dispatch mode), their dominant dtype, the device kind and
name, that step's duration, ms, and on a CPU the matmul peak measured once, FLOP/s, and how long
measuring it took, ms; ``flops_note`` says why there is no count."""


def _group(name: str | None, where: str) -> str | None:
    if name is not None and not group_name_ok(name):
        raise WireError(f"{where}: not a burst group name")
    return name


@dataclass(frozen=True)
class BurstState:
    """The burst machinery's state: ``idle``/``armed``/``running``/``summarizing``, the mode
    (``steps``/``window``), bursts asked so far, the last result and the last refusal."""

    state: str = "idle"
    mode: str = ""
    count: int = 0
    last: BurstResult | None = None
    last_refusal: Refusal | None = None

    @classmethod
    def decode(cls, value: object, where: str) -> BurstState:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(
            state=o.text("state", 16, choices=BURST_STATES),
            mode=o.text("mode", 16, optional=True, choices=BURST_MODES) or "",
            count=o.integer("count", 0, _U63),
            last=_opt(o.d.get("last"), f"{where}.last", BurstResult.decode),
            last_refusal=_opt(o.d.get("last_refusal"), f"{where}.last_refusal", Refusal.decode),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return {
            "state": self.state,
            "mode": self.mode,
            "count": self.count,
            "last": None if self.last is None else self.last.to_json(),
            "last_refusal": None if self.last_refusal is None else self.last_refusal.to_json(),
        }

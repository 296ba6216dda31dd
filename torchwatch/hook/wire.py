"""The hook's wire format: what the hook writes and torchwatch reads. Standard library only.

One module for both sides, so the writer (the hook, inside the training) and the reader
(torchwatch, often as root) agree by construction:

- the burst signals allowed (:func:`signal_allowed`): SIGUSR1, SIGUSR2 and the real-time
  signals, nothing that stops, kills or interrupts a process;
- the process instance a hook directory belongs to (:class:`Instance`): namespace-local PID,
  start time (clock ticks since boot, ``/proc/PID/stat`` field 22) and PID-namespace inode,
  and the directory name made from them (``<pid>-<start>-<pidns>``);
- ``hook.json`` as typed, frozen records (:class:`HookRecord` and its parts, among them the
  rank's identity, :class:`RankInfo`) with a strict decoder: types, ranges, list and string
  lengths; strings lose every control, format and separator character, so nothing read from a
  file reaches a terminal raw;
- the ``counters`` binary layout (:func:`decode_counters`, per step: :class:`RankStep`) and the
  burst request (:class:`BurstRequest`).

Compatibility: fields added to ``hook.json`` are optional (a reader of the same schema that does
not know them ignores them), so its schema stays ``torchwatch.hook/2``. The ``counters`` layout is
versioned on its own (:data:`COUNTERS_VERSION`, 3 since the per-rank fields): a reader of another
version refuses the file with a one-line reason.

The hook runs its own ``hook.json`` through the same decoder before writing it, so it never
publishes what torchwatch would refuse. Every decode failure is a :class:`WireError` whose
message is one line naming the field.
"""

from __future__ import annotations

import math
import os
import re
import signal
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

__all__ = [
    "CATEGORIES",
    "COUNTERS_FILE",
    "IDLE_PARTS",
    "LOADER_SETTINGS",
    "PHASES",
    "REQUEST_FILE",
    "SCHEMA",
    "STATE_FILE",
    "AmpInfo",
    "BurstRequest",
    "BurstResult",
    "BurstState",
    "CompileEvent",
    "CompileInfo",
    "CounterSnapshot",
    "DeviceMemory",
    "GpuSettings",
    "HookRecord",
    "Instance",
    "LoaderInfo",
    "OpTime",
    "RankInfo",
    "RankStep",
    "Refusal",
    "WireError",
    "clean_text",
    "decode_counters",
    "group_name_ok",
    "parse_signal",
    "signal_allowed",
    "signal_name",
]

SCHEMA = "torchwatch.hook/2"
STATE_FILE = "hook.json"
COUNTERS_FILE = "counters"
REQUEST_FILE = "request.json"
KNOWN_FILES = (STATE_FILE, COUNTERS_FILE, REQUEST_FILE)
TEMP_PREFIX = ".tw-"  # temp files the hook or torchwatch create before a rename (see publish.write_atomic)

STATE_MAX_BYTES = 1 << 20  # a real hook.json is 2-20 KB (a burst summary lists at most 10 ops and kernels)
REQUEST_MAX_BYTES = 4096  # a request is eight numbers and a short name

# Linux pid_max is at most 2**22 (PID_MAX_LIMIT, include/linux/threads.h).
PID_MAX = 1 << 22
_U63 = (1 << 63) - 1
_TIME_MAX = 1e10  # monotonic seconds (317 years of uptime): anything larger is not a clock reading


class WireError(ValueError):
    """A published file or request does not match the wire format; the message is one line."""


# -- signals ------------------------------------------------------------------------------------
def burst_signals() -> frozenset[int]:
    """The signals a burst may be asked with: SIGUSR1, SIGUSR2, SIGRTMIN..SIGRTMAX.

    Their default action is to terminate, but none of them is sent by a shell, a terminal, a
    service manager or a scheduler to stop or interrupt a process (signal(7)), so taking one
    changes nothing else in the training. SIGTERM, SIGINT, SIGHUP, SIGKILL, SIGSTOP, ... are
    never accepted.
    """
    sigs = {int(signal.SIGUSR1), int(signal.SIGUSR2)}
    lo, hi = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if lo is not None and hi is not None:
        sigs.update(range(int(lo), int(hi) + 1))
    return frozenset(sigs)


def signal_allowed(signum: object) -> bool:
    """Whether ``signum`` (an int) is one of :func:`burst_signals`."""
    return isinstance(signum, int) and not isinstance(signum, bool) and signum in burst_signals()


def signal_name(signum: int) -> str:
    """``SIGUSR2``, ``SIGRTMIN+3``, or the number for anything else."""
    lo = getattr(signal, "SIGRTMIN", None)
    hi = getattr(signal, "SIGRTMAX", None)
    if lo is not None and hi is not None and int(lo) < signum <= int(hi):
        return f"SIGRTMIN+{signum - int(lo)}"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


_RT = re.compile(r"^(?:SIG)?RTM(IN|AX)(?:([+-])(\d{1,3}))?$")


def parse_signal(text: str) -> int:
    """A burst signal from its name (``SIGUSR1``, ``usr2``, ``SIGRTMIN+2``) or number.

    Raises:
        WireError: unknown, or not one of :func:`burst_signals` (the message names those).
    """
    name = text.strip().upper()
    signum: int | None = None
    if name.isdigit() and len(name) <= 3:
        signum = int(name)
    elif m := _RT.match(name):
        base = getattr(signal, "SIGRTMIN" if m.group(1) == "IN" else "SIGRTMAX", None)
        if base is not None:
            off = int(m.group(3) or 0)
            signum = int(base) + (off if m.group(2) != "-" else -off)
    else:
        sig = getattr(signal, name if name.startswith("SIG") else "SIG" + name, None)
        signum = int(sig) if isinstance(sig, int) else None
    if signum is None or not signal_allowed(signum):
        shown = clean_text(text, 40)
        raise WireError(f"TORCHWATCH_SIGNAL={shown!r} is not allowed: use SIGUSR1, SIGUSR2 or SIGRTMIN+N")
    return signum


# -- the process instance -------------------------------------------------------------------------
_DIR_NAME = re.compile(r"^([1-9][0-9]{0,6})-([0-9]{1,20})-([0-9]{1,20})$")


@dataclass(frozen=True)
class Instance:
    """One process, told apart from any later process with the same PID.

    Attributes:
        pid: its PID in its own PID namespace (what ``os.getpid()`` returns inside it).
        start: its start time, clock ticks since boot (``/proc/PID/stat`` field 22, proc(5)).
        pidns: the inode of its PID namespace (``/proc/PID/ns/pid``, namespaces(7)).
    """

    pid: int
    start: int
    pidns: int

    @property
    def dir_name(self) -> str:
        """The name of its hook directory: ``<pid>-<start>-<pidns>``."""
        return f"{self.pid}-{self.start}-{self.pidns}"

    @classmethod
    def from_dir_name(cls, name: str) -> Instance | None:
        """The instance a hook directory name stands for; ``None`` for any other name."""
        m = _DIR_NAME.match(name)
        if m is None:
            return None
        pid, start, ns = (int(g) for g in m.groups())
        return cls(pid, start, ns) if pid < PID_MAX and start <= _U63 and ns <= _U63 else None


def stat_start(stat: str) -> int:
    """Field 22 (``starttime``) of a ``/proc/PID/stat`` line.

    The command name (field 2) may hold spaces and parentheses, so fields are counted from
    the last ``)``.

    Raises:
        WireError: not a stat line.
    """
    try:
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (ValueError, IndexError):
        raise WireError("/proc/PID/stat: no start time") from None


def self_instance() -> Instance:
    """This process's :class:`Instance`.

    Raises:
        OSError: ``/proc`` is not mounted. WireError: an unreadable stat line.
    """
    with open("/proc/self/stat") as f:
        start = stat_start(f.read())
    return Instance(os.getpid(), start, os.stat("/proc/self/ns/pid").st_ino)


def proc_is_own_namespace() -> bool:
    """Whether ``/proc`` shows this process's PID namespace (``/proc/self`` is our own PID).

    After ``unshare --pid`` without a new ``/proc`` mount, ``/proc/N`` are the PIDs of another
    namespace: nothing there tells whether a PID of ours is alive.
    """
    try:
        return int(os.readlink("/proc/self")) == os.getpid()
    except (OSError, ValueError):
        return False


def alive_here(inst: Instance) -> bool:
    """Whether ``inst`` (an instance of this PID namespace) is still running.

    ``False`` only when provably gone: no ``/proc/PID``, or one with another start time. Call
    only after :func:`proc_is_own_namespace`.
    """
    try:
        with open(f"/proc/{inst.pid}/stat") as f:
            return stat_start(f.read()) == inst.start
    except FileNotFoundError:
        return False
    except ProcessLookupError:
        return False
    except (OSError, WireError):
        return True  # cannot tell: keep it


# -- strict decoding helpers ------------------------------------------------------------------
def clean_text(value: str, limit: int) -> str:
    """``value`` without control, format, surrogate and separator characters (but spaces),
    cut to ``limit`` characters: safe to print on a terminal."""
    if not value.isprintable():
        value = "".join(ch for ch in value if ch.isprintable())
    return value[:limit]


def _type(v: object) -> str:
    return "null" if v is None else type(v).__name__


class _Obj:
    """Typed access to one JSON object; every failure names the field (``where.key``)."""

    def __init__(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise WireError(f"{where}: expected an object, got {_type(value)}")
        self.d: dict[str, Any] = value
        self.where = where

    def _get(self, key: str, optional: bool) -> Any:
        v = self.d.get(key)
        if v is None and not optional:
            raise WireError(f"{self.where}.{key}: missing")
        return v

    def integer(self, key: str, lo: int, hi: int, optional: bool = False) -> Any:
        v = self._get(key, optional)
        if v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool):
            raise WireError(f"{self.where}.{key}: expected an integer, got {_type(v)}")
        if not lo <= v <= hi:
            raise WireError(f"{self.where}.{key}: {v} is outside {lo}..{hi}")
        return v

    def number(self, key: str, lo: float, hi: float, optional: bool = False) -> Any:
        v = self._get(key, optional)
        if v is None:
            return None
        return _number(v, lo, hi, f"{self.where}.{key}")

    def flag(self, key: str, optional: bool = False) -> Any:
        v = self._get(key, optional)
        if v is None:
            return None if optional else False
        if not isinstance(v, bool):
            raise WireError(f"{self.where}.{key}: expected true or false, got {_type(v)}")
        return v

    def text(self, key: str, limit: int, optional: bool = False, choices: Sequence[str] = ()) -> Any:
        v = self._get(key, optional)
        if v is None:
            return None
        if not isinstance(v, str):
            raise WireError(f"{self.where}.{key}: expected a string, got {_type(v)}")
        if len(v) > limit:
            raise WireError(f"{self.where}.{key}: {len(v)} characters, at most {limit}")
        if choices and v not in choices:
            raise WireError(f"{self.where}.{key}: {clean_text(v, 20)!r} is not one of {', '.join(choices)}")
        return clean_text(v, limit)

    def items(self, key: str, limit: int) -> list[tuple[Any, str]]:
        v = self.d.get(key)
        if v is None:
            return []
        if not isinstance(v, list):
            raise WireError(f"{self.where}.{key}: expected a list, got {_type(v)}")
        if len(v) > limit:
            raise WireError(f"{self.where}.{key}: {len(v)} items, at most {limit}")
        return [(item, f"{self.where}.{key}[{i}]") for i, item in enumerate(v)]

    def floats(self, key: str, limit: int, lo: float, hi: float) -> tuple[float, ...]:
        return tuple(_number(v, lo, hi, w) for v, w in self.items(key, limit))

    def shares(self, key: str, names: Sequence[str], lo: float, hi: float) -> tuple[tuple[str, float], ...]:
        """A ``{name: number}`` object whose names are all in ``names`` (kept in that order)."""
        v = self.d.get(key)
        if v is None:
            return ()
        obj = _Obj(v, f"{self.where}.{key}")
        unknown = [k for k in obj.d if k not in names]
        if unknown:
            raise WireError(f"{obj.where}: unknown key {clean_text(str(unknown[0]), 40)!r}")
        return tuple((n, _number(obj.d[n], lo, hi, f"{obj.where}.{n}")) for n in names if n in obj.d)


def _number(v: object, lo: float, hi: float, where: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise WireError(f"{where}: expected a number, got {_type(v)}")
    f = float(v)
    if not math.isfinite(f) or not lo <= f <= hi:
        raise WireError(f"{where}: {f!r} is outside {lo:g}..{hi:g}")
    return f


_T = TypeVar("_T")


def _opt(v: object, where: str, decode: Callable[[object, str], _T]) -> _T | None:
    return None if v is None else decode(v, where)


# -- hook.json ----------------------------------------------------------------------------------
CATEGORIES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")
"""Step-time categories of a burst summary, highest priority first (TensorBoard plugin ``ProfileRole``)."""

PHASES = ("data", "forward", "backward", "optimizer", "other")
"""Host-side phases of a step (the priority is data > optimizer > backward > forward > other)."""

IDLE_PARTS = ("host_wait", "kernel_wait", "other")
"""The parts of GPU idle time in ``gpu_idle_split_ms`` / ``gpu_idle_split_share``."""

BURST_STATES = ("idle", "armed", "running", "summarizing")
BURST_MODES = ("", "steps", "window")
STEP_SOURCES = ("", "optimizer", "backward")  # where step boundaries come from; "": not known yet
RANK_SOURCES = ("env", "torch.distributed", "mp.spawn index", "mp.spawn parent")
RANK_FIELDS = ("rank", "local_rank", "world_size", "local_world_size", "group_rank", "job", "backend")
MAX_RANKS = 1 << 20  # ranks and world sizes above this are not a real job's
MAX_SPAWNED = 256  # PIDs of the ranks one torch.multiprocessing.spawn call started, kept in hook.json
MAX_LOADERS = 16
MAX_ERRORS = 16
MAX_TOP = 50
MAX_STEPS_LISTED = 100
TEXT = 300  # error messages, reasons, paths are cut here by the writer
NAME = 256  # operator and kernel names

_BIG = float(1 << 62)


@dataclass(frozen=True)
class LoaderInfo:
    """One DataLoader's settings as the user passed them, and what the hook measured on it.

    Attributes:
        num_workers, batch_size, prefetch_factor: as passed (``None`` when not set, e.g.
            ``batch_size`` with a ``batch_sampler``). pin_memory, persistent_workers, drop_last: as passed.
        multiprocessing_context: ``fork``, ``spawn``, ``forkserver`` or ``None``.
        dataset, collate_fn: type or function names. batches: batches taken. wait_s: s in
        ``__next__``. batch_bytes: bytes of the tensors of the first batch (``None``: not yet).
    """

    num_workers: int
    batch_size: int | None
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool
    multiprocessing_context: str | None
    dataset: str
    collate_fn: str
    batches: int
    wait_s: float
    batch_bytes: int | None
    drop_last: bool = False

    @classmethod
    def decode(cls, value: object, where: str) -> LoaderInfo:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(
            num_workers=o.integer("num_workers", 0, 1 << 16),
            batch_size=o.integer("batch_size", 0, _U63, optional=True),
            pin_memory=o.flag("pin_memory"),
            prefetch_factor=o.integer("prefetch_factor", 0, 1 << 20, optional=True),
            persistent_workers=o.flag("persistent_workers"),
            multiprocessing_context=o.text("multiprocessing_context", 32, optional=True),
            dataset=o.text("dataset", NAME, optional=True) or "",
            collate_fn=o.text("collate_fn", NAME, optional=True) or "",
            batches=o.integer("batches", 0, _U63),
            wait_s=o.number("wait_s", 0.0, _TIME_MAX),
            batch_bytes=o.integer("batch_bytes", 0, _U63, optional=True),
            drop_last=o.flag("drop_last", optional=True) or False,
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object (the keys torchwatch's report shows)."""
        return dict(self.__dict__)


LOADER_SETTINGS = ("num_workers", "batch_size", "pin_memory", "prefetch_factor", "persistent_workers", "drop_last")
"""The :class:`LoaderInfo` fields that are settings the user passed, in the order the report and
the TUI show them (each face iterates this list: a new setting is a field, its decoding, and a
name here)."""


@dataclass(frozen=True)
class AmpInfo:
    """Mixed precision seen in the training: the first enabled ``autocast`` and ``GradScaler``."""

    autocast: bool = False
    dtype: str | None = None
    device_type: str | None = None
    grad_scaler: bool = False

    @classmethod
    def decode(cls, value: object, where: str) -> AmpInfo:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(
            o.flag("autocast"),
            o.text("dtype", 32, optional=True),
            o.text("device_type", 32, optional=True),
            o.flag("grad_scaler"),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return dict(self.__dict__)


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


@dataclass(frozen=True)
class DeviceMemory:
    """The CUDA caching allocator of one device of the training, as the hook read it
    (``torch.cuda.memory_stats``: ``allocated_bytes.all.current``, ``reserved_bytes.all.current``,
    ``allocated_bytes.all.peak``, ``num_alloc_retries``), bytes.

    Optional in ``hook.json``: the hook writes it only once the training has initialised CUDA
    (it never creates a CUDA context itself).

    Attributes:
        device: the CUDA device index (in the training's ``CUDA_VISIBLE_DEVICES`` numbering).
        allocated_bytes / reserved_bytes: memory in tensors / held by the caching allocator now.
        peak_bytes: the most ever allocated in tensors (``max_memory_allocated``: since the
            process started, or since the training last reset it).
        capacity_bytes: the device's memory (``get_device_properties().total_memory``); added.
        alloc_retries: ``cudaMalloc`` calls that failed and were retried after freeing the
            allocator's cache (each one synchronises the device); added.
        t: when the hook read them, monotonic s; added.
    """

    device: int
    allocated_bytes: int
    reserved_bytes: int
    peak_bytes: int | None = None
    capacity_bytes: int | None = None
    alloc_retries: int | None = None
    t: float | None = None

    @classmethod
    def decode(cls, value: object, where: str) -> DeviceMemory:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(
            o.integer("device", 0, 1 << 16),
            o.integer("allocated_bytes", 0, _U63),
            o.integer("reserved_bytes", 0, _U63),
            o.integer("peak_bytes", 0, _U63, optional=True),
            o.integer("capacity_bytes", 0, _U63, optional=True),
            o.integer("alloc_retries", 0, _U63, optional=True),
            o.number("t", 0.0, _TIME_MAX, optional=True),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object (the added fields only when known, so older readers see what they did)."""
        return {k: v for k, v in self.__dict__.items() if v is not None or k == "peak_bytes"}


FLOAT32_PRECISIONS = ("highest", "high", "medium")
MAX_DEVICES = 16  # devices listed per process (an 8- or 16-GPU node)


@dataclass(frozen=True)
class GpuSettings:
    """Settings a GPU fix quotes, as the hook read them in the training (``None``: not read).

    Attributes:
        float32_matmul_precision: ``torch.get_float32_matmul_precision()`` (``highest`` = no TF32).
        matmul_allow_tf32: ``torch.backends.cuda.matmul.allow_tf32``.
        cudnn_allow_tf32 / cudnn_benchmark: ``torch.backends.cudnn.allow_tf32`` / ``.benchmark``.
        compiled: ``torch._dynamo`` has compiled at least one graph in this process.
        optimizer: the stepped optimizer's class name; optimizer_foreach / optimizer_fused: its
            ``foreach`` / ``fused`` as set (``None`` in the defaults: torch picks).
        alloc_conf: the training's ``PYTORCH_CUDA_ALLOC_CONF`` (``None``: not set).
    """

    float32_matmul_precision: str | None = None
    matmul_allow_tf32: bool | None = None
    cudnn_allow_tf32: bool | None = None
    cudnn_benchmark: bool | None = None
    compiled: bool | None = None
    optimizer: str | None = None
    optimizer_foreach: bool | None = None
    optimizer_fused: bool | None = None
    alloc_conf: str | None = None

    @classmethod
    def decode(cls, value: object, where: str) -> GpuSettings:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(
            o.text("float32_matmul_precision", 16, optional=True, choices=FLOAT32_PRECISIONS),
            o.flag("matmul_allow_tf32", optional=True),
            o.flag("cudnn_allow_tf32", optional=True),
            o.flag("cudnn_benchmark", optional=True),
            o.flag("compiled", optional=True),
            o.text("optimizer", 64, optional=True),
            o.flag("optimizer_foreach", optional=True),
            o.flag("optimizer_fused", optional=True),
            o.text("alloc_conf", TEXT, optional=True),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return dict(self.__dict__)


MAX_THREADS = 1 << 16  # an intra-op or inter-op pool larger than this is not a real setting


@dataclass(frozen=True)
class ThreadSettings:
    """The CPU threads the training asks for, as the hook read them (``None``: not read).

    Attributes:
        intra_op: ``torch.get_num_threads()``: threads each op may use (OpenMP / ATen pool; by
            default the physical cores, or ``OMP_NUM_THREADS``).
        inter_op: ``torch.get_num_interop_threads()``: threads running independent ops at once.
        omp_num_threads / mkl_num_threads: the training's ``OMP_NUM_THREADS`` /
            ``MKL_NUM_THREADS`` as set (``None``: not set), verbatim, cut to 32 characters.
    """

    intra_op: int | None = None
    inter_op: int | None = None
    omp_num_threads: str | None = None
    mkl_num_threads: str | None = None

    @classmethod
    def decode(cls, value: object, where: str) -> ThreadSettings:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(
            o.integer("intra_op", 1, MAX_THREADS, optional=True),
            o.integer("inter_op", 1, MAX_THREADS, optional=True),
            o.text("omp_num_threads", 32, optional=True),
            o.text("mkl_num_threads", 32, optional=True),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class RankInfo:
    """Who this process is in a distributed job, and where each answer came from.

    Attributes:
        rank, world_size: the global rank and the number of ranks (``RANK``, ``WORLD_SIZE``, or
            ``torch.distributed.get_rank()`` / ``get_world_size()`` once initialised).
        local_rank, local_world_size: the rank on this machine and the ranks on it
            (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``; for ``torch.multiprocessing.spawn`` ranks the
            process index passed to the function is the local rank when nothing else says).
        group_rank: the machine's index among the job's machines (``GROUP_RANK``, torchrun).
        job: a key shared by every rank of one job: ``TORCHELASTIC_RUN_ID`` (torchrun, unless
            ``none``), else ``MASTER_ADDR:MASTER_PORT``, else the address of a ``tcp://``
            ``init_method``, else ``mp.spawn:<the spawning process's hook directory name>``.
        backend: the default process group's backend (``gloo``, ``nccl``, ...) once initialised.
        spawned_by: the hook directory name (:attr:`Instance.dir_name`) of the process whose
            ``torch.multiprocessing.spawn`` started this rank; ``None`` otherwise.
        sources: ``(field, source)`` for each field set: ``env``, ``torch.distributed``,
            ``mp.spawn index`` or ``mp.spawn parent`` (:data:`RANK_SOURCES`).
    """

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    group_rank: int | None = None
    job: str | None = None
    backend: str | None = None
    spawned_by: str | None = None
    sources: tuple[tuple[str, str], ...] = ()

    def source(self, field: str) -> str | None:
        """Where ``field`` came from (one of :data:`RANK_SOURCES`), ``None`` when unset."""
        return dict(self.sources).get(field)

    @classmethod
    def decode(cls, value: object, where: str) -> RankInfo:
        """Raises: WireError."""
        o = _Obj(value, where)
        src = _Obj(o.d.get("sources") or {}, f"{where}.sources")
        unknown = [k for k in src.d if k not in RANK_FIELDS]
        if unknown:
            raise WireError(f"{src.where}: unknown key {clean_text(str(unknown[0]), 40)!r}")
        spawned = o.text("spawned_by", 64, optional=True)
        if spawned is not None and Instance.from_dir_name(spawned) is None:
            raise WireError(f"{where}.spawned_by: not a hook directory name")
        return cls(
            rank=o.integer("rank", 0, MAX_RANKS, optional=True),
            local_rank=o.integer("local_rank", 0, MAX_RANKS, optional=True),
            world_size=o.integer("world_size", 1, MAX_RANKS, optional=True),
            local_world_size=o.integer("local_world_size", 1, MAX_RANKS, optional=True),
            group_rank=o.integer("group_rank", 0, MAX_RANKS, optional=True),
            job=o.text("job", NAME, optional=True),
            backend=o.text("backend", 32, optional=True),
            spawned_by=spawned,
            sources=tuple((k, src.text(k, 32, choices=RANK_SOURCES)) for k in RANK_FIELDS if k in src.d),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object (``sources`` as ``{field: source}``)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in (*RANK_FIELDS, "spawned_by")}
        out["sources"] = dict(self.sources)
        return out


# -- torch.compile's health (torchwatch.hook.compiled) --------------------------------------------
COMPILE_KINDS = ("recompile", "graph_break", "cache_limit")
"""What a compile event is: a frame compiled again because a guard failed, a graph break (the
frame runs in pieces, the code between them eagerly), or a frame that hit the recompile limit
(torch runs it eagerly from then on)."""

COMPILE_CAUSES = (
    "shape",
    "dtype",
    "device",
    "stride",
    "requires_grad",
    "tensor",
    "value",
    "length",
    "type",
    "object",
    "training",
    "global_state",
    "freed",
    "item",
    "print",
    "data_dependent",
    "unsupported",
    "other",
)
"""Why, in one word: the guard that failed (``shape`` of a tensor, ``value`` of a Python scalar,
``training`` flag, ...) or what broke the graph (``item``, ``print``, ``data_dependent``, ...)."""

MAX_COMPILE_EVENTS = 8  # distinct events kept, the most recent
MAX_COMPILE_SPANS = 32  # compile intervals kept, the most recent
PATH = 1024  # file paths in compile events


@dataclass(frozen=True)
class CompileEvent:
    """One compile event, in the user's words (:func:`torchwatch.hook.compiled.guard_words`).

    Attributes:
        kind: one of :data:`COMPILE_KINDS`. cause: one of :data:`COMPILE_CAUSES`.
        words: what happened, e.g. ``shape of x changed 32→17 (dim 0)``.
        reason: torch's own reason (the failed guard, or the graph break's first line), clipped.
        hint: torch's hint for a graph break (``Hint:`` line), when it gives one.
        file / line: where in the user's code: the call of the compiled code that recompiled, or
            the line that broke the graph; ``None`` when not found.
        code: that line's source, stripped. function: the compiled function's name.
        count: times seen (events of one kind, cause, place and words are one).
        t: when last seen, monotonic s (the compile's start when known).
    """

    kind: str
    cause: str
    words: str
    reason: str = ""
    hint: str | None = None
    file: str | None = None
    line: int | None = None
    code: str | None = None
    function: str | None = None
    count: int = 1
    t: float = 0.0

    @property
    def where(self) -> str | None:
        """``train.py:88`` (the file's name and the line), ``None`` when not known."""
        if self.file is None:
            return None
        name = self.file.rsplit("/", 1)[-1]
        return name if self.line is None else f"{name}:{self.line}"

    @classmethod
    def decode(cls, value: object, where: str) -> CompileEvent:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(
            kind=o.text("kind", 16, choices=COMPILE_KINDS),
            cause=o.text("cause", 16, choices=COMPILE_CAUSES),
            words=o.text("words", TEXT),
            reason=o.text("reason", TEXT, optional=True) or "",
            hint=o.text("hint", TEXT, optional=True),
            file=o.text("file", PATH, optional=True),
            line=o.integer("line", 0, 1 << 31, optional=True),
            code=o.text("code", NAME, optional=True),
            function=o.text("function", NAME, optional=True),
            count=o.integer("count", 1, _U63),
            t=o.number("t", 0.0, _TIME_MAX),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class CompileInfo:
    """What ``torch.compile`` did in the training, read from what torch keeps (no ``TORCH_LOGS``):
    ``torch._dynamo.utils.counters``, its compilation metrics and graph-break reasons.

    Attributes:
        frames: frames compiled (``counters["frames"]["ok"]``). graphs: graphs made
            (``counters["stats"]["unique_graphs"]``).
        recompiles: compiles of a frame already compiled (a guard failed), so far.
        graph_breaks: graph breaks met while compiling, so far (a break is met once per compile,
            then costs every step that runs that code).
        cache_limit_hits: frames that hit the recompile limit: torch runs them eagerly from then on.
        compile_s: seconds spent compiling so far (forward and backward graphs).
        spans: the last :data:`MAX_COMPILE_SPANS` compile intervals, ``(start, end)`` monotonic s:
            a step that overlaps one is a step that compiled.
        events: the last :data:`MAX_COMPILE_EVENTS` distinct events, oldest first.
        recompile_limit: ``torch._dynamo.config.recompile_limit`` (``cache_size_limit`` before
            torch 2.6), ``None`` when not read.
        t: when the hook read all this, monotonic s.
    """

    frames: int = 0
    graphs: int = 0
    recompiles: int = 0
    graph_breaks: int = 0
    cache_limit_hits: int = 0
    compile_s: float = 0.0
    spans: tuple[tuple[float, float], ...] = ()
    events: tuple[CompileEvent, ...] = ()
    recompile_limit: int | None = None
    t: float = 0.0

    @classmethod
    def decode(cls, value: object, where: str) -> CompileInfo:
        """Raises: WireError."""
        o = _Obj(value, where)
        spans = []
        for v, w in o.items("spans", MAX_COMPILE_SPANS):
            if not isinstance(v, list) or len(v) != 2:
                raise WireError(f"{w}: expected [start, end]")
            t0, t1 = (_number(x, 0.0, _TIME_MAX, w) for x in v)
            if t1 < t0:
                raise WireError(f"{w}: ends before it starts")
            spans.append((t0, t1))
        return cls(
            frames=o.integer("frames", 0, _U63),
            graphs=o.integer("graphs", 0, _U63),
            recompiles=o.integer("recompiles", 0, _U63),
            graph_breaks=o.integer("graph_breaks", 0, _U63),
            cache_limit_hits=o.integer("cache_limit_hits", 0, _U63),
            compile_s=o.number("compile_s", 0.0, _TIME_MAX),
            spans=tuple(spans),
            events=tuple(CompileEvent.decode(v, w) for v, w in o.items("events", MAX_COMPILE_EVENTS)),
            recompile_limit=o.integer("recompile_limit", 0, _U63, optional=True),
            t=o.number("t", 0.0, _TIME_MAX),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object (``spans`` as ``[[start, end], ...]``)."""
        out = dict(self.__dict__)
        out["spans"] = [list(s) for s in self.spans]
        out["events"] = [e.to_json() for e in self.events]
        return out


@dataclass(frozen=True)
class HookRecord:
    """Everything ``hook.json`` holds: who publishes (the process instance), the burst
    signal and whether the hook owns its handler, the training's settings, the burst state and
    the hook's errors.

    Attributes:
        instance: the process that wrote it; torchwatch accepts the record only when it is the
            live process it watches (PID reuse and other PID namespaces are told apart).
        started: when the hook started, monotonic s.
        signal: the burst signal (0: bursts off), one of :func:`burst_signals` otherwise.
        usable_cpus: CPUs the training may use (affinity and cgroup quota). shm_bytes: size of
            ``/dev/shm``, bytes.
        step_source: where step boundaries come from (:data:`STEP_SOURCES`): ``optimizer`` (a
            global optimizer step hook), ``backward`` (the end of each ``torch.autograd.backward``
            call, for loops without ``torch.optim``), ``""`` while not known yet.
        rank: the process's place in a distributed job (``None``: no sign of one).
        spawned_ranks: PIDs (in this process's namespace) of the ranks its
            ``torch.multiprocessing.spawn`` / ``start_processes`` calls started.
        device_memory: the caching allocator of the training's current CUDA device (only once the
            training initialised CUDA); devices: every device it holds memory on (at most
            :data:`MAX_DEVICES`), added.
        gpu_settings: TF32, cuDNN, compile, optimizer and allocator settings as read; added.
        threads: the CPU threads the training asks for (intra-op, inter-op, ``OMP_NUM_THREADS``);
            added.
        trial: the last live trial of a setting (:class:`torchwatch.hook.trialspec.TrialState`),
            ``None`` before the first; added.
        compile: what ``torch.compile`` did (:class:`CompileInfo`), ``None`` before it compiled; added.
    """

    instance: Instance
    python: str
    torch: str | None
    started: float
    signal: int
    signal_owned: bool
    burst_at: tuple[int, ...] = ()
    usable_cpus: float | None = None
    shm_bytes: int | None = None
    cuda_initialized: bool = False
    amp: AmpInfo = AmpInfo()
    dataloaders: tuple[LoaderInfo, ...] = ()
    burst: BurstState | None = None
    errors: tuple[str, ...] = ()
    device_memory: DeviceMemory | None = None
    step_source: str = ""
    rank: RankInfo | None = None
    spawned_ranks: tuple[int, ...] = ()
    devices: tuple[DeviceMemory, ...] = ()
    gpu_settings: GpuSettings | None = None
    threads: ThreadSettings | None = None
    trial: Any = None  # trialspec.TrialState | None (that module imports this one)
    compile: CompileInfo | None = None

    @classmethod
    def decode(cls, value: object, where: str = "hook.json") -> HookRecord:
        """Check and type a parsed ``hook.json``.

        Raises:
            WireError: wrong schema, a missing field, a wrong type, a value out of range, a
                list or string too long (the message names the field).
        """
        o = _Obj(value, where)
        schema = o.d.get("schema")
        if schema != SCHEMA:
            shown = clean_text(schema, 40) if isinstance(schema, str) else _type(schema)
            raise WireError(f"{where}: schema {shown!r}, expected {SCHEMA!r}")
        return cls(
            instance=Instance(o.integer("pid", 1, PID_MAX), o.integer("start", 0, _U63), o.integer("pidns", 0, _U63)),
            python=o.text("python", 32, optional=True) or "",
            torch=o.text("torch", 64, optional=True),
            started=o.number("started", 0.0, _TIME_MAX),
            signal=o.integer("signal", 0, 128),
            signal_owned=o.flag("signal_owned"),
            burst_at=tuple(_int_item(v, w) for v, w in o.items("burst_at", 64)),
            usable_cpus=o.number("usable_cpus", 0.0, 1 << 20, optional=True),
            shm_bytes=o.integer("shm_bytes", 0, _U63, optional=True),
            cuda_initialized=o.flag("cuda_initialized", optional=True) or False,
            amp=_opt(o.d.get("amp"), f"{where}.amp", AmpInfo.decode) or AmpInfo(),
            dataloaders=tuple(LoaderInfo.decode(v, w) for v, w in o.items("dataloaders", MAX_LOADERS)),
            burst=_opt(o.d.get("burst"), f"{where}.burst", BurstState.decode),
            errors=tuple(_text_item(v, w) for v, w in o.items("errors", MAX_ERRORS)),
            device_memory=_opt(o.d.get("device_memory"), f"{where}.device_memory", DeviceMemory.decode),
            step_source=o.text("step_source", 16, optional=True, choices=STEP_SOURCES) or "",
            rank=_opt(o.d.get("rank"), f"{where}.rank", RankInfo.decode),
            spawned_ranks=tuple(_pid_item(v, w) for v, w in o.items("spawned_ranks", MAX_SPAWNED)),
            devices=tuple(DeviceMemory.decode(v, w) for v, w in o.items("devices", MAX_DEVICES)),
            gpu_settings=_opt(o.d.get("gpu_settings"), f"{where}.gpu_settings", GpuSettings.decode),
            threads=_opt(o.d.get("threads"), f"{where}.threads", ThreadSettings.decode),
            trial=_opt(o.d.get("trial"), f"{where}.trial", _trial_state),
            compile=_opt(o.d.get("compile"), f"{where}.compile", CompileInfo.decode),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object (``torchwatch.hook/2``)."""
        return {
            "schema": SCHEMA,
            "pid": self.instance.pid,
            "start": self.instance.start,
            "pidns": self.instance.pidns,
            "python": self.python,
            "torch": self.torch,
            "started": self.started,
            "signal": self.signal,
            "signal_owned": self.signal_owned,
            "burst_at": list(self.burst_at),
            "usable_cpus": self.usable_cpus,
            "shm_bytes": self.shm_bytes,
            "cuda_initialized": self.cuda_initialized,
            "amp": self.amp.to_json(),
            "dataloaders": [d.to_json() for d in self.dataloaders],
            "burst": None if self.burst is None else self.burst.to_json(),
            "errors": list(self.errors),
            **({} if self.device_memory is None else {"device_memory": self.device_memory.to_json()}),
            "step_source": self.step_source,
            "rank": None if self.rank is None else self.rank.to_json(),
            "spawned_ranks": list(self.spawned_ranks),
            **({"devices": [d.to_json() for d in self.devices]} if self.devices else {}),
            **({} if self.gpu_settings is None else {"gpu_settings": self.gpu_settings.to_json()}),
            **({} if self.threads is None else {"threads": self.threads.to_json()}),
            **({} if self.trial is None else {"trial": self.trial.to_json()}),
            **({} if self.compile is None else {"compile": self.compile.to_json()}),
        }


def _trial_state(value: object, where: str) -> Any:
    """A live trial's state (:class:`torchwatch.hook.trialspec.TrialState`; imported here, not at
    the top: that module builds on this one)."""
    from torchwatch.hook.trialspec import TrialState

    return TrialState.decode(value, where)


def _pid_item(v: object, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v < PID_MAX:
        raise WireError(f"{where}: expected a PID, got {_type(v)}")
    return v


def _int_item(v: object, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _U63:
        raise WireError(f"{where}: expected a count, got {_type(v)}")
    return v


def _text_item(v: object, where: str) -> str:
    if not isinstance(v, str) or len(v) > TEXT:
        raise WireError(f"{where}: expected a string of at most {TEXT} characters")
    return clean_text(v, TEXT)


# -- the burst request --------------------------------------------------------------------------
@dataclass(frozen=True)
class BurstRequest:
    """Bounds of one burst (``request.json``, written by torchwatch before the signal).

    Attributes:
        warmup: steps profiled but discarded first (the profiler's own start-up cost lands there).
        steps: active steps recorded (at most 20).
        max_s: seconds after which the burst stops at the next step boundary (or in time-window
            mode, at the deadline).
        window_s: length of a time-window burst, for processes that make no optimizer steps.
        max_bytes: a larger exported trace is deleted before it is read (no summary).
        arm_timeout_s: seconds to wait for a step boundary before falling back to a time window.
        start_step: the step (0-based, as counted by the hook) at which the burst starts, so that
            every rank of a job profiles the same steps; ``None``: the next step. A rank already
            past it starts at its next step and says so (``BurstResult.first_step``).
        group: a name shared by the bursts of all ranks (:func:`group_name_ok`): their traces go
            to one folder, ``<trace dir>/<group>/``, one file per rank (what HolisticTraceAnalysis
            reads as one multi-rank trace). ``None``: the process's own folder.
    """

    warmup: int = 1
    steps: int = 3
    max_s: float = 10.0
    window_s: float = 2.0
    max_bytes: int = 200 * 1024 * 1024
    arm_timeout_s: float = 3.0
    start_step: int | None = None
    group: str | None = None

    @classmethod
    def from_request(cls, req: Mapping[str, Any] | None) -> BurstRequest:
        """Params from a ``request.json`` dict, each value clamped to a safe range (a wrong
        type or a non-finite number gives the default)."""
        d = cls()
        if not req:
            return d

        def num(key: str, lo: float, hi: float, default: float) -> float:
            v = req.get(key, default)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                return default
            return min(hi, max(lo, float(v)))

        return cls(
            warmup=int(num("warmup", 0, 5, d.warmup)),
            steps=int(num("steps", 1, 20, d.steps)),
            max_s=num("max_s", 0.5, 60.0, d.max_s),
            window_s=num("window_s", 0.2, 30.0, d.window_s),
            max_bytes=int(num("max_bytes", 1e6, 2e9, d.max_bytes)),
            arm_timeout_s=num("arm_timeout_s", 0.5, 60.0, d.arm_timeout_s),
            start_step=_count_or_none(req.get("start_step")),
            group=req["group"] if group_name_ok(req.get("group")) else None,
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return dict(self.__dict__)


_GROUP = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def group_name_ok(name: object) -> bool:
    """Whether ``name`` may name a burst group: 1 to 64 of ``A-Z a-z 0-9 _ . -``, not only dots
    (it becomes a folder name: no ``/``, no ``.`` or ``..``)."""
    return isinstance(name, str) and _GROUP.match(name) is not None and name.strip(".") != ""


def _count_or_none(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _U63 else None


# -- counters -------------------------------------------------------------------------------------
COUNTERS_MAGIC = b"TWH3"
COUNTERS_VERSION = 3  # 3: step source, backward and collective totals, per-step backward/collective times
# magic, version, seq, pid, start (ticks), pid namespace inode, steps, batches, ring capacity,
# ring written, last step end (s), data wait total (s), step time total (s), in-next since
# (s, 0 = not in next), last batch end (s), first step end (s), step source (index in
# STEP_SOURCES), backward calls, collective calls, backward wall total (s), backward blocked
# total (s), collective wait total (s), in-backward since (s, 0 = not in one), in-collective
# since (s, 0 = not in one)
HEADER = struct.Struct("<4sIQQQQQQQQddddddQQQddddd")
SEQ = struct.Struct("<Q")  # the header's seq field, at offset 8
SEQ_OFFSET = 8
IDENTITY = struct.Struct("<4sI8xQQQ")  # magic, version, (seq), pid, start, pidns: written once
DYNAMIC = struct.Struct("<QQQQddddddQQQddddd")  # steps ... in-collective since: rewritten at every update
DYNAMIC_OFFSET = IDENTITY.size
assert IDENTITY.size + DYNAMIC.size == HEADER.size
# step end (monotonic s), step duration, data wait, backward wall, backward blocked, collective wait (s)
ENTRY = struct.Struct("<dddddd")
RING = 512
COUNTERS_SIZE = HEADER.size + RING * ENTRY.size


class RankStep(NamedTuple):
    """One step of one rank, as the counters hold it (all in s; ``end`` is monotonic).

    Attributes:
        end: when the step ended (an optimizer step, or the end of a backward pass).
        duration: from the previous step's end to this one's.
        data_wait: blocked in DataLoader ``__next__``.
        backward: wall time of ``torch.autograd.backward`` calls in the step.
        backward_blocked: the part of ``backward`` in which the calling thread used no CPU
            (wall minus ``time.thread_time()``). With DDP on CPU this is the wait for the
            gradient all-reduce that DDP's reducer runs inside backward (see
            :meth:`collective_wait`).
        collective: blocked in explicit ``torch.distributed`` collectives and ``Work.wait()``
            called outside backward.
    """

    end: float
    duration: float
    data_wait: float
    backward: float
    backward_blocked: float
    collective: float

    def collective_wait(self, backward_blocked_is_comm: bool) -> float:
        """Time blocked on peers in the step, s: explicit collectives, plus the blocked part of
        backward when that is the reducer's all-reduce.

        Args:
            backward_blocked_is_comm: count ``backward_blocked`` as collective wait. True for a
                distributed training whose backward runs on the CPU (CUDA not initialised): the
                autograd engine then runs backward on the calling thread, and what blocks it is
                DDP's wait for its bucket all-reduces. On a GPU the engine runs backward on its
                device threads and the caller blocks for all of it: say False (collectives on
                the GPU are asynchronous; a burst shows their kernels). The estimate counts an
                OpenMP thread's spin-wait as CPU (so it is low with several intra-op threads)
                and a descheduled thread as blocked (so it is high on an oversubscribed CPU).
        """
        return self.collective + (self.backward_blocked if backward_blocked_is_comm else 0.0)

    def before_collective(self) -> float:
        """What the rank does in the step besides loading data, backward and collectives, s:
        the step minus data wait, backward wall and explicit collectives (forward, optimizer
        and other host work). In synchronous data parallelism every rank's step lasts as long
        as the slowest's, so the step itself names no straggler; the rank that arrives last at
        the gradient all-reduce does (HolisticTraceAnalysis's straggler analysis: the rank whose
        last collective starts latest; TraceML: the rank with the shortest backward, which
        includes the wait). ``data_wait + before_collective()`` is how long a rank takes to
        reach its backward pass; the rank with the longest is the straggler, and the larger
        of the two parts says why."""
        return max(0.0, self.duration - self.data_wait - self.backward - self.collective)


@dataclass(frozen=True)
class CounterSnapshot:
    """One consistent read of the hook's counters. Times are ``time.monotonic()`` seconds (the
    same clock in every process of the machine), durations in s.

    Attributes:
        instance: the training process that writes them.
        steps: step boundaries since the hook started (optimizer steps, or backward passes:
            ``step_source``).
        batches: batches taken from DataLoader iterators.
        last_step_t: when the last step ended (0.0: none yet).
        first_step_t: when the first step ended (0.0: none yet).
        data_wait_s: total time blocked in DataLoader ``__next__``.
        step_time_s: total duration of the steps (from the first step end on).
        in_next_since: when the ``__next__`` now running began (0.0: not in one).
        last_batch_t: when the last batch arrived (0.0: none yet).
        entries: the last up-to-:data:`RING` steps as ``(end, duration, data wait)``, oldest first
            (read with ``since``: those written after it).
        step_source: where the step boundaries come from (:data:`STEP_SOURCES`). It changes at
            most once after it is set: from ``backward`` to ``optimizer`` when a loop that made
            no optimizer step for a while makes one (its first steps were backward passes).
        backward_calls, backward_s, backward_blocked_s: ``torch.autograd.backward`` calls of the
            main thread, their total wall time and the part of it spent blocked (no CPU), s.
        collective_calls, collective_s: explicit ``torch.distributed`` collectives (and
            ``Work.wait()``) of the main thread outside backward, and the time blocked in them, s.
        in_backward_since, in_collective_since: when the backward pass or collective now
            running began (0.0: not in one), so a rank stuck on a dead peer shows while it lasts.
        details: for each of ``entries``, ``(backward, backward blocked, collective)``, s
            (see :meth:`rank_steps`).
        written: step entries written since the hook started (the ring holds the last
            :data:`RING`); a reader passes it back as ``since`` to decode only newer ones.
    """

    instance: Instance
    steps: int
    batches: int
    last_step_t: float
    first_step_t: float
    data_wait_s: float
    step_time_s: float
    in_next_since: float
    last_batch_t: float
    entries: tuple[tuple[float, float, float], ...]
    step_source: str = ""
    backward_calls: int = 0
    backward_s: float = 0.0
    backward_blocked_s: float = 0.0
    collective_calls: int = 0
    collective_s: float = 0.0
    in_backward_since: float = 0.0
    in_collective_since: float = 0.0
    details: tuple[tuple[float, float, float], ...] = ()
    written: int = 0

    @property
    def pid(self) -> int:
        """The writer's PID (in its own namespace)."""
        return self.instance.pid

    def rank_steps(self) -> tuple[RankStep, ...]:
        """The steps of :attr:`entries` with their backward and collective times, oldest first."""
        details = self.details if len(self.details) == len(self.entries) else ((0.0, 0.0, 0.0),) * len(self.entries)
        return tuple(RankStep(*e, *d) for e, d in zip(self.entries, details, strict=True))


class Busy(WireError):
    """The counters were being written (odd sequence number, or it changed while read)."""


def decode_counters(data: bytes, again: bytes, expect: Instance | None = None, since: int = 0) -> CounterSnapshot:
    """Decode a ``counters`` file read twice (the whole file, then its header again).

    Args:
        data: the file's :data:`COUNTERS_SIZE` bytes. again: its header, read after ``data``.
        expect: the process that must have written it (``None``: any).
        since: the ``written`` count of the caller's previous snapshot: only the step entries
            written after it are decoded and checked (a reader once a second decodes its new
            steps, not the whole ring: the whole ring was 4.5 ms of a 7 ms read at 125 steps/s).
            0, or more than the file's count: every entry in the ring.

    Raises:
        Busy: a write was in progress (read again). WireError: wrong size, magic, version,
            ring, writer, or a value that is not a count or a clock reading.
    """
    if len(data) != COUNTERS_SIZE or len(again) < HEADER.size:
        raise WireError(f"counters: {len(data)} bytes, expected {COUNTERS_SIZE}")
    head = HEADER.unpack_from(data, 0)
    magic, version, seq, pid, start, ns, steps, batches, ring, written = head[:10]
    if magic != COUNTERS_MAGIC or version != COUNTERS_VERSION:
        raise WireError(f"counters: not a torchwatch counters file of version {COUNTERS_VERSION}")
    if seq % 2 or seq != SEQ.unpack_from(again, SEQ_OFFSET)[0]:
        raise Busy("counters: being written")
    inst = Instance(pid, start, ns)
    if expect is not None and inst != expect:
        raise WireError(f"counters: written by process {inst.dir_name}, not {expect.dir_name}")
    source, bw_calls, coll_calls = head[16:19]
    if ring != RING or max(written, steps, batches, bw_calls, coll_calls) > _U63 or source >= len(STEP_SOURCES):
        raise WireError("counters: bad ring, counts or step source")
    times = head[10:16] + head[19:]
    if not all(math.isfinite(t) and 0.0 <= t <= _TIME_MAX for t in times):
        raise WireError("counters: a time is not a clock reading")
    last_step, wait, step_time, in_next, last_batch, first, bw_s, bw_blocked, coll_s, in_bw, in_coll = times
    begin = written - min(written, ring)
    if 0 < since <= written:
        begin = max(begin, since)
    rows = [ENTRY.unpack_from(data, HEADER.size + (i % ring) * ENTRY.size) for i in range(begin, written)]
    if not all(math.isfinite(x) and abs(x) <= _TIME_MAX for e in rows for x in e):
        raise WireError("counters: a step entry is not a clock reading")
    return CounterSnapshot(
        inst, steps, batches, last_step, first, wait, step_time, in_next, last_batch,
        entries=tuple(r[:3] for r in rows),
        step_source=STEP_SOURCES[source],
        backward_calls=bw_calls,
        backward_s=bw_s,
        backward_blocked_s=bw_blocked,
        collective_calls=coll_calls,
        collective_s=coll_s,
        in_backward_since=in_bw,
        in_collective_since=in_coll,
        details=tuple(r[3:] for r in rows),
        written=written,
    )  # fmt: skip

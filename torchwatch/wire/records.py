"""``hook.json`` as one typed, frozen record (:class:`HookRecord`), written by the hook and read
by torchwatch, and the mixed precision seen in the training (:class:`AmpInfo`).

Its parts live in their own sections: DataLoaders (:mod:`~torchwatch.wire.loader`), bursts
(:mod:`~torchwatch.wire.burst`), device memory, out-of-memory errors and GPU settings
(:mod:`~torchwatch.wire.gpu`), the rank (:mod:`~torchwatch.wire.ranks`), torch.compile
(:mod:`~torchwatch.wire.compile`), CPU threads (:mod:`~torchwatch.wire.cpus`) and the live trial
(:mod:`~torchwatch.wire.trial`). The hook runs its own record through :meth:`HookRecord.decode`
before writing it, so it never publishes what torchwatch would refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import (
    _TIME_MAX,
    _U63,
    PID_MAX,
    WireError,
    _int_item,
    _Obj,
    _opt,
    _pid_item,
    _text_item,
    _type,
    clean_text,
)
from .burst import BurstState
from .compile import CompileInfo
from .counters import STEP_SOURCES
from .cpus import ThreadSettings
from .gpu import MAX_DEVICES, DeviceMemory, GpuSettings, OomRecord
from .identity import Instance
from .loader import LoaderInfo
from .progress import ProgressInfo
from .ranks import MAX_SPAWNED, RankInfo
from .trial import TrialState

__all__ = ["MAX_ERRORS", "MAX_LOADERS", "SCHEMA", "AmpInfo", "HookRecord"]


SCHEMA = "torchwatch.hook/2"
MAX_LOADERS = 16
MAX_ERRORS = 16


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
        trial: the last live trial of a setting (:class:`~torchwatch.wire.trial.TrialState`),
            ``None`` before the first; added.
        trial_refused: the last trial request refused because another trial was running (state
            ``refused``, with the reason), kept apart from ``trial`` so that the running trial's
            state, and the put-back of its setting, stay; ``None`` before one; added.
        compile: what ``torch.compile`` did (:class:`CompileInfo`), ``None`` before it compiled; added.
        oom: the last CUDA out-of-memory error the hook saw (:class:`OomRecord`), ``None`` before one; added.
        progress: the epoch, the batch in it and the loss readings (:class:`ProgressInfo`),
            ``None`` before the first batch or loss; added.
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
    trial: TrialState | None = None
    compile: CompileInfo | None = None
    oom: OomRecord | None = None
    progress: ProgressInfo | None = None
    trial_refused: TrialState | None = None

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
            trial=_opt(o.d.get("trial"), f"{where}.trial", TrialState.decode),
            compile=_opt(o.d.get("compile"), f"{where}.compile", CompileInfo.decode),
            oom=_opt(o.d.get("oom"), f"{where}.oom", OomRecord.decode),
            progress=_opt(o.d.get("progress"), f"{where}.progress", ProgressInfo.decode),
            trial_refused=_opt(o.d.get("trial_refused"), f"{where}.trial_refused", TrialState.decode),
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
            **({} if self.oom is None else {"oom": self.oom.to_json()}),
            **({} if self.progress is None else {"progress": self.progress.to_json()}),
            **({} if self.trial_refused is None else {"trial_refused": self.trial_refused.to_json()}),
        }

"""NVML source: per-GPU utilization, memory, power, SM clock, PCIe, the target's GPU PIDs, GPM
SM activity / occupancy / tensor activity / DRAM bandwidth, and the tree's per-process SM %.

This is the only module of the package that imports ``pynvml`` (from ``nvidia-ml-py``), and
every per-device NVML call goes through one choke point, :meth:`NvmlSource._call`, which
turns a driver error on one field into ``None`` (absence, never zero) and a one-line reason,
while the other fields of that GPU are still reported. Errors that make NVML itself unusable
(no library, driver not loaded, GPU lost) become ``status = unavailable`` with a reason and a
hint instead.

NVML utilization (``nvmlDeviceGetUtilizationRates().gpu``) is the share of the sample period
in which at least one kernel ran: a stream of tiny kernels that occupy one SM each reads
100 %. GPM (GPU Performance Monitoring, Hopper and newer; ``nvmlGpmSampleGet`` at each
sample, ``nvmlGpmMetricsGet`` between two consecutive ones, as nvidia-ml-py and NVIDIA's
``nvml.h`` describe them) gives what util cannot: the share of SMs busy (``SM_UTIL``, what DCGM
calls SM activity), warp occupancy, tensor-core activity and DRAM bandwidth. Where GPM cannot
be read (an older GPU, a driver or bindings without it, MIG mode) those fields are ``None``
and :attr:`GpuSample.gpm_reason` says why; :attr:`NvmlSource.gpm_status` says it once for the
report's ``sources``.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import threading
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from torchwatch.model.readings import GpuSample, SourceStatus, Status
from torchwatch.sources import SourceSpec, set_interval

LIBRARY_NOT_FOUND = "NVML library not found (no NVIDIA driver)"
NO_GPU = "no NVIDIA GPU found"

# NVML errors after which no further call can succeed: the source stops, with the reason.
# Any other NVMLError (NotSupported, NoPermission, Unknown, ...) only blanks one field.
_FATAL = frozenset(
    f"NVMLError_{kind}"
    for kind in (
        "LibraryNotFound",
        "DriverNotLoaded",
        "Uninitialized",
        "LibRmVersionMismatch",
        "GpuIsLost",
        "ResetRequired",
    )
)

_HINTS = {
    "NVMLError_LibraryNotFound": (
        "install the NVIDIA driver to see GPU readings; on a CPU-only machine this is expected"
    ),
    "NVMLError_DriverNotLoaded": (
        "load the NVIDIA kernel module (does `nvidia-smi` work?); "
        "in a container, start it with GPU access (e.g. --gpus all)"
    ),
    "NVMLError_NoPermission": "give this user access to /dev/nvidia* (check with `nvidia-smi`)",
    "NVMLError_LibRmVersionMismatch": (
        "the driver was upgraded without a reboot: reboot or reload the nvidia kernel module"
    ),
    "NVMLError_GpuIsLost": "the GPU fell off the bus: check `dmesg` for Xid errors",
    "NVMLError_ResetRequired": "the GPU needs a reset (`nvidia-smi -r`) or a reboot",
}
_DEFAULT_HINT = "run `nvidia-smi` to check the NVIDIA driver"

_KIB = 1024  # NVML's PCIe "KB" is 1024 bytes
_MILLI = 1000.0  # NVML reports power in mW

# Why one field could not be read, by NVMLError class (others: the error's own message).
_FIELD_REASONS = {
    "NVMLError_NotSupported": "not supported by this GPU or driver",
    "NVMLError_NoPermission": "no permission to read it (root or access to /dev/nvidia* needed)",
    "NVMLError_FunctionNotFound": "not supported by this driver (too old for this NVML function)",
    "NVMLError_NotFound": "no sample since the last reading",
}
_NOT_IN_BINDINGS = "not in the installed nvidia-ml-py (pip install -U nvidia-ml-py)"
_NOT_IN_DRIVER = "not supported by this driver (too old for this NVML function)"

# GPM metrics read between two samples: (GpuSample field, pynvml metric id constant). All four
# are percentages 0..100 over the interval (pynvml's NVML_GPM_METRIC_* comments, nvml.h).
GPM_METRICS = (
    ("sm_active_pct", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_active_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("dram_bw_pct", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)
_GPM_API = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmMetricsGet")
# Two GPM samples closer than this are not turned into metrics: counters over a few ms are
# noise, and DCGM's profiling fields (the same counters) have a 100 ms minimum period too.
GPM_MIN_INTERVAL_S = 0.1
GPM_FIRST_SAMPLE = "first GPM sample: the metrics come with the next one"
GPM_HINT = (
    "without GPM, a profiler burst tells busy SMs from launch overhead: press b in the TUI, or torchwatch burst PID"
)
PROC_NOT_TREE = "no per-process sample for the training's PIDs (in a container NVML may list host PIDs)"


@dataclass
class _Gpm:
    """GPM state of one device: why it is not read (``None``: it is), and its two samples.

    ``samples[0]`` holds the previous sample (taken at ``prev_t``), ``samples[1]`` receives the
    next one; they swap after each metrics read, so only two buffers are ever allocated.
    """

    reason: str | None
    samples: list[Any] = field(default_factory=list)
    prev_t: float | None = None


class _NvmlLost(Exception):
    """NVML became unusable; carries the original NVMLError."""

    def __init__(self, err: BaseException) -> None:
        super().__init__(str(err))
        self.err = err


def _unavailable(err: BaseException, context: str) -> SourceStatus:
    """Build the ``unavailable`` status for an NVMLError, naming the error."""
    kind = type(err).__name__
    reason = LIBRARY_NOT_FOUND if kind == "NVMLError_LibraryNotFound" else f"{context}: {err}"
    return SourceStatus.unavailable(reason, _HINTS.get(kind, _DEFAULT_HINT))


class NvmlSource:
    """Reads every NVIDIA GPU through NVML, one :class:`GpuSample` per device and call.

    NVML is initialised once, in the constructor; when that fails (no driver, no permission,
    no device, ``pynvml`` not installed) ``status`` is ``unavailable`` with a reason and a
    hint, and :meth:`sample` returns ``[]``. Nothing raises out of this class for NVML errors.

    ``target_pids`` of a sample is the intersection of ``tree_pids()`` with the PIDs NVML
    lists as compute or graphics processes on that GPU. Inside a container NVML may list
    *host* PIDs (the container's PID namespace is not applied), so the intersection can be
    empty even though the target uses the GPU. No PID translation is guessed here: an empty
    ``target_pids`` on every GPU means "not found", and the features layer then uses all GPUs
    and says so.

    Attributes:
        name: ``"nvml"``, the key in the report's ``sources``.
        interval: seconds between two :meth:`sample` calls.
        status: ``starting`` until the first sample, then ``ok`` or ``unavailable``.
    """

    name = "nvml"

    def __init__(
        self,
        tree_pids: Callable[[], Collection[int]],
        interval: float = 1.0,
        nvml: Any | None = None,
    ) -> None:
        """Load NVML and find the devices.

        Args:
            tree_pids: returns the PIDs of the watched process tree; called once per sample.
            interval: seconds between two samples.
            nvml: a module with the ``pynvml`` API (tests pass a fake); default ``pynvml``.
        """
        self.interval = interval
        self.status = SourceStatus(Status.STARTING)
        self._tree_pids = tree_pids
        self._lock = threading.Lock()
        self._initialized = False
        self._closed = False
        self._devices: list[tuple[int, Any, str]] = []  # (index, handle, name)
        self._gpm: dict[int, _Gpm] = {}  # device index -> GPM state
        self._uuids: dict[int, str] = {}  # device index -> UUID (GPU-...), read once
        self._proc_seen: dict[int, int] = {}  # device index -> newest per-process sample timestamp, us
        self._nvml: Any = nvml
        if self._nvml is None:
            try:
                import pynvml  # type: ignore[import-untyped]
            except ImportError:
                self.status = SourceStatus.unavailable(
                    "NVML Python bindings not installed (no module pynvml)",
                    "pip install nvidia-ml-py",
                )
                return
            self._nvml = pynvml
        self._init()

    def _init(self) -> None:
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            self.status = _unavailable(err, "NVML init failed")
            return
        self._initialized = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
            for index in range(count):
                handle = self._query("nvmlDeviceGetHandleByIndex", index)
                if handle is None:  # e.g. NoPermission on a GPU this container may not use
                    continue
                raw = self._query("nvmlDeviceGetName", handle)
                name = str((raw.decode(errors="replace") if isinstance(raw, bytes) else raw) or f"GPU {index}")
                self._devices.append((index, handle, name))
                uuid = self._query("nvmlDeviceGetUUID", handle)
                if uuid is not None:
                    self._uuids[index] = str(uuid.decode(errors="replace") if isinstance(uuid, bytes) else uuid)
                self._gpm[index] = self._gpm_setup(handle, name)
        except _NvmlLost as lost:
            self.status = _unavailable(lost.err, "NVML stopped working")
            return
        except nvml.NVMLError as err:
            self.status = _unavailable(err, "NVML could not count the GPUs")
            return
        if count == 0:
            self.status = SourceStatus.unavailable(
                NO_GPU, "NVML sees no device: check `nvidia-smi`; in a container use --gpus all"
            )
        elif not self._devices:
            self.status = SourceStatus.unavailable(
                f"none of the {count} NVIDIA GPUs could be opened", _HINTS["NVMLError_NoPermission"]
            )

    def _call(self, func: str, *args: Any) -> tuple[Any, str | None]:
        """Call ``nvml.<func>(*args)``: the single choke point for per-device NVML calls.

        Returns:
            ``(result, None)``, or ``(None, reason)`` when this field cannot be read: reason is one
            line (``"not supported by this GPU or driver"``, ``"no permission ..."``, the function
            missing from old bindings or from the driver, or the NVMLError's own message).

        Raises:
            _NvmlLost: on an error after which NVML is unusable (GPU lost, driver gone).
        """
        nvml = self._nvml
        fn = getattr(nvml, func, None)
        if fn is None:
            return None, _NOT_IN_BINDINGS
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", ())
        try:
            return fn(*args), None
        except nvml.NVMLError as err:
            kind = type(err).__name__
            if kind in _FATAL:
                raise _NvmlLost(err) from err
            return None, _FIELD_REASONS.get(kind, str(err) or kind)
        except mismatch:  # unversioned function the installed driver lacks
            return None, _NOT_IN_DRIVER

    def _query(self, func: str, *args: Any) -> Any:
        """:meth:`_call`'s result alone: ``None`` when the field cannot be read."""
        return self._call(func, *args)[0]

    def _num(self, factor: float, func: str, *args: Any) -> float | None:
        """Read a numeric field through :meth:`_query`, times ``factor`` (to the unit named)."""
        value = self._query(func, *args)
        return None if value is None else float(value) * factor

    def _pids(self, handle: Any) -> set[int]:
        pids: set[int] = set()
        for kind in ("Compute", "Graphics"):
            func = f"nvmlDeviceGet{kind}RunningProcesses"
            pids.update(int(p.pid) for p in self._query(func, handle) or ())
        return pids

    # -- GPM ----------------------------------------------------------------------------------
    def _gpm_setup(self, h: Any, name: str) -> _Gpm:
        """Whether GPM can be read on this device; if so, allocate its two sample buffers."""
        nvml = self._nvml
        missing = [f for f in (*_GPM_API, "c_nvmlGpmMetricsGet_t") if getattr(nvml, f, None) is None]
        missing += [const for _, const in GPM_METRICS if getattr(nvml, const, None) is None]
        if missing:
            return _Gpm(f"GPM is {_NOT_IN_BINDINGS}")
        mode = self._query("nvmlDeviceGetMigMode", h)
        if isinstance(mode, (list, tuple)) and mode and mode[0] == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return _Gpm("the GPU is in MIG mode: GPM per MIG instance is not read")
        support, why = self._call("nvmlGpmQueryDeviceSupport", h)
        if support is None:
            return _Gpm(f"GPM {why}")
        if not getattr(support, "isSupportedDevice", 0):
            return _Gpm(f"GPM needs a Hopper or newer GPU (this is {name})")
        samples: list[Any] = []
        for _ in range(2):
            sample, why = self._call("nvmlGpmSampleAlloc")
            if sample is None:
                self._gpm_free(samples)
                return _Gpm(f"GPM sample buffer: {why}")
            samples.append(sample)
        return _Gpm(None, samples)

    def _gpm_free(self, samples: list[Any]) -> None:
        for sample in samples:
            with contextlib.suppress(_NvmlLost):
                self._call("nvmlGpmSampleFree", sample)
        samples.clear()

    def _gpm_read(self, gpm: _Gpm, h: Any, now: float) -> tuple[dict[str, float | None], str | None]:
        """Take a GPM sample; with the previous one, the four metrics over the interval.

        Returns:
            ``({field: % or None}, None)`` when read, else ``({}, reason)``.
        """
        if gpm.reason is not None or len(gpm.samples) != 2:
            return {}, gpm.reason or "GPM is not read on this GPU"
        prev, cur = gpm.samples
        _, why = self._call("nvmlGpmSampleGet", h, cur)
        if why is not None:
            gpm.prev_t = None  # the next good sample starts a new interval
            return {}, f"GPM sample failed: {why}"
        if gpm.prev_t is None:
            gpm.samples.reverse()
            gpm.prev_t = now
            return {}, GPM_FIRST_SAMPLE
        if now - gpm.prev_t < GPM_MIN_INTERVAL_S:
            return {}, f"GPM samples less than {GPM_MIN_INTERVAL_S * 1000:.0f} ms apart"
        nvml = self._nvml
        try:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1, request.sample2 = prev, cur
            for i, (_, const) in enumerate(GPM_METRICS):
                request.metrics[i].metricId = getattr(nvml, const)
            _, why = self._call("nvmlGpmMetricsGet", request)
            gpm.samples.reverse()
            gpm.prev_t = now
            if why is not None:
                return {}, f"GPM metrics failed: {why}"
            out: dict[str, float | None] = {}
            for i, (name, _) in enumerate(GPM_METRICS):
                metric = request.metrics[i]
                value = float(metric.value)
                ok = metric.nvmlReturn == nvml.NVML_SUCCESS and math.isfinite(value)
                out[name] = value if ok else None
        except (AttributeError, TypeError, ValueError, ctypes.ArgumentError) as exc:
            # bindings whose GPM structures differ from the ones this was written against: GPM off
            # on this device, the other readings go on (an exception here would stop the source)
            gpm.reason = f"GPM request not understood by these nvidia-ml-py bindings ({type(exc).__name__}: {exc})"
            return {}, gpm.reason
        return out, None

    def _proc_sm(self, index: int, h: Any, tree: set[int]) -> tuple[float | None, str | None]:
        """The tree's SM % on this GPU from NVML's per-process samples since the last read.

        ``nvmlDeviceGetProcessUtilization`` returns, per process, samples of ``smUtil``: the share
        of time one of its kernels ran (nvidia-smi pmon's ``sm%``). Each PID's samples are
        averaged, the tree's PIDs summed, capped at 100.
        """
        last = self._proc_seen.get(index, 0)
        samples, why = self._call("nvmlDeviceGetProcessUtilization", h, last)
        if samples is None:
            return None, f"per-process utilization: {why}"
        by_pid: dict[int, list[float]] = defaultdict(list)
        newest = last
        try:
            for s in samples:
                newest = max(newest, int(s.timeStamp))
                if int(s.pid) in tree:
                    by_pid[int(s.pid)].append(float(s.smUtil))
        except (AttributeError, TypeError, ValueError) as exc:  # samples not shaped as documented
            return None, f"per-process utilization not understood ({type(exc).__name__}: {exc})"
        self._proc_seen[index] = newest
        if not by_pid:
            return None, PROC_NOT_TREE
        return min(100.0, sum(sum(v) / len(v) for v in by_pid.values())), None

    @property
    def gpm_status(self) -> SourceStatus:
        """Whether GPM is read on at least one GPU; else why not (``sources.gpm`` in the report)."""
        with self._lock:
            if self.status.status is Status.STARTING:
                return SourceStatus(Status.STARTING)
            if self.status.status is not Status.OK:
                return SourceStatus.unavailable(f"needs NVML: {self.status.reason}", GPM_HINT)
            reasons = {i: g.reason for i, g in self._gpm.items()}
        if not reasons or any(r is None for r in reasons.values()):
            return SourceStatus.ok() if reasons else SourceStatus.unavailable("no GPU", GPM_HINT)
        distinct = set(reasons.values())
        text = distinct.pop() if len(distinct) == 1 else "; ".join(f"GPU {i}: {r}" for i, r in sorted(reasons.items()))
        return SourceStatus.unavailable(str(text), GPM_HINT)

    # -- one reading ----------------------------------------------------------------------------
    def _read(self, now: float, index: int, h: Any, name: str, tree: set[int]) -> GpuSample:
        nvml = self._nvml
        tx, rx = nvml.NVML_PCIE_UTIL_TX_BYTES, nvml.NVML_PCIE_UTIL_RX_BYTES
        util = self._query("nvmlDeviceGetUtilizationRates", h)
        mem = self._query("nvmlDeviceGetMemoryInfo", h)
        gpm, gpm_reason = self._gpm_read(self._gpm[index], h, now)
        proc_sm, proc_reason = self._proc_sm(index, h, tree)
        return GpuSample(
            t=now,
            index=index,
            name=name,
            util_pct=None if util is None else float(util.gpu),
            mem_used_bytes=None if mem is None else int(mem.used),
            mem_total_bytes=None if mem is None else int(mem.total),
            power_w=self._num(1 / _MILLI, "nvmlDeviceGetPowerUsage", h),
            power_limit_w=self._num(1 / _MILLI, "nvmlDeviceGetEnforcedPowerLimit", h),
            sm_clock_mhz=self._num(1.0, "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM),
            pcie_tx_bytes_per_s=self._num(_KIB, "nvmlDeviceGetPcieThroughput", h, tx),
            pcie_rx_bytes_per_s=self._num(_KIB, "nvmlDeviceGetPcieThroughput", h, rx),
            target_pids=tuple(sorted(tree & self._pids(h))),
            sm_active_pct=gpm.get("sm_active_pct"),
            sm_occupancy_pct=gpm.get("sm_occupancy_pct"),
            tensor_active_pct=gpm.get("tensor_active_pct"),
            dram_bw_pct=gpm.get("dram_bw_pct"),
            gpm_reason=gpm_reason,
            proc_sm_pct=proc_sm,
            uuid=self._uuids.get(index),
            proc_util_reason=proc_reason,
        )

    def sample(self, now: float) -> list[GpuSample]:
        """Read every GPU once.

        Args:
            now: timestamp for the readings, ``time.monotonic()`` seconds.

        Returns:
            One :class:`GpuSample` per device (a field NVML cannot give is ``None``), or ``[]``
            when NVML is unavailable, was lost during this call, or the source is closed.
        """
        with self._lock:
            if self._closed or self.status.status is Status.UNAVAILABLE:
                return []
            tree = set(self._tree_pids())
            try:
                out = [self._read(now, i, h, name, tree) for i, h, name in self._devices]
            except _NvmlLost as lost:
                self.status = _unavailable(lost.err, "NVML stopped working")
                return []
            self.status = SourceStatus.ok()
            return out

    def close(self) -> None:
        """Shut NVML down once if it was initialised. Idempotent; never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._initialized:
                for gpm in self._gpm.values():
                    self._gpm_free(gpm.samples)
                # already unusable (GPU lost, driver unloaded): nothing to release
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlShutdown()


# NVML may block in the driver: a thread of its own, each second fast, every 2 s steady; off with
# --no-nvml. Its GPM status ("gpm") is reported beside its own; once unavailable it never comes back.
SPEC = SourceSpec(
    name="nvml",
    readings=(GpuSample,),
    make=lambda ctx: NvmlSource(ctx.tree.pids) if ctx.options.nvml else None,
    ticked=False,
    words=("nvml",),
    fast=lambda options: {"interval_s": 1.0},
    steady=lambda fast, window_s: {"interval_s": max(fast["interval_s"], 2.0)},
    apply=set_interval,
    statuses=lambda src: {"gpm": src.gpm_status},
    final_unavailable=True,
)

"""NVML source: per-GPU utilization, memory, power, SM clock, PCIe and the target's GPU PIDs.

This is the only module of the package that imports ``pynvml`` (from ``nvidia-ml-py``), and
every per-device NVML call goes through one choke point, :meth:`NvmlSource._query`, which
turns a driver error on one field into ``None`` (absence, never zero) while the other fields
of that GPU are still reported. Errors that make NVML itself unusable (no library, driver not
loaded, GPU lost) become ``status = unavailable`` with a reason and a hint instead.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection
from typing import Any

from torchwatch.readings import GpuSample, SourceStatus, Status

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
                name = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
                self._devices.append((index, handle, str(name or f"GPU {index}")))
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

    def _query(self, func: str, *args: Any) -> Any:
        """Call ``nvml.<func>(*args)``: the single choke point for per-device NVML calls.

        Returns:
            The call's result, or ``None`` when this field cannot be read (NotSupported,
            NoPermission, any non-fatal NVMLError, a function missing from old bindings).

        Raises:
            _NvmlLost: on an error after which NVML is unusable (GPU lost, driver gone).
        """
        nvml = self._nvml
        fn = getattr(nvml, func, None)
        if fn is None:
            return None
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", ())
        try:
            return fn(*args)
        except nvml.NVMLError as err:
            if type(err).__name__ in _FATAL:
                raise _NvmlLost(err) from err
            return None
        except mismatch:  # unversioned function the installed driver lacks
            return None

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

    def _read(self, now: float, index: int, h: Any, name: str, tree: set[int]) -> GpuSample:
        nvml = self._nvml
        tx, rx = nvml.NVML_PCIE_UTIL_TX_BYTES, nvml.NVML_PCIE_UTIL_RX_BYTES
        util = self._query("nvmlDeviceGetUtilizationRates", h)
        mem = self._query("nvmlDeviceGetMemoryInfo", h)
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
                # already unusable (GPU lost, driver unloaded): nothing to release
                with contextlib.suppress(self._nvml.NVMLError):
                    self._nvml.nvmlShutdown()

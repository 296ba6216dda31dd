"""What the hook reads of the training's GPU side: device memory and the settings a fix quotes.

Standard library only; ``torch`` is the training's own module, used duck-typed (tests pass a
fake ``torch.cuda`` surface). Read in the training's main thread at an optimizer step, at most
every :data:`SAMPLE_EVERY_S` (``bench/hook_cost.py`` prints the cost per step).

Device memory is read only when the training has initialised CUDA itself
(``torch.cuda.is_initialized()``): the hook never creates a CUDA context, which would take
hundreds of MB of device memory and seconds in a process that may never use the GPU.
``torch.cuda.memory_stats_as_nested_dict`` returns ``{}`` on an uninitialised process and
``get_device_properties`` initialises CUDA, so both are called only after that check.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .. import wire

SAMPLE_EVERY_S = 0.5
"""Seconds between two reads at step boundaries: the Memory panel's trend needs about one point
per second (torchwatch's tick), and a read costs tens of microseconds per device."""

_MIB = 1 << 20
ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _stat(stats: Any, name: str, kind: str) -> int | None:
    """``stats[name]["all"][kind]`` of ``torch.cuda.memory_stats_as_nested_dict`` (the
    ``{name}.all.{kind}`` key of ``memory_stats``), or ``None`` when absent or not a count."""
    try:
        return _count(stats[name]["all"][kind])
    except (KeyError, TypeError):
        return None


def cuda_initialized(torch: Any) -> bool:
    """Whether the training initialised CUDA (never initialises it); ``False`` on any error."""
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def read_settings(torch: Any, optimizer: Any) -> wire.GpuSettings:
    """TF32, cuDNN, compile, optimizer and allocator settings, each ``None`` when it cannot be
    read (a torch without the attribute). Attribute reads only: about 2 us in all.

    Args:
        torch: the training's ``torch`` module. optimizer: the stepped optimizer, or ``None``.
    """
    precision: str | None = None
    try:
        value = torch.get_float32_matmul_precision()
        precision = value if value in wire.FLOAT32_PRECISIONS else None
    except Exception:
        pass
    backends = getattr(torch, "backends", None)
    matmul = getattr(getattr(backends, "cuda", None), "matmul", None)
    cudnn = getattr(backends, "cudnn", None)

    def attr(obj: Any, name: str) -> bool | None:
        try:
            return _flag(getattr(obj, name, None)) if obj is not None else None
        except Exception:  # a property of a torch build without CUDA may raise
            return None

    group: Any = None
    if optimizer is not None:
        groups = getattr(optimizer, "param_groups", None)
        group = groups[0] if isinstance(groups, list) and groups and isinstance(groups[0], dict) else None
        group = group if group is not None else getattr(optimizer, "defaults", None)
    group = group if isinstance(group, dict) else {}
    conf = os.environ.get(ALLOC_CONF_ENV)
    return wire.GpuSettings(
        float32_matmul_precision=precision,
        matmul_allow_tf32=attr(matmul, "allow_tf32"),
        cudnn_allow_tf32=attr(cudnn, "allow_tf32"),
        cudnn_benchmark=attr(cudnn, "benchmark"),
        compiled=_compiled(),
        optimizer=None if optimizer is None else wire.clean_text(type(optimizer).__name__, 64),
        optimizer_foreach=_flag(group.get("foreach")),
        optimizer_fused=_flag(group.get("fused")),
        alloc_conf=None if conf is None else wire.clean_text(conf, wire.TEXT),
    )


def _compiled() -> bool:
    """Whether ``torch.compile`` compiled a graph in this process: ``torch._dynamo`` counts the
    graphs it made in ``torch._dynamo.utils.counters["stats"]["unique_graphs"]``. Not imported:
    nothing was compiled (``torch.compile`` imports it). Read without creating a key."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if not isinstance(counters, dict):
        return False
    stats = counters.get("stats")
    try:
        return bool(stats and int(stats.get("unique_graphs", 0)) > 0)
    except Exception:
        return False


class GpuWatch:
    """The hook's GPU readings: the last device memory and settings read, and when to read again.

    Attributes:
        memory: the current device's allocator (``None``: CUDA not initialised, or not read yet).
        devices: every device the training holds memory on (the current one always), at most
            :data:`wire.MAX_DEVICES`.
        settings: the settings last read (``None``: not read yet).
        errors: the first failure of a read, if any (the hook records it once).
    """

    def __init__(self) -> None:
        self.memory: wire.DeviceMemory | None = None
        self.devices: tuple[wire.DeviceMemory, ...] = ()
        self.settings: wire.GpuSettings | None = None
        self.error: str | None = None
        self._next_t = 0.0
        self._capacity: dict[int, int] = {}

    def due(self, now: float) -> bool:
        """Whether a step at ``now`` (monotonic s) should read (at most every :data:`SAMPLE_EVERY_S`)."""
        return now >= self._next_t

    def sample(self, torch: Any, optimizer: Any, now: float) -> bool:
        """Read settings, and device memory when CUDA is initialised. Never raises.

        Returns:
            whether what ``hook.json`` shows changed (a setting, or a memory figure by more
            than 1 MiB and 1 %), so the caller republishes only then.
        """
        self._next_t = now + SAMPLE_EVERY_S
        changed = False
        try:
            settings = read_settings(torch, optimizer)
            changed = settings != self.settings
            self.settings = settings
            if cuda_initialized(torch):
                devices = self._read_memory(torch.cuda, now)
                changed = changed or _moved(self.devices, devices)
                if changed:
                    self.devices = devices
                    self.memory = devices[0] if devices else None
        except Exception as exc:
            if self.error is None:
                self.error = f"GPU readings: {exc!r}"
                return True
        return changed

    def _read_memory(self, cuda: Any, now: float) -> tuple[wire.DeviceMemory, ...]:
        """The current device first, then the others the process holds memory on."""
        current = int(cuda.current_device())
        count = int(cuda.device_count())
        order = [current] + [d for d in range(min(count, wire.MAX_DEVICES + 1)) if d != current]
        out: list[wire.DeviceMemory] = []
        for dev in order:
            # the nested form: memory_stats() flattens and sorts the same dict, ~200 us more a read
            stats = cuda.memory_stats_as_nested_dict(dev)
            reserved = _stat(stats, "reserved_bytes", "current") or 0
            if dev != current and not reserved:
                continue  # no allocation there: not a device this process uses
            cap = self._capacity.get(dev)
            if cap is None:
                # safe only now: get_device_properties initialises CUDA on a process that has not
                cap = _count(getattr(cuda.get_device_properties(dev), "total_memory", None)) or 0
                self._capacity[dev] = cap
            out.append(
                wire.DeviceMemory(
                    device=dev,
                    allocated_bytes=_stat(stats, "allocated_bytes", "current") or 0,
                    reserved_bytes=reserved,
                    peak_bytes=_stat(stats, "allocated_bytes", "peak"),
                    capacity_bytes=cap or None,
                    alloc_retries=_count(stats.get("num_alloc_retries")),
                    t=round(now, 3),
                )
            )
            if len(out) >= wire.MAX_DEVICES:
                break
        return tuple(out)


def _moved(old: tuple[wire.DeviceMemory, ...], new: tuple[wire.DeviceMemory, ...]) -> bool:
    """Whether ``new`` differs from ``old`` enough to republish: another device set, new
    allocation retries, or a figure that moved by more than 1 MiB and 1 %."""
    if [d.device for d in old] != [d.device for d in new]:
        return True
    for a, b in zip(old, new, strict=True):
        if a.alloc_retries != b.alloc_retries:
            return True
        for x, y in ((a.allocated_bytes, b.allocated_bytes), (a.reserved_bytes, b.reserved_bytes),
                     (a.peak_bytes or 0, b.peak_bytes or 0)):  # fmt: skip
            if abs(x - y) > max(_MIB, 0.01 * max(x, y)):
                return True
    return False

"""The training's GPUs as ``hook.json`` carries them: the CUDA caching allocator of each device
(:class:`DeviceMemory`), the last CUDA out-of-memory error (:class:`OomRecord`) and the settings a
GPU fix quotes (:class:`GpuSettings`). The hook never creates a CUDA context: all are optional."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import _TIME_MAX, _U63, NAME, TEXT, _int_item, _Obj, _text_item

__all__ = [
    "FLOAT32_PRECISIONS",
    "MAX_DEVICES",
    "MAX_OOM_BLOCKS",
    "MAX_OOM_FRAMES",
    "DeviceMemory",
    "GpuSettings",
    "OomRecord",
]


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


MAX_OOM_FRAMES = 16
MAX_OOM_BLOCKS = 8


@dataclass(frozen=True)
class OomRecord:
    """What the hook recorded when the CUDA caching allocator ran out of memory (its
    out-of-memory observer, called just before ``torch.cuda.OutOfMemoryError`` is raised: the
    hook records, it never catches or changes the error). Optional in ``hook.json``; added.

    Attributes:
        t: when, monotonic s. count: out-of-memory errors seen in this process so far (a training
            that catches the error and goes on can have several).
        device: the CUDA device index. requested_bytes: the allocation that failed, bytes.
        device_total_bytes / device_free_bytes: the device's memory (or the allocator's limit from
            ``set_per_process_memory_fraction``) and what CUDA said was free, bytes.
        allocated_bytes / reserved_bytes / peak_bytes / active_bytes: ``memory_stats`` at that moment
            (``allocated_bytes.all.current``, ``reserved_bytes.all.current``, ``.peak``,
            ``active_bytes.all.current``), bytes. inactive_split_bytes: reserved but unallocated
            inside split segments (fragmentation), bytes. alloc_retries / ooms: ``num_alloc_retries``
            / ``num_ooms``.
        segments: segments the allocator holds (``torch.cuda.memory._snapshot``); largest_free_bytes:
            the largest free block inside them, bytes; largest_active: the largest blocks in use,
            bytes, at most :data:`MAX_OOM_BLOCKS`. snapshot_ms: what taking and summarising the
            snapshot cost at the error, ms (``None``: not taken).
        step: the optimizer steps done before the error. step_ms: the last steps' durations, ms.
        stack: the Python stack that asked for the memory, ``file:line function``, innermost last,
            at most :data:`MAX_OOM_FRAMES`. thread: that thread's name.
    """

    t: float
    count: int
    device: int
    requested_bytes: int
    device_total_bytes: int | None = None
    device_free_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    peak_bytes: int | None = None
    active_bytes: int | None = None
    inactive_split_bytes: int | None = None
    alloc_retries: int | None = None
    ooms: int | None = None
    segments: int | None = None
    largest_free_bytes: int | None = None
    largest_active: tuple[int, ...] = ()
    snapshot_ms: float | None = None
    step: int | None = None
    step_ms: tuple[float, ...] = ()
    stack: tuple[str, ...] = ()
    thread: str = ""

    @classmethod
    def decode(cls, value: object, where: str) -> OomRecord:
        """Raises: WireError."""
        o = _Obj(value, where)

        def size(key: str) -> Any:
            return o.integer(key, 0, _U63, optional=True)

        return cls(
            t=o.number("t", 0.0, _TIME_MAX),
            count=o.integer("count", 1, _U63),
            device=o.integer("device", 0, 1 << 16),
            requested_bytes=o.integer("requested_bytes", 0, _U63),
            device_total_bytes=size("device_total_bytes"),
            device_free_bytes=size("device_free_bytes"),
            allocated_bytes=size("allocated_bytes"),
            reserved_bytes=size("reserved_bytes"),
            peak_bytes=size("peak_bytes"),
            active_bytes=size("active_bytes"),
            inactive_split_bytes=size("inactive_split_bytes"),
            alloc_retries=size("alloc_retries"),
            ooms=size("ooms"),
            segments=size("segments"),
            largest_free_bytes=size("largest_free_bytes"),
            largest_active=tuple(_int_item(v, w) for v, w in o.items("largest_active", MAX_OOM_BLOCKS)),
            snapshot_ms=o.number("snapshot_ms", 0.0, 1e7, optional=True),
            step=o.integer("step", 0, _U63, optional=True),
            step_ms=o.floats("step_ms", 16, 0.0, 1e9),
            stack=tuple(_text_item(v, w) for v, w in o.items("stack", MAX_OOM_FRAMES)),
            thread=o.text("thread", NAME, optional=True) or "",
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object (fields that are unknown are left out)."""
        out: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            if v is None or v == () or v == "":
                continue
            out[k] = list(v) if isinstance(v, tuple) else v
        return out


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

"""The GPUs the training uses (NVML readings), its device memory (hook) and its GPU settings."""

from __future__ import annotations

from collections.abc import Sequence

from torchwatch.analysis.features.catalogue import Features
from torchwatch.analysis.features.common import _flag, _mean, _num, _pct_share
from torchwatch.analysis.features.steps import Step, step
from torchwatch.analysis.store import Window
from torchwatch.model.readings import GpuSample, HookState
from torchwatch.wire import GpuSettings


def gpus_in_use(gpus: Sequence[GpuSample]) -> list[GpuSample]:
    """The readings of the GPUs the training uses (a process of the tree holds a context on them),
    or of every GPU when it uses none yet: the one choice behind every GPU feature and panel."""
    used = {g.index for g in gpus if g.target_pids}
    return [g for g in gpus if not used or g.index in used]


def _gpu_features(window: Window) -> Features:
    """GPU readings over the window, on the GPUs the training uses (all GPUs when none is known to be).

    GPM means are over the samples that carried a GPM reading; a GPU without GPM leaves them ``None``,
    never 0 (its reason is in the sample and in ``sources.gpm``).
    """
    samples = gpus_in_use(window.gpus)
    ratios = [g.power_w / g.power_limit_w for g in samples if g.power_w is not None and g.power_limit_w]
    mems = [g.mem_used_bytes / g.mem_total_bytes for g in samples if g.mem_used_bytes is not None and g.mem_total_bytes]
    return {
        "gpu_count": float(len({g.index for g in samples})) if samples else None,
        "gpu_util_mean": _mean(g.util_pct for g in samples),
        "gpu_power_ratio": _mean(ratios),
        "gpu_mem_ratio": max(mems) if mems else None,
        "gpu_sm_active_mean": _pct_share(g.sm_active_pct for g in samples),
        "gpu_sm_occupancy_mean": _pct_share(g.sm_occupancy_pct for g in samples),
        "gpu_tensor_active_mean": _pct_share(g.tensor_active_pct for g in samples),
        "gpu_dram_bw_mean": _pct_share(g.dram_bw_pct for g in samples),
        "gpu_proc_sm_pct": _mean(g.proc_sm_pct for g in samples),
    }


def _device_memory_features(reads: Sequence[HookState]) -> Features:
    """The caching allocator of the training's current device over the window (hook readings).

    The hook reads at optimizer steps, when the step's activations are freed: ``allocated`` is
    then at its lowest and ``reserved - allocated`` is mostly cache the next forward reuses, not
    waste. The waste is what the training never needed at once: ``reserved - peak allocated``
    (what PyTorch's out-of-memory message calls "reserved by PyTorch but unallocated"). Taking
    its least value over the window keeps a one-read spike from counting.
    """
    mems = [r.record.device_memory for r in reads if r.record is not None and r.record.device_memory is not None]
    if not mems:
        return {}
    last = mems[-1]
    cap = last.capacity_bytes
    reserved = max(m.reserved_bytes for m in mems)
    peak = max(m.peak_bytes if m.peak_bytes is not None else m.allocated_bytes for m in mems)
    unused = min(max(0, m.reserved_bytes - (m.peak_bytes or m.allocated_bytes)) for m in mems)
    retries = [m.alloc_retries for m in mems if m.alloc_retries is not None]
    return {
        "cuda_mem_allocated_bytes": float(last.allocated_bytes),
        "cuda_mem_reserved_bytes": float(reserved),
        "cuda_mem_peak_bytes": float(peak),
        "cuda_mem_capacity_bytes": _num(cap),
        "cuda_mem_peak_ratio": max(peak, reserved) / cap if cap else None,
        "cuda_mem_unused_reserved_bytes": float(unused),
        "cuda_mem_unused_reserved_share": unused / last.reserved_bytes if last.reserved_bytes else None,
        # hook.json is rewritten when the count grows, so the window's first and last reads bound it
        "cuda_alloc_retries": float(retries[-1] - retries[0]) if retries else None,
    }


def _gpu_setting_features(settings: GpuSettings | None) -> Features:
    """The GPU settings the hook read, as flags (``None``: not read, never guessed)."""
    if settings is None:
        return {}
    precision = settings.float32_matmul_precision
    tf32 = None
    if precision is not None or settings.matmul_allow_tf32 is not None:
        tf32 = float(precision in ("high", "medium") or bool(settings.matmul_allow_tf32))
    conf = settings.alloc_conf
    optimizer = settings.optimizer is not None
    return {
        "tf32_matmul": tf32,
        "cudnn_benchmark": _flag(settings.cudnn_benchmark),
        "model_compiled": _flag(settings.compiled),
        "optimizer_fused": float(bool(settings.optimizer_fused)) if optimizer else None,
        "optimizer_foreach": float(bool(settings.optimizer_foreach)) if optimizer else None,
        "alloc_expandable_segments": float("expandable_segments:true" in (conf or "").replace(" ", "").lower()),
    }


GPU_FEATURES = (
    "gpu_count", "gpu_util_mean", "gpu_power_ratio", "gpu_mem_ratio", "gpu_proc_sm_pct", "gpu_sm_active_mean",
    "gpu_sm_occupancy_mean", "gpu_tensor_active_mean", "gpu_dram_bw_mean",
)  # fmt: skip
DEVICE_MEMORY_FEATURES = (
    "cuda_mem_allocated_bytes", "cuda_mem_reserved_bytes", "cuda_mem_peak_bytes", "cuda_mem_capacity_bytes",
    "cuda_mem_peak_ratio", "cuda_mem_unused_reserved_bytes", "cuda_mem_unused_reserved_share", "cuda_alloc_retries",
)  # fmt: skip
"""Made by the hook's step (:func:`_device_memory_features`), from its readings."""
GPU_SETTING_FEATURES = (
    "tf32_matmul", "cudnn_benchmark", "model_compiled", "optimizer_fused", "optimizer_foreach",
    "alloc_expandable_segments",
)  # fmt: skip
"""Made by the hook's step (:func:`_gpu_setting_features`), from its record."""

STEPS: tuple[Step, ...] = (step("gpu", lambda w, pid, f: _gpu_features(w), GPU_FEATURES),)
"""The GPUs' NVML (and GPM) readings."""

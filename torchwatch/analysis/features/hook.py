"""What the hook measured in the training: steps, step time, DataLoader wait and settings, AMP,
threads and the last burst's breakdown."""

from __future__ import annotations

import statistics

from torchwatch.analysis.features.catalogue import Features
from torchwatch.analysis.features.common import _num, _percentile
from torchwatch.analysis.features.gpu import (
    DEVICE_MEMORY_FEATURES,
    GPU_SETTING_FEATURES,
    _device_memory_features,
    _gpu_setting_features,
)
from torchwatch.analysis.features.steps import Step, step
from torchwatch.analysis.store import Window
from torchwatch.model.readings import HookState

HOOK_FEATURES = (
    "loop_started", "hook_steps_per_s", "step_time_p50_ms", "step_time_p95_ms", "data_wait_fraction",
    "dl_num_workers", "dl_batch_size", "dl_pin_memory", "dl_prefetch_factor", "dl_persistent_workers",
    "dl_batch_bytes", "amp_enabled", "shm_bytes", "intra_op_threads", "interop_threads", "burst_age_s",
    "burst_dataloader_share", "burst_cpu_exec_share", "burst_kernel_share", "burst_gpu_idle_share",
    "burst_sync_per_step", "burst_cpu_ops_per_step", "burst_short_kernel_share", "burst_kernels_per_step",
    "burst_host_wait_share", "burst_kernel_wait_share", "burst_pageable_h2d_per_step",
    "burst_pageable_h2d_bytes_per_step", "burst_pageable_h2d_share",
    *DEVICE_MEMORY_FEATURES, *GPU_SETTING_FEATURES,
)  # fmt: skip
"""What :func:`_hook_features` makes (each ``None`` until read)."""


def _hook_features(window: Window, main_pid: int | None) -> Features:
    """Measured in the training process: steps, step time, DataLoader wait and settings, AMP.

    Step time is optimizer step to optimizer step (``register_optimizer_step_post_hook``); data
    wait is wall time inside DataLoader ``__next__``, including a ``__next__`` still running at
    the last read (a stall shows while it lasts).
    """
    reads = [h for h in window.hook if main_pid is None or h.pid == main_pid]
    out: Features = dict.fromkeys(HOOK_FEATURES)
    if not reads:
        return out
    first, last = reads[0], reads[-1]
    span = last.t - first.t
    steps = [e for h in reads for e in h.new_steps if window.start <= e[0] <= window.end]
    out["loop_started"] = float(bool(last.steps or last.first_step_t or last.batches or last.in_next_since))
    if span >= 1.0 and last.steps > 0:
        out["hook_steps_per_s"] = (last.steps - first.steps) / span
    if len(steps) >= 2:
        durations = [e[1] * 1000.0 for e in steps]
        out["step_time_p50_ms"] = statistics.median(durations)
        out["step_time_p95_ms"] = _percentile(durations, 0.95)

    def waited(h: HookState) -> float:
        return h.data_wait_s + (max(0.0, h.t - h.in_next_since) if h.in_next_since else 0.0)

    if span >= 1.0 and (last.batches > 0 or last.in_next_since):
        out["data_wait_fraction"] = max(0.0, min(1.0, (waited(last) - waited(first)) / span))
    rec = last.record
    if rec is None:
        return out
    if rec.dataloaders:
        dl = rec.dataloaders[0]  # the most-used loader comes first
        out["dl_num_workers"] = float(dl.num_workers)
        out["dl_batch_size"] = _num(dl.batch_size)
        out["dl_pin_memory"] = float(dl.pin_memory)
        out["dl_prefetch_factor"] = _num(dl.prefetch_factor)
        out["dl_persistent_workers"] = float(dl.persistent_workers)
        out["dl_batch_bytes"] = _num(dl.batch_bytes)
    if rec.torch:
        out["amp_enabled"] = float(rec.amp.autocast)
    out["shm_bytes"] = _num(rec.shm_bytes)
    out.update(_device_memory_features(reads))
    out.update(_gpu_setting_features(rec.gpu_settings))
    if rec.threads is not None:
        out["intra_op_threads"] = _num(rec.threads.intra_op)
        out["interop_threads"] = _num(rec.threads.inter_op)
    lb = rec.burst.last if rec.burst is not None else None
    if lb is not None and lb.error is None and lb.breakdown_share:
        share = dict(lb.breakdown_share)
        out["burst_age_s"] = None if lb.started_at is None else max(0.0, last.t - lb.started_at)
        out["burst_dataloader_share"] = share.get("dataloader")
        out["burst_cpu_exec_share"] = share.get("cpu_exec")
        out["burst_kernel_share"] = share.get("kernel")
        out["burst_gpu_idle_share"] = lb.gpu_idle_share
        out["burst_sync_per_step"] = lb.sync_calls_per_step
        out["burst_cpu_ops_per_step"] = lb.cpu_ops_per_step
        out["burst_short_kernel_share"] = lb.short_kernel_share
        out["burst_kernels_per_step"] = lb.kernels_per_step
        split = dict(lb.gpu_idle_split_share)
        out["burst_host_wait_share"] = split.get("host_wait")
        out["burst_kernel_wait_share"] = split.get("kernel_wait")
        out["burst_pageable_h2d_per_step"] = lb.pageable_h2d_copies_per_step
        out["burst_pageable_h2d_bytes_per_step"] = lb.pageable_h2d_bytes_per_step
        copy_ms, step_ms = lb.pageable_h2d_ms_per_step, lb.step_time_ms
        out["burst_pageable_h2d_share"] = None if copy_ms is None or not step_ms else min(1.0, copy_ms / step_ms)
    return out


STEPS: tuple[Step, ...] = (step("hook", lambda w, pid, f: _hook_features(w, pid), HOOK_FEATURES),)
"""What the hook measured and read in the training."""

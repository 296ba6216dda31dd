"""Features: pure functions from a :class:`~torchwatch.analysis.store.Window` to named numbers.

Every feature is declared once in :data:`CATALOGUE` with its unit and source; a value that
cannot be computed (source unavailable, too few samples) is ``None``, never 0.

Shares are fractions of the training loop's wall time, 0..1. "The loop" is the main thread
of the first training process (rank). Stack shares come from py-spy; thread-state shares
come from ``/proc`` sampled independently at 10 Hz. The two are joined by attribution:
with ``num_workers=0`` the DataLoader runs in the main thread, so its disk, sleep and socket
waits are counted against the time the stacks show in the DataLoader first (see
:func:`_attribute_fetch`).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from torchwatch.analysis import producers, stacks
from torchwatch.analysis import progress as _progress
from torchwatch.analysis.store import Window
from torchwatch.model.observation import FeatureSpec
from torchwatch.model.peaks import flop_rate
from torchwatch.model.readings import GpuSample, HookState, Role, ThreadSample, Wait
from torchwatch.wire import CompileEvent, CompileInfo, GpuSettings, HookRecord, RankStep

MIN_STACK_SAMPLES = 20  # below this many loop samples the stack shares are None (1 s at 20 Hz)
MIN_THREAD_SAMPLES = 10  # below this many main-thread state samples the state shares are None


def _specs(*rows: tuple[str, str, str, str]) -> dict[str, FeatureSpec]:
    return {r[0]: FeatureSpec(*r) for r in rows}


PRODUCER_CATALOGUE: tuple[tuple[str, str, str, str], ...] = (
    (
        "producer_wait_share",
        "share",
        "py-spy",
        "loop time waiting for data handed over by another thread or process of the training outside the "
        "DataLoader (a queue.Queue, a condition, a pipe, a multiprocessing queue: torchwatch.analysis.producers)",
    ),
    ("producer_thread_wait_share", "share", "py-spy", "of that, waiting on a thread of the training process"),
    ("producer_process_wait_share", "share", "py-spy", "of that, waiting on another process (pipe, multiprocessing)"),
    (
        "producer_cpu_share",
        "share",
        "py-spy+proc",
        "the producers' CPU, share of wall time (summed, at most 1): the process's other Python threads not "
        "running the model (schedstat), or the tree's other processes for a wait on a process",
    ),
    ("producer_count", "count", "py-spy+proc", "producer threads or processes busy >= 5 % of the window"),
)
"""The features of :mod:`torchwatch.analysis.producers` (data from a hand-written producer)."""


CATALOGUE: dict[str, FeatureSpec] = _specs(
    ("stack_samples", "count", "py-spy", "main-thread samples of the loop in the window (startup excluded)"),
    ("startup_share", "share", "py-spy", "main-thread samples spent importing modules"),
    (
        "data_wait_share",
        "share",
        "py-spy",
        "loop time inside a DataLoader iterator (__next__ / __iter__); the hook's measurement when present",
    ),
    (
        "data_wait_queue_share",
        "share",
        "py-spy",
        "loop time waiting on DataLoader worker processes (scaled to the hook's measured wait)",
    ),
    (
        "data_wait_fetch_share",
        "share",
        "py-spy",
        "loop time running the dataset / collate in the main thread (scaled to the hook's measured wait)",
    ),
    ("data_wait_start_share", "share", "py-spy", "loop time starting DataLoader workers"),
    ("forward_share", "share", "py-spy", "loop time in nn.Module calls"),
    ("backward_share", "share", "py-spy", "loop time in autograd backward"),
    ("optimizer_share", "share", "py-spy", "loop time in torch.optim (step, zero_grad)"),
    ("other_code_share", "share", "py-spy", "loop time in other code (user Python, direct tensor ops)"),
    ("thread_samples", "count", "proc", "main-thread state samples in the window"),
    (
        "main_running_share",
        "share",
        "proc",
        "main thread on a CPU (schedstat run time; state R where the counters are missing), less kernel "
        "time of reads, plus the time its autograd engine thread computed backward while it waited; "
        "waiting for a CPU is main_runqueue_share, not this",
    ),
    (
        "main_disk_share",
        "share",
        "proc",
        "main thread on storage: state D or a file read, plus the kernel CPU of those reads",
    ),
    ("main_sys_share", "share", "proc", "main thread in kernel mode (stime / wall time)"),
    ("main_runqueue_share", "share", "proc", "main thread ready to run but waiting for a CPU (schedstat)"),
    (
        "threads_runqueue_share",
        "share",
        "proc",
        "the training process's thread that waited most for a CPU (intra-op threads meet at a barrier in "
        "every op: the slowest to get a CPU holds the step), of threads busy >= 10 % of the window (schedstat)",
    ),
    ("main_sleep_share", "share", "proc", "main thread in a timer sleep (nanosleep)"),
    (
        "main_sync_share",
        "share",
        "proc",
        "main thread waiting on another thread or process (futex, poll, pipe), less the time its autograd "
        "engine thread computed backward for it",
    ),
    (
        "autograd_running_share",
        "share",
        "proc",
        "the training's autograd engine threads (pt_autograd_N: backward of CUDA tensors) on a CPU or runnable",
    ),
    ("main_net_share", "share", "proc", "main thread blocked reading a socket"),
    ("worker_count", "count", "psutil", "DataLoader worker processes alive now"),
    (
        "workers_running_fraction",
        "share",
        "proc",
        "of the workers' producing time, the part on a CPU or waiting for one",
    ),
    ("workers_runqueue_fraction", "share", "proc", "of the workers' producing time, the part waiting for a CPU"),
    (
        "cpu_wait_share",
        "share",
        "proc",
        "loop time lost waiting for a CPU: the largest of its own thread's and its intra-op threads' run-queue "
        "share, and its wait on workers times the workers' run-queue fraction (schedstat)",
    ),
    ("workers_disk_fraction", "share", "proc", "of the workers' producing time, the part blocked on storage"),
    ("workers_other_wait_fraction", "share", "proc", "of the workers' producing time, sleeping or on sockets"),
    ("workers_busy_share", "share", "proc", "workers' main threads producing (not idle on their index queue)"),
    ("fetch_cpu_share", "share", "py-spy+proc", "loop time the main thread computes samples (num_workers=0)"),
    ("fetch_disk_share", "share", "py-spy+proc", "loop time the main thread reads storage inside the DataLoader"),
    (
        "fetch_other_wait_share",
        "share",
        "py-spy+proc",
        "loop time the main thread sleeps / reads sockets inside the DataLoader",
    ),
    (
        "input_cpu_share",
        "share",
        "py-spy+proc",
        "loop time lost to CPU work of the data pipeline (main thread or workers)",
    ),
    ("storage_wait_share", "share", "py-spy+proc", "loop time lost to storage reads (main thread or workers)"),
    ("storage_wait_async_share", "share", "py-spy+proc", "loop time waiting on workers that wait on storage"),
    ("input_other_wait_share", "share", "py-spy+proc", "loop time lost to data-pipeline sleeps / socket reads"),
    ("loop_cpu_share", "share", "py-spy+proc", "main thread on CPU outside the data pipeline"),
    ("main_cpu_pct", "%", "psutil", "training process CPU, % of one core (all its threads)"),
    ("workers_cpu_pct", "%", "psutil", "all DataLoader workers' CPU, % of one core"),
    ("workers_cpu_fraction", "share", "psutil", "the workers' part of the training's CPU (main process + workers)"),
    ("tree_cpu_saturation", "share", "psutil", "the training's CPU (main process + workers) / usable CPUs"),
    ("read_bytes_per_s", "bytes/s", "psutil", "storage reads of the whole tree"),
    ("rss_bytes", "bytes", "psutil", "resident memory of the whole tree"),
    ("system_cpu_pct", "%", "psutil", "machine CPU busy, % of all CPUs"),
    ("io_pressure_pct", "%", "psi", "wall time with at least one task stalled on IO (PSI some)"),
    (
        "disk_read_bytes_per_s",
        "bytes/s",
        "diskstats",
        "reads of the block device that read the most in the window (machine-wide, iostat rkB/s)",
    ),
    ("disk_read_request_bytes", "bytes", "diskstats", "mean bytes per read request on that device (iostat rareq-sz)"),
    ("disk_read_await_ms", "ms", "diskstats", "mean time per read request, queued + served (iostat r_await)"),
    (
        "disk_read_queue",
        "count",
        "diskstats",
        "read requests in flight on average while the device is busy (read part of aqu-sz / %util)",
    ),
    ("disk_busy_share", "share", "diskstats", "wall time the device has >= 1 request in flight (iostat %util)"),
    (
        "disk_tree_share",
        "share",
        "psutil+diskstats",
        "the training's storage reads / that device's reads (> 1: it reads from elsewhere too)",
    ),
    ("swap_in_bytes_per_s", "bytes/s", "vmstat", "machine-wide swap-ins (pswpin), bytes/s"),
    ("memory_pressure_pct", "%", "psi", "wall time with at least one task stalled on memory (PSI some)"),
    ("mem_available_bytes", "bytes", "psutil", "memory available without swapping (MemAvailable), lowest in window"),
    ("usable_cpus", "CPUs", "proc", "CPUs the training may use (affinity, cgroup quota)"),
    (
        "foreign_cpu_cores",
        "cores",
        "proc",
        "CPU used outside the training and outside torchwatch (other processes, what no visible process "
        "explains), mean over the window",
    ),
    ("own_cpu_cores", "cores", "proc", "CPU used by torchwatch and py-spy, mean over the window"),
    ("cpu_pressure_pct", "%", "psi", "wall time with >= 1 runnable task waiting for a CPU (PSI cpu some)"),
    ("cpu_quota_cpus", "CPUs", "cgroup", "the cgroup CPU quota that binds the training (cpu.max / cfs_quota_us)"),
    (
        "cpu_throttled_periods_share",
        "share",
        "cgroup",
        "the quota's periods in which the training's cgroup was throttled (nr_throttled / nr_periods)",
    ),
    ("cpu_throttled_share", "share", "cgroup", "wall time the training's cgroup spent throttled (throttled_usec)"),
    ("intra_op_threads", "count", "hook", "torch.get_num_threads() in the training process"),
    ("interop_threads", "count", "hook", "torch.get_num_interop_threads() in the training process"),
    ("local_ranks", "count", "psutil", "training processes (ranks) on this machine"),
    (
        "cpu_threads_wanted",
        "count",
        "hook+psutil",
        "CPU threads the training runs at once: intra-op threads x ranks + DataLoader workers (1 thread each; "
        "num_workers as set, or alive, the larger)",
    ),
    (
        "collective_cpu_share",
        "share",
        "/proc schedstat",
        "of the CPU time of the training processes' threads, the part of the threads that run CPU collectives "
        "(gloo's pt_gloo_runloop, gloo_tcp_loop): communication work",
    ),
    (
        "trainer_count",
        "count",
        "psutil+py-spy",
        "trainers: children of a training process that run its forward/backward/optimizer steps themselves "
        "(Hogwild, a multiprocessing.Pool of trainers), not a DataLoader worker loop",
    ),
    (
        "trainer_busy_threads",
        "count",
        "/proc schedstat",
        "the trainers' threads on a CPU or waiting for one >= 10 % of the window, all trainers together",
    ),
    ("trainer_threads", "count", "/proc schedstat", "trainer_busy_threads per trainer (the median trainer's)"),
    (
        "trainers_runqueue_share",
        "share",
        "/proc schedstat",
        "of the time the trainers' busy threads wanted a CPU, the part they waited for one",
    ),
    ("trainers_cpu_pct", "% of a core", "psutil", "CPU of the trainers together"),
    (
        "trainer_suggested_threads",
        "count",
        "/proc",
        "intra-op threads per trainer that fit the usable CPUs: max(1, floor(usable_cpus / trainer_count))",
    ),
    ("mem_limit_bytes", "bytes", "cgroup", "the memory limit that applies: the tightest cgroup limit, else RAM + swap"),
    ("mem_used_bytes", "bytes", "cgroup", "the working set counted against it (usage - inactive file cache)"),
    ("mem_used_share", "share", "cgroup", "mem_used_bytes / mem_limit_bytes"),
    (
        "mem_forecast_s",
        "s",
        "cgroup",
        "time until the working set reaches the limit at the window's pace (shown only for a real, steady rise: "
        "torchwatch.model.forecast)",
    ),
    ("mem_forecast_soonest_s", "s", "cgroup", "the forecast's 95 % interval, soonest end"),
    ("mem_forecast_latest_s", "s", "cgroup", "the forecast's 95 % interval, latest end (none: no upper bound)"),
    ("mem_growth_bytes_per_s", "bytes/s", "cgroup", "the working set's growth (Theil-Sen slope of its peaks)"),
    ("mem_tree_growth_share", "share", "smaps", "the watched tree's share of that growth (its PSS slope / the slope)"),
    ("cuda_mem_forecast_s", "s", "hook", "time until the allocator's peak reaches the device's memory"),
    ("cuda_mem_forecast_soonest_s", "s", "hook", "the device forecast's 95 % interval, soonest end"),
    ("cuda_mem_growth_bytes_per_s", "bytes/s", "hook", "the allocator peak's growth"),
    (
        "worker_private_growth_bytes",
        "bytes",
        "smaps",
        "DataLoader workers' private memory (USS) gained since each started, summed",
    ),
    ("worker_shared_drop_bytes", "bytes", "smaps", "their shared memory lost since each started, summed"),
    (
        "worker_private_growth_bytes_per_s",
        "bytes/s",
        "smaps",
        "the workers' summed private memory's growth, only when it is a real, steady rise",
    ),
    ("worker_cow_share", "share", "smaps", "shared memory lost / private memory gained by the workers (copy-on-write)"),
    ("oom_records", "count", "kmsg+hook", "out-of-memory records made (a process of the tree killed, or CUDA OOM)"),
    ("gpu_count", "count", "nvml", "GPUs read (those the training uses, else all)"),
    ("gpu_util_mean", "%", "nvml", "mean GPU utilization: time with >= 1 kernel running"),
    ("gpu_power_ratio", "share", "nvml", "mean power draw / enforced power limit"),
    ("gpu_mem_ratio", "share", "nvml", "peak device memory used / total"),
    (
        "gpu_sm_active_mean",
        "share",
        "gpm",
        "mean share of SMs busy (GPM SM_UTIL, DCGM's SM activity): low while util is high = tiny kernels / gaps",
    ),
    ("gpu_sm_occupancy_mean", "share", "gpm", "mean resident warps / the SMs' maximum (GPM SM_OCCUPANCY)"),
    ("gpu_tensor_active_mean", "share", "gpm", "mean SM time in tensor-core instructions (GPM ANY_TENSOR_UTIL)"),
    ("gpu_dram_bw_mean", "share", "gpm", "mean device-memory bandwidth used / peak (GPM DRAM_BW_UTIL)"),
    (
        "gpu_proc_sm_pct",
        "%",
        "nvml",
        "the training's own SM utilization (per-process samples, its PIDs summed): time one of its kernels ran",
    ),
    ("hook_steps_per_s", "steps/s", "hook", "optimizer steps per second, measured in the training process"),
    (
        "loop_started",
        "flag",
        "hook",
        "the training reached its loop: a step, a DataLoader batch, or one being fetched (0 = still starting up)",
    ),
    ("step_time_p50_ms", "ms", "hook", "median step time (optimizer step to optimizer step)"),
    (
        "collective_wait_share",
        "share",
        "hook+proc",
        "step time a rank waits on its peers in collectives (and, DDP on the CPU, in backward's all-reduce), "
        "less its main thread's wait for a CPU",
    ),
    ("step_time_p95_ms", "ms", "hook", "95th percentile step time"),
    (
        "data_wait_fraction",
        "share",
        "hook",
        "wall time blocked in DataLoader __next__, measured in the training process",
    ),
    ("dl_num_workers", "count", "hook", "DataLoader num_workers as set (the most-used loader)"),
    ("dl_batch_size", "count", "hook", "DataLoader batch_size as set"),
    ("dl_pin_memory", "flag", "hook", "DataLoader pin_memory as set (1 = True)"),
    ("dl_prefetch_factor", "count", "hook", "DataLoader prefetch_factor as set (batches per worker)"),
    ("dl_persistent_workers", "flag", "hook", "DataLoader persistent_workers as set (1 = True)"),
    ("dl_batch_bytes", "bytes", "hook", "bytes of tensors in one batch (its first)"),
    ("amp_enabled", "flag", "hook", "autocast seen enabled in the training (1 = yes)"),
    ("shm_bytes", "bytes", "hook", "size of /dev/shm, where DataLoader workers pass batches"),
    (
        "cuda_mem_allocated_bytes",
        "bytes",
        "hook",
        "device memory in tensors at the last step boundary (torch.cuda.memory_allocated, current device)",
    ),
    ("cuda_mem_reserved_bytes", "bytes", "hook", "most device memory the caching allocator held in the window"),
    ("cuda_mem_peak_bytes", "bytes", "hook", "most device memory ever in tensors (torch.cuda.max_memory_allocated)"),
    ("cuda_mem_capacity_bytes", "bytes", "hook", "the device's memory (get_device_properties().total_memory)"),
    (
        "cuda_mem_peak_ratio",
        "share",
        "hook",
        "max(peak allocated, reserved) / capacity in the window: how close the training comes to an out-of-memory",
    ),
    (
        "cuda_mem_unused_reserved_bytes",
        "bytes",
        "hook",
        "reserved - peak allocated, least in the window: cache the training never needed at once (fragmentation)",
    ),
    ("cuda_mem_unused_reserved_share", "share", "hook", "that cache / reserved"),
    (
        "cuda_alloc_retries",
        "count",
        "hook",
        "cudaMalloc failures in the window retried after freeing the whole cache (each synchronises the device)",
    ),
    (
        "tf32_matmul",
        "flag",
        "hook",
        "float32 matmuls may use TF32 (float32_matmul_precision high/medium or matmul.allow_tf32; 1 = yes)",
    ),
    ("cudnn_benchmark", "flag", "hook", "torch.backends.cudnn.benchmark as set (1 = True)"),
    ("model_compiled", "flag", "hook", "torch.compile compiled a graph in the training (1 = yes)"),
    (
        "optimizer_fused",
        "flag",
        "hook",
        "the optimizer was built with fused=True (1) or not (0: False or left to torch)",
    ),
    (
        "optimizer_foreach",
        "flag",
        "hook",
        "the optimizer was built with foreach=True (1) or not (0: False or left to torch)",
    ),
    (
        "alloc_expandable_segments",
        "flag",
        "hook",
        "PYTORCH_CUDA_ALLOC_CONF in the training has expandable_segments:True (1) or not (0)",
    ),
    ("burst_age_s", "s", "burst", "seconds since the last profiler burst started"),
    ("burst_dataloader_share", "share", "burst", "last burst: step time in DataLoader (TensorBoard plugin priority)"),
    ("burst_cpu_exec_share", "share", "burst", "last burst: step time in host operators not covered by device work"),
    ("burst_kernel_share", "share", "burst", "last burst: step time with a device kernel running"),
    ("burst_gpu_idle_share", "share", "burst", "last burst: step time with no device activity"),
    (
        "burst_sync_per_step",
        "count",
        "burst",
        "last burst: host-device sync calls per step (.item(), synchronize, ...)",
    ),
    ("burst_cpu_ops_per_step", "count", "burst", "last burst: host operators per step"),
    ("burst_short_kernel_share", "share", "burst", "last burst: kernels shorter than 10 us"),
    ("burst_kernels_per_step", "count", "burst", "last burst: device kernels per step"),
    (
        "burst_host_wait_share",
        "share",
        "burst",
        "last burst: step time the GPU idles waiting for the host to launch work (HTA host wait)",
    ),
    (
        "burst_kernel_wait_share",
        "share",
        "burst",
        "last burst: step time in short gaps between already-queued kernels (HTA kernel wait: launch overhead)",
    ),
    (
        "burst_pageable_h2d_per_step",
        "count",
        "burst",
        "last burst: host-to-device copies from pageable (not pinned) memory per step",
    ),
    ("burst_pageable_h2d_bytes_per_step", "bytes", "burst", "last burst: bytes copied from pageable memory per step"),
    ("burst_pageable_h2d_share", "share", "burst", "last burst: step time the device spends on those pageable copies"),
    (
        "compile_recompiles",
        "count",
        "hook",
        "torch.compile recompiles in the window (a guard failed: a shape, a value or a flag changed)",
    ),
    ("compile_recompiles_total", "count", "hook", "torch.compile recompiles since the training started"),
    (
        "compile_time_share",
        "share",
        "hook",
        "loop time spent compiling in the window (torch's compilation metrics, forward and backward graphs)",
    ),
    ("compile_total_s", "s", "hook", "seconds torch.compile spent compiling since the training started"),
    (
        "compile_graph_breaks_total",
        "count",
        "hook",
        "graph breaks torch.compile met: each splits a compiled function, the code between runs eagerly every step",
    ),
    (
        "compile_cache_limit_hits",
        "count",
        "hook",
        "compiled functions that hit the recompile limit: torch runs them eagerly from then on",
    ),
    ("compile_recompile_limit", "count", "hook", "torch._dynamo.config.recompile_limit as set"),
    ("compile_recompile_shape", "flag", "hook", "the last recompile came from a tensor's shape or strides (1 = yes)"),
    ("compiling_step_p50_ms", "ms", "hook", "median time of the window's steps during which torch compiled"),
    ("compiled_step_p50_ms", "ms", "hook", "median time of the window's steps during which nothing compiled"),
    (
        "burst_flops_per_step",
        "count",
        "burst",
        "last burst: the model's FLOPs in one step (matmuls, convolutions, attention; forward and backward)",
    ),
    ("achieved_tflop_per_s", "TFLOP/s", "hook+burst", "the last burst's FLOPs per step / the median step time"),
    (
        "peak_tflop_per_s",
        "TFLOP/s",
        "burst",
        "the device's dense peak for the step's math (data sheet); on a CPU, measured by a matmul in the training",
    ),
    ("mfu", "share", "hook+burst", "model FLOPs utilisation: achieved / peak FLOP/s"),
    *PRODUCER_CATALOGUE,
    *_progress.CATALOGUE,
)

Features = dict[str, "float | None"]


def _share(counter: Counter[str], key: str, total: int) -> float | None:
    return counter[key] / total if total else None


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _stack_features(window: Window, main_pid: int | None) -> Features:
    phases: Counter[str] = Counter()
    parts: Counter[str] = Counter()
    for s in window.stacks:
        if not s.is_main_thread or (main_pid is not None and s.pid != main_pid):
            continue
        ph = stacks.phase(s.frames)
        phases[ph] += s.count
        if ph == "data":
            parts[stacks.data_part(s.frames) or "other"] += s.count
    startup = phases.pop("startup", 0)
    total = sum(phases.values())
    out: Features = {
        "stack_samples": float(total),
        "startup_share": startup / (startup + total) if startup + total else None,
    }
    enough = total >= MIN_STACK_SAMPLES
    for key, name in (
        ("data", "data_wait_share"),
        ("forward", "forward_share"),
        ("backward", "backward_share"),
        ("optimizer", "optimizer_share"),
        ("other", "other_code_share"),
    ):
        out[name] = _share(phases, key, total) if enough else None
    for key, name in (
        ("queue", "data_wait_queue_share"),
        ("fetch", "data_wait_fetch_share"),
        ("start", "data_wait_start_share"),
    ):
        out[name] = _share(parts, key, total) if enough else None
    return out


def _growth(samples: Sequence[ThreadSample], *counters: str) -> float | None:
    """Growth of the sum of one thread's cumulative ``counters`` (s) per second of wall time, from
    the first sample that has them all to the last; ``None`` when those span < 1 s. Not clipped."""
    timed = [s for s in samples if all(getattr(s, c) is not None for c in counters)]
    if len(timed) < 2 or timed[-1].t - timed[0].t < 1.0:
        return None
    first, last = timed[0], timed[-1]
    grown = sum(float(getattr(last, c)) - float(getattr(first, c)) for c in counters)
    return grown / (last.t - first.t)


def _rate(samples: list[ThreadSample], counter: str) -> float | None:
    """Growth of one thread's cumulative counter (``sys_s``, ``runq_s``) per second of wall time."""
    rate = _growth(samples, counter)
    return None if rate is None else max(0.0, min(1.0, rate))


def _io_kernel(sys_share: float | None, disk_share: float) -> float:
    """Kernel CPU time attributed to storage reads: system time, at most the disk wait itself.

    A storage read costs kernel CPU (syscall, page pinning for O_DIRECT, DMA mapping) beside
    its disk wait, and the thread is in state R, not D, for that part: measured on a 2-core
    virtual machine, ~25-30 us of kernel CPU per ~75 us 4 KiB O_DIRECT read. System time also
    comes from page faults of fresh allocations (41 % of a CPU-bound augmentation loop here),
    so only as much as the disk wait is attributed: with no disk wait, nothing.
    """
    return 0.0 if sys_share is None else min(sys_share, disk_share)


def _sched_shares(samples: Sequence[ThreadSample]) -> tuple[float, float] | None:
    """``(on a CPU, waiting for a CPU)``: shares of wall time of one thread, from the growth of its
    ``schedstat`` counters (``run_s``, ``runq_s``) from the first sample to the last. ``None`` as
    :func:`_busy_share` says."""
    if len({(s.pid, s.tid) for s in samples}) > 1:
        return None
    run, queued = _growth(samples, "run_s"), _growth(samples, "runq_s")
    if run is None or queued is None or run < 0 or queued < 0:
        return None
    return min(1.0, run), min(1.0 - min(1.0, run), queued)


def _busy_share(samples: Sequence[ThreadSample]) -> float | None:
    """Share of wall time one thread was on a CPU or ready for one (state R), from the growth of
    its ``schedstat`` counters (``run_s + runq_s``) from the first sample to the last.

    The scheduler counts these in nanoseconds, so the share is exact where the state letters,
    read at 5-10 Hz, are a sample: ~100 letters in a 10 s window stray +-0.04 for a thread busy
    15 % of the time, and more when the reads keep one phase of a periodic loop. A loop sleeping
    80 ms of each 96 ms step read 0.19-0.36 R from its letters on the tick grid, 0.15 from these
    counters.

    Returns:
        share in [0, 1]; ``None`` when the samples are of several threads, lack the counters,
        span < 1 s, or the counters went back (another thread behind a reused TID).
    """
    if len({(s.pid, s.tid) for s in samples}) > 1:
        return None
    busy = _growth(samples, "run_s", "runq_s")
    return None if busy is None or busy < 0 else min(1.0, busy)


def _state_shares(samples: Sequence[ThreadSample]) -> dict[str, float]:
    """Shares of one thread's (or one group's) time in each state: ``running`` (on a CPU) less
    the kernel time of storage reads, ``runqueue`` (ready to run, waiting for a CPU), ``disk``
    (state D, file reads, plus that kernel time), ``sleep``, ``sync``, ``net``, ``other``. The one
    math behind the loop's and the workers' state features and the states every face shows.

    State R is a thread on a CPU *or* waiting for one: the scheduler's counters tell the two
    apart (:func:`_sched_shares`), so a loop that waits for a CPU a neighbour holds is not taken
    for a loop that computes. The rest of the time is split between the waits in proportion to
    the samples that found the thread waiting (``other`` when none did). Without the counters (a
    group of threads, an old kernel) every share is its share of the samples and ``runqueue`` is
    0: not measured, the R samples count as ``running``."""
    counts = Counter(th.wait for th in samples)
    n = len(samples)
    sched = _sched_shares(samples)
    waiting = n - counts[Wait.RUNNING]
    if sched is None:
        oncpu, queued = counts[Wait.RUNNING] / n, 0.0
        scale = 1.0 / n
    else:
        oncpu, queued = sched
        scale = (1.0 - oncpu - queued) / waiting if waiting else 0.0
    disk = (counts[Wait.DISK] + counts[Wait.FILE]) * scale
    io_kernel = _io_kernel(_rate(list(samples), "sys_s"), disk)
    return {
        "running": max(0.0, oncpu - io_kernel),
        "runqueue": queued,
        "disk": min(1.0, disk + io_kernel),
        "sleep": counts[Wait.SLEEP] * scale,
        "sync": counts[Wait.SYNC] * scale,
        "net": counts[Wait.NET] * scale,
        "other": counts[Wait.OTHER] * scale + (max(0.0, 1.0 - oncpu - queued) if not waiting else 0.0),
    }


def _autograd_busy(window_threads: Iterable[ThreadSample], main_pid: int | None) -> float | None:
    """Share of wall time the loop's autograd engine threads (:attr:`ThreadSample.autograd`) were
    on a CPU or ready for one, from their ``schedstat`` counters, summed over the threads and
    capped at 1; ``None`` when the training has none (a CPU training: its backward runs on the
    thread that called it) or their counters do not cover 1 s."""
    threads: dict[tuple[int, int], list[ThreadSample]] = defaultdict(list)
    for th in window_threads:
        if th.autograd and th.role is Role.MAIN and (main_pid is None or th.pid == main_pid):
            threads[(th.pid, th.tid)].append(th)
    shares = [b for samples in threads.values() if (b := _busy_share(samples)) is not None]
    return min(1.0, sum(shares)) if shares else None


def _loop_shares(main: Sequence[ThreadSample], autograd: float | None) -> dict[str, float]:
    """The loop's state shares (:func:`_state_shares` of its main thread), with the time its
    autograd engine thread was busy moved from ``sync`` to ``running``.

    On CUDA, ``loss.backward()`` hands the graph to the engine's device thread (``pt_autograd_0``)
    and the calling thread sleeps on a futex until it is done: on an H200 (torch 2.11, recorded
    2026-11-26) demo/launch_bound.py's main thread read 45 % running and 55 % waiting on another
    thread, which the rules took for "the loop waits elsewhere", while the loop's CPU work, forward
    on one thread and backward on the other, was the whole step. What the main thread waits on
    while that thread runs is the loop's own CPU work, so at most the busy share of the engine
    thread moves, and never more than the main thread's sync share."""
    shares = _state_shares(main)
    if autograd:
        moved = min(autograd, shares["sync"])
        shares["running"] += moved
        shares["sync"] -= moved
    return shares


def _main_threads(
    window_threads: Iterable[ThreadSample], main_pid: int | None
) -> tuple[list[ThreadSample], dict[int, list[ThreadSample]]]:
    """The loop's main-thread samples (of ``main_pid``, or of any main when ``None``) and each
    DataLoader worker's main-thread samples (the thread that runs the dataset), by worker pid."""
    main: list[ThreadSample] = []
    workers: dict[int, list[ThreadSample]] = defaultdict(list)
    for th in window_threads:
        if not th.is_main_thread:
            continue
        if th.role is Role.MAIN and (main_pid is None or th.pid == main_pid):
            main.append(th)
        elif th.role is Role.WORKER:
            workers[th.pid].append(th)
    return main, workers


def thread_states(
    window_threads: Iterable[ThreadSample], main_pid: int | None
) -> tuple[tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]]:
    """``(state, share)`` of the loop's main thread and of the workers' main threads (each worker
    weighted by its samples), largest first, states with no sample left out: the shares the
    state features are made of (:func:`_state_shares`), for the faces.

    Args:
        window_threads: thread samples of the window.
        main_pid: the diagnosed training process; ``None`` takes any main.
    """
    window_threads = list(window_threads)  # read twice: the main threads, then the autograd threads
    main, workers = _main_threads(window_threads, main_pid)

    def ordered(shares: dict[str, float]) -> tuple[tuple[str, float], ...]:
        return tuple(sorted(((k, v) for k, v in shares.items() if v > 0), key=lambda kv: -kv[1]))

    loop = ordered(_loop_shares(main, _autograd_busy(window_threads, main_pid))) if main else ()
    total = sum(len(s) for s in workers.values())
    mixed: dict[str, float] = defaultdict(float)
    for samples in workers.values():
        for state, share in _state_shares(samples).items():
            mixed[state] += share * len(samples) / total
    return loop, ordered(mixed)


def _thread_features(window: Window, main_pid: int | None) -> Features:
    main, workers = _main_threads(window.threads, main_pid)
    n = len(main)
    out: Features = {"thread_samples": float(n)}
    autograd = _autograd_busy(window.threads, main_pid)
    out["autograd_running_share"] = autograd
    if n >= MIN_THREAD_SAMPLES:
        shares = _loop_shares(main, autograd)
        out["main_sys_share"] = _rate(main, "sys_s")
        out["main_runqueue_share"] = _rate(main, "runq_s")
        out["main_running_share"] = shares["running"]
        out["main_disk_share"] = shares["disk"]
        out["main_sleep_share"] = shares["sleep"]
        out["main_sync_share"] = shares["sync"]
        out["main_net_share"] = shares["net"]
    out["threads_runqueue_share"] = _threads_runqueue(window.threads, main_pid)

    running = disk_w = other = queued = 0.0
    wn = 0
    for samples in workers.values():
        k = len(samples)
        w = _state_shares(samples)  # weight each worker by its number of samples
        # A worker waiting for a CPU is still producing on the CPU side: the pipeline's CPU work
        # is what the loop waits for, whether the worker computes or waits to compute.
        running += k * (w["running"] + w["runqueue"])
        queued += k * w["runqueue"]
        disk_w += k * w["disk"]
        other += k * (w["sleep"] + w["net"])
        wn += k
    producing = running + disk_w + other
    out["workers_busy_share"] = producing / wn if wn >= MIN_THREAD_SAMPLES else None
    good = wn >= MIN_THREAD_SAMPLES and producing >= 0.05 * wn
    out["workers_running_fraction"] = running / producing if good else None
    out["workers_runqueue_fraction"] = queued / producing if good else None
    out["workers_disk_fraction"] = disk_w / producing if good else None
    out["workers_other_wait_fraction"] = other / producing if good else None
    return out


BUSY_THREAD_SHARE = 0.1  # threads on a CPU or waiting for one less than this are not the step's


def _threads_runqueue(window_threads: Iterable[ThreadSample], main_pid: int | None) -> float | None:
    """The largest run-queue share (schedstat) among the diagnosed training process's threads busy
    >= :data:`BUSY_THREAD_SHARE` of the window: the intra-op pool's threads meet at a barrier at
    the end of every parallel op, so the one that waits longest for a CPU sets the op's time while
    the others spin or sleep at the barrier (the classic oversubscription slowdown: the main
    thread reads "running" while it spins). Every thread's counters are read once a second
    (:class:`~torchwatch.sources.proc.ThreadStateSource`); ``None`` when no thread's cover 1 s."""
    threads: dict[tuple[int, int], list[ThreadSample]] = defaultdict(list)
    for th in window_threads:
        if th.role is Role.MAIN and (main_pid is None or th.pid == main_pid) and th.runq_s is not None:
            threads[(th.pid, th.tid)].append(th)
    worst: float | None = None
    for samples in threads.values():
        sched = _sched_shares(samples)
        if sched is None:
            continue
        worst = worst or 0.0
        if sum(sched) >= BUSY_THREAD_SHARE:
            worst = max(worst, sched[1])
    return worst


def _attribute_fetch(f: Features) -> Features:
    """Split main-thread data fetching (``num_workers=0``) into CPU, disk and other waits.

    Stacks say *where* the main thread is, ``/proc`` states say *how* it spends the time; they
    are sampled apart, so waits are attributed to the DataLoader first: storage, sleep and
    socket waits happen while fetching samples far more often than in forward/backward.
    """
    fetch, disk = f.get("data_wait_fetch_share"), f.get("main_disk_share")
    if fetch is None or disk is None:
        return {"fetch_cpu_share": None, "fetch_disk_share": None, "fetch_other_wait_share": None}
    other = (f.get("main_sleep_share") or 0.0) + (f.get("main_net_share") or 0.0)
    fetch_disk = min(disk, fetch)
    fetch_other = min(other, fetch - fetch_disk)
    return {
        "fetch_disk_share": fetch_disk,
        "fetch_other_wait_share": fetch_other,
        "fetch_cpu_share": max(0.0, fetch - fetch_disk - fetch_other),
    }


def _combine(f: Features) -> Features:
    queue = f.get("data_wait_queue_share")
    wrun, wdisk, wother = (
        f.get("workers_running_fraction"),
        f.get("workers_disk_fraction"),
        f.get("workers_other_wait_fraction"),
    )
    fetch_cpu, fetch_disk, fetch_other = (
        f.get("fetch_cpu_share"),
        f.get("fetch_disk_share"),
        f.get("fetch_other_wait_share"),
    )
    out: Features = {}

    def via_workers(frac: float | None) -> float | None:
        if queue is None:
            return None
        if queue < 0.01:
            return 0.0
        return None if frac is None else queue * frac

    def add(a: float | None, b: float | None) -> float | None:
        return None if a is None and b is None else (a or 0.0) + (b or 0.0)

    main_disk = f.get("main_disk_share")
    # Main-thread storage waits outside the DataLoader (reads in the loop) count as well.
    out["storage_wait_async_share"] = via_workers(wdisk)
    out["storage_wait_share"] = add(main_disk if main_disk is not None else fetch_disk, via_workers(wdisk))
    out["input_cpu_share"] = add(fetch_cpu, via_workers(wrun))
    out["input_other_wait_share"] = add(fetch_other, via_workers(wother))
    running = f.get("main_running_share")
    out["loop_cpu_share"] = None if running is None or fetch_cpu is None else max(0.0, running - fetch_cpu)
    return out


def _cpu_wait(f: Features) -> Features:
    """``cpu_wait_share``: the loop's time lost waiting for a CPU, the largest of three readings of
    it (each a share of wall time, schedstat): its main thread's run-queue wait, the wait of the
    intra-op thread that waited most (the barrier at the end of each op waits for it), and, when
    the loop waits on DataLoader workers, that wait times the part of the workers' work spent
    waiting for a CPU. ``None`` when none of them is measured."""
    readings = [f.get("main_runqueue_share"), f.get("threads_runqueue_share")]
    queue, wq = f.get("data_wait_queue_share"), f.get("workers_runqueue_fraction")
    if queue is not None and wq is not None:
        readings.append(queue * wq)
    known = [r for r in readings if r is not None]
    return {"cpu_wait_share": max(known) if known else None}


def _process_features(window: Window, main_pid: int | None) -> Features:
    out: Features = {}
    if not window.processes:
        return {
            k: None
            for k in ("main_cpu_pct", "workers_cpu_pct", "read_bytes_per_s", "rss_bytes", "worker_count", "local_ranks")
        }
    last_t = window.processes[-1].t
    latest = [p for p in window.processes if p.t == last_t]
    by_t: dict[float, list[float]] = defaultdict(list)
    main_cpu: list[float | None] = []
    reads: dict[float, float] = defaultdict(float)
    for p in window.processes:
        if p.role is Role.MAIN and (main_pid is None or p.pid == main_pid):
            main_cpu.append(p.cpu_pct)
        elif p.role is Role.WORKER and p.cpu_pct is not None:
            by_t[p.t].append(p.cpu_pct)
        if p.read_bytes_per_s is not None:
            reads[p.t] += p.read_bytes_per_s
    out["main_cpu_pct"] = _mean(main_cpu)
    out["workers_cpu_pct"] = _mean(sum(v) for v in by_t.values()) if by_t else (0.0 if main_cpu else None)
    out["read_bytes_per_s"] = _mean(reads.values())
    out["rss_bytes"] = float(sum(p.rss_bytes or 0 for p in latest))
    out["worker_count"] = float(sum(1 for p in latest if p.role is Role.WORKER))
    # Ranks counted from the job: a training process that started others (a
    # torch.multiprocessing.spawn launcher, a Hogwild main joining its trainers, a wrapper script)
    # is not one of them (issue 47: the launcher of 4 spawned ranks made 5).
    parents = {p.ppid for p in latest if p.role is Role.MAIN}
    out["local_ranks"] = float(sum(1 for p in latest if p.role is Role.MAIN and p.pid not in parents))
    return out


MIN_DISK_READS = 20  # read requests in the window below which request size, await and queue are None


def _system_features(window: Window) -> Features:
    avail = [s.mem_available_bytes for s in window.system if s.mem_available_bytes is not None]
    out: Features = {
        "system_cpu_pct": _mean(s.cpu_pct for s in window.system),
        "io_pressure_pct": _mean(s.io_some_pct for s in window.system),
        "usable_cpus": window.system[-1].usable_cpus if window.system else None,
        "swap_in_bytes_per_s": _mean(s.swap_in_bytes_per_s for s in window.system),
        "memory_pressure_pct": _mean(s.mem_some_pct for s in window.system),
        "mem_available_bytes": float(min(avail)) if avail else None,
        "foreign_cpu_cores": _mean(s.foreign_cpu_cores for s in window.system),
        "own_cpu_cores": _mean(s.own_cpu_cores for s in window.system),
        "cpu_pressure_pct": _mean(s.cpu_some_pct for s in window.system),
        "cpu_quota_cpus": window.system[-1].cpu_quota_cpus if window.system else None,
        "cpu_throttled_periods_share": _mean(s.throttled_periods_share for s in window.system),
        "cpu_throttled_share": _mean(s.throttled_share for s in window.system),
    }
    out.update(_disk_features(window))
    return out


def _disk_features(window: Window) -> Features:
    """The busiest device's reads over the window, as ratios of window means (iostat's way).

    Each sample names the device that read the most in its second; the window keeps the device
    with the most bytes in all, and seconds in which another device led count as no reads.
    """
    out: Features = dict.fromkeys(
        ("disk_read_bytes_per_s", "disk_read_request_bytes", "disk_read_await_ms", "disk_read_queue", "disk_busy_share")
    )
    timed = [s for s in window.system if s.disk_read_bytes_per_s is not None]
    if not timed:
        return out
    by_disk: Counter[str] = Counter()
    for s in timed:
        if s.disk is not None:
            by_disk[s.disk] += int(s.disk_read_bytes_per_s or 0)
    top = by_disk.most_common(1)[0][0] if by_disk else None
    own = [s for s in timed if s.disk == top and top is not None]
    n = len(timed)

    def mean(attr: str) -> float:
        return sum(getattr(s, attr) or 0.0 for s in own) / n

    rbytes, reads, inflight, busy = (
        mean("disk_read_bytes_per_s"),
        mean("disk_reads_per_s"),
        mean("disk_read_inflight"),
        mean("disk_busy"),
    )
    out["disk_read_bytes_per_s"] = rbytes
    if top is None:
        return out
    out["disk_busy_share"] = busy
    if reads * n >= MIN_DISK_READS:  # n samples of about 1 s each
        out["disk_read_request_bytes"] = rbytes / reads
        out["disk_read_await_ms"] = 1000.0 * inflight / reads
        out["disk_read_queue"] = inflight / busy if busy > 0 else None
    return out


def _disk_tree_share(f: Features) -> Features:
    """The tree's storage reads over the busiest device's, not clipped: above 1 the training reads
    more than that device serves (another device, or a network file system counted in read_bytes)."""
    tree, disk = f.get("read_bytes_per_s"), f.get("disk_read_bytes_per_s")
    return {"disk_tree_share": None if tree is None or not disk else tree / disk}


def gpus_in_use(gpus: Sequence[GpuSample]) -> list[GpuSample]:
    """The readings of the GPUs the training uses (a process of the tree holds a context on them),
    or of every GPU when it uses none yet: the one choice behind every GPU feature and panel."""
    used = {g.index for g in gpus if g.target_pids}
    return [g for g in gpus if not used or g.index in used]


def _pct_share(values: Iterable[float | None]) -> float | None:
    """Mean of percentages as a share 0..1 (GPM readings can stray a little outside 0..100)."""
    mean = _mean(values)
    return None if mean is None else max(0.0, min(1.0, mean / 100.0))


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


def _cpu_budget(f: Features) -> Features:
    """How much of the usable CPUs the training takes, and the DataLoader workers' part of it."""
    main, workers, cpus = f.get("main_cpu_pct"), f.get("workers_cpu_pct"), f.get("usable_cpus")
    intra, ranks = f.get("intra_op_threads"), f.get("local_ranks")
    # DataLoader workers run torch with 1 thread each (torch.utils.data._utils.worker sets it);
    # as set (hook) or alive, whichever is more: workers between two epochs come back.
    workers_n = max(f.get("worker_count") or 0.0, f.get("dl_num_workers") or 0.0)
    wanted = intra * max(1.0, ranks or 0.0) + workers_n if intra is not None else None
    if main is None or workers is None:
        return {"workers_cpu_fraction": None, "tree_cpu_saturation": None, "cpu_threads_wanted": wanted}
    total = main + workers
    return {
        "workers_cpu_fraction": workers / total if total > 0 else None,
        "tree_cpu_saturation": total / (100.0 * cpus) if cpus else None,
        "cpu_threads_wanted": wanted,
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _hook_features(window: Window, main_pid: int | None) -> Features:
    """Measured in the training process: steps, step time, DataLoader wait and settings, AMP.

    Step time is optimizer step to optimizer step (``register_optimizer_step_post_hook``); data
    wait is wall time inside DataLoader ``__next__``, including a ``__next__`` still running at
    the last read (a stall shows while it lasts).
    """
    reads = [h for h in window.hook if main_pid is None or h.pid == main_pid]
    out: Features = {name: None for name, spec in CATALOGUE.items() if spec.source in ("hook", "burst")}
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


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


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


def _overlap(t0: float, t1: float, spans: Sequence[tuple[float, float]]) -> float:
    """Seconds of ``[t0, t1]`` covered by ``spans`` (compile intervals do not overlap: one thread)."""
    return sum(max(0.0, min(t1, b) - max(t0, a)) for a, b in spans)


def _compile_features(window: Window, main_pid: int | None) -> Features:
    """What torch.compile did, from the hook's :class:`~torchwatch.wire.CompileInfo`.

    Recompiles in the window are the growth of the hook's count from the window's first reading
    (the last one before the window when :func:`loop_window` kept it) to its last. A step is a
    compiling step when a compile interval of the hook's overlaps it (step ``[end - duration,
    end]``); the rest are compiled steps. Counts of graph breaks and limit hits are totals: both
    last as long as the compiled code does."""
    reads = [h for h in window.hook if (main_pid is None or h.pid == main_pid) and h.record is not None]
    infos = [h.record.compile if h.record is not None else None for h in reads]
    last = infos[-1] if infos else None
    if last is None:
        return {}
    first = infos[0]
    span = window.end - window.start
    compiling = _overlap(window.start, window.end, last.spans)
    steps = [e for h in reads for e in h.new_steps if window.start <= e[0] <= window.end]
    hot = [e[1] * 1000.0 for e in steps if _overlap(e[0] - e[1], e[0], last.spans) > 0]
    cold = [e[1] * 1000.0 for e in steps if _overlap(e[0] - e[1], e[0], last.spans) <= 0]
    recompiles = [e for e in last.events if e.kind == "recompile"]
    return {
        "compile_recompiles": float(max(0, last.recompiles - (first.recompiles if first is not None else 0))),
        "compile_recompiles_total": float(last.recompiles),
        "compile_time_share": min(1.0, compiling / span) if span > 0 else None,
        "compile_total_s": last.compile_s,
        "compile_graph_breaks_total": float(last.graph_breaks),
        "compile_cache_limit_hits": float(last.cache_limit_hits),
        "compile_recompile_limit": _num(last.recompile_limit),
        "compile_recompile_shape": float(recompiles[-1].cause in ("shape", "stride")) if recompiles else None,
        "compiling_step_p50_ms": statistics.median(hot) if hot else None,
        "compiled_step_p50_ms": statistics.median(cold) if cold else None,
    }


def _flop_features(window: Window, main_pid: int | None, f: Features) -> Features:
    """FLOP/s and MFU from the last burst's FLOP count (:func:`torchwatch.model.peaks.flop_rate`)
    over the window's median step time."""
    reads = [h for h in window.hook if (main_pid is None or h.pid == main_pid) and h.record is not None]
    rec = reads[-1].record if reads else None
    last = rec.burst.last if rec is not None and rec.burst is not None else None
    tf32 = f.get("tf32_matmul")
    rate = flop_rate(last, f.get("step_time_p50_ms"), None if tf32 is None else bool(tf32))
    if rate is None:
        return {"burst_flops_per_step": None if last is None else last.flops_per_step}
    return {
        "burst_flops_per_step": rate.flops_per_step,
        "achieved_tflop_per_s": rate.achieved_flops_per_s / 1e12,
        "peak_tflop_per_s": None if rate.peak is None else rate.peak.flops_per_s / 1e12,
        "mfu": rate.mfu,
    }


COMPILE_TEXTS = {
    "compile_recompile_words": "its reason not read",
    "compile_mark_dynamic": "torch._dynamo.mark_dynamic(tensor, dim)",
    "compile_break_words": "its reason not read",
    "compile_break_hint": "none",
    "compile_limit_words": "hit the recompile limit",
}
"""The texts of torch.compile events that rule templates quote (:func:`compile_texts`), and what
each reads when the hook has not published one."""


def event_text(event: CompileEvent) -> str:
    """An event in words with its place: ``shape of x changed 32→17 (dim 0) at train.py:88
    (`out = model(x)`)``."""
    where = event.where
    text = event.words + (f" at {where}" if where else "")
    return text + (f" (`{event.code}`)" if event.code else "")


def compile_texts(info: CompileInfo) -> dict[str, str]:
    """The latest recompile, graph break and recompile-limit hit in words (:data:`COMPILE_TEXTS`),
    each only when there is one; ``compile_mark_dynamic`` is the call that marks the changing
    dimension dynamic (``torch._dynamo.mark_dynamic(x, 0)``) for a shape recompile."""
    out: dict[str, str] = {}
    latest: dict[str, CompileEvent] = {}
    for e in sorted(info.events, key=lambda e: e.t):
        latest[e.kind] = e
    rec = latest.get("recompile")
    if rec is not None:
        out["compile_recompile_words"] = event_text(rec)
        m = re.match(r"^shape of (.+?) changed.*\(dim (-?\d+)\)$", rec.words)
        if m is not None:
            out["compile_mark_dynamic"] = f"torch._dynamo.mark_dynamic({m.group(1)}, {m.group(2)})"
    brk = latest.get("graph_break")
    if brk is not None:
        out["compile_break_words"] = event_text(brk)
        out["compile_break_hint"] = brk.hint or "none"
    hit = latest.get("cache_limit")
    if hit is not None:
        out["compile_limit_words"] = event_text(hit)
    return out


WATCH_FEATURES = frozenset(
    {
        "mem_limit_bytes", "mem_used_bytes", "mem_used_share", "mem_forecast_s", "mem_forecast_soonest_s",
        "mem_forecast_latest_s", "mem_growth_bytes_per_s", "mem_tree_growth_share", "cuda_mem_forecast_s",
        "cuda_mem_forecast_soonest_s", "cuda_mem_growth_bytes_per_s", "worker_private_growth_bytes",
        "worker_shared_drop_bytes", "worker_private_growth_bytes_per_s", "worker_cow_share", "oom_records",
    }
)  # fmt: skip
"""Features of the catalogue that :func:`compute` does not make: the memory watch makes them from
minutes of readings (:meth:`torchwatch.watch.memwatch.MemoryWatch.features`), and the session adds
them to every analysis."""

PROGRESS_FEATURES = frozenset(name for name, *_ in _progress.CATALOGUE)
"""Features of the catalogue that :func:`compute` does not make: the epoch and the loss's health,
from minutes of the hook's readings (:func:`torchwatch.analysis.progress.features`); the session
adds them to every analysis."""


def texts(window: Window, main_pid: int | None) -> dict[str, str]:
    """Settings fix templates quote verbatim, as the training's hook read them (none: no hook).

    Returns:
        ``optimizer_state`` (``AdamW(foreach=None, fused=None)``: ``None`` = left to torch),
        ``alloc_conf_state`` (``PYTORCH_CUDA_ALLOC_CONF='...'`` or ``PYTORCH_CUDA_ALLOC_CONF is not set``),
        ``thread_env`` (``OMP_NUM_THREADS=8`` or ``OMP_NUM_THREADS unset``), each only when read, and
        ``cpu_neighbours`` (``PID 812 python (alice) 1.0 cores, ...``: the largest CPU users outside
        the training and torchwatch in the window's last scan that saw any), only when there are,
        and the torch.compile events in words (:func:`compile_texts`), once something compiled.
    """
    out: dict[str, str] = {}
    neighbours = next((s.neighbours for s in reversed(window.system) if s.neighbours), ())
    if neighbours:
        out["cpu_neighbours"] = ", ".join(f"PID {n.pid} {n.name} ({n.user}) {n.cores:.1f} cores" for n in neighbours)
    reads = [h for h in window.hook if (main_pid is None or h.pid == main_pid) and h.record is not None]
    record = reads[-1].record if reads else None
    threads = record.threads if record is not None else None
    if threads is not None:
        out["thread_env"] = (
            f"OMP_NUM_THREADS={threads.omp_num_threads}"
            if threads.omp_num_threads is not None
            else "OMP_NUM_THREADS unset"
        )
    if record is not None and record.compile is not None:
        out.update(compile_texts(record.compile))
    out.update(producers.producer_texts(window, main_pid))
    settings = record.gpu_settings if record is not None else None
    if settings is None:
        return out
    out["alloc_conf_state"] = (
        "PYTORCH_CUDA_ALLOC_CONF is not set"
        if settings.alloc_conf is None
        else f"PYTORCH_CUDA_ALLOC_CONF={settings.alloc_conf!r}"
    )
    if settings.optimizer is not None:
        out["optimizer_state"] = (
            f"{settings.optimizer}(foreach={settings.optimizer_foreach}, fused={settings.optimizer_fused})"
        )
    return out


def _prefer_measured_wait(f: Features) -> Features:
    """Scale the stack estimate of the DataLoader's share to the hook's measurement.

    py-spy samples where the loop is (20 Hz); the hook times every ``__next__``. When both exist,
    the measured total wins and the stacks only split it (queue vs in-thread fetch). With
    ``num_workers=0`` (the hook reads it from the DataLoader) the split is known without stacks.
    """
    measured, estimated = f.get("data_wait_fraction"), f.get("data_wait_share")
    if measured is None:
        return {}
    if f.get("dl_num_workers") == 0:
        # num_workers=0: every __next__ runs the dataset and collate in the loop's own thread, so
        # the whole measured wait is in-thread fetching; no stacks are needed to split it.
        return {
            "data_wait_share": measured,
            "data_wait_fetch_share": measured,
            "data_wait_queue_share": 0.0,
            "data_wait_start_share": 0.0,
        }
    if estimated is None or estimated < 0.02:
        return {}
    k = measured / estimated
    out: Features = {"data_wait_share": measured}
    for name in ("data_wait_queue_share", "data_wait_fetch_share", "data_wait_start_share"):
        v = f.get(name)
        out[name] = None if v is None else min(1.0, v * k)
    return out


def rank_collective_wait(rec: HookRecord | None, step: RankStep) -> float:
    """Time ``step`` of a rank spent blocked on its peers, s (:meth:`RankStep.collective_wait`):
    the blocked part of backward counts only for a rank of a job of several processes whose
    backward runs on the CPU (CUDA not initialised), where it is DDP's gradient all-reduce."""
    info = rec.rank if rec is not None else None
    multi = info is not None and (info.world_size or 0) > 1
    return step.collective_wait(multi and rec is not None and not rec.cuda_initialized)


def collective_cpu(window: Window) -> Features:
    """``collective_cpu_share``: of the CPU time (schedstat run time) of every thread of the
    training processes (role main) in ``window``, the part of the threads that run CPU
    collectives (:attr:`ThreadSample.collective`: gloo's). Every thread's counters are read once
    a second. ``None`` when no thread's counters cover 1 s, or the processes used no CPU.

    Gloo over loopback does its all-reduce on the CPU: ring copies and sums on its own threads.
    On a machine with fewer cores than ranks those threads hold the CPUs the ranks' main threads
    queue for, and that queueing is communication, not oversubscription (issue 47: 4 gloo ranks
    on 2 cores read "cpu-oversubscribed" while accumulating 5 steps per all-reduce ran 2.55x
    faster and halving the compute 1.01x).
    """
    threads: dict[tuple[int, int], list[ThreadSample]] = defaultdict(list)
    for th in window.threads:
        if th.role is Role.MAIN and th.run_s is not None:
            threads[(th.pid, th.tid)].append(th)
    total = comm = 0.0
    seen = False
    for samples in threads.values():
        rate = _growth(samples, "run_s")
        if rate is None or rate < 0:
            continue
        seen = True
        total += rate
        if samples[-1].collective:
            comm += rate
    if not seen or total <= 0:
        return {"collective_cpu_share": None}
    return {"collective_cpu_share": min(1.0, comm / total)}


def _collective_wait(window: Window, main_pid: int | None, f: Features) -> Features:
    """Share of the step time blocked on peers, less the main thread's run-queue share that
    the collectives' own CPU work does not explain.

    A thread that lost its core counts as blocked in the hook's estimate (wall minus thread
    CPU time), so on an oversubscribed machine every rank looks as if it waited in backward;
    the main thread's run-queue wait (schedstat) over the same window is that part, and is taken
    out, but only for the share of the training's CPU that is not the CPU collectives' own
    (``collective_cpu_share``): a main thread queueing behind gloo's threads waits on
    communication (4 gloo ranks on 2 cores: runq 0.41 of the step left 0.33 of a measured 0.75 all
    taken out). ``None`` without per-step readings; 0 for a process that is no rank and calls no
    collective.
    """
    reads = [h for h in window.hook if main_pid is None or h.pid == main_pid]
    steps = [(h.record, s) for h in reads for s in h.rank_steps if window.start <= s.end <= window.end]
    total = sum(s.duration for _, s in steps)
    if len(steps) < 2 or total <= 0:
        return {"collective_wait_share": None}
    blocked = sum(rank_collective_wait(rec, s) for rec, s in steps) / total
    runq = (f.get("main_runqueue_share") or 0.0) * (1.0 - (f.get("collective_cpu_share") or 0.0))
    return {"collective_wait_share": max(0.0, min(1.0, blocked - runq))}


def trainer_features(window: Window, usable_cpus: float | None) -> Features:
    """The trainers of the window (processes marked ``trainer``: children of a training process
    whose stacks showed training steps, :mod:`torchwatch.analysis.roles`) and how their threads
    share the CPUs.

    A trainer started by ``multiprocessing`` has no hook (its ``torch.get_num_threads()`` is not
    published), so its threads are counted from outside: a thread on a CPU or waiting for one
    (schedstat ``run_s + runq_s``) >= :data:`BUSY_THREAD_SHARE` of the window is one the trainer
    runs at once (an intra-op thread spinning at its barrier counts: it holds a CPU). Every
    thread's counters are read once a second (:class:`~torchwatch.sources.proc.ThreadStateSource`).

    Returns:
        ``trainer_count`` (0 without trainers), ``trainer_busy_threads``, ``trainer_threads``,
        ``trainers_runqueue_share`` (run-queue time / (run + run-queue time) of the busy threads,
        summed: the share of their demand the CPUs did not serve), ``trainers_cpu_pct`` and
        ``trainer_suggested_threads``; the thread figures ``None`` when no trainer thread's
        counters cover 1 s.
    """
    none: Features = dict.fromkeys(
        ("trainer_busy_threads", "trainer_threads", "trainers_runqueue_share", "trainers_cpu_pct"), None
    )
    if not window.processes:
        return {"trainer_count": None, "trainer_suggested_threads": None, **none}
    last_t = window.processes[-1].t
    trainers = {p.pid for p in window.processes if p.t == last_t and p.trainer}
    out: Features = {"trainer_count": float(len(trainers)), **none}
    out["trainer_suggested_threads"] = (
        float(max(1, math.floor(usable_cpus / len(trainers)))) if trainers and usable_cpus else None
    )
    if not trainers:
        return out
    cpu: dict[float, float] = defaultdict(float)
    for p in window.processes:
        if p.pid in trainers and p.cpu_pct is not None:
            cpu[p.t] += p.cpu_pct
    out["trainers_cpu_pct"] = _mean(cpu.values())
    threads: dict[tuple[int, int], list[ThreadSample]] = defaultdict(list)
    for th in window.threads:
        if th.pid in trainers and th.runq_s is not None:
            threads[(th.pid, th.tid)].append(th)
    per_trainer: dict[int, int] = dict.fromkeys(trainers, 0)
    run_sum = queued_sum = 0.0
    seen = False
    for (pid, _tid), samples in threads.items():
        sched = _sched_shares(samples)
        if sched is None:
            continue
        seen = True
        if sum(sched) >= BUSY_THREAD_SHARE:
            per_trainer[pid] += 1
            run_sum, queued_sum = run_sum + sched[0], queued_sum + sched[1]
    if not seen:
        return out
    out["trainer_busy_threads"] = float(sum(per_trainer.values()))
    out["trainer_threads"] = float(statistics.median(per_trainer.values()))
    out["trainers_runqueue_share"] = queued_sum / (run_sum + queued_sum) if run_sum + queued_sum > 0 else 0.0
    return out


def loop_window(window: Window, main_pid: int | None) -> Window:
    """``window`` from the training's first step on, when that step ended inside it.

    A window that reaches back before the first step mixes the training's start (imports, model
    set-up, CUDA initialisation, all on the loop's thread and on the CPU) with its loop, and its
    means then describe neither. Recorded on an H200 (2026-11-26), demo/gpu_bound.py took 9 s to
    its first step; over the 10 s window the GPU's utilization climbed 11 -> 62 % while the loop's
    thread read 96 -> 66 % running, and the rules called that GPU-bound training cpu-bound at
    confidence 0.95 for 8 s. From the first step on, every reading is of the loop. The hook's
    reading just before the step is kept as the base of its counters (steps, data wait).
    ``window`` as it is without the hook, before the first step, or when it began after it.
    """
    reads = [h for h in window.hook if main_pid is None or h.pid == main_pid]
    first = reads[-1].first_step_t if reads else 0.0
    if not window.start < first < window.end:
        return window

    def since(items: list[Any]) -> list[Any]:
        return [x for x in items if x.t >= first]

    before: dict[int, HookState] = {}  # each process's last reading before the step
    for h in window.hook:
        if h.t < first:
            before[h.pid] = h
    base = sorted(before.values(), key=lambda h: h.t)
    return Window(
        start=first,
        end=window.end,
        processes=since(window.processes),
        threads=since(window.threads),
        system=since(window.system),
        gpus=since(window.gpus),
        stacks=since(window.stacks),
        hook=base + since(window.hook),
    )


def compute(window: Window, main_pid: int | None) -> Features:
    """All features of :data:`CATALOGUE` for ``window``.

    Args:
        window: readings of the last few seconds.
        main_pid: the training process whose main thread is "the loop"; ``None`` takes any main.

    Returns:
        ``{name: value or None}`` with exactly the catalogue's keys.
    """
    window = loop_window(window, main_pid)
    f: Features = {}
    f.update(_stack_features(window, main_pid))
    f.update(producers.producer_features(window, main_pid, MIN_STACK_SAMPLES))
    f.update(_hook_features(window, main_pid))
    f.update(_compile_features(window, main_pid))
    f.update(_flop_features(window, main_pid, f))
    f.update(_prefer_measured_wait(f))
    f.update(_thread_features(window, main_pid))
    f.update(collective_cpu(window))
    f.update(_collective_wait(window, main_pid, f))
    f.update(_attribute_fetch(f))
    f.update(_combine(f))
    f.update(_cpu_wait(f))
    f.update(_process_features(window, main_pid))
    f.update(_system_features(window))
    f.update(trainer_features(window, f.get("usable_cpus")))
    f.update(_disk_tree_share(f))
    f.update(_cpu_budget(f))
    f.update(_gpu_features(window))
    return {name: f.get(name) for name in CATALOGUE}

"""Every feature, declared once: its name, unit, source and meaning (:data:`CATALOGUE`), and the
sample counts below which the stack and thread-state shares are ``None``."""

from __future__ import annotations

from torchwatch.analysis import progress as _progress
from torchwatch.model.observation import FeatureSpec

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

"""torchwatch.analysis.features.compute on synthetic windows of readings."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.hookrecords import hook_record
from torchwatch.analysis.features import CATALOGUE, MIN_STACK_SAMPLES, MIN_THREAD_SAMPLES, compute
from torchwatch.analysis.store import Window
from torchwatch.model.readings import (
    Frame,
    GpuSample,
    HookState,
    ProcessSample,
    Role,
    StackSample,
    SystemSample,
    ThreadSample,
    Wait,
)

MAIN = 1000
WORKERS = (1001, 1002)
SITE = "/usr/lib/python3.11/site-packages/torch"
DL = f"{SITE}/utils/data/dataloader.py"
MOD = Frame("<module>", "/home/u/train.py", 40)

FETCH = (
    MOD,
    Frame("_BaseDataLoaderIter.__next__", DL, 725),
    Frame("_SingleProcessDataLoaderIter._next_data", DL, 790),
    Frame("_MapDatasetFetcher.fetch", f"{SITE}/utils/data/_utils/fetch.py", 54),
    Frame("D.__getitem__", "/home/u/train.py", 7),
)
QUEUE = (
    MOD,
    Frame("_BaseDataLoaderIter.__next__", DL, 725),
    Frame("_MultiProcessingDataLoaderIter._next_data", DL, 1505),
    Frame("_MultiProcessingDataLoaderIter._get_data", DL, 1464),
    Frame("Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py", 113),
)
FORWARD = (
    MOD,
    Frame("Module._wrapped_call_impl", f"{SITE}/nn/modules/module.py", 1736),
    Frame("Net.forward", "/home/u/train.py", 12),
)
STARTUP = (MOD, Frame("_find_and_load", "<frozen importlib._bootstrap>", 1176))


def stack(frames: tuple[Frame, ...], count: int, pid: int = MAIN, tid: int | None = None) -> StackSample:
    tid = pid if tid is None else tid
    return StackSample(
        t=5.0,
        pid=pid,
        tid=tid,
        thread_name="MainThread",
        role=Role.MAIN,
        is_main_thread=tid == pid,
        frames=frames,
        count=count,
    )


def threads(pid: int, role: Role, **waits: int) -> list[ThreadSample]:
    """``waits`` main-thread samples per Wait name, e.g. ``threads(MAIN, Role.MAIN, DISK=7, RUNNING=3)``."""
    out = []
    i = 0
    for name, n in waits.items():
        wait = Wait[name]
        state = {"RUNNING": "R", "DISK": "D"}.get(name, "S")
        for _ in range(n):
            out.append(
                ThreadSample(
                    t=i * 0.1,
                    pid=pid,
                    tid=pid,
                    role=role,
                    is_main_thread=True,
                    state=state,
                    wait=wait,
                )
            )
            i += 1
    return out


def proc(
    pid: int,
    role: Role,
    t: float,
    cpu: float | None,
    rss: int | None = 100,
    read: float | None = None,
) -> ProcessSample:
    return ProcessSample(
        t=t,
        pid=pid,
        ppid=1,
        role=role,
        name="python",
        cmdline=("python", "train.py"),
        cpu_pct=cpu,
        rss_bytes=rss,
        read_bytes_per_s=read,
        write_bytes_per_s=None,
        num_threads=4,
    )


def gpu(
    index: int,
    util: float,
    t: float = 1.0,
    pids: tuple[int, ...] = (),
    mem: int = 50,
    power: float | None = 100.0,
) -> GpuSample:
    return GpuSample(
        t=t,
        index=index,
        name="GPU",
        util_pct=util,
        mem_used_bytes=mem,
        mem_total_bytes=100,
        power_w=power,
        power_limit_w=400.0,
        sm_clock_mhz=1500.0,
        pcie_tx_bytes_per_s=0.0,
        pcie_rx_bytes_per_s=0.0,
        target_pids=pids,
    )


def window(**kw: object) -> Window:
    return Window(start=0.0, end=10.0, **kw)  # type: ignore[arg-type]


def test_keys_are_exactly_the_catalogue() -> None:
    assert list(compute(window(), MAIN)) == list(CATALOGUE)
    full = window(
        stacks=[stack(FETCH, 50)],
        threads=threads(MAIN, Role.MAIN, RUNNING=20),
        processes=[proc(MAIN, Role.MAIN, 1.0, 90.0)],
        system=[SystemSample(1.0, 50.0, 1.0, 4.0)],
        gpus=[gpu(0, 80.0)],
    )
    assert list(compute(full, MAIN)) == list(CATALOGUE)


def test_empty_window_is_all_none_except_counts() -> None:
    f = compute(window(), MAIN)
    assert f["stack_samples"] == 0.0 and f["thread_samples"] == 0.0
    assert all(v is None for k, v in f.items() if k not in ("stack_samples", "thread_samples")), f


def test_too_few_samples_give_none_not_zero() -> None:
    w = window(
        stacks=[stack(FETCH, MIN_STACK_SAMPLES - 1)],
        threads=threads(MAIN, Role.MAIN, DISK=MIN_THREAD_SAMPLES - 1),
    )
    f = compute(w, MAIN)
    assert f["stack_samples"] == MIN_STACK_SAMPLES - 1
    assert f["thread_samples"] == MIN_THREAD_SAMPLES - 1
    for name in (
        "data_wait_share",
        "data_wait_fetch_share",
        "forward_share",
        "main_running_share",
        "main_disk_share",
        "fetch_cpu_share",
        "storage_wait_share",
        "input_cpu_share",
        "loop_cpu_share",
    ):
        assert f[name] is None, name


def test_startup_is_left_out_of_the_loop() -> None:
    f = compute(window(stacks=[stack(STARTUP, 60), stack(FETCH, 30), stack(FORWARD, 10)]), MAIN)
    assert f["stack_samples"] == 40.0
    assert f["startup_share"] == pytest.approx(0.6)
    assert f["data_wait_share"] == pytest.approx(0.75)
    assert f["forward_share"] == pytest.approx(0.25)


def test_other_processes_and_threads_are_not_the_loop() -> None:
    w = window(stacks=[stack(FORWARD, 30), stack(FETCH, 30, pid=2000), stack(FETCH, 30, tid=MAIN + 7)])
    f = compute(w, MAIN)
    assert f["stack_samples"] == 30.0 and f["forward_share"] == 1.0 and f["data_wait_share"] == 0.0


def test_nw0_main_thread_in_disk_wait_is_storage() -> None:
    w = window(
        stacks=[stack(FETCH, 80), stack(FORWARD, 20)],
        threads=threads(MAIN, Role.MAIN, DISK=70, RUNNING=30),
    )
    f = compute(w, MAIN)
    assert f["data_wait_fetch_share"] == pytest.approx(0.8)
    assert f["storage_wait_share"] == pytest.approx(0.7)
    assert f["fetch_disk_share"] == pytest.approx(0.7)
    assert f["fetch_cpu_share"] == pytest.approx(0.1)
    assert f["input_cpu_share"] == pytest.approx(0.1)
    assert f["loop_cpu_share"] == pytest.approx(0.2)


def test_nw0_main_thread_running_is_fetch_cpu() -> None:
    w = window(stacks=[stack(FETCH, 80), stack(FORWARD, 20)], threads=threads(MAIN, Role.MAIN, RUNNING=100))
    f = compute(w, MAIN)
    assert f["fetch_cpu_share"] == pytest.approx(0.8)
    assert f["input_cpu_share"] == pytest.approx(0.8)
    assert f["storage_wait_share"] == pytest.approx(0.0)
    assert f["loop_cpu_share"] == pytest.approx(0.2)


def test_nw0_sleeps_in_fetch_are_other_waits() -> None:
    w = window(
        stacks=[stack(FETCH, 80), stack(FORWARD, 20)],
        threads=threads(MAIN, Role.MAIN, SLEEP=50, RUNNING=50),
    )
    f = compute(w, MAIN)
    assert f["fetch_other_wait_share"] == pytest.approx(0.5)
    assert f["fetch_cpu_share"] == pytest.approx(0.3)
    assert f["main_sleep_share"] == pytest.approx(0.5)


def test_queue_wait_with_workers_in_disk_wait_is_storage() -> None:
    w = window(
        stacks=[stack(QUEUE, 60), stack(FORWARD, 40)],
        threads=threads(MAIN, Role.MAIN, SYNC=60, RUNNING=40)
        + threads(WORKERS[0], Role.WORKER, DISK=40, RUNNING=10)
        + threads(WORKERS[1], Role.WORKER, DISK=40, RUNNING=10),
    )
    f = compute(w, MAIN)
    assert f["data_wait_queue_share"] == pytest.approx(0.6)
    assert f["workers_disk_fraction"] == pytest.approx(0.8)
    assert f["storage_wait_share"] == pytest.approx(0.6 * 0.8)
    assert f["input_cpu_share"] == pytest.approx(0.6 * 0.2)
    assert f["main_sync_share"] == pytest.approx(0.6)


def test_queue_wait_with_running_workers_is_input_cpu() -> None:
    w = window(
        stacks=[stack(QUEUE, 60), stack(FORWARD, 40)],
        threads=threads(MAIN, Role.MAIN, SYNC=60, RUNNING=40)
        + threads(WORKERS[0], Role.WORKER, RUNNING=50)
        + threads(WORKERS[1], Role.WORKER, RUNNING=45, SYNC=5),
    )
    f = compute(w, MAIN)
    assert f["workers_running_fraction"] == pytest.approx(1.0)
    assert f["workers_busy_share"] == pytest.approx(0.95)
    assert f["input_cpu_share"] == pytest.approx(0.6)
    assert f["storage_wait_share"] == pytest.approx(0.0)


def test_idle_workers_give_no_fractions() -> None:
    w = window(
        stacks=[stack(FORWARD, 100)],
        threads=threads(MAIN, Role.MAIN, RUNNING=20) + threads(WORKERS[0], Role.WORKER, SYNC=50),
    )
    f = compute(w, MAIN)
    assert f["workers_busy_share"] == 0.0
    assert f["workers_running_fraction"] is None  # nothing produced: a fraction of nothing
    assert f["input_cpu_share"] == 0.0  # no queue wait: workers explain nothing


def test_process_features() -> None:
    w = window(
        processes=[
            proc(MAIN, Role.MAIN, 1.0, None, read=1e6),
            proc(WORKERS[0], Role.WORKER, 1.0, None),
            proc(MAIN, Role.MAIN, 2.0, 100.0, rss=1000, read=3e6),
            proc(WORKERS[0], Role.WORKER, 2.0, 80.0, rss=500),
            proc(WORKERS[1], Role.WORKER, 2.0, 60.0, rss=500, read=1e6),
        ]
    )
    f = compute(w, MAIN)
    assert f["main_cpu_pct"] == 100.0
    assert f["workers_cpu_pct"] == 140.0
    assert f["worker_count"] == 2.0
    assert f["rss_bytes"] == 2000.0
    assert f["read_bytes_per_s"] == pytest.approx((1e6 + 4e6) / 2)


def test_system_features() -> None:
    w = window(system=[SystemSample(1.0, 40.0, None, 4.0), SystemSample(2.0, 60.0, 10.0, 2.0)])
    f = compute(w, MAIN)
    assert (f["system_cpu_pct"], f["io_pressure_pct"], f["usable_cpus"]) == (50.0, 10.0, 2.0)


def test_gpu_features_use_only_the_targets_gpus() -> None:
    w = window(
        gpus=[
            gpu(0, 5.0, pids=(), mem=99),
            gpu(1, 90.0, pids=(MAIN,), mem=40),
            gpu(0, 7.0, t=2.0, mem=99),
            gpu(1, 94.0, t=2.0, pids=(MAIN,), mem=60, power=200.0),
        ]
    )
    f = compute(w, MAIN)
    assert f["gpu_count"] == 1.0
    assert f["gpu_util_mean"] == pytest.approx(92.0)
    assert f["gpu_mem_ratio"] == pytest.approx(0.6)
    assert f["gpu_power_ratio"] == pytest.approx((0.25 + 0.5) / 2)


def test_gpu_features_use_all_gpus_when_none_has_the_target() -> None:
    f = compute(window(gpus=[gpu(0, 10.0), gpu(1, 30.0)]), MAIN)
    assert f["gpu_count"] == 2.0 and f["gpu_util_mean"] == pytest.approx(20.0)


def test_no_gpu_samples_give_none() -> None:
    f = compute(window(stacks=[stack(FORWARD, 100)]), MAIN)
    for name in ("gpu_count", "gpu_util_mean", "gpu_power_ratio", "gpu_mem_ratio", *GPM_FEATURES, "gpu_proc_sm_pct"):
        assert f[name] is None, name


GPM_FEATURES = ("gpu_sm_active_mean", "gpu_sm_occupancy_mean", "gpu_tensor_active_mean", "gpu_dram_bw_mean")


def test_gpm_features_are_shares_of_the_targets_gpus_and_skip_samples_without_gpm() -> None:
    def gpm(index: int, t: float, sm: float | None, pids: tuple[int, ...] = (MAIN,)) -> GpuSample:
        reason = None if sm is not None else "first GPM sample: the metrics come with the next one"
        return dataclasses.replace(
            gpu(index, 99.0, t=t, pids=pids),
            sm_active_pct=sm,
            sm_occupancy_pct=None if sm is None else sm / 4,
            tensor_active_pct=None if sm is None else sm / 2,
            dram_bw_pct=None if sm is None else 100.4,  # GPM can stray a little above 100
            gpm_reason=reason,
            proc_sm_pct=97.0,
        )

    f = compute(window(gpus=[gpm(0, 1.0, None), gpm(0, 2.0, 80.0), gpm(0, 3.0, 90.0), gpm(1, 2.0, 5.0, pids=())]), MAIN)
    assert f["gpu_sm_active_mean"] == pytest.approx(0.85)  # GPU 1 is not the training's; the first sample has none
    assert f["gpu_sm_occupancy_mean"] == pytest.approx(0.2125)
    assert f["gpu_tensor_active_mean"] == pytest.approx(0.425)
    assert f["gpu_dram_bw_mean"] == 1.0  # clipped to a share
    assert f["gpu_proc_sm_pct"] == pytest.approx(97.0)


def test_gpu_without_gpm_gives_none_not_zero() -> None:
    no_gpm = dataclasses.replace(gpu(0, 100.0, pids=(MAIN,)), gpm_reason="GPM needs a Hopper or newer GPU (this is X)")
    f = compute(window(gpus=[no_gpm]), MAIN)
    assert f["gpu_util_mean"] == 100.0
    for name in GPM_FEATURES:
        assert f[name] is None, name


def test_burst_gpu_features_come_from_the_summary() -> None:
    summary = {
        "breakdown_share": {"kernel": 0.3, "dataloader": 0.0, "cpu_exec": 0.1},
        "step_time_ms": 10.0,
        "gpu_idle_share": 0.6,
        "gpu_idle_split_share": {"host_wait": 0.5, "kernel_wait": 0.04, "other": 0.06},
        "kernels_per_step": 420.0,
        "short_kernel_share": 0.9,
        "pageable_h2d": {"copies_per_step": 2.0, "ms_per_step": 1.5, "bytes_per_step": 4e6},
        "started_at": 5.0,
    }
    hook = HookState(
        t=9.0,
        pid=MAIN,
        steps=10,
        batches=10,
        data_wait_s=0.0,
        in_next_since=0.0,
        record=hook_record(MAIN, burst={"last": summary}),
    )
    f = compute(window(hook=[hook]), MAIN)
    assert (f["burst_host_wait_share"], f["burst_kernel_wait_share"]) == (0.5, 0.04)
    assert (f["burst_kernels_per_step"], f["burst_pageable_h2d_per_step"]) == (420.0, 2.0)
    assert f["burst_pageable_h2d_bytes_per_step"] == 4e6
    assert f["burst_pageable_h2d_share"] == pytest.approx(0.15)
    # a CPU-only burst: no device numbers, so none of these
    cpu_only = {**summary, "gpu_idle_share": None, "gpu_idle_split_share": None, "pageable_h2d": None}
    hook = dataclasses.replace(hook, record=hook_record(MAIN, burst={"last": cpu_only}))
    f = compute(window(hook=[hook]), MAIN)
    for name in ("burst_host_wait_share", "burst_kernel_wait_share", "burst_pageable_h2d_per_step"):
        assert f[name] is None, name


def with_sys(samples: list[ThreadSample], sys_share: float) -> list[ThreadSample]:
    """The same samples with a cumulative system time growing at ``sys_share`` of wall time."""
    from dataclasses import replace

    return [replace(s, cpu_s=s.t, sys_s=s.t * sys_share) for s in samples]


def test_kernel_time_of_reads_counts_as_storage_up_to_the_disk_wait() -> None:
    """O_DIRECT reads show R for their kernel part: that part moves from CPU to storage."""
    samples = with_sys(threads(MAIN, Role.MAIN, DISK=30, RUNNING=70), sys_share=0.45)
    f = compute(Window(0.0, 10.0, threads=samples), MAIN)
    assert f["main_sys_share"] == pytest.approx(0.45, abs=0.01)
    assert f["main_disk_share"] == pytest.approx(0.30 + 0.30, abs=0.01)  # capped at the disk wait
    assert f["main_running_share"] == pytest.approx(0.70 - 0.30, abs=0.01)


def test_system_time_without_disk_wait_stays_cpu() -> None:
    """Page faults of fresh allocations are system time too: with no disk wait, nothing moves."""
    samples = with_sys(threads(MAIN, Role.MAIN, RUNNING=100), sys_share=0.4)
    f = compute(Window(0.0, 10.0, threads=samples), MAIN)
    assert f["main_disk_share"] == 0.0
    assert f["main_running_share"] == 1.0


def test_worker_kernel_read_time_shifts_the_workers_disk_fraction() -> None:
    worker = with_sys(threads(WORKERS[0], Role.WORKER, DISK=50, RUNNING=50), sys_share=0.4)
    f = compute(Window(0.0, 10.0, threads=worker), MAIN)
    assert f["workers_disk_fraction"] == pytest.approx(0.9, abs=0.01)
    assert f["workers_running_fraction"] == pytest.approx(0.1, abs=0.01)


def test_cpu_budget_features() -> None:
    procs = [proc(MAIN, Role.MAIN, t, 90.0) for t in (1.0, 2.0)] + [
        proc(WORKERS[0], Role.WORKER, t, 105.0) for t in (1.0, 2.0)
    ]
    system = [SystemSample(t=2.0, cpu_pct=98.0, io_some_pct=None, usable_cpus=2.0)]
    f = compute(Window(0.0, 3.0, processes=procs, system=system), MAIN)
    assert f["tree_cpu_saturation"] == pytest.approx(195 / 200)
    assert f["workers_cpu_fraction"] == pytest.approx(105 / 195)


def test_run_queue_wait_of_the_loop() -> None:
    from dataclasses import replace

    samples = [replace(s, runq_s=s.t * 0.3) for s in threads(MAIN, Role.MAIN, RUNNING=100)]
    f = compute(Window(0.0, 10.0, threads=samples), MAIN)
    assert f["main_runqueue_share"] == pytest.approx(0.3, abs=0.01)
    assert (
        compute(Window(0.0, 10.0, threads=threads(MAIN, Role.MAIN, RUNNING=100)), MAIN)["main_runqueue_share"] is None
    )


def _counted(samples: list[ThreadSample], busy_per_s: float, queued: float = 1 / 3) -> list[ThreadSample]:
    """``samples`` with scheduler counters growing ``busy_per_s`` s per s, ``1 - queued`` of it on a
    CPU and ``queued`` waiting for one."""
    return [
        dataclasses.replace(s, run_s=5.0 + s.t * busy_per_s * (1 - queued), runq_s=1.0 + s.t * busy_per_s * queued)
        for s in samples
    ]


def _interleaved(**waits: int) -> list[ThreadSample]:
    """Main-thread samples at 0.1 s whose waits alternate (a periodic loop), not in runs."""
    kinds = [name for name, n in waits.items() for _ in range(n)]
    kinds = [kinds[(i * 7) % len(kinds)] for i in range(len(kinds))]
    return [
        ThreadSample(
            t=i * 0.1,
            pid=MAIN,
            tid=MAIN,
            role=Role.MAIN,
            is_main_thread=True,
            state={"RUNNING": "R", "DISK": "D"}.get(k, "S"),
            wait=Wait[k],
        )
        for i, k in enumerate(kinds)
    ]


def test_the_loop_running_share_comes_from_its_scheduler_counters_not_its_state_letters() -> None:
    """Letters read R 40 % of the time (reads in phase with a loop busy 15 %); the counters say 15 %
    (10 % on a CPU, 5 % waiting for one), and the waits share the other 85 % as their letters do
    (half sleep, half disk)."""
    samples = _counted(_interleaved(RUNNING=40, SLEEP=30, DISK=30), busy_per_s=0.15)
    f = compute(Window(0.0, 10.0, threads=samples), MAIN)
    assert f["main_running_share"] == pytest.approx(0.10, abs=0.005)
    assert f["main_runqueue_share"] == pytest.approx(0.05, abs=0.005)
    assert f["main_sleep_share"] == pytest.approx(0.425, abs=0.005)
    assert f["main_disk_share"] == pytest.approx(0.425, abs=0.005)
    letters = compute(Window(0.0, 10.0, threads=_interleaved(RUNNING=40, SLEEP=30, DISK=30)), MAIN)
    assert letters["main_running_share"] == pytest.approx(0.40)  # without counters: the letters


def test_busy_time_no_letter_found_waiting_is_other() -> None:
    f = compute(Window(0.0, 10.0, threads=_counted(_interleaved(RUNNING=100), busy_per_s=0.6)), MAIN)
    assert f["main_running_share"] == pytest.approx(0.4, abs=0.005)
    assert f["main_runqueue_share"] == pytest.approx(0.2, abs=0.005)
    assert f["main_sleep_share"] == 0.0


def test_waiting_for_a_cpu_is_not_computing() -> None:
    """A loop that sleeps 40 % of the time beside a busy neighbour: state R 60 % of the samples, but
    the scheduler says 25 % on a CPU and 35 % waiting for one. The loop's running share (what
    loop_cpu_share is made of) is the 25 %: no loop-cpu from a neighbour's load; the 35 % is the
    loop's wait for a CPU."""
    samples = _counted(_interleaved(RUNNING=60, SLEEP=40), busy_per_s=0.6, queued=0.35 / 0.6)
    f = compute(Window(0.0, 10.0, threads=samples), MAIN)
    assert f["main_running_share"] == pytest.approx(0.25, abs=0.005)
    assert f["main_runqueue_share"] == pytest.approx(0.35, abs=0.005)
    assert f["main_sleep_share"] == pytest.approx(0.40, abs=0.005)
    assert f["cpu_wait_share"] == pytest.approx(0.35, abs=0.005)


def test_counters_of_several_threads_or_going_back_are_not_used() -> None:
    """Two processes' main threads in one group, or a TID reused by a younger thread (counters
    smaller than before): the letters decide."""
    samples = _counted(_interleaved(RUNNING=40, SLEEP=60), busy_per_s=0.15)
    reused = samples[:50] + [dataclasses.replace(s, run_s=0.1, runq_s=0.0) for s in samples[50:]]
    assert compute(Window(0.0, 10.0, threads=reused), MAIN)["main_running_share"] == pytest.approx(0.40)
    other = [dataclasses.replace(s, pid=MAIN + 1, tid=MAIN + 1) for s in samples[::2]]
    mixed = sorted(samples[1::2] + other, key=lambda s: s.t)
    assert compute(Window(0.0, 10.0, threads=mixed), None)["main_running_share"] == pytest.approx(0.40)


def disk_sample(
    t: float,
    disk: str | None,
    rbytes: float,
    reads: float = 0.0,
    inflight: float = 0.0,
    busy: float = 0.0,
    **kw: float,
) -> SystemSample:
    return SystemSample(
        t,
        50.0,
        None,
        2.0,
        disk=disk,
        disk_read_bytes_per_s=rbytes,
        disk_reads_per_s=reads,
        disk_read_inflight=inflight,
        disk_busy=busy,
        **kw,  # type: ignore[arg-type]
    )


def test_disk_features_are_ratios_of_window_means_on_the_busiest_device() -> None:
    # 4 s: vda reads 4 KiB requests (1000/s, 0.06 s of read time per s), one second with no
    # reads anywhere, and one second in which sdb led with a single large read.
    system = [
        disk_sample(1.0, "vda", 4096e3, 1000, 0.06, 0.7),
        disk_sample(2.0, "vda", 4096e3, 1000, 0.06, 0.7),
        disk_sample(3.0, None, 0.0),
        disk_sample(4.0, "sdb", 1e6, 1, 0.002, 0.002),
    ]
    f = compute(window(system=system), MAIN)
    assert f["disk_read_bytes_per_s"] == pytest.approx(2 * 4096e3 / 4)
    assert f["disk_read_request_bytes"] == pytest.approx(4096)
    assert f["disk_read_await_ms"] == pytest.approx(0.06)  # 0.12 s of read time / 2000 reads
    assert f["disk_busy_share"] == pytest.approx(1.4 / 4)
    assert f["disk_read_queue"] == pytest.approx(0.12 / 1.4)


def test_disk_features_need_enough_requests_and_some_reads() -> None:
    few = compute(window(system=[disk_sample(1.0, "vda", 8e6, 4, 0.01, 0.01), disk_sample(2.0, None, 0.0)]), MAIN)
    assert few["disk_read_bytes_per_s"] == pytest.approx(4e6)
    assert few["disk_read_request_bytes"] is None and few["disk_read_queue"] is None  # 4 reads < MIN_DISK_READS
    assert few["disk_busy_share"] == pytest.approx(0.005)
    idle = compute(window(system=[disk_sample(1.0, None, 0.0), disk_sample(2.0, None, 0.0)]), MAIN)
    assert idle["disk_read_bytes_per_s"] == 0.0
    assert idle["disk_busy_share"] is None and idle["disk_read_request_bytes"] is None
    unread = compute(window(system=[SystemSample(1.0, 50.0, None, 2.0)]), MAIN)
    assert unread["disk_read_bytes_per_s"] is None and unread["disk_tree_share"] is None


def test_disk_tree_share_compares_the_trees_reads_with_the_devices() -> None:
    procs = [proc(MAIN, Role.MAIN, 1.0, 100.0, read=2e6), proc(MAIN, Role.MAIN, 2.0, 100.0, read=2e6)]
    system = [disk_sample(1.0, "vda", 4e6, 100, 0.1, 0.5), disk_sample(2.0, "vda", 4e6, 100, 0.1, 0.5)]
    f = compute(window(processes=procs, system=system), MAIN)
    assert f["disk_tree_share"] == pytest.approx(0.5)
    # the tree reads 50x what the local disk serves (a network file system): not clipped to 1
    far = [disk_sample(1.0, "vda", 4e4, 100, 0.1, 0.5), disk_sample(2.0, "vda", 4e4, 100, 0.1, 0.5)]
    assert compute(window(processes=procs, system=far), MAIN)["disk_tree_share"] == pytest.approx(50.0)


def test_memory_features() -> None:
    system = [
        disk_sample(1.0, None, 0.0, swap_in_bytes_per_s=0.0, mem_some_pct=10.0, mem_available_bytes=5e9),
        disk_sample(2.0, None, 0.0, swap_in_bytes_per_s=4e6, mem_some_pct=30.0, mem_available_bytes=2e9),
    ]
    f = compute(window(system=system), MAIN)
    assert (f["swap_in_bytes_per_s"], f["memory_pressure_pct"], f["mem_available_bytes"]) == (2e6, 20.0, 2e9)


# -- the loop's CPU work on the autograd engine's thread (recorded on an H200, 2026-11-26) ----------------


def _autograd_thread(busy_per_s: float, tid: int = MAIN + 7, pid: int = MAIN) -> list[ThreadSample]:
    """An autograd device thread (pt_autograd_0) sampled every 0.1 s for 10 s, busy ``busy_per_s``."""
    return [
        ThreadSample(
            t=i * 0.1,
            pid=pid,
            tid=tid,
            role=Role.MAIN,
            is_main_thread=False,
            state="S",
            wait=Wait.SYNC,
            run_s=2.0 + i * 0.1 * busy_per_s,
            runq_s=0.0,
            autograd=True,
        )
        for i in range(100)
    ]


def test_the_autograd_threads_busy_time_is_the_loops_own_cpu_work() -> None:
    """On CUDA, backward runs on pt_autograd_0 while the main thread sleeps on a futex for it: main
    45 % running, 55 % sync (demo/launch_bound.py on an H200). With the engine thread busy 50 %,
    that 50 % of the main thread's sync time is the loop computing: 95 % running, 5 % sync."""
    main = _counted(_interleaved(RUNNING=45, SYNC=55), busy_per_s=0.45, queued=0.0)
    alone = compute(Window(0.0, 10.0, threads=main), MAIN)
    assert alone["main_sync_share"] == pytest.approx(0.55, abs=0.01)
    assert alone["autograd_running_share"] is None  # a CPU training has no engine thread
    both = compute(Window(0.0, 10.0, threads=sorted(main + _autograd_thread(0.5), key=lambda s: s.t)), MAIN)
    assert both["autograd_running_share"] == pytest.approx(0.5, abs=0.01)
    assert both["main_running_share"] == pytest.approx(0.95, abs=0.01)
    assert both["main_sync_share"] == pytest.approx(0.05, abs=0.01)
    # never more than the main thread waited, and only the engine threads of the training itself
    busy = compute(Window(0.0, 10.0, threads=sorted(main + _autograd_thread(0.9), key=lambda s: s.t)), MAIN)
    assert busy["main_running_share"] == pytest.approx(1.0, abs=0.01)
    assert busy["main_sync_share"] == pytest.approx(0.0, abs=0.01)
    other = _autograd_thread(0.5, tid=MAIN + 100, pid=MAIN + 99)
    apart = compute(Window(0.0, 10.0, threads=sorted(main + other, key=lambda s: s.t)), MAIN)
    assert apart["main_sync_share"] == pytest.approx(0.55, abs=0.01)


# -- the window from the loop's first step on --------------------------------------------------------------


def _hook_read(t: float, steps: int, first_step_t: float) -> HookState:
    return HookState(
        t=t, pid=MAIN, steps=steps, batches=0, data_wait_s=0.0, in_next_since=0.0, first_step_t=first_step_t
    )


def test_readings_before_the_first_step_are_left_out_of_the_window() -> None:
    """demo/gpu_bound.py on an H200: 9 s of start-up (imports, CUDA initialisation, the loop's thread
    running) then a GPU at 100 %. A window holding both read the GPU 11-62 % busy and the loop's
    thread 96-66 % running; from the first step on it reads what the loop does."""
    first = 6.0
    gpus = [dataclasses.replace(gpu(0, 0.0 if t < first else 100.0, t=t, pids=(MAIN,))) for t in range(10)]
    main = [
        dataclasses.replace(s, state="R" if s.t < first else "S", wait=Wait.RUNNING if s.t < first else Wait.SYNC)
        for s in threads(MAIN, Role.MAIN, RUNNING=100)
    ]
    hook = [_hook_read(float(t), 0 if t < first else (t - 5) * 70, first if t >= first else 0.0) for t in range(11)]
    f = compute(Window(0.0, 10.0, threads=main, gpus=gpus, hook=hook), MAIN)
    assert f["gpu_util_mean"] == pytest.approx(100.0)
    assert f["thread_samples"] == 40  # 6.0 .. 9.9 s
    assert f["main_running_share"] == pytest.approx(0.0)
    assert f["hook_steps_per_s"] == pytest.approx(70.0)  # the reading at 5 s is the base of the count
    assert f["loop_started"] == 1.0
    # before the first step: the whole window, and the loop has not started
    early = compute(Window(0.0, 5.5, threads=main[:55], gpus=gpus[:6], hook=hook[:6]), MAIN)
    assert early["loop_started"] == 0.0
    assert early["thread_samples"] == 55
    # without the hook there is no first step to cut at
    assert compute(Window(0.0, 10.0, threads=main, gpus=gpus), MAIN)["gpu_util_mean"] == pytest.approx(40.0)

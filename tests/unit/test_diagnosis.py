"""torchwatch.analysis.diagnosis with the shipped rules: firing, silence, not-applicable, verdict, hysteresis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.reports import loader_info
from tests.unit.rules import RULES, features
from torchwatch.analysis.diagnosis import Analysis, Diagnoser
from torchwatch.analysis.features import CATALOGUE, PROGRESS_FEATURES, WATCH_FEATURES, Features
from torchwatch.analysis.rules_engine import Rule, parse_rule

WINDOWS = Path(__file__).resolve().parent.parent / "fixtures" / "windows"


# The loop waits on reads of a device that carries the training's reads (storage-wait holds).
_STORAGE: dict[str, Any] = {
    "storage_wait_share": 0.5,
    "main_disk_share": 0.5,
    "loop_cpu_share": 0.1,
    "disk_tree_share": 1.0,
    "disk_read_bytes_per_s": 80e6,
    "disk_read_await_ms": 0.1,
    "disk_busy_share": 0.7,
}


# NVML util 100 % with GPM SM activity 0.2: many small kernels (Hopper with GPM).
_LAUNCH_GPM: dict[str, Any] = {"gpu_util_mean": 100.0, "gpu_sm_active_mean": 0.2, "data_wait_share": 0.0}
# A CUDA burst: GPU idle 45 % of the step, 40 % waiting for the host, kernels of normal length.
_HOST_WAIT: dict[str, Any] = {
    "burst_gpu_idle_share": 0.45,
    "burst_host_wait_share": 0.4,
    "burst_kernel_wait_share": 0.01,
    "burst_kernel_share": 0.5,
    "burst_short_kernel_share": 0.1,
    "burst_age_s": 20.0,
    "main_running_share": 0.9,
}


# Per shipped rule: values that fire it, values that keep it silent, and the input that when
# None makes it not applicable (set on top of the firing values).
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    # the loss's health: features from torchwatch.analysis.progress (test_progress builds them from readings)
    "loss-not-finite": (
        {"loss_nonfinite": 1.0, "loss_nonfinite_step": 20.0, "loss_last_finite_step": 19.0, "loss": float("nan")},
        {"loss_nonfinite": 0.0, "loss": 0.5},
        "loss_nonfinite",  # no loss read (no hook, or a backward that is not a loss)
    ),
    "loss-spike": (
        {"loss_spike_z": 12.0, "loss_spike_ratio": 3.0, "loss_spike_step": 400.0, "loss": 1.5},
        {"loss_spike_z": 2.0, "loss_spike_ratio": 1.1, "loss_spike_step": 400.0},
        "loss_spike_z",  # under a minute of readings before the last 5 s
    ),
    "loss-stalled": (
        {"loss_change_share": 0.002, "loss_trend_significant": 0.0, "loss_trend_per_min": -0.0001, "loss": 0.7},
        {"loss_change_share": 0.2, "loss_trend_significant": 1.0},
        "loss_change_share",  # under 2 minutes of readings
    ),
    # the memory forecast's features come from torchwatch.watch.memwatch (its own tests build them)
    "memory-growth": (
        {
            "mem_forecast_s": 190.0,
            "mem_forecast_soonest_s": 150.0,
            "mem_forecast_latest_s": 260.0,
            "mem_growth_bytes_per_s": 6.5 * 2**20,
            "mem_used_bytes": 1.2 * 2**30,
            "mem_limit_bytes": 2.4 * 2**30,
            "mem_tree_growth_share": 0.98,
            "worker_private_growth_bytes_per_s": 6.4 * 2**20,
            "worker_count": 2.0,
        },
        {"mem_forecast_s": 90000.0},
        "mem_forecast_s",  # no real, steady rise: no forecast
    ),
    "loader-worker-memory-growth": (
        {
            "worker_private_growth_bytes_per_s": 6.4 * 2**20,
            "worker_private_growth_bytes": 400.0 * 2**20,
            "worker_shared_drop_bytes": 390.0 * 2**20,
            "worker_cow_share": 0.97,
            "worker_count": 2.0,
        },
        {"worker_private_growth_bytes_per_s": 0.0, "worker_cow_share": 0.0},
        "worker_private_growth_bytes_per_s",  # no steady rise of the workers' private memory
    ),
    "gpu-memory-growth": (
        {
            "cuda_mem_forecast_s": 95.0,
            "cuda_mem_forecast_soonest_s": 80.0,
            "cuda_mem_growth_bytes_per_s": 0.5 * 2**30,
            "cuda_mem_peak_bytes": 40.0 * 2**30,
            "cuda_mem_reserved_bytes": 44.0 * 2**30,
            "cuda_mem_capacity_bytes": 80.0 * 2**30,
            "cuda_alloc_retries": 0.0,
        },
        {"cuda_mem_forecast_s": 200000.0},
        "cuda_mem_forecast_s",
    ),
    "gpu-memory-pressure": ({"gpu_mem_ratio": 0.95}, {"gpu_mem_ratio": 0.5}, "gpu_mem_ratio"),
    # FABRICATED (no GPU lent): a hook reading of an 80 GiB device, 76 GiB reserved, 40 GiB peak
    "gpu-memory-fragmentation": (
        {"cuda_mem_unused_reserved_bytes": 36.0 * 2**30, "cuda_mem_unused_reserved_share": 36 / 76},
        {"cuda_mem_unused_reserved_bytes": 0.5 * 2**30, "cuda_mem_unused_reserved_share": 0.5 / 76},
        "cuda_mem_unused_reserved_bytes",  # no hook, or CUDA not initialised
    ),
    "gpu-saturated": (
        {"gpu_util_mean": 97.0, "data_wait_share": 0.05, "gpu_sm_active_mean": 0.92},
        {"gpu_util_mean": 97.0, "data_wait_share": 0.5, "gpu_sm_active_mean": 0.92},
        "gpu_util_mean",
    ),
    "gpu-util-unverified": (
        # util alone, no GPM (an A100), no burst: cannot be checked
        {"gpu_util_mean": 97.0, "data_wait_share": 0.05},
        {"gpu_util_mean": 97.0, "data_wait_share": 0.05, "gpu_sm_active_mean": 0.92},
        "gpu_util_mean",  # no NVML at all
    ),
    "gpu-launch-bound": (
        {**_LAUNCH_GPM},
        {**_LAUNCH_GPM, "gpu_sm_active_mean": 0.85},
        "gpu_util_mean",
    ),
    "gpu-host-wait": (
        {**_HOST_WAIT},
        # idle, but mostly waiting on something already queued (events, another stream)
        {**_HOST_WAIT, "burst_host_wait_share": 0.05, "burst_kernel_wait_share": 0.02},
        "burst_gpu_idle_share",  # a CPU-only burst: no device events
    ),
    "pageable-h2d": (
        {
            "burst_pageable_h2d_bytes_per_step": 48 * 2**20,
            "burst_pageable_h2d_per_step": 2.0,
            "burst_age_s": 30.0,
            "burst_pageable_h2d_share": 0.12,
        },
        # a few scalars copied to the device each step: normal
        {
            "burst_pageable_h2d_bytes_per_step": 64.0,
            "burst_pageable_h2d_per_step": 8.0,
            "burst_age_s": 30.0,
            "burst_pageable_h2d_share": 0.001,
        },
        "burst_pageable_h2d_bytes_per_step",  # no CUDA burst yet
    ),
    "input-waits-elsewhere": (
        {"input_other_wait_share": 0.5},
        {"input_other_wait_share": 0.05},
        "input_other_wait_share",
    ),
    "loader-cpu-in-main-thread": (
        {"fetch_cpu_share": 0.6, "loop_cpu_share": 0.3},
        # in-thread loading a quarter of the step beside 3x as much loop CPU: not the limit
        {"fetch_cpu_share": 0.25, "loop_cpu_share": 0.75},
        "fetch_cpu_share",
    ),
    "loader-cpu-contention": (
        {
            "worker_count": 2.0,
            "tree_cpu_saturation": 0.95,
            "workers_cpu_fraction": 0.55,
            "workers_running_fraction": 0.9,
        },
        # CPUs to spare: the workers take nothing from the loop
        {
            "worker_count": 2.0,
            "tree_cpu_saturation": 0.5,
            "workers_cpu_fraction": 0.55,
            "workers_running_fraction": 0.9,
        },
        "tree_cpu_saturation",
    ),
    # Beside one busy process on 2 CPUs: the loop's intra-op thread waits for a CPU 30 % of the time.
    "cpu-contention": (
        {"cpu_wait_share": 0.3, "foreign_cpu_cores": 1.0, "usable_cpus": 2.0, "intra_op_threads": 2.0},
        # the same wait with no neighbour: it comes from inside the training, not from others
        {"cpu_wait_share": 0.3, "foreign_cpu_cores": 0.1, "usable_cpus": 2.0, "intra_op_threads": 2.0},
        "foreign_cpu_cores",
    ),
    # Hogwild: 4 trainer processes x 2 busy threads on 2 CPUs, waiting 80 % of the time they want
    # one (tests/scenarios/hogwild_fork.py read 0.78-0.84).
    "cpu-oversubscribed-trainers": (
        {
            "trainer_count": 4.0,
            "trainer_busy_threads": 8.0,
            "trainer_threads": 2.0,
            "trainer_suggested_threads": 1.0,
            "usable_cpus": 2.0,
            "trainers_runqueue_share": 0.8,
            "trainers_cpu_pct": 190.0,
            "foreign_cpu_cores": 0.1,
        },
        # the relief: 4 trainers x 1 thread, beyond the CPUs but hardly waiting (no barrier)
        {
            "trainer_count": 4.0,
            "trainer_busy_threads": 4.0,
            "trainer_threads": 1.0,
            "trainer_suggested_threads": 1.0,
            "usable_cpus": 2.0,
            "trainers_runqueue_share": 0.15,
        },
        "trainers_runqueue_share",  # no trainer thread's counters cover 1 s yet
    ),
    # OMP_NUM_THREADS=8 on 2 CPUs, threads waiting for a CPU 40 % of the time, no neighbour.
    "cpu-oversubscribed": (
        {
            "cpu_threads_wanted": 8.0,
            "intra_op_threads": 8.0,
            "local_ranks": 1.0,
            "worker_count": 0.0,
            "usable_cpus": 2.0,
            "cpu_wait_share": 0.4,
            "threads_runqueue_share": 0.4,
        },
        # as many threads, but none waits for a CPU (they idle between ops): no harm seen
        {
            "cpu_threads_wanted": 8.0,
            "intra_op_threads": 8.0,
            "local_ranks": 1.0,
            "worker_count": 0.0,
            "usable_cpus": 2.0,
            "cpu_wait_share": 0.3,  # the workers queue for CPUs, the loop's threads do not
            "threads_runqueue_share": 0.05,
        },
        "cpu_threads_wanted",  # no hook: the threads asked for are not known
    ),
    # A quota of 1 CPU throttles 80 % of the periods; the group stands still 40 % of the time.
    "cpu-quota-throttled": (
        {"cpu_quota_cpus": 1.0, "cpu_throttled_periods_share": 0.8, "cpu_throttled_share": 0.4},
        {"cpu_quota_cpus": 1.0, "cpu_throttled_periods_share": 0.1, "cpu_throttled_share": 0.02},
        "cpu_throttled_periods_share",  # no quota
    ),
    "loader-cpu-in-workers": (
        {"worker_count": 2.0, "data_wait_queue_share": 0.6, "workers_running_fraction": 0.9},
        {"worker_count": 2.0, "data_wait_queue_share": 0.6, "workers_running_fraction": 0.1},
        "data_wait_queue_share",
    ),
    "loop-cpu": (
        {"loop_cpu_share": 0.8},
        {"loop_cpu_share": 0.8, "gpu_util_mean": 95.0},
        "loop_cpu_share",
    ),
    "loop-sleeps": ({"main_sleep_share": 0.6}, {"main_sleep_share": 0.1}, "main_sleep_share"),
    "loop-host-sync": (
        {"burst_sync_per_step": 2.0, "burst_gpu_idle_share": 0.45, "burst_age_s": 20.0},
        {"burst_sync_per_step": 2.0, "burst_gpu_idle_share": 0.05, "burst_age_s": 20.0},
        "burst_gpu_idle_share",  # a CPU run: no device events in the burst
    ),
    "loop-tiny-ops": (
        {"burst_cpu_ops_per_step": 9000.0, "loop_cpu_share": 0.8, "burst_age_s": 20.0},
        {"burst_cpu_ops_per_step": 300.0, "loop_cpu_share": 0.8, "burst_age_s": 20.0},
        "burst_cpu_ops_per_step",  # no burst yet
    ),
    "dataloader-shm": (
        # 4 workers x 2 batches x 40 MB in flight, 64 MB /dev/shm (a container's default)
        {"dl_num_workers": 4.0, "dl_prefetch_factor": 2.0, "dl_batch_bytes": 40e6, "shm_bytes": 64e6},
        {"dl_num_workers": 4.0, "dl_prefetch_factor": 2.0, "dl_batch_bytes": 40e6, "shm_bytes": 16e9},
        "shm_bytes",
    ),
    "loop-waits-elsewhere": (
        {"main_sync_share": 0.8},
        {"main_sync_share": 0.8, "data_wait_share": 0.5},
        "main_sync_share",
    ),
    "loader-producer-thread": (
        # the loop waits 45 % in queue.get() while its producer thread computes 95 % of the time
        {
            "producer_wait_share": 0.45,
            "producer_thread_wait_share": 0.45,
            "producer_process_wait_share": 0.0,
            "producer_cpu_share": 0.95,
            "producer_count": 1.0,
            "forward_share": 0.2,
            "backward_share": 0.2,
            "optimizer_share": 0.05,
        },
        # lock_wait: the helper the loop waits on sleeps
        {
            "producer_wait_share": 0.7,
            "producer_cpu_share": 0.02,
            "forward_share": 0.1,
            "backward_share": 0.1,
            "optimizer_share": 0.05,
        },
        "producer_cpu_share",  # no thread states of the producer
    ),
    "ranks-collective-wait": (
        # a rank blocked 60 % of its step in the gradient all-reduce, beyond its run-queue wait
        {"collective_wait_share": 0.6, "dl_batch_size": 32.0},
        {"collective_wait_share": 0.1, "dl_batch_size": 32.0},
        "collective_wait_share",  # one process without the hook's per-step counters
    ),
    "storage-latency": (
        # 4 KiB reads, 1.2 in flight while the disk is busy: latency-bound
        {**_STORAGE, "disk_read_request_bytes": 4096.0, "disk_read_queue": 1.2},
        # 2 MiB reads: each request is mostly transfer, not latency
        {**_STORAGE, "disk_read_request_bytes": 2 * 2**20, "disk_read_queue": 1.2},
        "disk_read_request_bytes",  # no block device served the reads (page cache, NFS)
    ),
    "storage-bandwidth": (
        {**_STORAGE, "disk_read_request_bytes": 560e3, "disk_busy_share": 0.96, "disk_read_queue": 8.0},
        # large reads but the disk idles half the time: more overlap would still help
        {**_STORAGE, "disk_read_request_bytes": 2 * 2**20, "disk_busy_share": 0.5, "disk_read_queue": 1.0},
        "disk_tree_share",  # the training's own reads unreadable: the device may be serving others
    ),
    "host-swap": (
        {"swap_in_bytes_per_s": 30e6, "memory_pressure_pct": 40.0, "rss_bytes": 20e9, "mem_available_bytes": 1e8},
        # a few pages swapped back in after a quiet period, no stalls
        {"swap_in_bytes_per_s": 2e6, "memory_pressure_pct": 1.0, "rss_bytes": 2e9, "mem_available_bytes": 1e10},
        "memory_pressure_pct",  # a kernel without PSI
    ),
    "storage-wait": (
        {"storage_wait_share": 0.5, "main_disk_share": 0.5, "loop_cpu_share": 0.1},
        {"storage_wait_share": 0.25, "main_disk_share": 0.25, "loop_cpu_share": 0.7},
        "storage_wait_share",
    ),
    # torch.compile (the hook's CompileInfo): a recompile that took 1.5 s of a 10 s window
    "compile-recompiles": (
        {"compile_recompiles": 1.0, "compile_time_share": 0.15},
        # two recompiles served from inductor's cache: 40 ms each, 0.8 % of the window
        {"compile_recompiles": 2.0, "compile_time_share": 0.008},
        "compile_recompiles",  # no hook, or nothing compiled
    ),
    "compile-graph-breaks": (
        {"compile_graph_breaks_total": 1.0},
        {"compile_graph_breaks_total": 0.0},
        "compile_graph_breaks_total",
    ),
    "compile-cache-limit": (
        {"compile_cache_limit_hits": 1.0},
        {"compile_cache_limit_hits": 0.0},
        "compile_cache_limit_hits",
    ),
}


def ids(analysis: Analysis) -> set[str]:
    return {f.rule for f in analysis.findings}


def test_every_shipped_rule_has_a_case() -> None:
    assert set(CASES) == set(RULES)


def test_time_in_collectives_is_no_wait_elsewhere() -> None:
    # A DDP rank asleep in the all-reduce: communication, never "waits on another process".
    f = features(main_sync_share=0.8, collective_wait_share=0.6)
    d = Diagnoser([RULES["loop-waits-elsewhere"], RULES["ranks-collective-wait"]])
    d.evaluate(f, 0.0)
    assert ids(d.evaluate(f, 10.0)) == {"ranks-collective-wait"}


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fires_after_hold(rule_id: str) -> None:
    rule = RULES[rule_id]
    fire, _, _ = CASES[rule_id]
    d = Diagnoser([rule])
    first = d.evaluate(features(**fire), 0.0)
    assert rule.hold_s > 0
    assert rule_id not in ids(first)  # must hold for `for` seconds first
    later = d.evaluate(features(**fire), rule.hold_s + 1)
    assert ids(later) == {rule_id}
    finding = later.findings[0]
    assert (finding.label, finding.severity) == (rule.label, rule.severity)
    assert "{" not in finding.summary and "n/a" not in finding.summary
    assert set(finding.evidence) == set(rule.evidence)
    assert finding.measure is not None and finding.measure > 0
    if rule.severity != "info" and rule.label != "undetermined":
        assert later.verdict.label == rule.label
    else:
        assert later.verdict.label == "undetermined"


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_stays_silent(rule_id: str) -> None:
    rule = RULES[rule_id]
    _, silent, _ = CASES[rule_id]
    d = Diagnoser([rule])
    for t in (0.0, rule.hold_s + 1, 2 * rule.hold_s + 2):
        a = d.evaluate(features(**silent), t)
        assert a.findings == [] and a.not_applicable == []
    assert a.verdict.label == "undetermined"
    assert a.verdict.summary.startswith("No resource")


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_not_applicable_names_missing_input(rule_id: str) -> None:
    rule = RULES[rule_id]
    fire, _, missing = CASES[rule_id]
    d = Diagnoser([rule], why_missing=lambda name: f"why {name}")
    values = {**fire, missing: None}
    for t in (0.0, rule.hold_s + 1):
        a = d.evaluate(features(**values), t)
    assert a.findings == []
    assert [(n.rule, n.missing, n.why) for n in a.not_applicable] == [(rule_id, missing, f"why {missing}")]


def test_not_applicable_drops_a_firing_finding() -> None:
    rule = RULES["storage-wait"]
    d = Diagnoser([rule])
    d.evaluate(features(storage_wait_share=0.5), 0.0)
    assert ids(d.evaluate(features(storage_wait_share=0.5), 5.0)) == {"storage-wait"}
    a = d.evaluate(features(), 6.0)
    assert a.findings == [] and a.not_applicable[0].missing == "storage_wait_share"


def settle(values: Features, rules: list[Rule] | None = None, texts: dict[str, str] | None = None) -> Analysis:
    d = Diagnoser(list(RULES.values()) if rules is None else rules)
    d.evaluate(values, 0.0, texts)
    return d.evaluate(values, 10.0, texts)


def _loader_texts(f: Features) -> dict[str, str]:
    """``loader_settings`` as the hook's record of that loader gives it (features.texts), from the
    loader settings a recorded window's features carry."""
    loader = loader_info(
        num_workers=int(f["dl_num_workers"] or 0),
        batch_size=None if f["dl_batch_size"] is None else int(f["dl_batch_size"]),
        pin_memory=bool(f["dl_pin_memory"]),
        prefetch_factor=None if f["dl_prefetch_factor"] is None else int(f["dl_prefetch_factor"]),
        persistent_workers=bool(f["dl_persistent_workers"]),
    )
    return {"loader_settings": loader.settings_text()}


def test_gpu_beats_io() -> None:
    a = settle(features(gpu_util_mean=97.0, gpu_sm_active_mean=0.9, storage_wait_share=0.6, fetch_cpu_share=0.5))
    assert {"gpu-saturated", "storage-wait", "loader-cpu-in-main-thread"} <= ids(a)
    assert a.verdict.label == "gpu-bound"


def test_io_beats_dataloader() -> None:
    a = settle(features(storage_wait_share=0.3, fetch_cpu_share=0.6, worker_count=0.0, usable_cpus=4.0))
    assert {"storage-wait", "loader-cpu-in-main-thread"} <= ids(a)
    assert a.verdict.label == "io-bound"
    assert 0.05 <= a.verdict.confidence < 1.0
    # a later label that explains more lowers the confidence (dominance)
    alone = settle(features(storage_wait_share=0.3, usable_cpus=4.0))
    assert a.verdict.confidence < alone.verdict.confidence


def test_dataloader_beats_cpu() -> None:
    a = settle(features(fetch_cpu_share=0.3, loop_cpu_share=0.6))
    assert {"loader-cpu-in-main-thread", "loop-cpu"} <= ids(a)
    assert a.verdict.label == "dataloader-bound"


def test_cpu_bound_alone() -> None:
    a = settle(features(loop_cpu_share=0.7, main_cpu_pct=98.0, usable_cpus=4.0))
    assert ids(a) == {"loop-cpu"}
    assert a.verdict.label == "cpu-bound"
    assert a.verdict.confidence == pytest.approx(0.95)


def label_rule(label: str, measure: float = 0.5) -> Rule:
    return parse_rule(
        f'id = "r-{label}"\nlabel = "{label}"\nseverity = "critical"\nsummary = "{label}"\n'
        f'when = "stack_samples >= 0"\nmeasure = "{measure}"\nsource = "test"\n',
        f"{label}.toml",
    )


def test_label_priority_order() -> None:
    order = ["gpu-bound", "io-bound", "dataloader-bound", "cpu-bound"]
    for i, want in enumerate(order):
        # later labels explain more: priority, not size, decides
        rules = [label_rule(label, 0.2 + 0.1 * j) for j, label in enumerate(order[i:])]
        a = settle(features(), rules)
        assert len(a.findings) == len(rules)
        assert a.verdict.label == want, (want, a.verdict)


def test_info_findings_never_decide() -> None:
    a = settle(features(gpu_mem_ratio=0.99))
    assert ids(a) == {"gpu-memory-pressure"}
    assert a.verdict.label == "undetermined"
    info_only = parse_rule(
        'id = "i"\nlabel = "cpu-bound"\nseverity = "info"\nsummary = "s"\nwhen = "stack_samples >= 0"\nsource = "t"\n',
        "i.toml",
    )
    assert settle(features(), [info_only]).verdict.label == "undetermined"


def test_undetermined_finding_gives_its_summary() -> None:
    a = settle(features(main_sleep_share=0.7))
    assert a.verdict.label == "undetermined"
    assert "sleeps on a timer 70%" in a.verdict.summary


@pytest.mark.parametrize("counts", [{}, {"stack_samples": 5.0, "thread_samples": 3.0}])
def test_too_few_samples_collects_evidence(counts: dict[str, float]) -> None:
    f: Features = {name: None for name in CATALOGUE}
    f.update(counts)
    a = settle(f)
    assert a.verdict.label == "undetermined"
    assert a.verdict.summary.startswith("Collecting evidence")
    assert a.verdict.confidence == 0.0


def test_hold_and_release_hysteresis() -> None:
    rule = RULES["storage-wait"]
    assert rule.hold_s == 2.0
    d = Diagnoser([rule])
    on, off = features(storage_wait_share=0.5), features(storage_wait_share=0.0)
    assert ids(d.evaluate(on, 0.0)) == set()
    assert ids(d.evaluate(on, 1.0)) == set()
    assert ids(d.evaluate(on, 2.0)) == {"storage-wait"}
    # a dip shorter than `for` keeps the finding
    assert ids(d.evaluate(off, 3.0)) == {"storage-wait"}
    assert ids(d.evaluate(off, 4.5)) == {"storage-wait"}
    assert ids(d.evaluate(on, 5.0)) == {"storage-wait"}
    assert ids(d.evaluate(off, 6.0)) == {"storage-wait"}
    assert ids(d.evaluate(off, 7.7)) == {"storage-wait"}
    # false for `for` seconds releases it
    assert ids(d.evaluate(off, 8.0)) == set()


def test_a_hold_is_met_at_the_evaluation_for_seconds_later_on_the_grid_despite_jitter() -> None:
    """Evaluations 1 s apart on the grid, the first 3 ms late: the third, 1.997 s after the first,
    fires a rule with `for = 2` (it waited a whole second more before HOLD_SLACK_S)."""
    d = Diagnoser([RULES["storage-wait"]])
    on, off = features(storage_wait_share=0.5), features(storage_wait_share=0.0)
    assert ids(d.evaluate(on, 10.003)) == set()
    assert ids(d.evaluate(on, 11.001)) == set()
    assert ids(d.evaluate(on, 12.0)) == {"storage-wait"}
    assert ids(d.evaluate(off, 13.002)) == {"storage-wait"}
    assert ids(d.evaluate(off, 14.0)) == {"storage-wait"}
    assert ids(d.evaluate(off, 15.0)) == set()


def test_flapping_condition_never_fires() -> None:
    d = Diagnoser([RULES["storage-wait"]])
    on, off = features(storage_wait_share=0.5), features(storage_wait_share=0.0)
    for t in range(0, 20, 2):
        assert ids(d.evaluate(on, float(t))) == set()
        assert ids(d.evaluate(off, t + 1.5)) == set()


def test_fix_templates_are_filled_with_real_values() -> None:
    a = settle(
        features(
            fetch_cpu_share=0.6,
            data_wait_share=0.7,
            data_wait_fetch_share=0.7,
            worker_count=0.0,
            usable_cpus=2.0,
            main_running_share=0.8,
        )
    )
    finding = next(f for f in a.findings if f.rule == "loader-cpu-in-main-thread")
    details = " | ".join(fx.detail for fx in finding.fixes)
    assert "num_workers=0 on 2 usable CPUs" in details
    assert "try num_workers=1" in details
    assert "60%" in details
    assert "60%" in finding.summary
    assert finding.evidence["usable_cpus"] == 2.0 and finding.evidence["worker_count"] == 0.0
    for fx in finding.fixes:
        assert "{" not in fx.title + fx.detail and "n/a" not in fx.detail


def test_conditional_fix_left_out_when_workers_suffice() -> None:
    a = settle(features(fetch_cpu_share=0.6, worker_count=3.0, usable_cpus=4.0))
    finding = next(f for f in a.findings if f.rule == "loader-cpu-in-main-thread")
    assert [fx.title for fx in finding.fixes] == ["Make each sample cheaper"]


def test_conditional_fix_left_out_when_its_input_is_missing() -> None:
    a = settle(features(storage_wait_share=0.5))  # worker_count, usable_cpus unknown
    finding = next(f for f in a.findings if f.rule == "storage-wait")
    assert "Overlap reads with DataLoader workers" not in [fx.title for fx in finding.fixes]
    assert any("reads n/a/s" in fx.detail for fx in finding.fixes)  # missing value shows as n/a


def test_confidence_stays_within_0_and_1_for_rule_without_measure() -> None:
    no_measure = parse_rule(
        'id = "a"\nlabel = "gpu-bound"\nseverity = "critical"\nsummary = "a"\n'
        'when = "stack_samples >= 0"\nsource = "s"\n',
        "a.toml",
    )
    a = settle(features(), [no_measure, label_rule("cpu-bound", 0.1)])
    assert a.verdict.label == "gpu-bound"
    assert 0.0 <= a.verdict.confidence <= 1.0


def test_workers_waiting_on_storage_decide_even_beside_loop_cpu() -> None:
    """Waiting on workers that wait on disk limits throughput whatever the loop's own CPU work."""
    rule = RULES["storage-wait"]
    d = Diagnoser([rule])
    values = {"storage_wait_share": 0.3, "storage_wait_async_share": 0.3, "main_disk_share": 0.0, "loop_cpu_share": 0.7}
    d.evaluate(features(**values), 0.0)
    assert ids(d.evaluate(features(**values), rule.hold_s + 1)) == {"storage-wait"}


def test_lower_label_waits_while_a_higher_one_is_settling() -> None:
    """At start-up, reads can settle a second after CPU work: no brief dataloader-bound first."""
    d = Diagnoser([RULES["storage-wait"], RULES["loader-cpu-in-main-thread"]])
    loader_only = features(fetch_cpu_share=0.6, loop_cpu_share=0.2, storage_wait_share=0.0)
    both = features(fetch_cpu_share=0.6, loop_cpu_share=0.2, storage_wait_share=0.5)
    d.evaluate(loader_only, 0.0)
    settling = d.evaluate(both, 2.0)  # loader rule fired; storage rule holds but waits its 2 s
    assert "loader-cpu-in-main-thread" in ids(settling)
    assert settling.verdict.label == "undetermined"
    assert d.evaluate(both, 4.0).verdict.label == "io-bound"


def test_fixes_quote_the_loaders_real_settings() -> None:
    f = features(
        fetch_cpu_share=0.8,
        usable_cpus=16.0,
        worker_count=0.0,
        dl_num_workers=0.0,
        dl_batch_size=64.0,
        dl_pin_memory=0.0,
    )
    d = Diagnoser([RULES["loader-cpu-in-main-thread"]])
    texts = _loader_texts({**f, "dl_prefetch_factor": None, "dl_persistent_workers": 0.0})
    d.evaluate(f, 0.0, texts)
    fixes = d.evaluate(f, 10.0, texts).findings[0].fixes
    assert fixes[0].detail.startswith(
        "num_workers=0, batch_size=64, pin_memory=False on 16 usable CPUs: try num_workers=15"
    )
    d = Diagnoser([RULES["loader-cpu-in-main-thread"]])  # no hook: only the workers alive are known
    d.evaluate({**f, "dl_num_workers": None}, 0.0)
    alone = d.evaluate({**f, "dl_num_workers": None}, 10.0).findings[0].fixes
    assert alone[0].detail.startswith("num_workers=0 on 16 usable CPUs")


def test_amp_fix_only_when_autocast_is_not_on() -> None:
    def titles(**extra: float) -> list[str]:
        f = features(gpu_util_mean=97.0, gpu_sm_active_mean=0.9, data_wait_share=0.05, gpu_mem_ratio=0.5, **extra)
        d = Diagnoser([RULES["gpu-saturated"]])
        d.evaluate(f, 0.0)
        return [fx.title for fx in d.evaluate(f, 10.0).findings[0].fixes]

    assert "Use bf16/fp16 autocast (AMP)" in titles(amp_enabled=0.0)
    assert "Use bf16/fp16 autocast (AMP)" not in titles(amp_enabled=1.0)


def _recorded(name: str) -> Features:
    """Features of the last window of a real scenario run (tests/fixtures/windows/, with provenance)."""
    data = json.loads((WINDOWS / f"{name}.json").read_text())
    # the memory watch's and the loss's are not computed from a window
    recorded_with = set(CATALOGUE) - WATCH_FEATURES - PROGRESS_FEATURES
    assert set(data["features"]) == recorded_with, "fixture recorded with another catalogue: record it again"
    return {k: v for k, v in data["features"].items()}


@pytest.mark.parametrize(
    ("scenario", "sub_cause", "overlap_fix"),
    [
        ("random_reads_workers", "storage-latency", False),  # 2 workers already: 1 usable CPU to spare is none
        ("reads_in_loop", "storage-latency", True),
        ("sequential_reads_workers", "storage-bandwidth", False),  # disk busy 96 %: workers would not help
        ("sequential_reads", None, True),  # 2 MiB reads but the disk idles half the time: overlap helps
    ],
)
def test_recorded_storage_windows_name_latency_or_bandwidth(
    scenario: str, sub_cause: str | None, overlap_fix: bool
) -> None:
    a = settle(_recorded(scenario))
    assert a.verdict.label == "io-bound"
    found = ids(a) & {"storage-latency", "storage-bandwidth"}
    assert found == ({sub_cause} if sub_cause else set())
    wait = next(f for f in a.findings if f.rule == "storage-wait")
    titles = [fx.title for fx in wait.fixes]
    assert ("Overlap reads with DataLoader workers" in titles) is overlap_fix
    assert "Read large sequential chunks" not in titles  # request size known: the sub-cause rules decide
    for f in a.findings:
        assert "n/a" not in f.summary + "".join(fx.detail for fx in f.fixes), f.rule


@pytest.mark.parametrize("share", [0.1, 50.0])
def test_storage_sub_causes_stand_back_when_the_device_is_not_the_trainings(share: float) -> None:
    # 0.1: the disk mostly serves another program; 50: the training reads from elsewhere (NFS)
    small = features(
        **{**_STORAGE, "disk_read_request_bytes": 4096.0, "disk_read_queue": 1.0, "disk_tree_share": share}
    )
    large = features(
        **{**_STORAGE, "disk_read_request_bytes": 2**20, "disk_busy_share": 0.97, "disk_tree_share": share}
    )
    for values in (small, large):
        found = ids(settle(values))
        assert "storage-wait" in found and not found & {"storage-latency", "storage-bandwidth"}


def test_recorded_latency_bound_workers_are_told_to_outnumber_the_cpus() -> None:
    # 2 workers on 2 CPUs, 65 % of their time in disk wait, 63 % of a core in all: the spare CPU
    # carries 3 (the scenario ran 16.2 / 22 / 29 steps/s with 2 / 3 / 4 workers).
    f = _recorded("random_reads_workers")
    a = settle(f, texts=_loader_texts(f))
    latency = next(f for f in a.findings if f.rule == "storage-latency")
    first = latency.fixes[0]
    assert first.title == "Run more workers than CPUs"
    assert "num_workers=2," in first.detail and "carry num_workers=3;" in first.detail


# -- GPU: busy vs saturated ---------------------------------------------------------------------------

_BURST_KERNELS: dict[str, Any] = {"burst_age_s": 30.0, "burst_gpu_idle_share": 0.03, "burst_short_kernel_share": 0.0}


def test_nvml_util_alone_no_longer_decides_gpu_bound() -> None:
    a = settle(features(gpu_util_mean=100.0, data_wait_share=0.0, gpu_power_ratio=0.9))
    assert a.verdict.label == "undetermined"
    assert ids(a) == {"gpu-util-unverified"}
    assert {n.rule: n.missing for n in a.not_applicable}["gpu-saturated"] == "burst_kernel_share"
    finding = a.findings[0]
    assert finding.fixes[0].title == "Take a profiler burst"
    assert "torchwatch burst PID" in finding.fixes[0].detail


@pytest.mark.parametrize(
    ("kernel_share", "age_s", "saturated"),
    [(0.96, 30.0, True), (0.6, 30.0, False), (0.96, 900.0, False)],  # busy; not busy; too old to trust
)
def test_without_gpm_a_recent_bursts_kernel_share_decides(kernel_share: float, age_s: float, saturated: bool) -> None:
    burst = {**_BURST_KERNELS, "burst_kernel_share": kernel_share, "burst_age_s": age_s}
    f = features(gpu_util_mean=98.0, data_wait_share=0.0, **burst)
    a = settle(f)
    assert ("gpu-saturated" in ids(a)) is saturated
    assert ("gpu-util-unverified" in ids(a)) is (age_s > 300)
    assert all(n.rule != "gpu-saturated" for n in a.not_applicable)


@pytest.mark.parametrize("sm", [0.55, 0.75])
def test_moderately_busy_sms_claim_neither_saturation_nor_launch_overhead(sm: float) -> None:
    a = settle(features(gpu_util_mean=99.0, gpu_sm_active_mean=sm, data_wait_share=0.0))
    assert not ids(a) & {"gpu-saturated", "gpu-launch-bound", "gpu-util-unverified"}


def test_launch_bound_from_a_burst_without_gpm() -> None:
    burst = {
        "burst_kernel_share": 0.25,
        "burst_short_kernel_share": 0.95,
        "burst_host_wait_share": 0.7,
        "burst_kernel_wait_share": 0.02,
        "burst_gpu_idle_share": 0.75,
        "burst_kernels_per_step": 600.0,
        "burst_sync_per_step": 0.0,
        "burst_age_s": 10.0,
    }
    a = settle(features(gpu_util_mean=100.0, data_wait_share=0.0, main_running_share=0.95, **burst))
    assert "gpu-launch-bound" in ids(a) and a.verdict.label == "cpu-bound"
    assert "gpu-host-wait" not in ids(a)  # mostly short kernels: the launch finding says it
    launch = next(f for f in a.findings if f.rule == "gpu-launch-bound")
    assert launch.measure == pytest.approx(0.75)
    assert "Sync less often" not in [fx.title for fx in launch.fixes]  # no syncs in the burst
    # long kernels with the same idle: host work, not launch cost
    long_kernels = settle(
        features(gpu_util_mean=100.0, main_running_share=0.95, **{**burst, "burst_short_kernel_share": 0.1})
    )
    assert "gpu-launch-bound" not in ids(long_kernels)
    assert "gpu-host-wait" in ids(long_kernels)


def test_launch_bound_is_not_applicable_on_a_cpu_burst() -> None:
    # a CPU-only training: NVML absent, the burst has no kernels
    f = features(burst_kernel_share=0.0, burst_cpu_ops_per_step=300.0, burst_age_s=10.0)
    missing = {n.rule: n.missing for n in settle(f).not_applicable}
    assert missing["gpu-launch-bound"] == "burst_short_kernel_share"
    assert missing["gpu-host-wait"] == "burst_gpu_idle_share"
    assert missing["gpu-saturated"] == "gpu_util_mean"


def test_host_wait_stays_silent_while_the_loop_waits_on_data_or_sleeps() -> None:
    for extra in ({"data_wait_share": 0.5}, {"main_running_share": 0.1}):
        a = settle(features(**{**_HOST_WAIT, **extra}))
        assert "gpu-host-wait" not in ids(a), extra

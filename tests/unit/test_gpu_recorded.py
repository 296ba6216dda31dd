"""From readings to verdict on GPU readings RECORDED on a real NVIDIA H200 (tests/fixtures/gpu_recorded/).

The demos ran under ``torchwatch run --headless`` with ``bench/record_gpu.py`` beside them (see the
README there: where, when, on what). Each test runs the real path, as test_gpu_fixtures does for the
fabricated files: the NVML recording replayed through NvmlSource, the burst's trace through
summarize_trace and the hook's wire format, then features.compute and the shipped rules. The
recordings begin 6 s after the training started; from 5 s into them every demo had stepped (the
reports' first steps came 9.0-11.6 s after launch), so the readings before that are start-up.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit import nvml_replay
from tests.unit.gpu_readings import burst, feats, ids, na, settle
from torchwatch import wire
from torchwatch.faces.compare import compare
from torchwatch.hook.summary import load_trace, short_name, summarize_trace
from torchwatch.model.readings import GpuSample
from torchwatch.model.report import Report

RECORDED = nvml_replay.RECORDED
LOOP_FROM_S = 5.0


def loop_samples(stem: str, recording: dict[str, Any] | None = None) -> list[GpuSample]:
    """The recording's readings from :data:`LOOP_FROM_S` on (the training's loop)."""
    rec = nvml_replay.load(stem) if recording is None else recording
    return [g for g in nvml_replay.replay(rec)[1] if g.t >= LOOP_FROM_S]


def recorded_burst(stem: str) -> Any:
    return burst(stem, folder=RECORDED)


def report(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(gzip.decompress((RECORDED / f"report_h200_{name}.json.gz").read_bytes()))
    return data


def test_every_recording_says_it_was_recorded_and_on_what() -> None:
    stems = sorted(p.name.removesuffix(".json.gz") for p in RECORDED.glob("nvml_*.json.gz"))
    assert len(stems) == 6
    for stem in stems:
        rec = nvml_replay.load(stem)
        assert rec["provenance"].startswith("recorded by bench/record_gpu.py")
        assert rec["static"]["0"]["nvmlDeviceGetName"] == rec["system"]["gpu"] == "NVIDIA H200"
        assert rec["system"]["driver"] and rec["system"]["cuda_driver"]
    assert "FABRICATED" not in (RECORDED / "README.md").read_text()


def test_h200_gpu_bound_is_gpu_bound() -> None:
    f = feats(loop_samples("nvml_h200_gpu_bound"))
    assert f["gpu_util_mean"] is not None and f["gpu_util_mean"] >= 90
    assert f["gpu_sm_active_mean"] is not None and f["gpu_sm_active_mean"] >= 0.8  # 0.94 once warm
    assert f["gpu_tensor_active_mean"] is not None and f["gpu_tensor_active_mean"] > 0.3  # bf16 on tensor cores
    assert f["gpu_proc_sm_pct"] is not None and f["gpu_proc_sm_pct"] >= 90  # the training's own kernels
    assert f["gpu_power_ratio"] is not None and f["gpu_power_ratio"] >= 0.9  # at its 700 W limit
    a = settle(f)
    assert "gpu-saturated" in ids(a)
    assert a.verdict.label == "gpu-bound"


def test_h200_gpu_bound_without_gpm_is_decided_by_its_burst() -> None:
    """The same readings as a GPU without GPM would give them (pre-Hopper): the recorded burst's kernels
    fill 96-99 % of its steps, and that decides."""
    rec = nvml_replay.load("nvml_h200_gpu_bound")
    rec["static"]["0"]["nvmlGpmQueryDeviceSupport"] = {"version": 1, "isSupportedDevice": 0}
    for sample in rec["samples"]:
        sample["devices"]["0"].pop("nvmlGpmMetricsGet", None)
    f = feats(loop_samples("", rec), recorded_burst("trace_h200_gpu_bound"))
    assert f["gpu_sm_active_mean"] is None
    assert f["burst_kernel_share"] is not None and f["burst_kernel_share"] >= 0.9
    a = settle(f)
    assert "gpu-saturated" in ids(a)
    assert a.verdict.label == "gpu-bound"


def test_h200_launch_bound_reads_an_idle_gpu_not_a_busy_one() -> None:
    """The fabricated H100 file has this demo at NVML utilization ~99 % with idle SMs. The real GPU
    said otherwise: utilization 10-21 %, SM activity 0.1-0.3 %: the host is so slow at launching
    (~40 us an op) that the GPU waits between the 3 us kernels. Without a burst, no GPU rule claims it."""
    f = feats(loop_samples("nvml_h200_launch_bound"))
    assert f["gpu_util_mean"] is not None and f["gpu_util_mean"] < 50
    assert f["gpu_sm_active_mean"] is not None and f["gpu_sm_active_mean"] < 0.01
    a = settle(f)
    assert not ids(a) & {"gpu-saturated", "gpu-launch-bound", "gpu-util-unverified"}
    assert na(a)["gpu-launch-bound"] == "burst_kernel_share"  # a burst decides
    assert a.verdict.label != "gpu-bound"


@pytest.mark.parametrize("demo", ["launch_bound", "launch_bound_relieve", "gpu_bound_relieve"])
def test_h200_host_bound_steps_with_their_burst_are_launch_bound(demo: str) -> None:
    """Idle SMs and a burst of short kernels with the GPU waiting on the host: the host's launches
    set the step time (the relieved gpu_bound too: 73 kernels in 2.9 ms, 71 % of it host wait)."""
    f = feats(loop_samples(f"nvml_h200_{demo}"), recorded_burst(f"trace_h200_{demo}"))
    assert f["gpu_sm_active_mean"] is not None and f["gpu_sm_active_mean"] < 0.5
    assert f["burst_short_kernel_share"] is not None and f["burst_short_kernel_share"] >= 0.5
    assert f["burst_host_wait_share"] is not None and f["burst_host_wait_share"] >= 0.5
    a = settle(f)
    assert "gpu-launch-bound" in ids(a)
    assert a.verdict.label == "cpu-bound"
    launch = next(x for x in a.findings if x.rule == "gpu-launch-bound")
    assert any("CUDA graph" in fx.title for fx in launch.fixes)


def test_h200_launch_bound_burst_counts_its_kernels() -> None:
    s = summarize_trace(load_trace(RECORDED / "trace_h200_launch_bound.json.gz"))
    assert s["kernels_per_step"] == pytest.approx(1234)  # 64 members x ~19 kernels, forward + backward + step
    assert s["short_kernel_share"] == 1.0
    assert s["gpu_idle_split_share"]["host_wait"] > 0.8


def test_h200_dataloader_bound_leaves_the_gpu_idle() -> None:
    f = feats(loop_samples("nvml_h200_dataloader_bound"))
    assert f["gpu_util_mean"] == 0.0
    assert f["gpu_sm_active_mean"] is not None and f["gpu_sm_active_mean"] < 0.01
    assert not ids(settle(f)) & {"gpu-saturated", "gpu-launch-bound"}


@pytest.mark.parametrize("path", sorted(RECORDED.glob("trace_*.json.gz")), ids=lambda p: p.name)
def test_real_kernel_names_fit_the_wire_format(path: Path) -> None:
    """CUDA kernel names are demangled C++: up to 3,009 characters here. Every burst on the H200
    failed with "summary did not validate: burst.top_kernels[2].name: 431 characters, at most 256"."""
    trace = load_trace(path)
    longest = max(len(e["name"]) for e in trace["traceEvents"] if e.get("cat") == "kernel")
    assert longest > wire.NAME  # these traces still hold names the format cannot take whole
    summary = summarize_trace(trace)
    result = wire.BurstResult.decode({"id": 1, **summary}, "burst")
    assert result.error is None
    assert all(len(k.name) <= wire.NAME for k in result.top_kernels)


def test_short_name_keeps_short_names_and_cuts_long_ones() -> None:
    assert short_name("aten::mm") == "aten::mm"
    long = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<" + "x" * 3000 + ">(int)"
    cut = short_name(long)
    assert len(cut) == wire.NAME and cut.endswith("…")
    assert cut.startswith("at::native::multi_tensor_apply_kernel<")
    fits = "void f<(anonymous namespace)::T>(" + "a" * 230 + ")"
    assert short_name(fits) == "f<T>(" + "a" * 230 + ")"


def test_recorded_reports_compare_plain_with_relieved() -> None:
    """The reports torchwatch wrote on the H200 read back through compare: the relieved demos are
    faster, as their --relieve promises (gpu_bound 72.8 -> 347.6 steps/s, launch_bound 25.3 -> 482.0)."""
    for demo, at_least in (("gpu_bound", 4.0), ("launch_bound", 15.0)):
        c = compare(Report.from_json(report(demo)), Report.from_json(report(f"{demo}_relieve")))
        assert c.speedup is not None and c.speedup >= at_least

"""From readings to verdict on the GPU fixtures: NVML/GPM recordings and CUDA profiler traces.

The fixtures in tests/fixtures/gpu/ are FABRICATED from the documented NVML and kineto structures (see
the README there); where a recording on a real H200 replaced one, the test reads it from
tests/fixtures/gpu_recorded/ (test_gpu_recorded.py has the tests of those recordings themselves). The
assertions are about what the readings mean (SM activity above or below the rules' thresholds, host
wait dominating), not about the fabricated values.

Each test runs the real path: a recording through NvmlSource (replayed pynvml), a trace through
summarize_trace and the hook's burst record, then features.compute, then the shipped rules. The loop's
own features (py-spy / thread states) are given: those sources are CPU-side and tested elsewhere.
"""

from __future__ import annotations

import pytest

from tests.unit import nvml_replay
from tests.unit.gpu_readings import burst, feats, ids, na, settle, texts_of
from torchwatch.model.readings import GpuSample
from torchwatch.model.units import human_bytes

RECORDED = nvml_replay.RECORDED  # recorded on a real H200 (see its README); FIXTURES are fabricated
# What py-spy and /proc would say of a CUDA loop that does not wait on data: thread mostly running.


def gpu_samples(stem: str) -> list[GpuSample]:
    return nvml_replay.replay(nvml_replay.load(stem))[1]


# -- NVML + GPM recordings ----------------------------------------------------------------------------


def test_h100_launch_bound_recording_is_launch_bound_not_gpu_bound() -> None:
    f = feats(gpu_samples("nvml_h100_launch_bound"))
    assert f["gpu_util_mean"] is not None and f["gpu_util_mean"] >= 90  # NVML says "busy"
    assert f["gpu_sm_active_mean"] is not None and f["gpu_sm_active_mean"] < 0.5  # the SMs say otherwise
    a = settle(f)
    assert "gpu-launch-bound" in ids(a)
    assert "gpu-saturated" not in ids(a)
    assert a.verdict.label == "cpu-bound"
    launch = next(x for x in a.findings if x.rule == "gpu-launch-bound")
    assert any("CUDA graph" in fx.title for fx in launch.fixes)


def test_h100_partly_idle_recording_claims_neither() -> None:
    a = settle(feats(gpu_samples("nvml_h100_partly_idle")))
    assert not ids(a) & {"gpu-saturated", "gpu-launch-bound", "gpu-util-unverified"}
    assert a.verdict.label != "gpu-bound"


def test_gpu_without_gpm_and_without_burst_is_not_called_gpu_bound() -> None:
    a = settle(feats(gpu_samples("nvml_a100_no_gpm")))
    assert a.features["gpu_sm_active_mean"] is None  # absent, not 0
    assert a.features["gpu_util_mean"] is not None and a.features["gpu_util_mean"] >= 90
    assert na(a)["gpu-saturated"] == "burst_kernel_share"  # take a burst to decide
    assert "gpu-util-unverified" in ids(a)
    assert a.verdict.label == "undetermined"
    assert "cannot be checked" in a.verdict.summary


@pytest.mark.parametrize(
    ("trace", "rule", "label"),
    [
        ("trace_h200_gpu_bound", "gpu-saturated", "gpu-bound"),
        ("trace_h200_launch_bound", "gpu-launch-bound", "cpu-bound"),
    ],
)
def test_gpu_without_gpm_is_decided_by_a_burst(trace: str, rule: str, label: str) -> None:
    a = settle(feats(gpu_samples("nvml_a100_no_gpm"), burst(trace, folder=RECORDED)))
    assert rule in ids(a)
    assert "gpu-util-unverified" not in ids(a)
    assert a.verdict.label == label


def test_an_old_burst_does_not_decide() -> None:
    a = settle(feats(gpu_samples("nvml_a100_no_gpm"), burst("trace_h200_gpu_bound", age_s=900.0, folder=RECORDED)))
    assert "gpu-saturated" not in ids(a)
    assert "gpu-util-unverified" in ids(a)


def test_gpm_decides_over_a_burst() -> None:
    """SMs idle per GPM beat a burst whose kernels fill the timeline (each kernel fills few SMs)."""
    a = settle(feats(gpu_samples("nvml_h100_launch_bound"), burst("trace_h200_gpu_bound", folder=RECORDED)))
    assert "gpu-saturated" not in ids(a)
    assert "gpu-launch-bound" in ids(a)


# -- CUDA traces ------------------------------------------------------------------------------------


def test_launch_bound_trace_splits_idle_into_host_wait() -> None:
    f = feats(hook=burst("trace_h200_launch_bound", folder=RECORDED))
    assert f["burst_short_kernel_share"] is not None and f["burst_short_kernel_share"] >= 0.9
    assert f["burst_kernels_per_step"] is not None and f["burst_kernels_per_step"] >= 100
    assert f["burst_kernel_share"] is not None and f["burst_kernel_share"] < 0.3
    assert f["burst_host_wait_share"] is not None and f["burst_host_wait_share"] > 0.7
    a = settle(f)
    assert "gpu-launch-bound" in ids(a)
    assert "gpu-host-wait" not in ids(a)  # short kernels: the launch finding, not the general one
    assert a.verdict.label == "cpu-bound"


def test_partly_idle_trace_is_host_wait_with_the_figures_quoted() -> None:
    f = feats(hook=burst("trace_partly_idle"))
    a = settle(f)
    assert "gpu-host-wait" in ids(a)
    assert "gpu-launch-bound" not in ids(a)
    assert a.verdict.label == "cpu-bound"
    host = next(x for x in a.findings if x.rule == "gpu-host-wait")
    idle, wait = f["burst_gpu_idle_share"], f["burst_host_wait_share"]
    assert idle is not None and wait is not None
    assert f"idles {idle:.0%}" in host.summary and f"{wait:.0%} of the step waiting for the host" in host.summary


def test_gpu_bound_trace_has_little_idle() -> None:
    f = feats(hook=burst("trace_h200_gpu_bound", folder=RECORDED))
    assert f["burst_kernel_share"] is not None and f["burst_kernel_share"] > 0.95
    assert f["burst_gpu_idle_share"] is not None and f["burst_gpu_idle_share"] < 0.05  # recorded: 2.5 %
    a = settle(f)
    assert not ids(a) & {"gpu-host-wait", "gpu-launch-bound", "pageable-h2d"}
    # no NVML reading here: gpu-bound needs NVML util beside the burst
    assert na(a)["gpu-saturated"] == "gpu_util_mean"


def test_pageable_copies_name_pin_memory_with_the_loaders_settings() -> None:
    loader = {"num_workers": 4, "batch_size": 256, "pin_memory": False, "prefetch_factor": 2}
    hook = burst("trace_pageable_h2d", dataloader=loader)
    a = settle(feats(hook=hook), texts_of(hook))
    copies, nbytes = a.features["burst_pageable_h2d_per_step"], a.features["burst_pageable_h2d_bytes_per_step"]
    assert copies is not None and copies >= 1
    assert nbytes is not None and nbytes >= 2**20  # a batch, not a few scalars
    finding = next(x for x in a.findings if x.rule == "pageable-h2d")
    assert finding.severity == "info"  # a sub-cause: it never decides the label
    assert f"{human_bytes(nbytes)} per step from pageable" in finding.summary
    fix = finding.fixes[0]
    assert "pin_memory=True" in fix.detail and "non_blocking=True" in fix.detail
    assert fix.detail.startswith("num_workers=4, batch_size=256, pin_memory=False")


def test_trace_without_pageable_copies_is_silent_on_them() -> None:
    a = settle(feats(hook=burst("trace_partly_idle")))
    assert a.features["burst_pageable_h2d_bytes_per_step"] == 0.0
    assert "pageable-h2d" not in ids(a)

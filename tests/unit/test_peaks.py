"""The dense peak table and a rank's FLOP/s and MFU from a burst's FLOP count (issue 33; no torch)."""

from __future__ import annotations

import pytest

from torchwatch import wire
from torchwatch.model import peaks


@pytest.mark.parametrize(
    ("name", "math", "tflops", "device"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4, "H100 SXM"),
        ("NVIDIA H100 PCIe", "bf16", 756.5, "H100 PCIe"),
        ("NVIDIA H100 NVL", "fp8", 1670.5, "H100 NVL"),
        ("NVIDIA H200", "bf16", 989.4, "H200 SXM"),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.7, "H100 SXM"),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156.0, "A100"),
        ("NVIDIA A100 80GB PCIe", "bf16", 312.0, "A100"),
        ("NVIDIA L4", "bf16", 121.0, "L4"),
        ("NVIDIA L40S", "bf16", 362.05, "L40S"),
        ("NVIDIA A10G", "fp16", 125.0, "A10G (A10 figures)"),
        ("Tesla V100-SXM2-16GB", "fp16", 125.0, "V100 SXM2"),
        ("Tesla T4", "fp32", 8.1, "T4"),
    ],
)
def test_dense_peaks_by_device_name(name: str, math: str, tflops: float, device: str) -> None:
    peak = peaks.device_peak(name, math)
    assert peak is not None and (peak.flops_per_s, peak.device) == (tflops * 1e12, device) and peak.source


def test_no_peak_for_a_math_the_device_lacks_or_an_unknown_device() -> None:
    assert peaks.device_peak("Tesla V100-SXM2-16GB", "bf16") is None  # no BF16 tensor cores
    assert peaks.device_peak("NVIDIA GeForce RTX 9090", "bf16") is None
    assert peaks.math_dtype("float32", True) == "tf32" and peaks.math_dtype("float32", None) == "fp32"
    assert peaks.math_dtype("float8_e4m3fn", None) == "fp8" and peaks.math_dtype("bfloat16", False) == "bf16"


def test_mfu_of_the_gpu_bound_demo_recorded_on_an_h200() -> None:
    # recorded on an H200 (torch 2.11): demo/gpu_bound.py, 6.633 TFLOP per step, 13.09 ms per step
    last = wire.BurstResult(
        1, steps=3, measured_step_ms=(14.0, 14.2, 14.1), flops_per_step=6.633e12, flops_dtype="bfloat16",
        flops_device="cuda", device_name="NVIDIA H200",
    )  # fmt: skip
    rate = peaks.flop_rate(last, 13.09)
    assert rate is not None and rate.step_source == "hook p50"
    assert rate.achieved_flops_per_s == pytest.approx(506.7e12, rel=1e-3)
    assert rate.mfu == pytest.approx(0.512, abs=0.001)
    assert "dense bf16 peak of the H200 SXM, 989 TFLOP/s" in rate.peak_text
    profiled = peaks.flop_rate(last, None)  # no hook p50: the burst's own (profiled) steps
    assert profiled is not None and profiled.step_source == "burst" and profiled.step_ms == 14.1

"""Peak FLOP rates of devices, and a training's achieved rate and MFU from a burst's FLOP count.

MFU (model FLOPs utilisation, PaLM: Chowdhery et al. 2022, appendix B) is the model's FLOPs per
step over the step time, divided by the device's peak for the dtype the math runs in. The GPU
peaks are the vendors' data-sheet figures for **dense** math: NVIDIA prints tensor-core figures
"with sparsity" (2:4 structured sparsity, twice the dense rate) and marks them with an asterisk;
the table holds those figures halved, which are the dense rates (the H100 SXM's BF16 1,979
TFLOP/s with sparsity is 989.4 dense). float32 matmuls run on tensor cores as TF32 only when the
training allows it (``torch.set_float32_matmul_precision('high')`` or ``allow_tf32``): the
TF32 peak then, the plain FP32 peak otherwise.

A CPU has no such sheet that holds for the cores a training gets: its peak is measured once in
the training, by the hook (:func:`torchwatch.hook.flops.cpu_peak`: square 512 matmuls of the
step's dtype with the training's intra-op threads, the best rate in about 50 ms), and every face
says "measured" beside it.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from torchwatch.wire import BurstResult

__all__ = ["PEAKS", "FlopRate", "Peak", "device_peak", "flop_rate", "math_dtype"]

# Data sheets (nvidia.com), read 2026-11: the figures marked "with sparsity" halved.
_H100 = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (dense / sparse table); NVL: the H100 data sheet"
_H200 = "NVIDIA H200 Tensor Core GPU data sheet (SXM / NVL columns; SXM: the H100 SXM5 compute, whitepaper figures)"
_A100 = "NVIDIA A100 Tensor Core GPU data sheet (SXM and PCIe: same peaks)"


@dataclass(frozen=True)
class Peak:
    """One device's dense peak for one math type.

    Attributes:
        device: the table's name (``H100 SXM``). math: ``fp64``, ``fp32``, ``tf32``, ``bf16``,
            ``fp16`` or ``fp8``. flops_per_s: FLOP/s, dense. source: where the figure comes from.
    """

    device: str
    math: str
    flops_per_s: float
    source: str


_T = 1e12
_HOPPER_SXM = {"fp64": 33.5, "fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}
_HOPPER_PCIE = {"fp64": 25.6, "fp32": 51.2, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0}
_HOPPER_NVL = {"fp64": 30.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}
_GA102 = {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}
_GH200 = "NVIDIA GH200 Grace Hopper Superchip data sheet (its H100: the SXM5 figures)"
_A10G = "NVIDIA A10 data sheet: AWS's A10G (G5 instances) has no NVIDIA sheet; the A10's figures, an upper bound"
# (pattern on torch.cuda.get_device_name(), table name, {math: dense TFLOP/s}, source); first match wins
PEAKS: tuple[tuple[str, str, dict[str, float], str], ...] = (
    (r"H100.*PCIe", "H100 PCIe", _HOPPER_PCIE, _H100),
    (r"H100 NVL", "H100 NVL", _HOPPER_NVL, _H100),
    (r"H200 NVL", "H200 NVL", _HOPPER_NVL, _H200),
    (r"H200", "H200 SXM", _HOPPER_SXM, _H200),
    (r"GH200", "GH200 (H100 SXM)", _HOPPER_SXM, _GH200),
    (r"H100", "H100 SXM", _HOPPER_SXM, _H100),
    (r"A100", "A100", {"fp64": 9.7, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}, _A100),
    (r"A30\b", "A30", {"fp64": 5.2, "fp32": 10.3, "tf32": 82.0, "bf16": 165.0, "fp16": 165.0}, "NVIDIA A30 data sheet"),
    (
        r"L40S",
        "L40S",
        {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
        "NVIDIA L40S data sheet",
    ),
    (
        r"L40\b",
        "L40",
        {"fp32": 90.5, "tf32": 90.5, "bf16": 181.05, "fp16": 181.05, "fp8": 362.0},
        "NVIDIA L40 data sheet",
    ),
    (r"\bL4\b", "L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5}, "NVIDIA L4 data sheet"),
    (r"A10G", "A10G (A10 figures)", _GA102, _A10G),
    (r"A10\b", "A10", _GA102, "NVIDIA A10 data sheet"),
    (r"V100S", "V100S PCIe", {"fp64": 8.2, "fp32": 16.4, "fp16": 130.0}, "NVIDIA V100 data sheet (V100S PCIe column)"),
    (r"V100.*PCI", "V100 PCIe", {"fp64": 7.0, "fp32": 14.0, "fp16": 112.0}, "NVIDIA V100 data sheet (PCIe column)"),
    (r"V100", "V100 SXM2", {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0}, "NVIDIA V100 data sheet (SXM2 column)"),
    (r"\bT4\b", "T4", {"fp32": 8.1, "fp16": 65.0}, "NVIDIA T4 data sheet"),
)
"""The dense peak table, TFLOP/s. V100 and T4 have no BF16 or TF32 tensor cores (their fp16 is the
tensor-core mixed-precision figure); a math type a device lacks gives no MFU."""

_MATH = {"bfloat16": "bf16", "float16": "fp16", "float64": "fp64", "float32": "fp32"}


def math_dtype(dtype: str | None, tf32: bool | None) -> str | None:
    """The math a step's dominant dtype runs in: ``bfloat16`` → ``bf16``; ``float32`` → ``tf32``
    when TF32 is allowed, else ``fp32``; an 8-bit float → ``fp8``; ``None`` when unknown."""
    if dtype is None:
        return None
    if dtype.startswith("float8"):
        return "fp8"
    math = _MATH.get(dtype)
    return "tf32" if math == "fp32" and tf32 else math


def device_peak(name: str | None, math: str | None) -> Peak | None:
    """The dense peak of the GPU called ``name`` (``torch.cuda.get_device_name()``) for ``math``;
    ``None`` when the device or that math is not in :data:`PEAKS`."""
    if not name or not math:
        return None
    for pattern, device, figures, source in PEAKS:
        if re.search(pattern, name):
            tflops = figures.get(math)
            return None if tflops is None else Peak(device, math, tflops * _T, source)
    return None


@dataclass(frozen=True)
class FlopRate:
    """A rank's achieved FLOP rate and MFU.

    Attributes:
        flops_per_step: the model's FLOPs in one step (the burst's count). step_ms: the step time
            it is divided by, ms; step_source: ``hook p50`` (the unprofiled steps' median) or
            ``burst`` (the profiled steps'). achieved_flops_per_s: FLOP/s.
        peak: the peak compared with (``None``: not known, ``why`` says why). measured_peak: the
            peak was measured on this CPU (not a data sheet's). mfu: achieved / peak, 0..1.
        dtype: the step's dominant dtype; device: its kind (``cuda``, ``cpu``); device_name: the
            GPU's name or the CPU's model. why: why there is no MFU, or ``None``.
    """

    flops_per_step: float
    step_ms: float
    step_source: str
    achieved_flops_per_s: float
    peak: Peak | None = None
    measured_peak: bool = False
    mfu: float | None = None
    dtype: str | None = None
    device: str | None = None
    device_name: str | None = None
    why: str | None = None

    @property
    def peak_text(self) -> str:
        """``dense bf16 peak of the H100 SXM, 989 TFLOP/s (NVIDIA H100 ... data sheet)`` or
        ``measured float32 matmul peak of this CPU, 0.21 TFLOP/s`` or ``n/a: why``."""
        p = self.peak
        if p is None:
            return f"n/a: {self.why}"
        rate = fmt_flops(p.flops_per_s)
        if self.measured_peak:
            return f"measured {p.math} matmul peak of this CPU, {rate} (the hook's microbenchmark)"
        return f"dense {p.math} peak of the {p.device}, {rate} ({p.source})"

    def to_json(self) -> dict[str, object]:
        """The JSON object of the report."""
        p = self.peak
        return {
            "flops_per_step": self.flops_per_step,
            "step_ms": round(self.step_ms, 4),
            "step_source": self.step_source,
            "achieved_flops_per_s": round(self.achieved_flops_per_s, 1),
            "peak_flops_per_s": None if p is None else p.flops_per_s,
            "peak_math": None if p is None else p.math,
            "peak_device": None if p is None else p.device,
            "peak_source": None if p is None else ("measured on this CPU" if self.measured_peak else p.source),
            "mfu": None if self.mfu is None else round(self.mfu, 4),
            "dtype": self.dtype,
            "device": self.device,
            "device_name": self.device_name,
            "why": self.why,
        }


def fmt_flops(flops_per_s: float) -> str:
    """``507 TFLOP/s``, ``212 GFLOP/s``."""
    for scale, unit in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.3g} {unit}"
    return f"{flops_per_s:.3g} FLOP/s"


def flop_rate(burst: BurstResult | None, step_ms: float | None, tf32: bool | None = None) -> FlopRate | None:
    """The achieved FLOP rate and MFU of a rank from its last burst's FLOP count.

    Args:
        burst: the rank's last burst (``None``, failed, or without a count: no rate).
        step_ms: the rank's unprofiled median step time, ms (the hook's p50); ``None``: the burst's
            profiled steps' median is used (the profiler slows them a little).
        tf32: whether float32 matmuls may run as TF32 (the hook's GPU settings); ``None``: unknown
            (taken as no: the FP32 peak, the honest lower bound of what TF32 would do).

    Returns:
        ``None`` when there is no count or no step time; else the rate, with ``mfu`` ``None`` and
        ``why`` set when no peak is known.
    """
    if burst is None or burst.error or not burst.flops_per_step:
        return None
    source = "hook p50"
    if not step_ms:
        measured = [m for m in burst.measured_step_ms if m > 0]
        if not measured:
            return None
        step_ms, source = statistics.median(measured), "burst"
    achieved = burst.flops_per_step / (step_ms / 1000.0)
    math = math_dtype(burst.flops_dtype, tf32)
    peak: Peak | None = None
    measured_peak = False
    why: str | None = None
    if burst.flops_device == "cpu":
        if burst.cpu_peak_flops:
            peak = Peak(burst.device_name or "CPU", burst.flops_dtype or "float32", burst.cpu_peak_flops, "measured")
            measured_peak = True
        else:
            why = "the CPU's matmul peak was not measured"
    elif burst.flops_device == "cuda":
        peak = device_peak(burst.device_name, math)
        if peak is None:
            why = f"no dense {math or burst.flops_dtype or '?'} peak for {burst.device_name or 'this GPU'} in the table"
    else:
        why = f"no peak for device {burst.flops_device or 'unknown'}"
    return FlopRate(
        flops_per_step=burst.flops_per_step,
        step_ms=step_ms,
        step_source=source,
        achieved_flops_per_s=achieved,
        peak=peak,
        measured_peak=measured_peak,
        mfu=None if peak is None else achieved / peak.flops_per_s,
        dtype=burst.flops_dtype,
        device=burst.flops_device,
        device_name=burst.device_name,
        why=why,
    )

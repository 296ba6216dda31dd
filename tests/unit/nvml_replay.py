"""Replay an NVML recording (``tests/fixtures/gpu/nvml_*.json``) through the pynvml API NvmlSource uses.

A recording holds, per sample and device, what each NVML function returned (``bench/record_gpu.py``
writes them on a real GPU; ``tests/fixtures/gpu/make_gpu_fixtures.py`` fabricated the ones here): keys
are function names (``"nvmlDeviceGetClockInfo:1"`` when an argument selects the reading), values the
structure's fields, a plain number, or ``{"nvml_error": code}``. :class:`ReplayNvml` answers the same
calls from it, raising pynvml's own exception classes and filling pynvml's own ``c_nvmlGpmMetricsGet_t``,
so the ctypes field names NvmlSource writes are checked against the real bindings.
"""

from __future__ import annotations

import ctypes
import gzip
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]

from torchwatch.model.readings import GpuSample
from torchwatch.sources.nvml import NvmlSource

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_recorded"


def load(stem: str) -> dict[str, Any]:
    """A recording of tests/fixtures/gpu by file stem (``"nvml_h100_gpu_bound"``, FABRICATED), or of
    tests/fixtures/gpu_recorded (``"nvml_h200_gpu_bound"``, recorded on a real GPU, gzipped)."""
    plain, recorded = FIXTURES / f"{stem}.json", RECORDED / f"{stem}.json.gz"
    text = plain.read_text() if plain.exists() else gzip.decompress(recorded.read_bytes()).decode()
    data: dict[str, Any] = json.loads(text)
    assert data["format"] == "torchwatch.nvml-recording/1"
    return data


def _ns(value: Any) -> Any:
    """Dicts become attribute objects (as pynvml's structures read), lists element-wise."""
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _ns(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_ns(v) for v in value]
    return value


def _address(pointer: Any) -> int:
    return int(ctypes.cast(pointer, ctypes.c_void_p).value or 0)


class ReplayNvml:
    """The slice of pynvml that NvmlSource calls, answered from a recording; ``step`` selects the sample.

    Attributes:
        step: index of the sample the next calls answer from (the test sets it before each ``sample``).
        freed: GPM sample buffers released with ``nvmlGpmSampleFree``.
        metrics_calls: ``(sample1 step, sample2 step)`` of each ``nvmlGpmMetricsGet``.
    """

    def __init__(self, recording: dict[str, Any]) -> None:
        self.rec = recording
        self.step = 0
        self.freed = 0
        self.metrics_calls: list[tuple[int, int]] = []
        self._buffers = 0
        self._taken: dict[int, tuple[int, int]] = {}  # GPM buffer address -> (device, step)

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML", "c_nvml")):  # NVMLError*, constants, ctypes structures: pynvml's own
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _answer(self, device: int, key: str) -> Any:
        sample = self.rec["samples"][self.step]["devices"].get(str(device), {})
        static = self.rec["static"].get(str(device), {})
        if key in sample:
            value = sample[key]
        elif key in static:
            value = static[key]
        else:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if isinstance(value, dict) and "nvml_error" in value:
            raise pynvml.NVMLError(value["nvml_error"])
        return value

    # -- device list ---------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.rec["static"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, h: int) -> Any:
        return self._answer(h, "nvmlDeviceGetName")

    def nvmlDeviceGetMigMode(self, h: int) -> Any:
        return self._answer(h, "nvmlDeviceGetMigMode")

    # -- readings --------------------------------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return _ns(self._answer(h, "nvmlDeviceGetUtilizationRates"))

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return _ns(self._answer(h, "nvmlDeviceGetMemoryInfo"))

    def nvmlDeviceGetPowerUsage(self, h: int) -> Any:
        return self._answer(h, "nvmlDeviceGetPowerUsage")

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> Any:
        return self._answer(h, "nvmlDeviceGetEnforcedPowerLimit")

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> Any:
        return self._answer(h, f"nvmlDeviceGetClockInfo:{clock}")

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> Any:
        return self._answer(h, f"nvmlDeviceGetPcieThroughput:{counter}")

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> Any:
        return _ns(self._answer(h, "nvmlDeviceGetComputeRunningProcesses"))

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> Any:
        return _ns(self._answer(h, "nvmlDeviceGetGraphicsRunningProcesses"))

    def nvmlDeviceGetProcessUtilization(self, h: int, last_seen: int) -> Any:
        newer = [s for s in self._answer(h, "nvmlDeviceGetProcessUtilization") if s["timeStamp"] > last_seen]
        if not newer:  # what NVML says when no sample is newer than last_seen
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return _ns(newer)

    # -- GPM -------------------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, h: int) -> Any:
        return _ns(self._answer(h, "nvmlGpmQueryDeviceSupport"))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._buffers += 1
        return ctypes.cast(ctypes.c_void_p(0x1000 * self._buffers), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.freed += 1

    def nvmlGpmSampleGet(self, h: int, sample: Any) -> Any:
        failure = self.rec["samples"][self.step]["devices"].get(str(h), {}).get("nvmlGpmSampleGet")
        if failure is not None:
            raise pynvml.NVMLError(failure["nvml_error"])
        self._taken[_address(sample)] = (h, self.step)
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        h1, step1 = self._taken[_address(request.sample1)]
        h2, step2 = self._taken[_address(request.sample2)]
        assert h1 == h2 and step1 <= step2, "metrics between two samples of one device, older first"
        self.metrics_calls.append((step1, step2))
        recorded = {
            m["metricId"]: m for m in self.rec["samples"][step2]["devices"][str(h2)].get("nvmlGpmMetricsGet", [])
        }
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            got = recorded.get(metric.metricId)
            metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED if got is None else got["nvmlReturn"]
            metric.value = 0.0 if got is None else got["value"]
        return request


def replay(recording: dict[str, Any], tree: set[int] | None = None) -> tuple[NvmlSource, list[GpuSample]]:
    """Every sample of ``recording`` read by an NvmlSource at its recorded times; the source is closed."""
    fake = ReplayNvml(recording)
    pids = set(recording["tree_pids"]) if tree is None else tree
    source = NvmlSource(lambda: pids, nvml=fake)
    out: list[GpuSample] = []
    for k, sample in enumerate(recording["samples"]):
        fake.step = k
        out += source.sample(sample["t"])
    source.close()
    return source, out

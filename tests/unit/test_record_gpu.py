"""bench/record_gpu.py writes what tests/unit/nvml_replay.py replays: record a replay, replay the record."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from tests.unit import nvml_replay

BENCH = Path(__file__).resolve().parents[2] / "bench" / "record_gpu.py"


def recorder_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("record_gpu", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_recording_of_a_recording_reads_the_same() -> None:
    original = nvml_replay.load("nvml_h100_launch_bound")
    fake = nvml_replay.ReplayNvml(original)
    times = [s["t"] for s in original["samples"]]

    class Stepping:
        """The fake, stepping to the next recorded sample whenever NvmlSource reads utilization."""

        def __getattr__(self, name: str) -> object:
            return getattr(fake, name)

    stepping = Stepping()
    calls = {"n": -1}

    def util(h: int) -> object:
        calls["n"] += 1
        fake.step = calls["n"]
        return fake.nvmlDeviceGetUtilizationRates(h)

    stepping.nvmlDeviceGetUtilizationRates = util  # type: ignore[attr-defined]
    again = recorder_module().record(stepping, times, set(original["tree_pids"]))

    assert again["static"]["0"]["nvmlDeviceGetName"] == "NVIDIA H100 80GB HBM3"
    assert again["static"]["0"]["nvmlGpmQueryDeviceSupport"]["isSupportedDevice"] == 1
    first, second = again["samples"][0]["devices"]["0"], again["samples"][1]["devices"]["0"]
    assert "nvmlGpmMetricsGet" not in first  # one sample is no interval
    assert {m["metricId"] for m in second["nvmlGpmMetricsGet"]} == {2, 3, 5, 10}
    assert second["nvmlDeviceGetClockInfo:1"] == 1980
    assert (
        first["nvmlDeviceGetProcessUtilization"]
        == original["samples"][0]["devices"]["0"]["nvmlDeviceGetProcessUtilization"]
    )
    # the record replays to the very readings the original gave
    assert nvml_replay.replay(again)[1] == nvml_replay.replay(original)[1]


def test_errors_are_recorded_as_codes() -> None:
    original = nvml_replay.load("nvml_a100_no_gpm")
    original["samples"][0]["devices"]["0"]["nvmlDeviceGetPowerUsage"] = {"nvml_error": 3}
    fake = nvml_replay.ReplayNvml(original)
    again = recorder_module().record(fake, [0.0], set(original["tree_pids"]))
    assert again["samples"][0]["devices"]["0"]["nvmlDeviceGetPowerUsage"] == {"nvml_error": 3}
    assert nvml_replay.replay(again)[1][0].power_w is None

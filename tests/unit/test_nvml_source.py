"""NvmlSource against a fake pynvml that raises the real pynvml exception classes."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest

from tests.unit import nvml_replay
from torchwatch.model.readings import Status
from torchwatch.sources.nvml import GPM_FIRST_SAMPLE, LIBRARY_NOT_FOUND, NO_GPU, PROC_NOT_TREE, NvmlSource


def nvml_error(code: int) -> pynvml.NVMLError:
    """What pynvml itself raises for ``code``: ``NVMLError(code)`` builds the subclass."""
    return pynvml.NVMLError(code)


def h100(**overrides: Any) -> dict[str, Any]:
    """Readings as an H100 SXM under load gives them (NVML units: mW, KB/s, bytes)."""
    device: dict[str, Any] = {
        "name": b"NVIDIA H100 80GB HBM3",
        "util": SimpleNamespace(gpu=97, memory=41),
        "mem": SimpleNamespace(total=85_520_809_984, used=71_303_168_000, free=14_217_641_984),
        "power": 612_345,  # mW
        "limit": 700_000,  # mW
        "sm_clock": 1980,  # MHz
        "pcie_tx": 1_200,  # KB/s
        "pcie_rx": 12_500_000,  # KB/s
        "compute": [SimpleNamespace(pid=4242, usedGpuMemory=70_000_000_000)],
        "graphics": [],
    }
    device.update(overrides)
    return device


class FakeNvml:
    """The slice of the pynvml API NvmlSource uses; constants and errors are pynvml's own."""

    def __init__(self, devices: list[dict[str, Any]], init_error: BaseException | None = None):
        self.devices = devices
        self.init_error = init_error
        self.calls: list[str] = []
        self.shutdowns = 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("NVML"):  # NVMLError*, NVML_CLOCK_SM, NVML_PCIE_UTIL_*
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _field(self, handle: int, key: str) -> Any:
        self.calls.append(key)
        value = self.devices[handle][key]
        if isinstance(value, BaseException):
            raise value
        return value

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return int(self._field(index, "handle") if "handle" in self.devices[index] else index)

    def nvmlDeviceGetName(self, handle: int) -> Any:
        return self._field(handle, "name")

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return self._field(handle, "util")

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return self._field(handle, "mem")

    def nvmlDeviceGetPowerUsage(self, handle: int) -> Any:
        return self._field(handle, "power")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> Any:
        return self._field(handle, "limit")

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> Any:
        assert clock == pynvml.NVML_CLOCK_SM
        return self._field(handle, "sm_clock")

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int) -> Any:
        key = {pynvml.NVML_PCIE_UTIL_TX_BYTES: "pcie_tx", pynvml.NVML_PCIE_UTIL_RX_BYTES: "pcie_rx"}
        return self._field(handle, key[counter])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> Any:
        return self._field(handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> Any:
        return self._field(handle, "graphics")


def test_fake_raises_the_real_pynvml_classes() -> None:
    err = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert type(err) is pynvml.NVMLError_NotSupported
    assert isinstance(err, pynvml.NVMLError)


def test_h100_readings_are_converted_to_named_units() -> None:
    source = NvmlSource(lambda: {4242, 4300}, nvml=FakeNvml([h100()]))
    before = source.status.status

    (gpu,) = source.sample(12.5)

    assert before is Status.STARTING  # no reading yet

    assert source.status.status is Status.OK
    assert gpu.t == 12.5 and gpu.index == 0
    assert gpu.name == "NVIDIA H100 80GB HBM3"  # bytes decoded
    assert gpu.util_pct == 97.0
    assert gpu.mem_used_bytes == 71_303_168_000
    assert gpu.mem_total_bytes == 85_520_809_984
    assert gpu.power_w == pytest.approx(612.345)  # mW -> W
    assert gpu.power_limit_w == pytest.approx(700.0)
    assert gpu.sm_clock_mhz == 1980.0
    assert gpu.pcie_tx_bytes_per_s == 1_200 * 1024  # KB/s -> bytes/s
    assert gpu.pcie_rx_bytes_per_s == 12_500_000 * 1024
    assert gpu.target_pids == (4242,)


def test_str_name_is_kept() -> None:
    source = NvmlSource(lambda: (), nvml=FakeNvml([h100(name="NVIDIA A100-SXM4-40GB")]))
    assert source.sample(0.0)[0].name == "NVIDIA A100-SXM4-40GB"


@pytest.mark.parametrize(
    ("key", "attrs"),
    [
        ("power", ["power_w"]),
        ("limit", ["power_limit_w"]),
        ("util", ["util_pct"]),  # MIG slices report no utilization
        ("mem", ["mem_used_bytes", "mem_total_bytes"]),
        ("sm_clock", ["sm_clock_mhz"]),
        ("pcie_rx", ["pcie_rx_bytes_per_s"]),
    ],
)
def test_not_supported_blanks_one_field_only(key: str, attrs: list[str]) -> None:
    fake = FakeNvml([h100(**{key: nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)})])
    source = NvmlSource(lambda: [4242], nvml=fake)

    (gpu,) = source.sample(1.0)

    for attr in attrs:
        assert getattr(gpu, attr) is None, attr
    others = {
        "util_pct",
        "mem_used_bytes",
        "mem_total_bytes",
        "power_w",
        "power_limit_w",
        "sm_clock_mhz",
        "pcie_tx_bytes_per_s",
        "pcie_rx_bytes_per_s",
    } - set(attrs)
    for attr in others:
        assert getattr(gpu, attr) is not None, attr  # absent is None, never a stand-in zero
    assert gpu.target_pids == (4242,)
    assert source.status.status is Status.OK


def test_no_permission_on_processes_leaves_target_pids_empty() -> None:
    denied = nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
    fake = FakeNvml([h100(compute=denied, graphics=denied)])
    (gpu,) = NvmlSource(lambda: [4242], nvml=fake).sample(1.0)
    assert gpu.target_pids == ()
    assert gpu.power_w == pytest.approx(612.345)


def test_target_pids_are_the_tree_on_each_gpu() -> None:
    proc = SimpleNamespace
    gpu0 = h100(compute=[proc(pid=4242), proc(pid=9999)], graphics=[proc(pid=4243)])
    gpu1 = h100(compute=[proc(pid=4244)], graphics=nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED))
    tree = {4242, 4243, 4244, 1}

    samples = NvmlSource(lambda: tree, nvml=FakeNvml([gpu0, gpu1])).sample(2.0)

    assert [(s.index, s.target_pids) for s in samples] == [(0, (4242, 4243)), (1, (4244,))]


def test_tree_pids_are_read_on_every_sample() -> None:
    tree: set[int] = set()
    source = NvmlSource(lambda: tree, nvml=FakeNvml([h100()]))
    assert source.sample(1.0)[0].target_pids == ()  # host PIDs in a container look like this
    tree.add(4242)
    assert source.sample(2.0)[0].target_pids == (4242,)


def test_zero_devices_is_unavailable() -> None:
    fake = FakeNvml([])
    source = NvmlSource(lambda: [4242], nvml=fake)
    assert source.status.status is Status.UNAVAILABLE
    assert source.status.reason == NO_GPU
    assert source.sample(1.0) == []
    source.close()
    assert fake.shutdowns == 1  # init did succeed, so it is undone


def test_device_that_cannot_be_opened_is_skipped() -> None:
    denied = h100(handle=nvml_error(pynvml.NVML_ERROR_NO_PERMISSION))
    samples = NvmlSource(list, nvml=FakeNvml([denied, h100()])).sample(1.0)
    assert [s.index for s in samples] == [1]


@pytest.mark.parametrize(
    ("code", "reason", "hint_word"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, LIBRARY_NOT_FOUND, "CPU-only"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVML init failed: Driver Not Loaded", "kernel"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "NVML init failed: Insufficient Permissions", "/dev"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML init failed: Unknown Error", "nvidia-smi"),
    ],
)
def test_init_errors_become_unavailable(code: int, reason: str, hint_word: str) -> None:
    fake = FakeNvml([h100()], init_error=nvml_error(code))
    source = NvmlSource(lambda: [4242], nvml=fake)

    assert source.status.status is Status.UNAVAILABLE
    assert source.status.reason == reason
    assert hint_word in (source.status.hint or "")
    assert source.sample(1.0) == []
    assert fake.calls == []
    source.close()
    assert fake.shutdowns == 0  # nothing to shut down


def test_missing_pynvml_module_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    source = NvmlSource(list)
    assert source.status.status is Status.UNAVAILABLE
    assert source.status.hint == "pip install nvidia-ml-py"
    assert source.sample(1.0) == []
    source.close()


def test_gpu_lost_mid_run_is_unavailable_and_empty() -> None:
    fake = FakeNvml([h100(), h100()])
    source = NvmlSource(lambda: [4242], nvml=fake)
    assert len(source.sample(1.0)) == 2

    fake.devices[1]["power"] = nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert source.sample(2.0) == []
    assert source.status.status is Status.UNAVAILABLE
    assert "GPU is lost" in (source.status.reason or "")
    assert "Xid" in (source.status.hint or "")

    calls = len(fake.calls)
    assert source.sample(3.0) == []
    assert len(fake.calls) == calls  # no more device calls once NVML is gone


def test_close_is_idempotent_and_shuts_down_once() -> None:
    fake = FakeNvml([h100()])
    source = NvmlSource(list, nvml=fake)
    source.close()
    source.close()
    assert fake.shutdowns == 1
    assert source.sample(1.0) == []


def test_close_swallows_shutdown_errors() -> None:
    fake = FakeNvml([h100()])

    def broken_shutdown() -> None:
        fake.shutdowns += 1
        raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)

    fake.nvmlShutdown = broken_shutdown  # type: ignore[method-assign]
    source = NvmlSource(list, nvml=fake)
    source.close()
    assert fake.shutdowns == 1


def test_real_pynvml_without_driver_is_unavailable() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass  # the machine this test is for: no NVIDIA driver
    except pynvml.NVMLError as err:
        pytest.skip(f"a driver is installed but NVML fails otherwise ({err})")
    else:
        pynvml.nvmlShutdown()
        pytest.skip("an NVIDIA driver is present: this test is for machines without one")

    source = NvmlSource(list)
    try:
        assert source.status.status is Status.UNAVAILABLE
        assert source.status.reason == LIBRARY_NOT_FOUND
        assert source.sample(1.0) == []
    finally:
        source.close()


# -- GPM and per-process utilization, on recordings (tests/fixtures/gpu/, FABRICATED: see its README) --


def _recorded_metric(rec: dict[str, Any], k: int, metric_id: int) -> float:
    metrics = rec["samples"][k]["devices"]["0"]["nvmlGpmMetricsGet"]
    return float(next(m["value"] for m in metrics if m["metricId"] == metric_id))


def test_gpm_metrics_come_from_consecutive_samples_of_a_hopper_gpu() -> None:
    rec = nvml_replay.load("nvml_h200_gpu_bound")
    fake = nvml_replay.ReplayNvml(rec)
    source = NvmlSource(lambda: {4242}, nvml=fake)
    samples = []
    for k, s in enumerate(rec["samples"]):
        fake.step = k
        samples += source.sample(s["t"])
    source.close()

    first, second, last = samples[0], samples[1], samples[-1]
    # one sample is no interval: absent with the reason, never 0
    assert first.sm_active_pct is None and first.tensor_active_pct is None
    assert first.gpm_reason == GPM_FIRST_SAMPLE
    assert second.gpm_reason is None
    assert second.sm_active_pct == _recorded_metric(rec, 1, pynvml.NVML_GPM_METRIC_SM_UTIL)
    assert second.sm_occupancy_pct == _recorded_metric(rec, 1, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY)
    assert second.tensor_active_pct == _recorded_metric(rec, 1, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL)
    assert second.dram_bw_pct == _recorded_metric(rec, 1, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
    assert last.sm_active_pct == _recorded_metric(rec, len(samples) - 1, pynvml.NVML_GPM_METRIC_SM_UTIL)
    # each read pairs the previous sample with the new one: two buffers, swapped
    assert fake.metrics_calls == [(k - 1, k) for k in range(1, len(samples))]
    assert fake.freed == 2  # both buffers released at close
    assert source.gpm_status.status is Status.OK


def test_gpu_without_gpm_says_why_and_keeps_the_nvml_readings() -> None:
    source, samples = nvml_replay.replay(nvml_replay.load("nvml_a100_no_gpm"))
    for g in samples:
        assert (g.sm_active_pct, g.sm_occupancy_pct, g.tensor_active_pct, g.dram_bw_pct) == (None,) * 4
        assert g.gpm_reason == "GPM needs a Hopper or newer GPU (this is NVIDIA A100-SXM4-40GB)"
        assert g.util_pct is not None and g.util_pct >= 90  # NVML util is still read
    st = source.gpm_status
    assert st.status is Status.UNAVAILABLE
    assert st.reason == "GPM needs a Hopper or newer GPU (this is NVIDIA A100-SXM4-40GB)"
    assert "torchwatch burst" in (st.hint or "")


@pytest.mark.parametrize(
    ("static", "reason"),
    [
        ({"nvmlDeviceGetMigMode": [1, 1]}, "the GPU is in MIG mode: GPM per MIG instance is not read"),
        (
            {"nvmlGpmQueryDeviceSupport": {"nvml_error": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}},
            "GPM not supported by this driver (too old for this NVML function)",
        ),
        (
            {"nvmlGpmQueryDeviceSupport": {"nvml_error": pynvml.NVML_ERROR_NOT_SUPPORTED}},
            "GPM not supported by this GPU or driver",
        ),
    ],
)
def test_gpm_unreadable_device_gives_a_reason(static: dict[str, Any], reason: str) -> None:
    rec = nvml_replay.load("nvml_h200_gpu_bound")
    rec["static"]["0"].update(static)
    source, samples = nvml_replay.replay(rec)
    assert {g.gpm_reason for g in samples} == {reason}
    assert all(g.sm_active_pct is None for g in samples)
    assert source.gpm_status.reason == reason


def test_bindings_without_gpm_say_so() -> None:
    source = NvmlSource(lambda: [4242], nvml=FakeNvml([h100()]))  # a pynvml without any nvmlGpm* function
    (gpu,) = source.sample(1.0)
    assert gpu.sm_active_pct is None
    assert gpu.gpm_reason == "GPM is not in the installed nvidia-ml-py (pip install -U nvidia-ml-py)"
    assert gpu.util_pct == 97.0


def test_one_unsupported_metric_blanks_only_that_metric() -> None:
    rec = nvml_replay.load("nvml_h200_gpu_bound")
    for s in rec["samples"][1:]:
        for m in s["devices"]["0"]["nvmlGpmMetricsGet"]:
            if m["metricId"] == pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL:
                m["nvmlReturn"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    _, samples = nvml_replay.replay(rec)
    assert samples[3].tensor_active_pct is None
    assert samples[3].sm_active_pct is not None and samples[3].dram_bw_pct is not None
    assert samples[3].gpm_reason is None


def test_failed_gpm_sample_starts_a_new_interval() -> None:
    rec = nvml_replay.load("nvml_h100_launch_bound")
    rec["samples"][3]["devices"]["0"]["nvmlGpmSampleGet"] = {"nvml_error": pynvml.NVML_ERROR_UNKNOWN}
    _, samples = nvml_replay.replay(rec)
    assert samples[3].gpm_reason == "GPM sample failed: Unknown Error" and samples[3].sm_active_pct is None
    assert samples[4].gpm_reason == GPM_FIRST_SAMPLE  # sample 2 is too old to pair with sample 4
    assert samples[5].gpm_reason is None and samples[5].sm_active_pct is not None


def test_gpm_buffers_freed_when_allocation_half_fails() -> None:
    rec = nvml_replay.load("nvml_h200_gpu_bound")
    fake = nvml_replay.ReplayNvml(rec)
    calls = {"n": 0}
    real_alloc = fake.nvmlGpmSampleAlloc

    def second_fails() -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise nvml_error(pynvml.NVML_ERROR_MEMORY)
        return real_alloc()

    fake.nvmlGpmSampleAlloc = second_fails  # type: ignore[method-assign]
    source = NvmlSource(lambda: {4242}, nvml=fake)
    (gpu,) = source.sample(0.0)
    assert gpu.gpm_reason is not None and gpu.gpm_reason.startswith("GPM sample buffer: ")
    assert fake.freed == 1  # the first buffer is not leaked


def test_per_process_sm_is_the_trees_own() -> None:
    rec = nvml_replay.load("nvml_h100_partly_idle")
    _, samples = nvml_replay.replay(rec)
    recorded = [s["smUtil"] for s in rec["samples"][5]["devices"]["0"]["nvmlDeviceGetProcessUtilization"]]
    assert samples[5].proc_sm_pct == pytest.approx(sum(recorded) / len(recorded))
    assert samples[5].proc_util_reason is None

    # PIDs of another namespace (a container): NVML's PIDs are not the tree's
    _, other = nvml_replay.replay(rec, tree={17})
    assert all(g.proc_sm_pct is None for g in other)
    assert other[5].proc_util_reason == PROC_NOT_TREE
    assert other[5].target_pids == ()


def test_per_process_samples_are_read_once() -> None:
    rec = nvml_replay.load("nvml_h100_partly_idle")
    fake = nvml_replay.ReplayNvml(rec)
    source = NvmlSource(lambda: {4242}, nvml=fake)
    (first,) = source.sample(0.0)
    (again,) = source.sample(0.5)  # same recorded second: nothing newer than what was read
    assert first.proc_sm_pct is not None
    assert again.proc_sm_pct is None
    assert again.proc_util_reason == "per-process utilization: no sample since the last reading"


def test_gpm_status_without_nvml_names_nvml() -> None:
    fake = FakeNvml([h100()], init_error=nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    st = NvmlSource(list, nvml=fake).gpm_status
    assert st.status is Status.UNAVAILABLE
    assert st.reason == f"needs NVML: {LIBRARY_NOT_FOUND}"


def test_gpm_structures_of_other_bindings_switch_gpm_off_not_the_source() -> None:
    rec = nvml_replay.load("nvml_h200_gpu_bound")
    fake = nvml_replay.ReplayNvml(rec)

    class OddRequest:  # a c_nvmlGpmMetricsGet_t without the fields this code writes
        __slots__ = ()

    fake.c_nvmlGpmMetricsGet_t = OddRequest  # type: ignore[attr-defined]
    source = NvmlSource(lambda: {4242}, nvml=fake)
    fake.step = 0
    source.sample(0.0)
    fake.step = 1
    (gpu,) = source.sample(1.0)
    assert source.status.status is Status.OK
    assert gpu.util_pct is not None and gpu.sm_active_pct is None
    assert gpu.gpm_reason is not None and "not understood" in gpu.gpm_reason
    fake.step = 2
    assert source.sample(2.0)[0].gpm_reason == gpu.gpm_reason  # stays off on that device

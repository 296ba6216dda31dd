"""NvmlSource against a fake pynvml that raises the real pynvml exception classes."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest

from torchwatch.readings import Status
from torchwatch.sources.nvml import LIBRARY_NOT_FOUND, NO_GPU, NvmlSource


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

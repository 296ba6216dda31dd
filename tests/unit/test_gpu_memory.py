"""Device memory and GPU settings from the hook: reading (only once the training initialised CUDA),
the wire format, features, the memory-pressure and fragmentation rules, the fixes that quote
settings, the report and its schema.

No GPU was lent for this work: every CUDA reading here is FABRICATED in the shape
``torch.cuda.memory_stats_as_nested_dict`` returns (``allocated_bytes`` / ``reserved_bytes`` ->
``all`` -> ``current`` / ``peak``, ``num_alloc_retries``), on an 80 GiB device (an H100 SXM's
capacity).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from tests.unit.hookrecords import hook_record
from tests.unit.hookrun import hook_script, result
from torchwatch import wire
from torchwatch.analysis.diagnosis import Analysis, Diagnoser, template_values
from torchwatch.analysis.features import CATALOGUE, compute, texts
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.analysis.store import Store, Window
from torchwatch.faces import report
from torchwatch.hook import gpu
from torchwatch.model.observation import TargetView
from torchwatch.model.readings import HookState, SourceStatus
from torchwatch.model.report import Report
from torchwatch.watch.observe import NO_CUDA, NO_HOOK_MEMORY, Tick, Trends, observe

GIB = 1 << 30
CAP = 80 * GIB
SCHEMA = json.loads((Path(__file__).resolve().parent / "report_schema.json").read_text())


def memory(allocated: float, reserved: float, peak: float, retries: int = 0, t: float = 0.0) -> dict[str, Any]:
    """A FABRICATED device-memory entry of hook.json (GiB in, bytes out)."""
    return {
        "device": 0,
        "allocated_bytes": int(allocated * GIB),
        "reserved_bytes": int(reserved * GIB),
        "peak_bytes": int(peak * GIB),
        "capacity_bytes": CAP,
        "alloc_retries": retries,
        "t": t,
    }


SETTINGS = {
    "float32_matmul_precision": "highest",
    "matmul_allow_tf32": False,
    "cudnn_allow_tf32": True,
    "cudnn_benchmark": False,
    "compiled": False,
    "optimizer": "AdamW",
    "optimizer_foreach": None,
    "optimizer_fused": None,
    "alloc_conf": "garbage_collection_threshold:0.6",
}


def reads(
    mems: list[dict[str, Any] | None], settings: dict[str, Any] | None = None, cuda: bool = True
) -> list[HookState]:
    """One hook reading per second from t=100, each with its published record (``None``: no entry)."""
    out = []
    for i, mem in enumerate(mems):
        parts: dict[str, Any] = {"torch": "2.13", "cuda_initialized": cuda}
        if mem is not None:
            parts |= {"device_memory": mem, "devices": [mem]}
        if settings is not None:
            parts["gpu_settings"] = settings
        out.append(HookState(100.0 + i, 7, 10 * i, 10 * i, 0.0, 0.0, record=hook_record(7, **parts)))
    return out


def window(hook: list[HookState]) -> Window:
    return Window(100.0, 100.0 + len(hook), hook=hook)


def diagnose(hook: list[HookState], **extra: float) -> Analysis:
    w = window(hook)
    f = {**compute(w, 7), **extra}
    d = Diagnoser(load_rules(), why_missing=lambda name: "not measured")
    d.evaluate(f, 0.0, texts(w, 7))
    return d.evaluate(f, 10.0, texts(w, 7))


def finding(a: Analysis, rule: str) -> Any:
    return next((f for f in a.findings if f.rule == rule), None)


def not_applicable(a: Analysis, rule: str) -> bool:
    return any(n.rule == rule for n in a.not_applicable)


# -- the hook in a real training process, with a fake torch.cuda surface ---------------------------
def run_fake_cuda(tmp_path: Path, initialised: bool, **env: str) -> dict[str, Any]:
    pytest.importorskip("torch", reason="the hook's training runs need torch")
    proc = hook_script("fake_cuda", tmp_path / "tw", tmp_path / "traces", FAKE_CUDA_INIT=str(int(initialised)), **env)
    return result(proc)


def test_the_hook_reads_nothing_of_cuda_when_the_training_has_not_initialised_it(tmp_path: Path) -> None:
    r = run_fake_cuda(tmp_path, initialised=False)
    assert r["cuda_calls"] == []  # not memory_stats, not get_device_properties, not even device_count
    st = r["state"]
    assert "device_memory" not in st and "devices" not in st and st["cuda_initialized"] is False
    assert st["gpu_settings"]["float32_matmul_precision"] == "high"  # settings need no CUDA
    assert st["errors"] == []


def test_the_hook_publishes_device_memory_and_settings_once_cuda_is_initialised(tmp_path: Path) -> None:
    r = run_fake_cuda(tmp_path, initialised=True, PYTORCH_CUDA_ALLOC_CONF="garbage_collection_threshold:0.6")
    st = r["state"]
    assert st["cuda_initialized"] is True and st["errors"] == []
    mem = st["device_memory"]
    assert (mem["device"], mem["reserved_bytes"], mem["peak_bytes"]) == (0, 12 * GIB, 9 * GIB)
    assert mem["capacity_bytes"] == 80 * GIB and mem["alloc_retries"] == 0
    assert mem["allocated_bytes"] in {k * GIB for k in (2, 3, 4, 5)}
    assert [d["device"] for d in st["devices"]] == [0]  # device 1 holds nothing: not listed
    assert "get_device_properties" in r["cuda_calls"]
    s = st["gpu_settings"]
    assert (s["float32_matmul_precision"], s["matmul_allow_tf32"]) == ("high", True)
    assert (s["optimizer"], s["optimizer_foreach"], s["optimizer_fused"]) == ("SGD", False, None)
    assert s["compiled"] is False and s["alloc_conf"] == "garbage_collection_threshold:0.6"
    wire.HookRecord.decode(st)  # what the reader accepts


class FakeCuda:
    """A FABRICATED ``torch.cuda`` surface that counts calls."""

    def __init__(self, initialised: bool, reserved: int = 12 * GIB) -> None:
        self.initialised = initialised
        self.reserved = reserved
        self.calls: list[str] = []

    def is_initialized(self) -> bool:
        return self.initialised

    def current_device(self) -> int:
        self.calls.append("current_device")
        return 0

    def device_count(self) -> int:
        self.calls.append("device_count")
        return 1

    def memory_stats_as_nested_dict(self, device: int) -> dict[str, Any]:
        self.calls.append("memory_stats")
        return {"allocated_bytes": {"all": {"current": 2 * GIB}}, "reserved_bytes": {"all": {"current": self.reserved}}}

    def get_device_properties(self, device: int) -> Any:
        self.calls.append("get_device_properties")
        return type("Props", (), {"total_memory": CAP})()


class FakeTorch:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda

    def get_float32_matmul_precision(self) -> str:
        return "highest"


def test_gpu_watch_reads_at_most_every_half_second_caches_capacity_and_republishes_on_change() -> None:
    cuda = FakeCuda(initialised=True)
    w = gpu.GpuWatch()
    assert w.due(0.0) and w.sample(FakeTorch(cuda), None, 0.0)  # first read: changed
    assert w.memory is not None and w.memory.capacity_bytes == CAP and w.settings is not None
    assert not w.due(0.3) and w.due(0.5)
    assert not w.sample(FakeTorch(cuda), None, 0.5)  # nothing moved: no rewrite of hook.json
    cuda.reserved += GIB // 2048  # 0.5 MiB: below the 1 MiB / 1 % step
    assert not w.sample(FakeTorch(cuda), None, 1.0)
    cuda.reserved += GIB
    assert w.sample(FakeTorch(cuda), None, 1.5) and w.memory.reserved_bytes == cuda.reserved
    assert cuda.calls.count("get_device_properties") == 1  # once per device


def test_gpu_watch_never_touches_cuda_before_the_training_initialises_it() -> None:
    cuda = FakeCuda(initialised=False)
    w = gpu.GpuWatch()
    w.sample(FakeTorch(cuda), None, 0.0)
    assert cuda.calls == [] and w.memory is None and w.devices == ()
    cuda.initialised = True  # the training moves its model to the GPU
    assert w.sample(FakeTorch(cuda), None, 1.0) and w.memory is not None


# -- wire format --------------------------------------------------------------------------------
def test_an_older_record_without_the_added_fields_still_decodes() -> None:
    rec = hook_record(7, device_memory={"device": 0, "allocated_bytes": 1, "reserved_bytes": 2, "peak_bytes": None})
    assert rec.device_memory is not None and rec.device_memory.capacity_bytes is None
    assert rec.devices == () and rec.gpu_settings is None
    assert "capacity_bytes" not in rec.to_json()["device_memory"]  # added fields only when known


@pytest.mark.parametrize(
    ("part", "value", "field"),
    [
        ("devices", [memory(1, 2, 2)] * (wire.MAX_DEVICES + 1), "devices"),
        ("device_memory", {**memory(1, 2, 2), "capacity_bytes": -1}, "capacity_bytes"),
        ("device_memory", {**memory(1, 2, 2), "alloc_retries": "many"}, "alloc_retries"),
        ("gpu_settings", {**SETTINGS, "float32_matmul_precision": "fast"}, "float32_matmul_precision"),
        ("gpu_settings", {**SETTINGS, "cudnn_benchmark": 1}, "cudnn_benchmark"),
        ("gpu_settings", {**SETTINGS, "alloc_conf": "x" * (wire.TEXT + 1)}, "alloc_conf"),
    ],
)
def test_the_reader_refuses_bad_device_entries_and_settings(part: str, value: Any, field: str) -> None:
    with pytest.raises(wire.WireError, match=field):
        hook_record(7, **{part: value})


def test_alloc_conf_loses_control_characters() -> None:
    rec = hook_record(7, gpu_settings={**SETTINGS, "alloc_conf": "expandable_segments:True\x1b[2J"})
    assert rec.gpu_settings is not None and rec.gpu_settings.alloc_conf == "expandable_segments:True[2J"


# -- features -----------------------------------------------------------------------------------
def test_features_of_a_fabricated_window_near_full_and_fragmented() -> None:
    # 74 GiB reserved of 80, peak 40 GiB: 34 GiB cached that no step ever needed at once
    f = compute(window(reads([memory(20, 74, 40, retries=1), memory(21, 74, 40, retries=3)], SETTINGS)), 7)
    assert f["cuda_mem_peak_ratio"] == pytest.approx(74 / 80)
    assert f["cuda_mem_unused_reserved_bytes"] == 34 * GIB
    assert f["cuda_mem_unused_reserved_share"] == pytest.approx(34 / 74)
    assert f["cuda_alloc_retries"] == 2.0  # in the window, not since the start
    assert f["cuda_mem_allocated_bytes"] == 21 * GIB and f["cuda_mem_capacity_bytes"] == CAP
    assert (f["tf32_matmul"], f["cudnn_benchmark"], f["model_compiled"]) == (0.0, 0.0, 0.0)
    assert (f["optimizer_fused"], f["optimizer_foreach"], f["alloc_expandable_segments"]) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("cuda", [True, False])
def test_device_memory_features_are_none_without_cuda_or_without_a_hook(cuda: bool) -> None:
    names = [n for n in CATALOGUE if n.startswith("cuda_")]
    assert all(compute(window(reads([None, None], cuda=cuda)), 7)[n] is None for n in names)
    assert all(compute(Window(100.0, 110.0), 7)[n] is None for n in [*names, "tf32_matmul", "optimizer_fused"])


# -- rules ------------------------------------------------------------------------------------
def test_memory_pressure_fires_on_the_allocators_peak_and_names_it() -> None:
    a = diagnose(reads([memory(30, 50, 74), memory(30, 50, 74)]))
    f = finding(a, "gpu-memory-pressure")
    assert f is not None and "reach 92% of the device's 80.0 GiB" in f.summary
    titles = [x.title for x in f.fixes]
    assert titles[:3] == [
        "Use bf16 autocast (AMP)",
        "Checkpoint activations",
        "Use a smaller batch with gradient accumulation",
    ]
    assert "Stop the allocation retries" not in titles


def test_memory_pressure_fires_on_allocation_retries_below_90_percent() -> None:
    a = diagnose(reads([memory(30, 60, 60, retries=0), memory(30, 60, 60, retries=4)], SETTINGS))
    f = finding(a, "gpu-memory-pressure")
    assert f is not None and "4 allocation retries in the window" in f.summary
    retry = next(x for x in f.fixes if x.title == "Stop the allocation retries")
    assert "PYTORCH_CUDA_ALLOC_CONF='garbage_collection_threshold:0.6'" in retry.detail


def test_memory_pressure_is_silent_with_headroom_and_not_applicable_without_readings() -> None:
    assert finding(diagnose(reads([memory(30, 50, 60)] * 2)), "gpu-memory-pressure") is None
    assert not not_applicable(diagnose(reads([memory(30, 50, 60)] * 2)), "gpu-memory-pressure")
    assert not_applicable(diagnose(reads([None, None], cuda=False)), "gpu-memory-pressure")  # no CUDA, no NVML
    assert not_applicable(diagnose([]), "gpu-memory-pressure")  # no hook


def test_fragmentation_fires_and_quotes_the_users_alloc_conf() -> None:
    a = diagnose(reads([memory(20, 74, 40), memory(21, 74, 40)], SETTINGS))
    f = finding(a, "gpu-memory-fragmentation")
    assert f is not None and "34.0 GiB (46% of what it reserved)" in f.summary
    fix = f.fixes[0]
    assert fix.title == "Let the allocator grow segments instead of splitting them"
    assert fix.detail.startswith("PYTORCH_CUDA_ALLOC_CONF='garbage_collection_threshold:0.6': start")
    unset = finding(
        diagnose(reads([memory(20, 74, 40)] * 2, {**SETTINGS, "alloc_conf": None})), "gpu-memory-fragmentation"
    )
    assert unset.fixes[0].detail.startswith("PYTORCH_CUDA_ALLOC_CONF is not set: start")


def test_fragmentation_with_expandable_segments_on_suggests_the_next_knob() -> None:
    on = {**SETTINGS, "alloc_conf": "expandable_segments:True"}
    f = finding(diagnose(reads([memory(20, 74, 40)] * 2, on)), "gpu-memory-fragmentation")
    assert [x.title for x in f.fixes] == ["Keep shapes steady", "Split no large blocks"]


@pytest.mark.parametrize(
    "mem",
    [
        # 64 GiB reserved above allocated at a step boundary, but the peak needs 72 of the 74:
        # the next forward reuses that cache (2 GiB = 3 % unused)
        memory(10, 74, 72),
        # 64 % of the reserved never needed, but 0.9 GiB: too little to matter
        memory(0.2, 1.4, 0.5),
    ],
    ids=["cache-the-next-forward-needs", "small"],
)
def test_fragmentation_is_silent_when_the_cache_is_needed_or_small(mem: dict[str, Any]) -> None:
    assert finding(diagnose(reads([mem, mem])), "gpu-memory-fragmentation") is None


def test_fragmentation_is_not_applicable_without_cuda_or_without_a_hook() -> None:
    assert not_applicable(diagnose(reads([None, None], cuda=False)), "gpu-memory-fragmentation")
    assert not_applicable(diagnose([]), "gpu-memory-fragmentation")


SATURATED = {"gpu_util_mean": 97.0, "gpu_sm_active_mean": 0.92, "data_wait_share": 0.05, "gpu_mem_ratio": 0.5}


def test_gpu_saturated_names_tf32_cudnn_and_the_optimizer_only_when_the_hook_read_them() -> None:
    f = finding(diagnose(reads([memory(10, 12, 12)] * 2, SETTINGS), **SATURATED), "gpu-saturated")
    details = {x.title: x.detail for x in f.fixes}
    assert "torch.get_float32_matmul_precision() is 'highest'" in details["Let float32 matmuls use TF32"]
    assert "torch.set_float32_matmul_precision('high')" in details["Let float32 matmuls use TF32"]
    assert "Let cuDNN pick its fastest convolutions" in details
    assert "optimizer: AdamW(foreach=None, fused=None)" in details["Use channels_last and a fused optimizer"]
    unread = finding(diagnose([], **SATURATED), "gpu-saturated")  # no hook: nothing read, nothing quoted
    titles = {x.title for x in unread.fixes}
    assert "Let float32 matmuls use TF32" not in titles and "Let cuDNN pick its fastest convolutions" not in titles
    tf32_on = {**SETTINGS, "float32_matmul_precision": "high", "compiled": True, "optimizer_fused": True}
    on = {x.title for x in finding(diagnose(reads([None] * 2, tf32_on), **SATURATED), "gpu-saturated").fixes}
    assert not on & {"Let float32 matmuls use TF32", "Compile the model", "Use channels_last and a fused optimizer"}


def test_loop_cpu_suggests_a_fused_optimizer_only_when_the_hook_saw_it_unfused() -> None:
    busy = {"loop_cpu_share": 0.8, "optimizer_share": 0.4, "gpu_util_mean": 10.0, "data_wait_queue_share": 0.0}
    f = finding(diagnose(reads([None] * 2, SETTINGS, cuda=False), **busy), "loop-cpu")
    fused = next(x for x in f.fixes if x.title == "Use a fused optimizer")
    assert "AdamW(foreach=None, fused=None) updates the parameters tensor by tensor" in fused.detail
    assert "Use a fused optimizer" not in {x.title for x in finding(diagnose([], **busy), "loop-cpu").fixes}
    fused_on = {**SETTINGS, "optimizer_fused": True}
    on = finding(diagnose(reads([None] * 2, fused_on, cuda=False), **busy), "loop-cpu")
    assert "Use a fused optimizer" not in {x.title for x in on.fixes}


def test_template_texts_say_unknown_when_not_read() -> None:
    values = template_values({name: None for name in CATALOGUE})
    assert values["optimizer_state"] == values["alloc_conf_state"] == "unknown (not read by the hook)"
    assert values["memory_pressure_state"] == "n/a"


# -- the Observation and the report -----------------------------------------------------------
def observed(hook: list[HookState]) -> dict[str, Any]:
    store = Store()
    store.add(hook)
    end = hook[-1].t if hook else 110.0
    w = window(hook)
    d = Diagnoser(load_rules())
    analysis = d.evaluate(compute(w, 7), end, texts(w, 7))
    tick = Tick(
        now=end,
        end=end,
        started=90.0,
        window_s=10.0,
        analysis=analysis,
        statuses=(("hook", SourceStatus.ok()),),
        focus_pid=7,
        target=TargetView(7, ("python", "train.py")),
        hook_status=SourceStatus.ok() if hook else None,
    )
    return report.build(observe(store, tick, Trends()), watched_s=20.0).to_json()


def test_the_report_carries_device_memory_and_settings_and_validates() -> None:
    data = observed(reads([memory(20, 74, 40), memory(21, 74, 40)], SETTINGS))
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    mem = data["hook"]["device_memory"]
    assert (mem["allocated_bytes"], mem["capacity_bytes"], mem["why"], mem["devices"]) == (21 * GIB, CAP, None, 1)
    assert data["hook"]["gpu_settings"]["alloc_conf"] == "garbage_collection_threshold:0.6"
    assert "gpu-memory-fragmentation" not in {f["rule"] for f in data["findings"]}  # 5 s hold: one tick is not enough
    text = report.render_text(Report.from_json(data))
    assert "device memory (cuda:0): 21.0 GiB allocated / 74.0 GiB reserved, peak 40.0 GiB of 80.0 GiB" in text
    assert "GPU settings: float32_matmul_precision=highest, matmul_allow_tf32=False" in text
    bad = json.loads(json.dumps(data))
    bad["hook"]["device_memory"]["capacity_bytes"] = "80 GiB"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(SCHEMA).validate(bad)


def test_the_report_says_why_device_memory_is_missing() -> None:
    data = observed(reads([None, None], cuda=False))
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    assert data["hook"]["device_memory"]["why"] == NO_CUDA and data["hook"]["gpu_settings"] is None
    assert f"device memory: n/a: {NO_CUDA}" in report.render_text(Report.from_json(data))
    no_hook = observed([])
    assert no_hook.get("hook") is None
    assert NO_HOOK_MEMORY.startswith("no hook")

"""The saved report's type (torchwatch/model/report.py): a report a real watch wrote decodes and
writes back byte for byte and prints what the watch printed; a report the builder makes from a
full Observation (hook, burst, torch.compile, FLOPs, ranks, straggler, hang, trials, injection)
survives JSON unchanged; older reports load; another major version, a foreign file and every
wrong type are one :class:`ReportError` naming the key and the version; a section added later
needs no decoder of its own."""

from __future__ import annotations

import copy
import gzip
import json
import math
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from tests.unit.reports import SCHEMA
from torchwatch import wire
from torchwatch.cli.injecting import Injected, job_report
from torchwatch.faces import report
from torchwatch.hook.summary import load_trace, summarize_trace
from torchwatch.model.findings import Finding, Fix, NotApplicable, Verdict
from torchwatch.model.hang import DumpedThread, HangProcess, HangView, ProcessDump
from torchwatch.model.observation import (
    BurstView,
    DeviceMemory,
    FeatureSpec,
    Observation,
    RankReading,
    RankView,
    SamplingChange,
    SamplingView,
    SelfUsage,
    StepsView,
    Straggler,
    TargetView,
    VerdictChange,
)
from torchwatch.model.peaks import FlopRate, Peak
from torchwatch.model.readings import Frame, SourceStatus, Status
from torchwatch.model.report import (
    OMIT_NONE,
    FlopsReport,
    HookReport,
    InjectionReport,
    Report,
    ReportError,
    decode_section,
    json_rounded,
    schema_version,
    to_json_value,
)
from torchwatch.watch.job import Job, Member
from torchwatch.wire import AmpInfo, BurstResult, CompileEvent, CompileInfo, GpuSettings, LoaderInfo, Refusal

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TODAY = FIXTURES / "reports" / "today.json"
RECORDED = sorted((FIXTURES / "gpu_recorded").glob("report_h200_*.json.gz"))
CONTRACT_ORDER = [
    "schema", "torchwatch_version", "created", "host", "target", "ended_by", "window", "verdict", "findings",
    "not_applicable", "sources", "features", "feature_units", "watched_seconds", "verdict_history", "self", "hook",
    "injection", "ranks", "straggler", "hang", "sampling", "trials",
]  # fmt: skip


def today() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(TODAY.read_text())
    return data


# -- a report a real watch saved, before the report had a type --------------------------------------
def test_a_saved_report_writes_back_byte_for_byte_and_prints_what_the_watch_printed() -> None:
    """tests/fixtures/reports/today.json and today.txt: ``torchwatch run --headless --duration 8
    --json today.json -- python demo/dataloader_bound.py --seconds 10`` (its stdout is today.txt)."""
    saved = Report.from_json(today())
    assert report.dumps(saved) + "\n" == TODAY.read_text()
    assert report.render_text(saved) + "\n" == (TODAY.parent / "today.txt").read_text()
    assert Report.from_json(saved.to_json()) == saved
    assert list(saved.to_json()) == CONTRACT_ORDER
    hook = saved.hook
    assert hook is not None and hook.dataloader is not None and hook.dataloader.num_workers == 0
    assert saved.verdict.label == "dataloader-bound" and saved.sources["nvml"].status is Status.UNAVAILABLE


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_the_reports_recorded_on_the_h200_load(path: Path) -> None:
    """Written by an older torchwatch: no ``trials``, no ``hook.compile`` or ``hook.flops``, and a
    key of the recorder's own (``recorded_on``)."""
    data = json.loads(gzip.decompress(path.read_bytes()))
    assert "trials" not in data and "recorded_on" in data
    saved = Report.from_json(data)
    assert saved.trials == () and saved.hook is not None and saved.hook.compile is None and saved.hook.flops is None
    assert saved.hook.gpu_settings is not None and saved.hook.last_burst is not None
    back = saved.to_json()
    assert {k: v for k, v in back.items() if k != "hook"} == {
        **{k: v for k, v in data.items() if k not in ("hook", "recorded_on")},
        "trials": [],
    }
    assert back["hook"] == {**data["hook"], "compile": None, "flops": None}


def test_a_report_without_the_keys_added_since_the_contract_loads_with_their_defaults() -> None:
    data = today()
    for key in ("ended_by", "not_applicable", "feature_units", "watched_seconds", "verdict_history", "self", "hook",
                "injection", "trials"):  # fmt: skip
        del data[key]
    saved = Report.from_json(data)
    assert (saved.hook, saved.own_usage, saved.watched_seconds, saved.trials, saved.feature_units) == (
        None, None, None, (), {},
    )  # fmt: skip
    assert "watched ? s" in report.render_text(saved)


# -- versions and foreign files --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("schema", "version"),
    [
        ("torchwatch.report/1", (1, 0)),
        ("torchwatch.report/1.12", (1, 12)),
        ("torchwatch.report/2", (2, 0)),
        ("torchwatch.report/", None),
        ("torchwatch.hook/2", None),
        (1, None),
    ],
)
def test_schema_versions(schema: object, version: tuple[int, int] | None) -> None:
    assert schema_version(schema) == version
    assert schema_version(report.SCHEMA) == (1, 0)


def test_a_newer_minor_version_is_read_and_what_it_added_skipped() -> None:
    data = today()
    data["schema"] = "torchwatch.report/1.3"
    data["energy"] = {"joules": None}
    data["verdict"]["why"] = "a newer key"
    saved = Report.from_json(data)
    assert saved.schema == "torchwatch.report/1.3" and saved.verdict == Report.from_json(today()).verdict


def test_another_major_version_is_refused_naming_both() -> None:
    data = today()
    data["schema"] = "torchwatch.report/2"
    with pytest.raises(ReportError) as err:
        Report.from_json(data)
    assert (
        str(err.value)
        == "a torchwatch.report/2 report, and this torchwatch reads torchwatch.report/1 (another major version)"
    )
    assert err.value.other_major and err.value.schema == "torchwatch.report/2"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, 2], "not a torchwatch report (a list, expected an object with schema 'torchwatch.report/1')"),
        ({"schema": "prometheus"}, "not a torchwatch report (schema 'prometheus', expected 'torchwatch.report/1')"),
        ({}, "not a torchwatch report (schema None, expected 'torchwatch.report/1')"),
        ({"schema": "x\x1b[2J"}, "not a torchwatch report (schema 'x\\\\x1b[2J'"),
    ],
)
def test_what_is_not_a_report_says_so(value: object, message: str) -> None:
    with pytest.raises(ReportError) as err:
        Report.from_json(value)
    assert str(err.value).startswith(message) and not err.value.other_major


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        (("verdict",), 3, "'verdict' is a number, expected an object"),
        (("verdict", "label"), None, "'verdict.label' is null, expected a string"),
        (("target", "cmdline"), 5, "'target.cmdline' is a number, expected a list of strings"),
        (("target", "cmdline", 1), 5, "'target.cmdline[1]' is a number, expected a string"),
        (("target", "exit_code"), True, "'target.exit_code' is a boolean, expected an integer"),
        (("feature_units",), ["s"], "'feature_units' is a list, expected an object of strings"),
        (("features", "data_wait_share"), "high", "'features.data_wait_share' is a string, expected a number"),
        (("window", "seconds"), math.inf, "'window.seconds' is inf, expected a finite number"),
        (("hook", "amp", "dtype"), 16, "'hook.amp.dtype' is a number, expected a string"),
        (("hook", "step_time_ms"), "fast", "'hook.step_time_ms' is a string, expected an object"),
        (("hook", "burst", "count"), "1", "'hook.burst.count' is a string, expected an integer"),
        (("sampling", "changes"), {}, "'sampling.changes' is an object, expected a list"),
        (("sources", "psutil", "status"), "fine", "'sources.psutil.status' is 'fine', expected one of ok, unavailable"),
        (("hook", "last_burst"), {"error": "x"}, "hook.last_burst.id: missing"),
        (("trials",), [{"id": 1}], "trials[0].setting: missing"),
    ],
)
def test_a_wrong_type_is_one_line_naming_the_key_and_the_version(
    path: tuple[Any, ...], value: Any, problem: str
) -> None:
    data = today()
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ReportError) as err:
        Report.from_json(data)
    assert str(err.value).startswith(f"a malformed torchwatch.report/1 report: {problem}")
    assert "\n" not in str(err.value) and not err.value.other_major


@pytest.mark.parametrize("key", ["target", "window", "verdict", "findings", "sources", "features", "ranks", "sampling",
                                 "straggler", "hang", "created", "host", "torchwatch_version"])  # fmt: skip
def test_the_keys_the_json_schema_requires_are_required(key: str) -> None:
    data = today()
    del data[key]
    with pytest.raises(ReportError, match=f"'{key}' is missing, expected"):
        Report.from_json(data)


def test_the_hook_without_a_reading_is_its_status_alone() -> None:
    data = today()
    data["hook"] = {"status": "unavailable", "reason": "no hook file"}
    saved = Report.from_json(data)
    assert saved.hook == HookReport(status="unavailable", reason="no hook file") and not saved.hook.measured
    assert saved.to_json()["hook"] == {"status": "unavailable", "reason": "no hook file"}
    assert "hook: unavailable: no hook file" in report.render_text(saved)


# -- a report the builder makes from a full Observation ----------------------------------------------------
def _loader() -> LoaderInfo:
    return LoaderInfo(
        num_workers=2, batch_size=32, pin_memory=True, prefetch_factor=2, persistent_workers=True,
        multiprocessing_context="fork", dataset="Images", collate_fn="default_collate", batches=40,
        wait_s=1.23456789, batch_bytes=1 << 20,
    )  # fmt: skip


def _rank(rank: int, pid: int, wait_ms: float) -> RankReading:
    return RankReading(
        rank, pid, 2, 20, 101.23456, wait_ms, 40.0, 10.0, 97.5, 0.0123456, "dataloader-bound", "waits", None
    )


def _trial() -> wire.TrialState:
    blocks = tuple(wire.TrialBlock(wire.is_on(i), 10 * i, 10, 2, m, m) for i, m in enumerate((1.0, 1.6, 1.62, 1.0)))
    return wire.TrialState(3, "num_workers", "4", "done", old="2", reason="decided", blocks=blocks,
                         estimate=wire.estimate(blocks), restored=True, now_value="2", started=1.0,
                         ended=9.0)  # fmt: skip


def _hang() -> HangView:
    frame = Frame("wait", "/usr/lib/python3.11/threading.py", 320)
    dump = ProcessDump(102, "worker", None, 101, (DumpedThread(102, "MainThread", False, (frame,)),), None, 0.0123456)
    rows = (
        HangProcess(101, "rank", 1, None, "dataloader", "next (dl.py:7)", "train (train.py:9)"),
        HangProcess(102, "worker", None, 101, "idle", "wait (threading.py:320)"),
    )
    return HangView(
        state="stall", pid=101, rank=1, threshold_s=30.0, threshold_from="max(30 s, 20 x p95 step)",
        last_step_s=12.0, fired_s=42.0, detected_after_s=30.0, stalled_s=33.3333333, resumed_s=45.3333333,
        processes=rows, odd_one_out=rows[1], summary="rank 1 waits on its DataLoader", dump_s=0.0123456,
        dumps=(dump,), number=1,
    )  # fmt: skip


def full_observation() -> Observation:
    summary = summarize_trace(load_trace(FIXTURES / "gpu" / "trace_pageable_h2d.json.gz"))
    burst = BurstView(
        state="idle", mode="steps", count=1, last_refusal=Refusal(3.5, "another profiler is active", "signal"),
        last=BurstResult.decode({**summary, "id": 1}, "burst"),
    )  # fmt: skip
    event = CompileEvent("recompile", "shape", "shape of x changed 32→17 (dim 0)", file="/x/train.py", line=88,
                         code="out = model(x)", count=2, t=5.123456789)  # fmt: skip
    compiled = CompileInfo(frames=2, graphs=3, recompiles=1, compile_s=1.5, spans=((1.0, 2.5),), events=(event,), t=6.0)
    rate = FlopRate(6.6e12, 13.2345678, "hook p50", 5.0e14, Peak("H100 SXM", "bf16", 989.4e12, "data sheet"),
                    mfu=0.50512345, dtype="bfloat16", device="cuda", device_name="NVIDIA H100")  # fmt: skip
    loader = _loader()
    steps = StepsView(
        status="ok", pid=101, torch="2.13.0", steps=20, first_step_after_s=2.5, steps_per_s=3.333333333,
        p50_ms=300.123456, p95_ms=350.0, data_wait=0.25, data_wait_source="hook", loader=loader, loaders=(loader,),
        usable_cpus=2.0, shm_bytes=1 << 30, amp=AmpInfo(True, "bfloat16", "cuda", False), cuda_initialized=True,
        signal=12, signal_owned=True, errors=("burst: trace too large",),
    )  # fmt: skip
    memory = DeviceMemory(70 << 30, 74 << 30, 72 << 30, None, 0, 80 << 30, 2, 1, (1.5, 2.123456789), (3.0,))
    focus = RankView(
        1, 101, steps=steps, burst=burst, device_memory=memory, gpu_settings=GpuSettings("high", True),
        reading=_rank(1, 101, 60.0), verdict=Verdict("dataloader-bound", 0.9, "waits"), compile=compiled,
        flop_rate=rate,
    )  # fmt: skip
    fixes = (Fix("More workers", "num_workers=2 on 8 CPUs", "num_workers=4"), Fix("Cache samples", "decode once"))
    finding = Finding("loader-cpu-in-workers", "dataloader-bound", "critical", "The loop waits.", 0.6,
                      {"data_wait_share": 0.612345678, "gpu_util_mean": math.inf}, fixes, "FIELD.md")  # fmt: skip
    return Observation(
        t=100.0, elapsed_s=45.67, window_s=10.0, target=TargetView(100, ("torchrun", "train.py"), exit_code=None),
        verdict=Verdict("dataloader-bound", 0.876543, "Rank 1 waits on its DataLoader."), findings=(finding,),
        not_applicable=(NotApplicable("gpu-saturated", "gpu_util_mean", "NVML unavailable"),),
        features={"data_wait_share": 0.612345678, "gpu_util_mean": None, "worker_count": 2.0, "odd": math.nan},
        catalogue={"data_wait_share": FeatureSpec("data_wait_share", "share", "hook", "waits")},
        statuses=(("psutil", SourceStatus.ok()), ("nvml", SourceStatus.unavailable("no driver", "install it"))),
        ranks={0: RankView(0, 100, reading=_rank(0, 100, 1.0)), 1: focus}, focus_rank=1,
        straggler=Straggler(1, 101, 0, 0.25, "critical", "data", 59.0, "dataloader-bound", "waits", None),
        history=(VerdictChange(1.0, "undetermined"), VerdictChange(4.5, "dataloader-bound")),
        own_usage=SelfUsage(1.25, 0.5, 45.0, 3.9, 1 << 27),
        sampling=SamplingView("steady", "held", 12.0, 1, (SamplingChange(14.0, "steady", "held"),)),
        hang=_hang(), trials=(_trial(),),
    )  # fmt: skip


JOB_INJECTION = job_report(
    Job(10, 10, "torchrun", (Member(100, time.time(), 0, "env"), Member(101, time.time(), 1, "env"))),
    [
        Injected(100, True, True, "torchwatch: hook injected into PID 100", 12.54, "ptrace"),
        Injected(101, False, False, "torchwatch: watching PID 101 from outside only: permission denied"),
    ],
)


def test_a_full_report_survives_json_unchanged_and_prints_the_same() -> None:
    made = report.build(
        full_observation(), ended_by="duration", injection=InjectionReport.from_json(JOB_INJECTION),
        created=datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc),
    )  # fmt: skip
    data = json.loads(report.dumps(made))
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    assert list(data) == CONTRACT_ORDER
    back = Report.from_json(data)
    assert back == made
    assert report.dumps(back) == report.dumps(made) and report.render_text(back) == report.render_text(made)
    text = report.render_text(back)
    for line in ("stall: rank 1 (PID 101) made no step for 33 s", "straggler: rank 1 (PID 101), score 0.25",
                 "  rank 1: FLOPs 6.6 T/step", "  DataLoader: num_workers=2, batch_size=32", "    top CPU ops",
                 "  torch.compile: 2 frames, 1 recompile", "live trials (torchwatch trial):",
                 "  num_workers=4: 1.6", "try it live: torchwatch trial 100 num_workers=4",
                 "sampling: steady (held; 12 s steady, back to fast 1 time)"):  # fmt: skip
        assert line in text, line
    # numbers as written: 4 digits, nothing that is not finite
    assert data["features"]["data_wait_share"] == 0.6123 and data["features"]["odd"] is None
    assert data["findings"][0]["evidence"] == {"data_wait_share": 0.6123, "gpu_util_mean": None}
    assert data["hook"]["steps_per_s"] == 3.3333 and data["hook"]["dataloader"]["wait_s"] == 1.2346
    assert data["hook"]["compile"]["events"][0]["t"] == 5.1235 and data["hang"]["stalled_s"] == 33.3333
    assert data["ranks"][1]["step_ms"] == 101.235 and data["ranks"][1]["focus"] is True
    assert data["hang"]["dumps"] == [{"pid": 102, "role": "worker", "rank": None, "threads": 1, "error": None,
                                      "dump_s": 0.0123}]  # fmt: skip
    assert data["trials"][0]["verdict"]["result"] == "faster"
    assert data["injection"] == JOB_INJECTION and data["injection"]["job"]["launcher"] == "torchrun"


def test_a_report_compares_with_itself() -> None:
    from torchwatch.faces.compare import compare, settings

    made = report.build(full_observation())
    c = compare(made, made)
    assert c.speedup == pytest.approx(1.0) and c.differ == ()
    assert settings(made)["matmul_allow_tf32"] == "True" and settings(made)["AMP"].startswith("autocast")
    assert len(c.trials[0]) == 1 and "faster" in c.trials[0][0]


def test_the_injection_of_one_process_has_no_job_keys() -> None:
    one = Injected(100, True, True, "torchwatch: hook injected into PID 100", 8.04, "remote_exec").report()
    decoded = InjectionReport.from_json(one)
    assert decoded.ranks is None and decoded.job is None and to_json_value(decoded) == one
    assert to_json_value(InjectionReport.from_json(JOB_INJECTION)) == JOB_INJECTION
    with pytest.raises(ReportError, match=r"'injection\.hooked' is missing"):
        InjectionReport.from_json({"injected": True})


def test_the_flops_of_the_report_are_the_rates_json_and_its_line() -> None:
    rate = FlopRate(1e9, 2.5, "burst", 4e11, Peak("cpu", "fp32", 2e11, "x"), measured_peak=True, mfu=0.5)
    assert to_json_value(FlopsReport.of(rate, "the line")) == {**rate.to_json(), "text": "the line"}
    no_peak = FlopRate(1e9, 2.5, "burst", 4e11, why="no peak known")
    assert to_json_value(FlopsReport.of(no_peak, None)) == {**no_peak.to_json(), "text": None}


def test_json_rounded_reaches_every_float_and_keeps_the_rest() -> None:
    st = Straggler(1, 101, 0, 0.123456789, "warning", "data", math.nan, "cpu-bound", "s", None)
    assert json_rounded(st) == replace(st, score=0.1235, extra_ms=None)  # type: ignore[arg-type]
    assert json_rounded({"a": (1, 2.000049, True), "b": [math.inf]}) == {"a": (1, 2.0, True), "b": [None]}
    assert json_rounded(SourceStatus(Status.OK)) == SourceStatus(Status.OK)


# -- a section added later ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class OomRecord:
    t: float
    requested_bytes: int | None
    where: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryReport:
    forecast_s: float | None = None
    oom: OomRecord | None = None
    devices: tuple[int, ...] = ()
    note: str | None = field(default=None, metadata=OMIT_NONE)


def test_a_section_added_later_is_read_and_written_from_its_annotations_alone() -> None:
    """What the module docstring promises whoever adds the memory section: a dataclass, no codec."""
    value = {"forecast_s": 12, "oom": {"t": 3.5, "requested_bytes": None}, "devices": [0, 1]}
    section = decode_section(MemoryReport, copy.deepcopy(value), "memory")
    assert section == MemoryReport(forecast_s=12, oom=OomRecord(t=3.5, requested_bytes=None), devices=(0, 1))
    assert to_json_value(section) == {**value, "oom": {"t": 3.5, "requested_bytes": None, "where": None}}
    assert decode_section(MemoryReport, {}, "memory") == MemoryReport()
    with pytest.raises(ReportError, match=r"'memory.oom.t' is missing, expected a number"):
        decode_section(MemoryReport, {"oom": {"requested_bytes": 1}}, "memory")
    with pytest.raises(ReportError, match=r"'memory.devices\[1\]' is a string, expected an integer"):
        decode_section(MemoryReport, {"devices": [0, "1"]}, "memory")

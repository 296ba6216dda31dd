"""The report (JSON contract validated against report_schema.json, and text), the status line and the
burst lines: faces of an Observation built by the real builder."""

from __future__ import annotations

import copy
import json
import math
import socket
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from tests.unit.reports import SCHEMA, analysed, features, observation
from torchwatch import __version__
from torchwatch.analysis.diagnosis import Analysis
from torchwatch.analysis.features import CATALOGUE
from torchwatch.faces import report
from torchwatch.faces.burst import burst_lines
from torchwatch.faces.headless import status_line
from torchwatch.hook.summary import load_trace, summarize_trace
from torchwatch.model.observation import SamplingChange, SamplingView
from torchwatch.model.report import InjectionReport, Report
from torchwatch.model.units import fmt_value
from torchwatch.wire import BurstResult

GPU_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"

VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def build(analysis: Analysis, exit_code: int | None = None) -> dict[str, Any]:
    """The report's JSON object, as written."""
    return report.build(observation(analysis, exit_code), watched_s=31.26).to_json()


@pytest.fixture
def busy() -> dict[str, Any]:
    f = features(
        storage_wait_share=0.5,
        fetch_cpu_share=0.3,
        worker_count=0.0,
        usable_cpus=2.0,
        read_bytes_per_s=2.5e6,
        gpu_mem_ratio=0.95,
        main_running_share=math.inf,
    )
    return build(analysed(f), exit_code=3)


def test_schema_is_valid() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_report_validates(busy: dict[str, Any]) -> None:
    VALIDATOR.validate(busy)
    assert busy["schema"] == "torchwatch.report/1"
    assert busy["verdict"]["label"] == "io-bound"
    assert {f["rule"] for f in busy["findings"]} >= {
        "storage-wait",
        "loader-cpu-in-main-thread",
        "gpu-memory-pressure",
    }
    assert busy["target"] == {"pid": 4242, "cmdline": ["python", "train.py"], "exit_code": 3}
    assert busy["sources"]["nvml"] == {
        "status": "unavailable",
        "reason": "NVML library not found (no NVIDIA driver)",
        "hint": "ignore on a CPU-only machine",
    }
    assert busy["sources"]["psutil"] == {"status": "ok"}
    assert set(busy["features"]) == set(CATALOGUE)
    assert busy["features"]["storage_wait_share"] == 0.5
    assert busy["features"]["main_running_share"] is None  # inf is not JSON: null
    assert busy["features"]["gpu_util_mean"] is None


def test_report_is_strict_json(busy: dict[str, Any]) -> None:
    text = report.dumps(Report.from_json(busy))
    assert json.loads(text) == busy
    json.dumps(busy, allow_nan=False)  # no NaN / Infinity anywhere


def test_not_applicable_listed(busy: dict[str, Any]) -> None:
    na = {n["rule"]: n for n in busy["not_applicable"]}
    assert na["gpu-saturated"] == {
        "rule": "gpu-saturated",
        "missing": "gpu_util_mean",
        "why": "source unavailable",
    }


def test_undetermined_report_validates() -> None:
    data = build(Analysis(t=0.0, features={name: None for name in CATALOGUE}))
    VALIDATOR.validate(data)
    assert data["verdict"]["label"] == "undetermined" and data["findings"] == []


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        (("schema",), "torchwatch.report/2"),
        (("verdict", "label"), "slow"),
        (("verdict", "confidence"), 1.5),
        (("target", "pid"), "4242"),
        (("sources", "nvml", "status"), "broken"),
        (("features", "storage_wait_share"), "high"),
        (("findings", 0, "severity"), "fatal"),
        (("findings", 0, "fixes", 0, "title"), 3),
        (("created",), "23/11/2026 17:55"),
        (("torchwatch_version",), ""),
        (("sampling", "mode"), "slow"),
        (("sampling", "returns_to_fast"), -1),
    ],
)
def test_schema_rejects_contract_breaches(busy: dict[str, Any], path: tuple[Any, ...], bad: Any) -> None:
    data = copy.deepcopy(busy)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    with pytest.raises(jsonschema.ValidationError):
        VALIDATOR.validate(data)


@pytest.mark.parametrize(
    "key",
    [
        "schema",
        "target",
        "window",
        "verdict",
        "findings",
        "sources",
        "features",
        "torchwatch_version",
        "created",
        "host",
        "sampling",
    ],
)
def test_schema_requires_contract_keys(busy: dict[str, Any], key: str) -> None:
    data = copy.deepcopy(busy)
    del data[key]
    with pytest.raises(jsonschema.ValidationError):
        VALIDATOR.validate(data)


def test_report_says_version_time_and_host() -> None:
    when = datetime(2026, 11, 23, 18, 30, 5, tzinfo=timezone(timedelta(hours=2)))
    data = report.build(observation(None), created=when)
    assert data.torchwatch_version == __version__
    assert data.created == "2026-11-23T16:30:05Z"  # UTC, whatever the zone it was given in
    assert data.host == socket.gethostname()
    now = datetime.strptime(report.build(observation(None)).created, "%Y-%m-%dT%H:%M:%SZ")
    assert abs((now - datetime.now(timezone.utc).replace(tzinfo=None)).total_seconds()) < 60


def test_render_text(busy: dict[str, Any]) -> None:
    text = report.render_text(Report.from_json(busy))
    assert "verdict: io-bound" in text
    assert "exit 3" in text and "python train.py" in text
    titles = [fx["title"] for f in busy["findings"] for fx in f["fixes"]]
    assert titles
    for title in titles:
        assert title in text
    assert "nvml unavailable: NVML library not found" in text
    assert "read_bytes_per_s=2.4 MiB/s" in text  # 2.5e6 bytes/s
    assert "storage_wait_share=50%" in text


def test_status_line() -> None:
    assert status_line(None, 3.0) == "torchwatch [   3s] starting"
    assert status_line(observation(None), 3.0) == "torchwatch [   3s] starting"
    line = status_line(observation(analysed(features(storage_wait_share=0.5, worker_count=2.0))), 12.0)
    assert "\n" not in line
    assert "io-bound" in line and "disk wait 50%" in line and "workers 2" in line
    assert "GPU n/a" in line
    gpu_line = status_line(observation(analysed(features(gpu_util_mean=100.0, gpu_sm_active_mean=0.12))), 12.0)
    assert "GPU 100% (SM 12%)" in gpu_line


def test_sampling_in_the_report_the_text_and_the_status_line() -> None:
    steady = SamplingView(
        mode="steady",
        reason="the verdict held for 10 evaluations in a row",
        steady_s=42.4,
        returns_to_fast=1,
        changes=(
            SamplingChange(14.0, "steady", "the verdict held for 10 evaluations in a row"),
            SamplingChange(30.0, "fast", "a key was pressed in the TUI"),
            SamplingChange(40.0, "steady", "the verdict held for 10 evaluations in a row"),
        ),
    )
    obs = replace(observation(analysed(features(storage_wait_share=0.5))), sampling=steady)
    made = report.build(obs, watched_s=60.0)
    data: dict[str, Any] = made.to_json()
    VALIDATOR.validate(data)
    assert data["sampling"]["mode"] == "steady"
    assert data["sampling"]["steady_s"] == 42.4 and data["sampling"]["returns_to_fast"] == 1
    assert [c["mode"] for c in data["sampling"]["changes"]] == ["steady", "fast", "steady"]
    assert "sampling: steady (the verdict held for 10 evaluations in a row; 42 s steady, back to fast 1 time)" in (
        report.render_text(made)
    )
    assert status_line(obs, 60.0).endswith(" | sampling: steady")
    fast = report.build(observation(analysed(features(storage_wait_share=0.5))), watched_s=3.0)
    assert fast.sampling.mode == "fast"
    assert status_line(observation(analysed(features())), 3.0).endswith(" | sampling: fast")


def test_burst_lines_give_the_idle_split_and_pageable_copies() -> None:
    summary = summarize_trace(load_trace(GPU_FIXTURES / "trace_pageable_h2d.json.gz"))
    lines = "\n".join(burst_lines(BurstResult.decode({**summary, "id": 2}, "summary")))
    split = summary["gpu_idle_split_share"]
    assert (
        f"GPU idle {summary['gpu_idle_share']:.0%} of the step: waiting for the host {split['host_wait']:.0%}" in lines
    )
    assert "pageable host-to-device copies: 2 per step, 48.0 MiB per step (pin_memory=True avoids them)" in lines
    cpu_only = {**summary, "gpu_idle_share": None, "pageable_h2d": None, "id": 3}
    cpu = "\n".join(burst_lines(BurstResult.decode(cpu_only, "summary")))
    assert "GPU idle" not in cpu and "pageable" not in cpu


@pytest.mark.parametrize(
    ("name", "value", "text"),
    [
        ("disk_read_request_bytes", 4096.0, "4.0 KiB"),
        ("disk_read_bytes_per_s", 1.2e9, "1.1 GiB/s"),
        ("disk_read_await_ms", 0.0653, "0.0653 ms"),
        ("step_time_p50_ms", 412.4, "412 ms"),
        ("disk_read_queue", 1.70033, "1.7"),
        ("burst_cpu_ops_per_step", 9123.0, "9123"),
        ("storage_wait_share", 0.38, "38%"),
        ("gpu_util_mean", None, "n/a"),
    ],
)
def test_format_value_by_unit(name: str, value: float | None, text: str) -> None:
    assert fmt_value(value, CATALOGUE[name].unit) == text


def test_the_injection_attach_made_is_reported(busy: dict[str, Any]) -> None:
    assert busy["injection"] is None  # run, or attach --no-inject
    done = {"injected": True, "hooked": True, "method": "ptrace", "pause_ms": 14.2, "reason": "hook injected"}
    made = report.build(
        observation(analysed(features(storage_wait_share=0.5))), injection=InjectionReport.from_json(done)
    )
    data = made.to_json()
    assert data["injection"] == done
    jsonschema.validate(data, SCHEMA)


def test_no_color_text_report_and_status_line_carry_no_escape_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    """no-color.org holds for every text torchwatch prints outside the TUI (the TUI's own test is in
    test_tui_app): the headless status line and the text report are plain, NO_COLOR or not."""
    from torchwatch.faces.headless import status_line

    monkeypatch.setenv("NO_COLOR", "1")
    obs = observation(analysed(features(data_wait_share=0.9, data_wait_queue_share=0.9, gpu_util_mean=40.0)))
    for text in (report.render_text(report.build(obs, watched_s=31.26)), status_line(obs, 12.0)):
        assert text and "\x1b" not in text and "\x9b" not in text

"""The Prometheus rules shipped in deploy/prometheus/: promtool checks them and runs their unit tests
(deploy/prometheus/tests/*.test.yml), and every rule has a case where it fires and one where it stays
silent. promtool comes with Debian's ``prometheus`` package; without it these tests are skipped."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from tests.unit.prom import samples, two_ranks
from torchwatch.faces.prometheus import PREFIX, RANK_LABELS, TARGET_LABELS
from torchwatch.model.hang import HangProcess, HangView

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = DEPLOY / "torchwatch.rules.yml"
TESTS = sorted((DEPLOY / "tests").glob("*.test.yml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)"
)


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=DEPLOY)


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout


@needs_promtool
@pytest.mark.parametrize("case", TESTS, ids=[t.name for t in TESTS])
def test_promtool_unit_tests_pass(case: Path) -> None:
    done = _promtool("test", "rules", str(case))
    assert done.returncode == 0, done.stdout + done.stderr


def _cases() -> tuple[dict[str, list[bool]], dict[str, list[bool]]]:
    """``({alert: [fires?...]}, {record: [has samples?...]})`` over every test case."""
    alerts: dict[str, list[bool]] = {}
    records: dict[str, list[bool]] = {}
    for path in TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                alerts.setdefault(case["alertname"], []).append(bool(case.get("exp_alerts")))
            for case in test.get("promql_expr_test", []):
                name = case["expr"].split("{", 1)[0].strip()
                records.setdefault(name, []).append(bool(case.get("exp_samples")))
    return alerts, records


def test_every_rule_has_a_firing_and_a_silent_case() -> None:
    alerts, records = _cases()
    missing = []
    for rule in _rules():
        name = rule.get("alert") or rule["record"]
        seen = (alerts if "alert" in rule else records).get(name, [])
        if True not in seen:
            missing.append(f"{name}: no case where it fires")
        if False not in seen:
            missing.append(f"{name}: no case where it stays silent")
    assert not missing, missing


def test_the_rules_read_series_the_exporter_writes_with_its_labels() -> None:
    """A metric renamed in the exporter would leave a rule reading nothing: every ``torchwatch_*``
    name in the rules is in a scrape of a hung 2-rank job, with the per-rank labels."""
    rows = (HangProcess(201, "rank", 0, None, "backward"), HangProcess(202, "rank", 1, None, "elsewhere"))
    hang = HangView("hang", 202, 1, 5.0, "--hang-after", 40.0, 45.9, 5.9, 7.5, processes=rows)
    got = samples([dataclasses.replace(two_ranks(), hang=hang)])
    exported = {name.removesuffix("_total") for name, _ in got}
    used = set(re.findall(rf"\b{PREFIX}_[a-z0-9_]+\b", RULES.read_text())) - {
        "torchwatch_rank_verdict",
        "torchwatch_verdict",
    }
    assert used, "no torchwatch series in the rules?"
    assert {u.removesuffix("_total") for u in used} <= exported, used
    for name in used:
        labels = {k for n, ls in got if n == name for k, _ in ls}
        assert set(RANK_LABELS) <= labels, (name, labels)
    assert "pid" not in RANK_LABELS and "training_job" in TARGET_LABELS


H100 = Path(__file__).resolve().parents[1] / "fixtures" / "prometheus" / "h100_gpu_bound.prom"


@needs_promtool
def test_the_rules_on_a_recorded_1_gpu_training(tmp_path: Path) -> None:
    """A scrape of ``torchwatch serve`` on an H100 running demo/gpu_bound.py (bench/gpu_serve.py),
    held for 5 minutes (its step counter going on at its own steps/s): the rules record its pace
    and no alert fires on this healthy one-GPU training; its device series carry the
    OpenTelemetry names and labels."""
    from prometheus_client.parser import text_string_to_metric_families

    text = H100.read_text()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    rate = next(s.value for s in samples if s.name == "torchwatch_steps_per_second")
    series = []
    for s in samples:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted({**s.labels, "instance": "vm:9400"}.items()))
        values = f"{s.value:g}+{rate * 15:g}x20" if s.name.endswith("_total") else f"{s.value:g}x20"
        series.append({"series": f"{s.name}{{{labels}}}", "values": values})
    alerts = [r["alert"] for r in _rules() if "alert" in r]
    case = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": series,
                "alert_rule_test": [{"eval_time": "5m", "alertname": a, "exp_alerts": []} for a in alerts],
                "promql_expr_test": [
                    {
                        "expr": "round(torchwatch:job_steps_per_second:rate2m)",
                        "eval_time": "5m",
                        "exp_samples": [{"labels": '{training_job="pid:2"}', "value": round(rate)}],
                    },
                    {"expr": "torchwatch:job_hang_culprit:state", "eval_time": "5m", "exp_samples": []},
                ],
            }
        ],
    }
    path = tmp_path / "h100.test.yml"
    path.write_text(yaml.safe_dump(case))
    done = _promtool("test", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    hw = {(s.name, s.labels.get("hw_type"), s.labels.get("hw_id", "")[:4]) for s in samples if s.name.startswith("hw_")}
    assert hw == {
        (name, "gpu", "GPU-")
        for name in (
            "hw_gpu_utilization_ratio",
            "hw_gpu_memory_usage_bytes",
            "hw_gpu_memory_limit_bytes",
            "hw_gpu_memory_utilization_ratio",
            "hw_power_watts",
        )
    }

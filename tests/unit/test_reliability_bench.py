"""bench/reliability.py: the confidence buckets, the scoring of a run and the calibration error
(the benchmark's own unit tests, on made-up runs)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("reliability", REPO / "bench" / "reliability.py")
assert _spec is not None and _spec.loader is not None
rel = importlib.util.module_from_spec(_spec)
sys.modules["reliability"] = rel  # its dataclasses look their module up
_spec.loader.exec_module(rel)


@pytest.mark.parametrize(
    ("confidence", "bucket"),
    [(0.0, 0), (0.49, 0), (0.5, 1), (0.69, 1), (0.7, 2), (0.89, 2), (0.9, 3), (1.0, 3), (1.2, 3)],
)
def test_a_confidence_falls_in_its_bucket(confidence: float, bucket: int) -> None:
    assert rel.bucket_of(confidence) == bucket


def test_scenario_runs_are_right_only_with_their_label_and_straggler() -> None:
    data = {
        "expected": {"a": "dataloader-bound", "distributed/b@torchrun": "cpu-bound"},
        "runs": {
            "a": [{"label": "dataloader-bound", "confidence": 0.95}, {"label": "cpu-bound", "confidence": 0.92}],
            "distributed/b@torchrun": [{"label": "cpu-bound", "confidence": 0.8, "straggler_ok": False}],
        },
    }
    runs = rel.scenario_runs(data)
    assert [r.right for r in runs] == [True, False, False]
    rows = rel.table(runs)
    assert [(row.runs, row.right) for row in rows] == [(0, 0), (0, 0), (1, 0), (2, 1)]
    text = rel.render(runs, markdown=False)
    assert "wrong at >= 0.9: 1" in text and "a [quiet]: cpu-bound 0.92, expected dataloader-bound" in text


@pytest.mark.parametrize(
    ("condition", "label", "findings", "right"),
    [
        ("hog", "dataloader-bound", ["loader-cpu"], True),
        ("hog", "cpu-bound", ["cpu-contention", "loader-cpu"], True),
        ("quota", "cpu-bound", ["cpu-quota-throttled"], True),
        ("hog", "cpu-bound", ["loop-cpu", "cpu-contention"], False),  # the loop blamed, not the neighbour
        ("quiet", "cpu-bound", ["cpu-contention"], False),  # nothing beside it: the label must be its own
        ("hog", "io-bound", ["cpu-contention"], False),
    ],
)
def test_a_noisy_cell_is_right_with_its_own_label_or_the_conditions_finding_first(
    condition: str, label: str, findings: list[str], right: bool
) -> None:
    assert rel.noisy_right("dataloader-bound", condition, label, findings) is right


def test_the_calibration_error_is_zero_when_each_bucket_is_right_as_often_as_it_says() -> None:
    runs = [rel.Run("scenarios", f"s{i}", "quiet", "cpu-bound", 0.6, "cpu-bound", i < 6) for i in range(10)]
    assert rel.calibration_error(runs) == pytest.approx(0.0)
    overconfident = [rel.Run("scenarios", f"s{i}", "quiet", "x", 0.95, "y", i < 5) for i in range(10)]
    assert rel.calibration_error(overconfident) == pytest.approx(0.45)


def test_the_command_reads_both_benches_files_and_refuses_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = tmp_path / "s.json"
    s.write_text(
        json.dumps({"expected": {"x": "io-bound"}, "runs": {"x": [{"label": "io-bound", "confidence": 0.91}]}})
    )
    n = tmp_path / "n.json"
    n.write_text(json.dumps({"x": {"hog": {"label": "cpu-bound", "confidence": 0.55, "findings": ["loop-cpu"]}}}))
    assert rel.main(["--scenarios", str(s), "--noisy", str(n), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| 0.9–1.0 (incl. 1.0) | 1 | 1 | 100 % | 0.91 |" in out
    assert "| 0.5–0.7 | 1 | 0 | 0 % | 0.55 |" in out
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert rel.main(["--scenarios", str(bad)]) == 2
    assert "reliability.py: error" in capsys.readouterr().out


def test_a_quiet_run_that_was_not_alone_is_scored_as_busy_unless_strict() -> None:
    data = {
        "expected": {"a": "io-bound"},
        "runs": {"a": [{"label": "cpu-bound", "confidence": 0.95, "findings": ["cpu-contention", "storage-latency"]}]},
    }
    (run,) = rel.scenario_runs(data)
    assert (run.condition, run.right) == ("busy", True)
    (strict,) = rel.scenario_runs(data, strict=True)
    assert (strict.condition, strict.right) == ("quiet", False)
    assert "scored as busy: 1" in rel.render([run], markdown=False)

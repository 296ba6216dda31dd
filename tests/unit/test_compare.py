"""``torchwatch compare``: speedup, verdicts, settings, features that moved (on reports the real
builder makes, edited as a change would, then decoded as a saved file is), Markdown, a report
saved by a real watch, and one-line refusals of anything else (exit 2): not JSON, not a report,
another major version, a key of the wrong type."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.unit.reports import _report
from torchwatch.cli import main
from torchwatch.faces import report
from torchwatch.faces.compare import Comparison, load_report, render_markdown, render_text
from torchwatch.faces.compare import compare as compare_reports
from torchwatch.model.report import Report

TODAY = Path(__file__).resolve().parents[1] / "fixtures" / "reports" / "today.json"


def compare(a: dict[str, Any], b: dict[str, Any]) -> Comparison:
    """:func:`compare_reports` of two reports' JSON objects, decoded as :func:`load_report` does."""
    return compare_reports(Report.from_json(a), Report.from_json(b))


@pytest.fixture
def pair() -> tuple[dict[str, Any], dict[str, Any]]:
    before = _report(2.0, 0, 0.9)
    after = _report(5.0, 1, 0.1)
    after["target"]["cmdline"] = ["python", "train.py", "--workers", "1"]
    return before, after


def test_speedup_verdicts_and_the_settings_that_differ(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    c = compare(*pair)
    assert c.speedup == pytest.approx(2.5) and c.change_pct == pytest.approx(150)
    differ = {k: (a, b) for k, a, b in c.differ}
    assert differ["num_workers"] == ("0", "1") and differ["persistent_workers"] == ("False", "True")
    assert differ["command"] == ("python train.py", "python train.py --workers 1")
    assert ("batch_size", "64") in c.same and "num_workers" not in dict(c.same)
    text = render_text(c)
    assert "5.00 steps/s: 2.50x faster (+150%)" in text
    assert "num_workers: 0 -> 1" in text
    assert f"verdict A: {pair[0]['verdict']['label']}" in text


def test_features_that_moved_most_by_points_and_relative_change(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    a, b = pair
    b["features"]["rss_bytes"] = 1.5e9  # +50 %: moved; main_cpu_pct the same: not listed
    moves = {m.name: m for m in compare(a, b).moves}
    assert moves["data_wait_share"].score == pytest.approx(0.8)
    assert next(iter(moves)) == "data_wait_share"  # the largest move first
    assert moves["rss_bytes"].score == pytest.approx(0.5 / 1.5)
    assert "main_cpu_pct" not in moves and "hook_steps_per_s" not in moves  # throughput has its own line
    assert not [n for n in moves if n.startswith("dl_") or n.endswith("_samples")]
    a["features"]["read_bytes_per_s"], b["features"]["read_bytes_per_s"] = 10e3, 0.0  # KiB/s: noise, not a move
    assert "read_bytes_per_s" not in {m.name for m in compare(a, b).moves}
    line = next(x for x in render_text(compare(a, b)).splitlines() if "data_wait_share" in x)
    assert line.split() == ["data_wait_share", "90%", "->", "10%", "(-80", "pts)"]


def test_same_settings_are_named_too() -> None:
    c = compare(_report(2.0, 0, 0.9), _report(3.0, 0, 0.5))
    assert c.differ == ()
    text = render_text(c)
    assert "settings that differ: none" in text and "num_workers=0" in text


def test_without_steps_no_speedup_is_claimed(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    a, b = copy.deepcopy(pair)
    a["hook"] = None
    del a["features"]["hook_steps_per_s"]
    c = compare(a, b)
    assert c.speedup is None and "not measured in both" in render_text(c)


def test_markdown_for_a_pull_request(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    md = render_markdown(compare(*pair))
    assert "| steps/s | 2.00 steps/s | 5.00 steps/s | **2.50×** (+150%) |" in md
    assert "| num_workers | `0` | `1` |" in md
    assert md.count("\n|---|") >= 2  # the tables have their header rows


def _write(tmp_path: Path, name: str, data: Any) -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def test_cli_compare_prints_and_exits_0(
    pair: tuple[dict[str, Any], dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = (_write(tmp_path, n, r) for n, r in zip(("a.json", "b.json"), pair, strict=True))
    assert main(["compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "2.50x faster" in out and "A: a.json (python train.py" in out
    assert main(["compare", "--markdown", a, b]) == 0
    assert "### torchwatch" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{not json", "is not JSON (line 1)"),
        ([1, 2], "is not a torchwatch report"),
        ({"schema": "prometheus"}, "is not a torchwatch report (schema 'prometheus'"),
        (
            {"schema": "torchwatch.report/1", "torchwatch_version": "0.1.0"},
            "malformed torchwatch.report/1 report: 'created' is missing",
        ),
        ("\xff\xfe", "is not JSON"),
    ],
)
def test_bad_files_are_one_line_exit_2(
    content: Any,
    message: str,
    pair: tuple[dict[str, Any], dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    good = _write(tmp_path, "good.json", pair[0])
    bad = str(tmp_path / "missing.json") if content is None else _write(tmp_path, "bad.json", content)
    assert main(["compare", good, bad]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_fifo_is_refused_without_blocking(tmp_path: Path, pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(Exception, match="not a regular file"):
        load_report(str(fifo))


def test_a_saved_report_loads(tmp_path: Path, pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    path = tmp_path / "r.json"
    report.write_atomic(path, report.dumps(Report.from_json(pair[0])))
    assert load_report(str(path)).created == pair[0]["created"]


def test_a_report_a_real_watch_saved_compares_with_itself(capsys: pytest.CaptureFixture[str]) -> None:
    """tests/fixtures/reports/today.json: ``torchwatch run --headless --duration 8 --json`` on
    demo/dataloader_bound.py, written before the report had a type."""
    saved = load_report(str(TODAY))
    c = compare_reports(saved, saved)
    assert c.speedup == pytest.approx(1.0) and c.differ == () and c.moves == ()
    assert ("num_workers", "0") in c.same and c.verdicts[0][0] == "dataloader-bound"
    assert main(["compare", str(TODAY), str(TODAY)]) == 0
    out = capsys.readouterr().out
    assert "1.00x faster (+0%)" in out and "settings that differ: none" in out


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("torchwatch.report/2", "is a torchwatch.report/2 report, and this torchwatch reads torchwatch.report/1"),
        ("torchwatch.report/0.9", "is a torchwatch.report/0.9 report, and this torchwatch reads torchwatch.report/1"),
        ("torchwatch.report/one", "is not a torchwatch report (schema 'torchwatch.report/one'"),
    ],
)
def test_another_major_version_is_one_line_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], schema: str, message: str
) -> None:
    data = json.loads(TODAY.read_text())
    data["schema"] = schema
    other = _write(tmp_path, "other.json", data)
    assert main(["compare", str(TODAY), other]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "other.json" in err and "Traceback" not in err


def test_a_newer_minor_version_with_keys_unknown_here_compares(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(TODAY.read_text())
    data["schema"] = "torchwatch.report/1.4"
    data["energy"] = {"joules": {"step": 12.0}}  # a section a later torchwatch writes
    data["hook"]["new_reading"] = [1, 2]
    newer = _write(tmp_path, "newer.json", data)
    assert main(["compare", str(TODAY), newer]) == 0
    assert "settings that differ: none" in capsys.readouterr().out
    assert load_report(newer).schema == "torchwatch.report/1.4"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("verdict", "confidence"), "high", "'verdict.confidence' is a string, expected a number"),
        (("target", "pid"), None, "'target.pid' is null, expected an integer"),
        (("findings",), {}, "'findings' is an object, expected a list"),
        (("findings", 0, "fixes", 0, "title"), 3, "'findings[0].fixes[0].title' is a number, expected a string"),
        (("sources", "nvml", "status"), "broken", "'sources.nvml.status' is 'broken', expected one of ok, unavailable"),
        (("features", "data_wait_share"), "93%", "'features.data_wait_share' is a string, expected a number"),
        (("hook", "dataloader", "num_workers"), 1.5, "'hook.dataloader.num_workers' is a number, expected an integer"),
        (("sampling",), None, "'sampling' is null, expected an object"),
        (("ranks",), None, "'ranks' is null, expected a list"),
    ],
)
def test_a_malformed_saved_report_is_one_line_naming_the_key_and_the_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: tuple[Any, ...], value: Any, field: str
) -> None:
    data = json.loads(TODAY.read_text())
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    bad = _write(tmp_path, "bad.json", data)
    assert main(["compare", str(TODAY), bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"bad.json is a malformed torchwatch.report/1 report: {field}" in err

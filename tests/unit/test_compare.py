"""``torchwatch compare``: speedup, verdicts, settings, features that moved (on reports the real
builder makes, edited as a change would), Markdown, and one-line refusals of anything else (exit 2)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_report import analysed, features, observation
from torchwatch.cli import main
from torchwatch.faces import report
from torchwatch.faces.compare import compare, load_report, render_markdown, render_text


def _report(steps_per_s: float, num_workers: int, data_wait: float, label_wait: float = 0.6) -> dict[str, Any]:
    data = report.build(observation(analysed(features(fetch_cpu_share=label_wait, worker_count=0.0))))
    data["features"].update(data_wait_share=data_wait, hook_steps_per_s=steps_per_s, rss_bytes=1e9, main_cpu_pct=99.0)
    data["hook"] = {
        "status": "ok",
        "steps": 100,
        "steps_per_s": steps_per_s,
        "step_time_ms": {"p50": 1000 / steps_per_s, "p95": 1200 / steps_per_s},
        "dataloader": {
            "num_workers": num_workers,
            "batch_size": 64,
            "pin_memory": False,
            "prefetch_factor": None,
            "persistent_workers": num_workers > 0,
            "drop_last": True,
        },
        "usable_cpus": 2.0,
        "amp": {"autocast": False, "dtype": None, "device_type": None, "grad_scaler": False},
        "torch": "2.13.0",
    }
    back: dict[str, Any] = json.loads(json.dumps(data))  # as read back from a file
    return back


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
        ({"schema": "torchwatch.report/1", "target": {}}, "malformed torchwatch report: 'verdict'"),
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
    report.write_atomic(path, report.dumps(pair[0]))
    assert load_report(str(path))["created"] == pair[0]["created"]

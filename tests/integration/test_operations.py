"""Operations (issue 17): a real Prometheus server scrapes ``--prometheus`` on a 2-rank gloo job, and
``torchwatch compare`` tells the DataLoader demo's plain run from its ``--relieve`` run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPO, Watched, torchwatch

pytestmark = pytest.mark.integration

TRAIN = Path(__file__).resolve().parent / "_ddp_train.py"
PROMETHEUS = shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


def _wait_for(what: str, check: Any, timeout: float, proc: subprocess.Popen[str] | None = None) -> Any:
    """Poll ``check()`` until it returns something true; fail with ``what`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the process ended first ({proc.returncode})")
        try:
            last = check()
        except OSError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {timeout} s (last: {str(last)[-1500:]})")


def _query(prom: str, expr: str) -> list[dict[str, Any]]:
    body = json.loads(_get(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
    assert body["status"] == "success", body
    return list(body["data"]["result"])


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (Debian: apt-get install prometheus)")
def test_prometheus_scrapes_the_step_time_of_every_rank(tmp_path: Path) -> None:
    exporter, web = _free_port(), _free_port()
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCHWATCH_DIR=str(tmp_path / "tw"))
    train = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(TRAIN)]
    watch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchwatch",
            "run",
            "--headless",
            "--duration",
            "150",
            "--prometheus",
            f"127.0.0.1:{exporter}",
            "--json",
            str(tmp_path / "report.json"),
            "--",
            *train,
            "--out",
            str(out),
            "--seconds",
            "200",
            "--rank1-sleep-ms",
            "5",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: torchwatch\n    static_configs:\n      - targets: ['127.0.0.1:{exporter}']\n"
    )
    server: subprocess.Popen[str] | None = None
    try:
        metrics = f"http://127.0.0.1:{exporter}/metrics"

        def both_ranks() -> bool:
            lines = [x for x in _get(metrics).splitlines() if x.startswith("torchwatch_step_time_seconds{")]
            return all(any(f',rank="{r}"' in x for x in lines) for r in (0, 1))  # not local_rank="1"

        _wait_for("the exporter shows a step time for ranks 0 and 1", both_ranks, 120, watch)
        server = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{web}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        prom = f"http://127.0.0.1:{web}"
        _wait_for("prometheus ready", lambda: "Ready" in _get(f"{prom}/-/ready"), 60, server)
        up = _wait_for("the exporter is up for prometheus", lambda: _query(prom, "up == 1"), 30, server)
        time.sleep(3.5)  # three scrape intervals

        def three_samples_per_rank() -> dict[str, float]:
            rows = _query(prom, "count_over_time(torchwatch_step_time_seconds[10s])")
            got = {r["metric"]["rank"]: float(r["value"][1]) for r in rows}
            return got if {"0", "1"} <= set(got) and min(got.values()) >= 3 else {}

        counts = _wait_for("3 scrapes of each rank's step time", three_samples_per_rank, 15, server)
        series = {r["metric"]["rank"]: r for r in _query(prom, "torchwatch_step_time_seconds")}
        assert set(series) == {"0", "1"}, series
        for rank, row in series.items():
            assert row["metric"]["local_rank"] == rank and row["metric"]["training_job"]
            assert 0 < float(row["value"][1]) < 10  # seconds, not ms
        assert up[0]["metric"]["job"] == "torchwatch" and counts
        verdict = _query(prom, "torchwatch_verdict")
        assert verdict and verdict[0]["metric"]["label"]
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        watch.send_signal(signal.SIGTERM)
        _, err = watch.communicate(timeout=60)
    # torchwatch ends by the signal it got, after the report (torchrun's own traceback on SIGTERM is
    # the training's stderr, which run --headless passes through)
    assert watch.returncode == -signal.SIGTERM, err[-3000:]
    assert json.loads((tmp_path / "report.json").read_text())["ended_by"] == "SIGTERM"


def test_compare_plain_and_relieved_dataloader_demo(
    dataloader_demo_runs: tuple[Watched, Watched, Path, Path],
) -> None:
    plain, relieved, *reports = dataloader_demo_runs  # the same two runs as test_demos' label tests
    assert plain.report is not None and relieved.report is not None
    result = torchwatch("compare", str(reports[0]), str(reports[1]))
    assert result.code == 0, result.stderr
    print(result.stdout)  # the figure for the record (pytest -s)
    lines = result.stdout.splitlines()
    speed = next(x for x in lines if x.startswith("steps/s: "))
    assert "x faster (+" in speed, result.stdout  # --relieve takes the per-sample work out of the loop
    assert float(speed.split(": ")[2].split("x")[0]) > 1.2
    assert "num_workers=0" in result.stdout  # the same in both: --relieve adds no workers
    assert lines[4].startswith("verdict A: dataloader-bound")
    markdown = torchwatch("compare", "--markdown", str(reports[0]), str(reports[1]))
    assert markdown.code == 0 and "`num_workers=0`" in markdown.stdout

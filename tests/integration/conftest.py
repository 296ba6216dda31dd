"""Helpers for tests that start real trainings from demo/ under torchwatch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo"

pytestmark = pytest.mark.integration


@dataclass
class Watched:
    """Result of one torchwatch process: exit code, output and the JSON report."""

    code: int
    stdout: str
    stderr: str
    report: dict[str, Any] | None


def torchwatch(
    *args: str, timeout: float = 120, json_path: Path | None = None, env: dict[str, str] | None = None, **popen: Any
) -> Watched:
    """Run ``python -m torchwatch ARGS`` to completion."""
    proc = subprocess.run(
        [sys.executable, "-m", "torchwatch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
        **popen,
    )
    report = json.loads(json_path.read_text()) if json_path and json_path.exists() else None
    return Watched(proc.returncode, proc.stdout, proc.stderr, report)


def headless_run(duration: float, out: Path, *command: str) -> list[str]:
    """Arguments of ``torchwatch run --headless --duration D --json OUT -- COMMAND``."""
    return ["run", "--headless", "--duration", str(duration), "--json", str(out), "--", *command]


def watch_demo(tmp_path: Path, demo: str, *demo_args: str, duration: float = 20.0) -> Watched:
    """``torchwatch run --headless --duration D --json out -- python demo/DEMO.py ARGS``."""
    out = tmp_path / f"{demo}-{int(time.time() * 1000)}.json"
    command = (sys.executable, str(DEMO / f"{demo}.py"), "--device", "cpu", *demo_args)
    return torchwatch(*headless_run(duration, out, *command), json_path=out, timeout=duration + 90)


def python_children_of(pid: int) -> list[int]:
    """PIDs still alive below ``pid`` (for orphan checks)."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@pytest.fixture
def demo_env() -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1")


@pytest.fixture(scope="session")
def dataloader_demo_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Watched, Watched, Path, Path]:
    """``dataloader_bound`` watched for 20 s plain and with ``--relieve``, once for the whole
    session: the label tests (test_demos) and ``torchwatch compare`` (test_operations) read the same
    two runs instead of each watching its own (40 s saved). Returns both results and both JSON
    report paths (plain, relieved)."""
    tmp = tmp_path_factory.mktemp("dataloader_demo")
    plain = watch_demo(tmp, "dataloader_bound")
    first = next(tmp.glob("dataloader_bound-*.json"), None)
    relieved = watch_demo(tmp, "dataloader_bound", "--relieve")
    second = next((x for x in tmp.glob("dataloader_bound-*.json") if x != first), None)
    assert first is not None and second is not None, (plain.stderr[-2000:], relieved.stderr[-2000:])
    return plain, relieved, first, second


@pytest.fixture(scope="session")
def cpu_bound_demo_run(tmp_path_factory: pytest.TempPathFactory) -> Watched:
    """``cpu_bound`` watched for 20 s, its --duration stopping it, once for the whole session: its
    label (test_demos) and what a --duration stop leaves (test_lifecycle) are read from the same
    run instead of each watching its own (10 s saved)."""
    return watch_demo(tmp_path_factory.mktemp("cpu_bound_demo"), "cpu_bound")

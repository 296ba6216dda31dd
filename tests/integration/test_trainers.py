"""Hogwild trainers started with multiprocessing's spawn are trainers, not DataLoader workers (issue 47)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import REPO, torchwatch

pytestmark = [pytest.mark.integration, pytest.mark.quiet]  # reads run-queue waits (CPU time): no other test beside it

SCENARIO = REPO / "tests" / "scenarios" / "hogwild_spawn.py"


def _wait_for_steps(proc: subprocess.Popen[str], timeout: float) -> None:
    """Until the scenario's main process reports its trainers' steps (4 spawned trainers import torch
    first: 80 s on this 2-core machine under load, 10 s quiet)."""
    deadline = time.monotonic() + timeout
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if "steps/s" in line:
            return
        if proc.poll() is not None:
            break
    raise AssertionError("the trainers never reported a step")


def test_spawned_hogwild_trainers_are_named_trainers_not_dataloader_workers(tmp_path: Path) -> None:
    training = subprocess.Popen(
        [sys.executable, str(SCENARIO), "--seconds", "300"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_steps(training, timeout=240)
        out = tmp_path / "attach.json"
        result = torchwatch(
            "attach", "--headless", "--duration", "15", "--json", str(out), str(training.pid), json_path=out
        )
        assert result.code == 0, result.stderr
        report = result.report
        assert report is not None
        f = report["features"]
        assert report["verdict"]["label"] != "dataloader-bound", report["verdict"]
        assert (f["worker_count"], f["trainer_count"], f["local_ranks"]) == (0, 4, 4), f
        rules = [x["rule"] for x in report["findings"]]
        assert "cpu-oversubscribed-trainers" in rules, (report["verdict"], rules, f)
        trainers = next(x for x in report["findings"] if x["rule"] == "cpu-oversubscribed-trainers")
        assert trainers["summary"].startswith("4 trainer processes"), trainers["summary"]
        assert any("torch.set_num_threads(1)" in fx["detail"] for fx in trainers["fixes"]), trainers["fixes"]
        assert training.poll() is None, "attach must leave the training running"
    finally:
        training.terminate()  # the scenario ends its trainers on SIGTERM
        try:
            training.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(training.pid, signal.SIGKILL)
            training.wait(timeout=30)

"""A training whose environment holds another package named ``torchwatch`` (the package index's
0.0.0 placeholder has no hook): ``torchwatch run`` and ``torchwatch attach`` still get this
torchwatch's hook into it (steps counted), and the training's own ``import torchwatch`` still gets
its package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.integration.conftest import headless_run, torchwatch
from tests.unit.bypath import stand_in

pytestmark = pytest.mark.integration

SMALL = Path(__file__).with_name("_small_train.py")

# The training: says which torchwatch its import gets (once torch is imported, and at exit), then
# trains SECONDS (or until the stop file is there).
TRAINING = f"""
import atexit, json, runpy, sys
import torch, torch.utils.data
import torchwatch
torch.nn.Linear(2, 2)(torch.zeros(1, 2))  # torch's lazy imports done: attach finds a training, not an import
out, stop, seconds = sys.argv[1], sys.argv[2], sys.argv[3]

def say(when):
    import torchwatch as now
    with open(out + "." + when, "w") as f:
        json.dump({{"file": now.__file__, "stand_in": getattr(now, "STAND_IN", False),
                   "private": "_torchwatch_by_path.hook.runtime" in sys.modules}}, f)

say("start")
atexit.register(say, "exit")
sys.argv = [{str(SMALL)!r}, "--seconds", seconds, "--stop-file", stop]
runpy.run_path({str(SMALL)!r}, run_name="__main__")
"""


def said(out: Path, when: str) -> dict[str, object]:
    data: dict[str, object] = json.loads(Path(f"{out}.{when}").read_text())
    return data


@pytest.fixture
def lookalike(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """The training's Python and environment: a venv of its own (made here, without this
    torchwatch), with the stand-in torchwatch first on its path and this environment's
    site-packages after it for torch (a PYTHONPATH entry: its .pth files, among them this
    torchwatch's editable finder, are not read)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = stand_in(tmp_path / "site")
    path = os.pathsep.join([str(site), sysconfig.get_paths()["purelib"]])
    env = dict(os.environ, PYTHONPATH=path, TORCHWATCH_DIR=str(tmp_path / "tw"), PYTHONUNBUFFERED="1")
    return str(venv / "bin" / "python"), env


def test_run_gets_its_hook_into_a_training_with_another_torchwatch(
    tmp_path: Path, lookalike: tuple[str, dict[str, str]]
) -> None:
    python, env = lookalike
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    report_path, out = tmp_path / "report.json", tmp_path / "said"
    # the training ends by itself 4 s after importing torch (which takes 3-10 s here): the report
    # keeps the steps its hook counted
    command = (python, str(script), str(out), str(tmp_path / "stop"), "4")
    watched = torchwatch(*headless_run(90, report_path, *command), json_path=report_path, env=env)
    assert watched.report is not None, watched.stderr[-2000:]
    assert watched.report["hook"].get("steps", 0) > 0, watched.report["hook"]
    assert "not installed" not in watched.stderr
    start = said(out, "start")
    assert start["stand_in"] is True and start["private"] is True  # theirs by name, ours by path


def test_attach_gets_its_hook_into_a_training_with_another_torchwatch(
    tmp_path: Path, lookalike: tuple[str, dict[str, str]]
) -> None:
    python, env = lookalike
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    out, stop = tmp_path / "said", tmp_path / "stop"
    training = subprocess.Popen(
        [python, str(script), str(out), str(stop), "120"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90  # importing torch: 3-10 s here
        while not Path(f"{out}.start").exists() and time.monotonic() < deadline and training.poll() is None:
            time.sleep(0.1)
        assert said(out, "start") == {
            "file": str(tmp_path / "site" / "torchwatch" / "__init__.py"),
            "stand_in": True,
            "private": False,
        }
        report_path = tmp_path / "report.json"
        watched = torchwatch(
            "attach",
            "--headless",
            "--duration",
            "8",
            "--json",
            str(report_path),
            str(training.pid),
            json_path=report_path,
        )
        assert watched.report is not None, watched.stderr[-2000:]
        injection = watched.report.get("injection") or {}
        assert watched.report["hook"].get("steps", 0) > 0, (
            [r.get("reason") for r in injection.get("ranks", [])],  # what the injection said, first
            watched.report["hook"],
            [line for line in watched.stderr.splitlines() if "inject" in line or "hook" in line][:6],
        )
        stop.touch()
        _, err = training.communicate(timeout=60)
        assert training.returncode == 0, err[-2000:]
        assert said(out, "exit")["stand_in"] is True  # the training's import torchwatch: still theirs
    finally:
        if training.poll() is None:
            training.kill()
            training.wait()

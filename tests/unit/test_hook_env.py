"""What the hook takes from the environment, and what it leaves to the training's children.

Bad ``TORCHWATCH_*`` values never raise into the user's code nor change its output; the
variables ``torchwatch run`` sets to pre-load the hook do not reach the training's children
(only a launcher's); a burst trace over its size bound is deleted before it is read.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.hookrun import hook_script, result
from torchwatch.watch.lifecycle import hook_env

HERE = Path(__file__).parent
REPO = HERE.parents[1]
SMALL = HERE.parent / "integration" / "_small_train.py"


def _bad_environments(tmp: Path) -> list[dict[str, str]]:
    """Environments with bad ``TORCHWATCH_*`` values. A bad ``TORCHWATCH_DIR`` turns the hook
    off, so each gets its own run; the other variables' bad values are combined, one of each
    per run, with a scheduled burst so the signal, cooldown and trace paths all run."""
    a_file = tmp / "a-file"
    a_file.write_text("x")
    link = tmp / "link"
    link.symlink_to(tmp)
    theirs = tmp / "theirs"
    theirs.mkdir(mode=0o755)
    if os.geteuid() == 0:
        os.chown(theirs, 12345, 12345)
    locked = tmp / "locked"
    locked.mkdir(mode=0o500)
    dirs = [str(a_file), "/dev/null", str(link), str(theirs), str(locked / "sub"), "/proc/1", "d" * 100_000]
    signals = ["SIGKILL", "SIGTERM", "SIGINT", "SIGSTOP", "abc", "999", "-1", "RTMIN+999", "x" * 100_000]
    trace_dirs = [str(a_file), "/dev/null", str(theirs), "t" * 100_000, str(link), str(locked / "t")]
    cooldowns = ["nan", "-1", "inf", "1e999", "abc"]
    burst_at = ["garbage,,-1,3.5,99999999999999999999999,\x01", ",".join(["5"] * 10_000), "5", "5"]
    good = {"TORCHWATCH_DIR": str(tmp / "tw"), "TORCHWATCH_TRACE_DIR": str(tmp / "traces")}
    envs = [{**good, "TORCHWATCH_DIR": d} for d in dirs]
    for i in range(max(len(signals), len(trace_dirs), len(cooldowns), len(burst_at))):
        envs.append(
            {
                **good,
                "TORCHWATCH_SIGNAL": signals[i % len(signals)],
                "TORCHWATCH_TRACE_DIR": trace_dirs[i % len(trace_dirs)],
                "TORCHWATCH_BURST_COOLDOWN_S": cooldowns[i % len(cooldowns)],
                "TORCHWATCH_BURST_AT": burst_at[i % len(burst_at)],
                "TORCHWATCH_HOOK_PATH": "/nonexistent",
            }
        )
    return envs


def test_bad_torchwatch_values_never_break_the_training(tmp_path: Path) -> None:
    """A small hooked training under each bad environment: exit 0, the same output, no
    traceback, and at most short lines from the hook on stderr (3 runs at a time)."""
    pending = _bad_environments(tmp_path)
    running: list[tuple[dict[str, str], subprocess.Popen[str]]] = []
    failures = []
    while pending or running:
        while pending and len(running) < 3:
            bad = pending.pop()
            env = {**hook_env(burst_at=(5,)), "TORCHWATCH_BURST_COOLDOWN_S": "0", **bad}
            proc = subprocess.Popen(
                [sys.executable, str(SMALL), "--seconds", "0.4"],  # ~35 steps: the burst at step 5 and after
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=tmp_path,
                env=env,
            )
            running.append((bad, proc))
        bad, proc = running.pop(0)
        out, err = proc.communicate(timeout=120)
        shown = {k: v[:40] for k, v in bad.items()}
        if proc.returncode != 0 or not re.fullmatch(r"small_train: \d+ steps\n", out) or "Traceback" in err:
            failures.append(f"{shown}: exit {proc.returncode}, stdout {out[-200:]!r}, stderr {err[-500:]!r}")
        elif any(len(line) > 400 for line in err.splitlines()):
            failures.append(f"{shown}: an over-long stderr line")
    assert failures == []


def test_the_run_preload_does_not_reach_the_trainings_children(tmp_path: Path) -> None:
    child = (
        "import json, os, signal, sys\n"
        "print(json.dumps({'env': {k: v for k, v in os.environ.items() if k.startswith('TORCHWATCH_HOOK')},\n"
        "  'pythonpath': os.environ.get('PYTHONPATH'), 'hooked': 'torchwatch.hook' in sys.modules}))\n"
    )
    parent = (
        "import subprocess, sys, torch\n"
        "from torchwatch.hook import runtime\n"
        "assert runtime.current() is not None and runtime.current().torch is not None\n"
        "assert runtime.current().burst_at == (7,)  # read before the variables were removed\n"
        "sys.stdout.write(subprocess.run([sys.executable, '-c', sys.argv[1]], capture_output=True, text=True).stdout)\n"
    )
    env = hook_env(burst_at=(7,))
    env["TORCHWATCH_DIR"] = str(tmp_path / "tw")
    env["PYTHONPATH"] = env["PYTHONPATH"] + os.pathsep + str(tmp_path / "mine")
    r = subprocess.run(
        [sys.executable, "-c", parent, child], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out == {"env": {}, "pythonpath": str(tmp_path / "mine"), "hooked": False}


def test_a_launcher_passes_the_preload_on_to_its_ranks(tmp_path: Path) -> None:
    launcher = tmp_path / "torchrun"
    launcher.write_text(
        "import subprocess, sys\n"
        "code = 'import os, sys, torch; from torchwatch.hook import runtime; "
        "print(runtime.current() is not None and runtime.current().torch is not None)'\n"
        "sys.exit(subprocess.run([sys.executable, '-c', code]).returncode)\n"
    )
    env = hook_env()
    env["TORCHWATCH_DIR"] = str(tmp_path / "tw")
    r = subprocess.run(
        [sys.executable, str(launcher)], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True"]  # the rank got the hook


def test_a_trace_over_its_bound_is_deleted_before_it_is_read(tmp_path: Path) -> None:
    out = result(hook_script("big_trace", tmp_path / "tw", tmp_path / "traces"))
    last = out["state"]["burst"]["last"]
    assert last["trace_bytes"] > 1_000_000 and last["trace_path"] is None
    assert "deleted unread" in last["error"] and last.get("steps") is None
    assert out["load_trace_calls"] == 0
    assert [p.name for p in (tmp_path / "traces").rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("value", ["SIGUSR1", "SIGRTMIN+3"])
def test_a_burst_on_another_allowed_signal(tmp_path: Path, value: str) -> None:
    st = result(hook_script("burst", tmp_path / "tw", tmp_path / "traces", TORCHWATCH_SIGNAL=value))["state"]
    assert st["signal_owned"] and "error" not in st["burst"]["last"]
    assert st["burst"]["last"]["steps"] == 3


@pytest.mark.parametrize(
    "breakage",
    [
        "wire.Counters = boom",  # on_torch fails half-way
        "wire.prepare_dir = boom",  # the base directory cannot be prepared
        "runtime.Hook._take_signal = boom",  # a bug in taking the signal
        "runtime.Hook._patch = boom",  # a bug in patching torch
        "wire.HookRecord.to_json = boom",  # a bug in publishing
    ],
)
def test_a_failing_hook_never_raises_into_import_torch(tmp_path: Path, breakage: str) -> None:
    code = (
        "import sys\n"
        "from torchwatch import wire\n"
        "from torchwatch.hook import install, runtime\n"
        "def boom(*a, **k):\n"
        "    raise RuntimeError('broken on purpose')\n"
        f"{breakage}\n"
        "assert install(directory=sys.argv[1])\n"
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)\n"
        "for _ in DataLoader(list(range(4))):\n"
        "    opt.step()\n"
        "print('trained')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "tw")], capture_output=True, text=True, timeout=120, check=False
    )
    assert r.returncode == 0 and r.stdout == "trained\n", r.stderr[-2000:]
    assert "Traceback" not in r.stderr

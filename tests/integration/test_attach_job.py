"""``torchwatch attach`` to a distributed job torchwatch did not start: to one rank (its sibling ranks
found through the launcher) and to the launcher itself, under torchrun and torch.multiprocessing.spawn.
The hook goes into every rank (never the launcher) and comes out when attach ends; the job is
watched as under ``run``: rank 1 of the straggler_data scenario (4x the per-sample data work) is
named the straggler. 2 ranks, gloo on the CPU, one intra-op thread each."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.integration.conftest import REPO, Watched, others_hold_cpus, torchwatch
from torchwatch.sources.proc import catches

pytest.importorskip("torch.distributed", reason="the ranks need torch")
pytestmark = pytest.mark.integration

SCEN = REPO / "tests" / "scenarios" / "distributed"
WATCH_S = 12.0  # the straggler is named ~4 s after the hook goes in; the window is 10 s


def _ranks_stepping(launcher: subprocess.Popen[str], timeout: float = 90.0) -> list[psutil.Process]:
    """The launcher's two rank children once rank 0 has printed a step line (the job trains)."""
    assert launcher.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = launcher.stdout.readline()
        if not line and launcher.poll() is not None:
            break
        if ": step " in line:
            kids = [
                c for c in psutil.Process(launcher.pid).children() if "resource_tracker" not in " ".join(c.cmdline())
            ]
            assert len(kids) == 2, kids
            return sorted(kids, key=lambda p: p.pid)
    raise AssertionError(f"the job did not start stepping (status {launcher.poll()})")


# Each way in once: the launcher-specific parts (RANK in the environment; torch's _wrap read from
# a real stack; a spawned rank's live install) run either way, and tests/unit/test_job.py finds
# the job from a rank and from the launcher under both launchers.
WAYS = [("torchrun", "rank"), ("mp.spawn", "launcher")]


@pytest.fixture(params=WAYS, ids=[f"{kind}-{named}" for kind, named in WAYS])
def job(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, subprocess.Popen[str], list[psutil.Process]]]:
    """A straggler_data job started without torchwatch: (launcher kind, what attach names, launcher, its two ranks)."""
    kind, named = request.param
    script = [str(SCEN / "straggler_data.py"), "--seconds", "150"]
    if kind == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *script]
    else:
        cmd = [sys.executable, *script]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHWATCH")}
    launcher = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=dict(env, PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the ranks end with it
    )
    try:
        yield kind, named, launcher, _ranks_stepping(launcher)
    finally:
        # SIGINT to the launcher and its ranks (all catch it: an mp.spawn parent alone would wait
        # for its ranks at exit), then SIGKILL to whatever of the group is left
        os.killpg(launcher.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            launcher.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(10)


def _rank_of(proc: psutil.Process, ranks: list[psutil.Process]) -> int:
    """The rank of ``proc`` as the scenario sees it: torchrun's RANK, else the spawn order."""
    env = proc.environ()
    return int(env["RANK"]) if "RANK" in env else ranks.index(proc)


def _attach(tmp_path: Path, pid: int) -> Watched:
    out = tmp_path / f"attach-{pid}.json"
    args = ("attach", "--headless", "--duration", str(WATCH_S), "--json", str(out), str(pid))
    return torchwatch(*args, json_path=out, timeout=WATCH_S + 90)


def test_attach_to_a_rank_or_its_launcher_watches_the_whole_job(
    job: tuple[str, str, subprocess.Popen[str], list[psutil.Process]], tmp_path: Path
) -> None:
    kind, named, launcher, ranks = job
    by_rank = {_rank_of(p, ranks): p for p in ranks}
    pid = by_rank[1].pid if named == "rank" else launcher.pid
    sigusr2_before = {p.pid: catches(p.pid, signal.SIGUSR2) for p in ranks}
    watched = _attach(tmp_path, pid)
    err = watched.stderr
    print(err)
    assert watched.code == 0, err[-3000:]
    assert f"2 ranks found under {kind} (PID {launcher.pid}" in err, err
    for p in ranks:
        assert f"hook injected into PID {p.pid}" in err, err
        assert f"hook taken out of PID {p.pid}" in err, err
    assert f"hook injected into PID {launcher.pid}" not in err
    assert "hook in 2 of 2 ranks" in err
    rep = watched.report
    assert rep is not None
    injection = rep["injection"]
    assert injection["injected"] and injection["hooked"], injection
    assert sorted(r["pid"] for r in injection["ranks"]) == sorted(p.pid for p in ranks)
    assert injection["job"]["launcher_pid"] == launcher.pid and injection["job"]["launcher"] == kind
    assert sorted(r["pid"] for r in injection["job"]["ranks_found"]) == sorted(p.pid for p in ranks)
    # the job as under run: every rank, rank 1 the straggler by its DataLoader
    assert [r["rank"] for r in rep["ranks"]] == [0, 1], rep["ranks"]
    assert {r["rank"]: r["pid"] for r in rep["ranks"]} == {r: p.pid for r, p in by_rank.items()}
    straggler = rep["straggler"]
    assert straggler is not None and straggler["rank"] == 1 and straggler["victim_rank"] == 0, straggler
    assert straggler["part"] == "data"
    if not others_hold_cpus(rep):  # on a busy machine the neighbours are named first
        assert rep["verdict"]["label"] == "dataloader-bound"
        assert rep["verdict"]["summary"].startswith("Rank 1 is the straggler")
    assert re.search(r"2 ranks, straggler rank 1 \(score", err), err
    # detached: each rank's burst signal is as before, and the job trains on
    assert {p.pid: catches(p.pid, signal.SIGUSR2) for p in ranks} == sigusr2_before
    assert launcher.poll() is None and all(p.is_running() for p in ranks)

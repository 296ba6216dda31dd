"""``attach`` finding a job from one of its ranks or its launcher (torchwatch/watch/job.py), on real
processes without torch: a fake launcher whose children carry RANK/WORLD_SIZE (torchrun's way), a
fake mp.spawn parent (the stack reader says which children run torch's _wrap), and the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import psutil
import pytest

from torchwatch.cli.injecting import Injected, job_report
from torchwatch.hook import ranks
from torchwatch.model.readings import Frame
from torchwatch.watch.job import Job, Member, find_job, launcher_kind

SCHEMA_INJECTION = json.loads((Path(__file__).parent / "report_schema.json").read_text())["properties"]["injection"]

# A "launcher" starting two children that sleep: with RANK/WORLD_SIZE (torchrun), or as
# multiprocessing's spawn entry point (mp.spawn) plus a resource tracker look-alike.
PARENT = r"""
import os, subprocess, sys, time
mode = sys.argv[1]
kids = []
for r in range(2):
    if mode == "torchrun":
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r))
        kids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env))
    else:
        code = "from multiprocessing.spawn import spawn_main; import time; time.sleep(60)"
        kids.append(subprocess.Popen([sys.executable, "-c", code, "--multiprocessing-fork"]))
code = "from multiprocessing.resource_tracker import main; import time; time.sleep(60)"
kids.append(subprocess.Popen([sys.executable, "-c", code]))
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[int, list[int]]]:
    mode = request.param
    script = tmp_path / "train.py"
    script.write_text(PARENT)
    argv = [sys.executable, str(script), mode]
    if mode == "torchrun":
        # `-m torch.distributed.run` would import torch: a launcher is told by its command line, so
        # the fake one runs the script through -c with `-m torch.distributed.run` in its arguments.
        code = f"import sys; sys.argv[1:] = [{mode!r}]; exec(open({str(script)!r}).read())"
        argv = [sys.executable, "-c", code, "-m", "torch.distributed.run"]
    parent = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
        kids = sorted(c.pid for c in psutil.Process(parent.pid).children())
        # each child past its execve: until then its command line reads empty (a CI run beside
        # load read the resource tracker's as "", so the test took it for a rank)
        deadline = time.monotonic() + 30.0
        while not all(psutil.Process(k).cmdline() for k in kids) and time.monotonic() < deadline:
            time.sleep(0.01)
        yield parent.pid, kids
    finally:
        for c in psutil.Process(parent.pid).children():
            c.kill()
        parent.kill()
        parent.wait()


def _ranks_only(kids: list[int]) -> list[int]:
    return [k for k in kids if "resource_tracker" not in " ".join(psutil.Process(k).cmdline())]


def stack(*frames: tuple[str, str]) -> list[Frame]:
    """Frames as ``py-spy dump --full-filenames`` gives them (innermost first)."""
    return [Frame(name, f"/venv/lib/python3.11/site-packages/{path}", 1) for name, path in frames]


RANK = stack(
    ("train", "/work/train.py"),
    ("_wrap", "torch/multiprocessing/spawn.py"),
    *[("_bootstrap", "multiprocessing/process.py")],
)
WORKER = stack(("_worker_loop", "torch/utils/data/_utils/worker.py"), ("_bootstrap", "multiprocessing/process.py"))


def wraps(ranks_: set[int]) -> Any:
    """A stack reader: the PIDs in ``ranks_`` run torch.multiprocessing.spawn's _wrap, others a DataLoader worker."""

    def read(pid: int) -> list[Frame]:
        return RANK if pid in ranks_ else WORKER

    return read


@pytest.mark.parametrize("tree", ["torchrun"], indirect=True)
def test_a_rank_of_torchrun_finds_its_siblings_through_the_launcher(tree: tuple[int, list[int]]) -> None:
    launcher, kids = tree
    ranks_ = _ranks_only(kids)
    for named in (*ranks_, launcher):
        job = find_job(named, stacks=lambda pid: None)
        assert job.is_job and job.launcher == launcher and job.kind == "torchrun", job
        assert [m.pid for m in job.ranks] == ranks_ and [m.rank for m in job.ranks] == [0, 1]
        assert job.root == launcher
        assert all(m.alive() for m in job.ranks)
    assert "2 ranks found under torchrun" in find_job(ranks_[1], stacks=lambda pid: None).line()


@pytest.mark.parametrize("tree", ["mp.spawn"], indirect=True)
def test_spawned_children_are_ranks_only_when_they_run_torchs_wrap(tree: tuple[int, list[int]]) -> None:
    launcher, kids = tree
    ranks_ = _ranks_only(kids)
    job = find_job(launcher, stacks=wraps(set(ranks_)))
    assert job.is_job and job.kind == "mp.spawn" and [m.pid for m in job.ranks] == ranks_, job
    assert find_job(ranks_[0], stacks=wraps(set(ranks_))).ranks == job.ranks
    # the same children running a DataLoader's worker loop: the parent is a training, not a launcher
    workers = find_job(launcher, stacks=wraps(set()))
    assert not workers.is_job and workers.root == launcher
    alone = find_job(ranks_[0], stacks=wraps(set()))
    assert not alone.is_job and "_wrap" in alone.note
    # one rank and one worker: the worker is no rank of the job
    mixed = find_job(launcher, stacks=wraps({ranks_[0]}))
    assert [m.pid for m in mixed.ranks] == [ranks_[0]]
    # the oldest spawned child decides whether the parent launched ranks (one py-spy dump)
    read: list[int] = []
    assert not find_job(launcher, stacks=lambda pid: read.append(pid) or wraps({ranks_[1]})(pid)).is_job
    assert read == [ranks_[0]]
    # a process a rank forked (a fork-context DataLoader worker) keeps the rank's frames below its own
    fork_of_rank = stack(
        ("_worker_loop", "torch/utils/data/_utils/worker.py"),
        ("run", "multiprocessing/process.py"),
        ("_bootstrap", "multiprocessing/process.py"),
        ("_launch", "multiprocessing/popen_fork.py"),
        ("train", "train.py"),
        ("_wrap", "torch/multiprocessing/spawn.py"),
        ("_bootstrap", "multiprocessing/process.py"),
        ("spawn_main", "multiprocessing/spawn.py"),
    )
    assert not find_job(launcher, stacks=lambda pid: fork_of_rank).is_job
    other_target = [Frame("my_target", f.filename, 1) if f.name == "_worker_loop" else f for f in fork_of_rank]
    assert not find_job(launcher, stacks=lambda pid: other_target).is_job
    # stacks unreadable (no py-spy, no permission): no job rather than a guess
    assert not find_job(launcher, stacks=lambda pid: None).is_job


def test_a_plain_process_is_no_job() -> None:
    job = find_job(os.getpid(), stacks=lambda pid: None)
    assert not job.is_job and job.root == os.getpid() and job.note
    gone = find_job(2**22 + 12345, stacks=lambda pid: None)
    assert not gone.is_job and gone.note == "the process exited"


@pytest.mark.parametrize(
    ("cmdline", "kind"),
    [
        ("/usr/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 train.py", "torchrun"),
        ("/venv/bin/python /venv/bin/torchrun --nproc_per_node 2 train.py", "torchrun"),
        ("python -m deepspeed.launcher.launch --world_info=x train.py", "torchrun"),
        ("python train.py --epochs 3", None),
        ("python -c from multiprocessing.spawn import spawn_main --multiprocessing-fork", None),
    ],
)
def test_launchers_by_command_line(cmdline: str, kind: str | None) -> None:
    assert launcher_kind(cmdline) == kind


def test_the_job_report_says_which_ranks_got_a_hook_and_why_not() -> None:
    now = time.time()
    job = Job(10, 10, "torchrun", (Member(11, now, 0, "env"), Member(12, now, 1, "env")))
    injected = [
        Injected(11, True, True, "torchwatch: hook injected into PID 11", 12.5, "ptrace"),
        Injected(12, False, False, "torchwatch: watching PID 12 from outside only: permission denied"),
    ]
    rep = job_report(job, injected)
    jsonschema.validate(rep, SCHEMA_INJECTION)
    assert rep["injected"] and rep["hooked"] and rep["pause_ms"] == 12.5 and rep["method"] == "ptrace"
    assert rep["reason"] == "hook in 1 of 2 ranks of the job"
    assert [(r["pid"], r["hooked"]) for r in rep["ranks"]] == [(11, True), (12, False)]
    assert "permission denied" in rep["ranks"][1]["reason"]
    assert rep["job"]["launcher_pid"] == 10 and [r["rank"] for r in rep["job"]["ranks_found"]] == [0, 1]
    untried = job_report(job, [], tried=False)
    jsonschema.validate(untried, SCHEMA_INJECTION)
    assert not untried["injected"] and untried["reason"].startswith("--no-inject")


def test_an_injected_spawn_rank_knows_its_index_without_the_parents_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranks, "spawn_index", lambda: 1)
    info = ranks.Identity().info(environ={})
    assert info is not None and info.local_rank == 1 and info.source("local_rank") == "mp.spawn index"
    monkeypatch.setattr(ranks, "spawn_index", lambda: None)
    assert ranks.Identity().info(environ={}) is None

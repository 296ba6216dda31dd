"""Rank identity, the torch.multiprocessing.spawn mark, and the per-rank wire records (no torch)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from torchwatch import wire
from torchwatch.hook import ranks, should_install

INST = wire.Instance(123, 4567, 4026531836)
SPAWN_CHILD = ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5)"]


# -- who is a rank ------------------------------------------------------------------------------
def test_a_spawned_child_is_a_rank_only_when_its_parent_marked_it() -> None:
    argv = [*SPAWN_CHILD, "--multiprocessing-fork"]
    assert should_install(argv) == (False, "multiprocessing child")  # a spawned DataLoader worker
    assert should_install(argv, spawn_mark=INST.dir_name) == (True, "")
    # helpers started while the mark is set stay out
    tracker = ["python", "-c", "from multiprocessing.resource_tracker import main;main(7)"]
    assert not should_install(tracker, spawn_mark=INST.dir_name)[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["python", "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "train.py"],
        ["python", "-m", "deepspeed.launcher.runner", "train.py"],
        ["python", "/venv/bin/deepspeed", "train.py"],
    ],
)
def test_deepspeed_launchers_leave_the_hook_to_their_ranks(argv: list[str]) -> None:
    # deepspeed's runner starts "python -u -m deepspeed.launcher.launch", which starts the ranks
    assert not should_install(argv)[0]


def test_the_mark_is_taken_out_of_the_environment_and_checked() -> None:
    env = {ranks.SPAWN_MARK: INST.dir_name, "OTHER": "x"}
    assert ranks.take_spawn_mark(env) == INST.dir_name and env == {"OTHER": "x"}
    for bad in ("", "../x", "1-2", "0-1-2", "123-4567-4026531836/..", "x" * 1000):
        env = {ranks.SPAWN_MARK: bad}
        assert ranks.take_spawn_mark(env) is None and env == {}
    assert ranks.take_spawn_mark({}) is None


def test_the_rank_environment_preloads_the_hook_and_marks_the_child() -> None:
    env = ranks.rank_environment(INST, (5, 9), {"PYTHONPATH": "/mine"})
    boot = Path(ranks.__file__).parent / "boot"
    assert env["PYTHONPATH"] == f"{boot}{os.pathsep}/mine" and (boot / "sitecustomize.py").exists()
    assert env["TORCHWATCH_HOOK"] == "1" and env["TORCHWATCH_BURST_AT"] == "5,9"
    assert (Path(env["TORCHWATCH_HOOK_PATH"]) / "torchwatch" / "hook" / "ranks.py").exists()
    assert env[ranks.SPAWN_MARK] == INST.dir_name
    assert "TORCHWATCH_BURST_AT" not in ranks.rank_environment(INST, (), {})
    assert ranks.rank_environment(INST, (), {})["PYTHONPATH"] == str(boot)


# -- identity -----------------------------------------------------------------------------------
TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "TORCHELASTIC_RUN_ID": "abc-123",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


def test_identity_from_torchrun_environment() -> None:
    info = ranks.Identity().info(environ=TORCHRUN)
    assert info is not None
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size, info.group_rank) == (3, 1, 4, 2, 1)
    assert info.job == "abc-123" and info.spawned_by is None
    assert {info.source(f) for f in ("rank", "local_rank", "world_size", "job")} == {"env"}


def test_the_job_key_falls_back_to_the_master_address_then_the_spawning_process() -> None:
    env = {**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}  # torchrun's default id is shared by unrelated jobs
    assert ranks.Identity().info(environ=env).job == "10.0.0.1:29500"  # type: ignore[union-attr]
    spawned = ranks.Identity(INST.dir_name).info(environ={})
    assert spawned is not None and spawned.job == f"mp.spawn:{INST.dir_name}"
    assert spawned.source("job") == "mp.spawn parent" and spawned.rank is None


def test_no_identity_without_a_sign_of_a_distributed_job() -> None:
    assert ranks.Identity().info(environ={"PATH": "/bin"}) is None
    bad = {"RANK": "-1", "WORLD_SIZE": "0", "LOCAL_RANK": "x", "GROUP_RANK": "99999999999"}
    assert ranks.Identity().info(environ=bad) is None


class _FakeDist:
    """What the identity reads of torch.distributed."""

    def __init__(self, initialized: bool) -> None:
        self.initialized = initialized

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def get_rank(self) -> int:
        return 1

    def get_world_size(self) -> int:
        return 2

    def get_backend(self) -> str:
        return "gloo"


def test_identity_from_torch_distributed_when_the_environment_says_nothing() -> None:
    ident = ranks.Identity(INST.dir_name)
    ident.learn(_FakeDist(False), "tcp://127.0.0.1:23456")
    assert ident.dist_rank is None and ident.init_address == "127.0.0.1:23456"
    ident.learn(_FakeDist(True))
    info = ident.info(environ={})
    assert info is not None
    assert (info.rank, info.world_size, info.backend) == (1, 2, "gloo")
    assert info.source("rank") == info.source("world_size") == "torch.distributed"
    # the environment wins where it speaks
    info = ident.info(environ={"RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert info is not None and info.source("rank") == "env" and info.job == "h:1"


def test_rank_info_round_trips_and_refuses_bad_values() -> None:
    info = ranks.Identity(INST.dir_name).info(environ=TORCHRUN)
    assert info is not None
    assert wire.RankInfo.decode(info.to_json(), "rank") == info
    for bad in (
        {"rank": -1},
        {"world_size": 0},
        {"rank": "1"},
        {"sources": {"rank": "guess"}},
        {"sources": {"pid": "env"}},
        {"spawned_by": "../../etc"},
        {"job": "x" * 1000},
    ):
        with pytest.raises(wire.WireError):
            wire.RankInfo.decode({**info.to_json(), **bad}, "rank")


def test_hook_json_carries_rank_step_source_and_spawned_ranks_and_stays_readable() -> None:
    info = wire.RankInfo(rank=1, world_size=2, sources=(("rank", "env"), ("world_size", "env")))
    rec = wire.HookRecord(
        INST, "3.11", "2.13", 1.0, 12, True, step_source="backward", rank=info, spawned_ranks=(200, 201)
    )
    data = rec.to_json()
    assert data["schema"] == "torchwatch.hook/2"  # new keys are optional: the schema stays
    assert wire.HookRecord.decode(data) == rec
    old = {k: v for k, v in data.items() if k not in ("step_source", "rank", "spawned_ranks")}
    assert wire.HookRecord.decode(old) == wire.HookRecord(INST, "3.11", "2.13", 1.0, 12, True)
    for key, bad in (("step_source", "guess"), ("spawned_ranks", [0]), ("spawned_ranks", list(range(1, 300)))):
        with pytest.raises(wire.WireError):
            wire.HookRecord.decode({**data, key: bad})


# -- burst requests for every rank --------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("job-1.burst_2", True),
        ("a" * 64, True),
        ("a" * 65, False),
        ("", False),
        (".", False),
        ("..", False),
        ("a/b", False),
        ("a b", False),
        ("é", False),
        (5, False),
        (None, False),
    ],
)
def test_group_names(name: object, ok: bool) -> None:
    assert wire.group_name_ok(name) is ok


def test_a_request_names_its_start_step_and_group() -> None:
    req = wire.BurstRequest.from_request({"start_step": 120, "group": "job-7", "steps": 5})
    assert (req.start_step, req.group, req.steps) == (120, "job-7", 5)
    assert wire.BurstRequest.from_request(req.to_json()) == req
    bad = wire.BurstRequest.from_request({"start_step": -3, "group": "../x"})
    assert (bad.start_step, bad.group) == (None, None)
    assert wire.BurstRequest.from_request({"start_step": True}).start_step is None
    assert len(wire.encode_json(req.to_json())) < wire.REQUEST_MAX_BYTES


def test_burst_results_name_their_steps_group_and_rank_only_when_set() -> None:
    res = wire.BurstResult(3, start_step=10, first_step=11, group="g", rank=1)
    assert wire.BurstResult.decode(res.to_json(), "b") == res
    assert "group" not in wire.BurstResult(3).to_json()
    with pytest.raises(wire.WireError):
        wire.BurstResult.decode({**res.to_json(), "group": "../x"}, "b")


# -- counters, version 3 ------------------------------------------------------------------------
def _counters(tmp_path: Path) -> tuple[wire.Counters, int]:
    fd = wire.open_dir(tmp_path, (os.geteuid(),), private=False)
    return wire.Counters(fd, INST), fd


def _read(fd: int) -> wire.CounterSnapshot:
    return wire.read_counters(fd, (os.geteuid(),), INST)


def test_counters_carry_backward_and_collective_times_per_step(tmp_path: Path) -> None:
    c, fd = _counters(tmp_path)
    try:
        c.set_step_source("backward")
        c.step(1.0, None, 0.0)
        c.backward_started(1.5)
        c.collective_started(1.6)
        snap = _read(fd)
        assert (snap.in_backward_since, snap.in_collective_since, snap.step_source) == (1.5, 1.6, "backward")
        c.collective_ended(0.1)
        c.backward_ended(0.4, 0.3, flush=False)
        c.step(2.0, 1.0, 0.2, 0.4, 0.3, 0.1)
        snap = _read(fd)
        assert (snap.backward_calls, snap.collective_calls, snap.steps) == (1, 1, 2)
        assert (snap.backward_s, snap.backward_blocked_s, snap.collective_s) == (0.4, 0.3, 0.1)
        assert snap.in_backward_since == snap.in_collective_since == 0.0
        assert snap.entries == ((2.0, 1.0, 0.2),)  # the old shape, for readers that know only it
        (step,) = snap.rank_steps()
        assert step == wire.RankStep(2.0, 1.0, 0.2, 0.4, 0.3, 0.1)
        assert step.collective_wait(True) == pytest.approx(0.4) and step.collective_wait(False) == 0.1
        assert step.before_collective() == pytest.approx(1.0 - 0.2 - 0.4 - 0.1)
    finally:
        c.close()
        os.close(fd)


def test_counters_of_another_version_are_refused_with_a_reason(tmp_path: Path) -> None:
    c, fd = _counters(tmp_path)
    c.close()
    try:
        path = tmp_path / wire.COUNTERS_FILE
        data = bytearray(path.read_bytes())
        data[:8] = b"TWH2" + (2).to_bytes(4, "little")
        path.write_bytes(bytes(data))
        with pytest.raises(wire.WireError, match="version 3"):
            _read(fd)
        data[:8] = wire.COUNTERS_MAGIC + wire.COUNTERS_VERSION.to_bytes(4, "little")
        off = wire.DYNAMIC_OFFSET + 8 * 10  # the step source
        data[off : off + 8] = (9).to_bytes(8, "little")
        path.write_bytes(bytes(data))
        with pytest.raises(wire.WireError, match="step source"):
            _read(fd)
    finally:
        os.close(fd)


# -- the job key shared across nodes (issue 31) -------------------------------------------------
@pytest.mark.parametrize(
    ("environ", "key"),
    [
        ({"TORCHWATCH_JOB": "train-llm", "TORCHELASTIC_RUN_ID": "abc", "MASTER_ADDR": "n1"}, "train-llm"),
        ({"TORCHELASTIC_RUN_ID": "abc", "MASTER_ADDR": "n1", "MASTER_PORT": "1", "SLURM_JOB_ID": "7"}, "abc"),
        ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}, "n1:29500"),
        ({"MASTER_ADDR": "n1", "MASTER_PORT": "29500", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}, "n1:29500"),
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "2"}, "slurm:7.2"),
        ({"SLURM_JOB_ID": "7"}, "slurm:7"),
        ({"SLURM_JOB_ID": "x7"}, None),
        ({}, None),
    ],
)
def test_the_job_key_is_the_first_the_launcher_set(environ: dict[str, str], key: str | None) -> None:
    assert ranks.job_from_env(environ) == key


def test_a_loopback_rendezvous_is_qualified_by_the_node() -> None:
    """Two single-node jobs on two nodes, both on 127.0.0.1:29500, are not one job."""
    import socket

    for addr in ("127.0.0.1", "localhost", "::1"):
        key = ranks.job_from_env({"MASTER_ADDR": addr, "MASTER_PORT": "29500"})
        assert key == f"{socket.gethostname()}/{addr}:29500"
    info = ranks.Identity().info(environ={"RANK": "0", "TORCHWATCH_JOB": "j\x1b[31m"})
    assert info is not None and info.job == "j[31m" and info.source("job") == "env"  # no control characters

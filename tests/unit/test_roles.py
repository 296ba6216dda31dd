"""Roles by what a process does (issue 47): a child of the training that runs torch's DataLoader
worker loop is a worker, one that runs forward/backward/optimizer steps is a trainer; the
trainers' features and the cpu-oversubscribed-trainers rule."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time

import pytest

from tests.unit.busy import _settled
from tests.unit.hookrecords import hook_record
from tests.unit.procs import PY, TRAIN, node
from torchwatch.analysis.features import _collective_wait, collective_cpu, trainer_features
from torchwatch.analysis.roles import TRAINER, WORKER, classify
from torchwatch.analysis.store import Window
from torchwatch.model.hang import DumpedThread
from torchwatch.model.readings import Frame, HookState, ProcessSample, Role, ThreadSample, Wait
from torchwatch.sources.proc import ProcessTree, ThreadStateSource, assign_roles
from torchwatch.watch import roles as role_probe
from torchwatch.watch.roles import RoleProbe
from torchwatch.wire import RankStep

SITE = "/usr/lib/python3.11/site-packages/"
BOOT = (
    Frame("<module>", "train.py", 30),
    Frame("BaseProcess._bootstrap", "/usr/lib/python3.11/multiprocessing/process.py", 314),
)


def thread(*frames: Frame, tid: int = 1) -> DumpedThread:
    return DumpedThread(tid=tid, name="MainThread", active=True, frames=(*BOOT, *frames))


WORKER_WAITING = thread(
    Frame("_worker_loop", SITE + "torch/utils/data/_utils/worker.py", 302),
    Frame("Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py", 113),
)
WORKER_IN_A_MODEL = thread(
    Frame("_worker_loop", SITE + "torch/utils/data/_utils/worker.py", 349),
    Frame("Features.__getitem__", "data.py", 12),
    Frame("Module._call_impl", SITE + "torch/nn/modules/module.py", 1789),
)
TRAINER_FORWARD = thread(
    Frame("train", "hogwild.py", 74),
    Frame("Module._wrapped_call_impl", SITE + "torch/nn/modules/module.py", 1778),
    Frame("Linear.forward", SITE + "torch/nn/modules/linear.py", 134),
)
TRAINER_BACKWARD = thread(
    Frame("train", "hogwild.py", 74),
    Frame("Tensor.backward", SITE + "torch/_tensor.py", 630),
    Frame("_engine_run_backward", SITE + "torch/autograd/graph.py", 841),
)
# The first optimizer.step() of a forked trainer imports parts of torch lazily (seen for 8 s).
TRAINER_FIRST_STEP = thread(
    Frame("train", "hogwild.py", 76),
    Frame("Optimizer.profile_hook_step.<locals>.wrapper", SITE + "torch/optim/optimizer.py", 517),
    Frame("_find_and_load", "<frozen importlib._bootstrap>", 1176),
    Frame("<module>", SITE + "torch/_dynamo/__init__.py", 3),
)
IMPORTING_OPTIM = thread(
    Frame("_find_and_load", "<frozen importlib._bootstrap>", 1176),
    Frame("<module>", SITE + "torch/optim/__init__.py", 10),
)
SETTING_UP = thread(Frame("make_data", "hogwild.py", 40), Frame("randn", SITE + "torch/random.py", 20))


@pytest.mark.parametrize(
    ("threads", "want"),
    [
        ([WORKER_WAITING], WORKER),
        ([WORKER_IN_A_MODEL], WORKER),  # the worker loop wins over a forward in its dataset
        ([TRAINER_FORWARD], TRAINER),
        ([TRAINER_BACKWARD], TRAINER),
        ([TRAINER_FIRST_STEP], TRAINER),
        ([SETTING_UP, TRAINER_BACKWARD], TRAINER),
        ([IMPORTING_OPTIM], None),  # importing torch.optim is no optimizer step
        ([SETTING_UP], None),
        ([], None),
    ],
)
def test_a_childs_role_is_what_its_stacks_run(threads: list[DumpedThread], want: str | None) -> None:
    assert classify(threads) == want


def test_trainers_are_training_processes_and_their_own_workers_stay_workers() -> None:
    spawn = (
        PY,
        "-c",
        "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
        "--multiprocessing-fork",
    )
    nodes = {
        100: node(1, TRAIN),
        101: node(100, TRAIN),  # forked trainer
        102: node(100, spawn),  # spawned trainer
        103: node(100, TRAIN),  # a DataLoader worker of the main
        104: node(101, TRAIN),  # a DataLoader worker of the forked trainer
    }
    assert assign_roles(nodes, 100) == dict.fromkeys((101, 102, 103, 104), Role.WORKER) | {100: Role.MAIN}
    assert assign_roles(nodes, 100, trainers={101, 102}) == {
        100: Role.MAIN,
        101: Role.MAIN,
        102: Role.MAIN,
        103: Role.WORKER,
        104: Role.WORKER,
    }


@pytest.fixture
def forked_pair() -> object:
    """A Python process and one forked child of it (same command line: a worker by its command line)."""
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nelse:\n    time.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        tree = ProcessTree(proc.pid)
        while len(tree.nodes()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            tree.refresh()
        yield tree
    finally:
        for pid in ProcessTree(proc.pid).pids() if proc.poll() is None else []:
            if pid != proc.pid:
                subprocess.run(["kill", str(pid)], check=False)
        proc.kill()
        proc.wait()


def test_the_probe_makes_a_training_child_a_trainer(forked_pair: ProcessTree) -> None:
    tree = forked_pair
    (child,) = [n for n in tree.nodes().values() if n.pid != tree.root]
    assert child.role is Role.WORKER
    now = [0.0]
    answers = [[SETTING_UP], [TRAINER_FORWARD]]
    asked: list[int] = []

    def dump(pid: int) -> tuple[tuple[DumpedThread, ...], str | None, float]:
        asked.append(pid)
        return tuple(answers.pop(0)), None, 0.01

    probe = RoleProbe(tree, dump=dump, clock=lambda: now[0])
    assert probe.round() == 0  # still setting up: undecided
    assert probe.round() == 0 and asked == [child.pid]  # not asked again before PROBE_EVERY_S
    now[0] += role_probe.PROBE_EVERY_S
    assert probe.round() == 1
    tree.refresh()
    after = tree.nodes()[child.pid]
    assert (after.role, after.trainer) == (Role.MAIN, True)
    assert tree.undecided() == []
    assert tree.mains() == [tree.root, child.pid]


def test_a_dump_that_fails_once_is_asked_again_and_the_trainer_found(forked_pair: ProcessTree) -> None:
    """py-spy's non-blocking dump of a trainer still importing torch can fail once ("Failed to get
    stack traces"): the next round reads it, and it is a trainer, not a worker by its command line."""
    tree = forked_pair
    (child,) = [n for n in tree.nodes().values() if n.pid != tree.root]
    now = [0.0]
    answers: list[tuple[tuple[DumpedThread, ...], str | None, float]] = [
        ((), "py-spy failed: Error: Failed to get stack traces", 0.01),
        ((TRAINER_FORWARD,), None, 0.01),
    ]
    probe = RoleProbe(tree, dump=lambda pid: answers.pop(0), clock=lambda: now[0])
    assert probe.round() == 0
    now[0] += role_probe.PROBE_EVERY_S
    assert probe.round() == 1
    tree.refresh()
    assert tree.nodes()[child.pid].role is Role.MAIN and tree.undecided() == []


def test_the_probe_leaves_a_child_that_never_shows_steps_to_its_command_line(forked_pair: ProcessTree) -> None:
    tree = forked_pair
    now = [0.0]
    asked: list[float] = []

    def dump(pid: int) -> tuple[tuple[DumpedThread, ...], str | None, float]:
        asked.append(now[0])
        return (SETTING_UP,), None, 0.01

    probe = RoleProbe(tree, dump=dump, clock=lambda: now[0])
    while now[0] < role_probe.GIVE_UP_S + 20:
        probe.round()
        now[0] += role_probe.PROBE_EVERY_S
    assert max(asked) <= role_probe.GIVE_UP_S
    assert all(n.role is not Role.MAIN for n in tree.nodes().values() if n.pid != tree.root)
    # py-spy cannot read a child: it is asked DUMP_ATTEMPTS times, then left to its command line
    failing: list[int] = []
    probe3 = RoleProbe(
        tree, dump=lambda pid: (failing.append(pid), ((), "permission denied", 0.0))[1], clock=lambda: now[0]
    )
    for _ in range(role_probe.DUMP_ATTEMPTS + 3):
        probe3.round()
        now[0] += role_probe.PROBE_EVERY_S
    assert len(failing) == role_probe.DUMP_ATTEMPTS
    # a real worker is decided as one, and never asked again
    probe2 = RoleProbe(tree, dump=lambda pid: ((WORKER_WAITING,), None, 0.01), clock=lambda: 0.0)
    assert probe2.round() == 1
    tree.refresh()
    assert tree.undecided() == [] and tree.mains() == [tree.root]


def _trainer_window(trainers: int, threads_each: int, queued: float, cpus: float = 2.0) -> Window:
    """``trainers`` trainer processes (plus an idle main), each with ``threads_each`` threads busy
    the whole window, a ``queued`` share of it waiting for a CPU; and one idle thread each."""
    procs, threads = [], []
    for t in range(11):
        procs.append(ProcessSample(t, 10, 1, Role.MAIN, "python", TRAIN, 2.0, 1, None, None, 3))
        for i in range(trainers):
            pid = 20 + i
            procs.append(
                ProcessSample(t, pid, 10, Role.MAIN, "python", TRAIN, 100 * cpus / trainers, 1, None, None, 5, True)
            )
            for k in range(threads_each + 1):
                busy = 1.0 if k < threads_each else 0.01
                threads.append(
                    ThreadSample(
                        float(t), pid, pid * 100 + k, Role.MAIN, k == 0, "R", Wait.RUNNING,
                        run_s=t * busy * (1 - queued), runq_s=t * busy * queued,
                    )
                )  # fmt: skip
    return Window(0.0, 10.0, processes=procs, threads=threads)


def test_a_process_that_started_the_others_is_no_rank() -> None:
    """The Hogwild main (or a torch.multiprocessing.spawn launcher) joins its 4 children: 4 ranks."""
    from torchwatch.analysis.features import compute

    assert compute(_trainer_window(4, 2, 0.5), None)["local_ranks"] == 4


def test_trainer_features_count_the_trainers_busy_threads_from_outside() -> None:
    f = trainer_features(_trainer_window(4, 2, 0.75), 2.0)
    assert f["trainer_count"] == 4
    assert f["trainer_busy_threads"] == 8 and f["trainer_threads"] == 2
    assert f["trainers_runqueue_share"] == pytest.approx(0.75)
    assert f["trainer_suggested_threads"] == 1
    assert f["trainers_cpu_pct"] == pytest.approx(200.0)
    none = trainer_features(
        Window(0.0, 10.0, processes=[p for p in _trainer_window(2, 1, 0.1).processes if p.pid == 10]), 2.0
    )
    assert none["trainer_count"] == 0 and none["trainer_busy_threads"] is None


HOGWILD = {"trainer_count": 4.0, "trainer_busy_threads": 8.0, "trainer_threads": 2.0, "usable_cpus": 2.0,
           "trainer_suggested_threads": 1.0, "trainers_runqueue_share": 0.8}  # fmt: skip


def test_hogwild_trainers_beyond_the_cpus_are_cpu_bound_with_one_share_each() -> None:
    found, label, confidence = _settled(["cpu-oversubscribed-trainers"], **HOGWILD)
    assert (found, label) == (["cpu-oversubscribed-trainers"], "cpu-bound")
    assert confidence >= 0.9  # waiting 80 % of the time they want a CPU: most of the trainers' time


def test_a_trainer_pool_waiting_less_reads_a_lower_confidence() -> None:
    found, _, confidence = _settled(["cpu-oversubscribed-trainers"], **{**HOGWILD, "trainers_runqueue_share": 0.3})
    assert found == ["cpu-oversubscribed-trainers"] and confidence < 0.9


@pytest.mark.parametrize(
    "change",
    [
        {"trainer_busy_threads": 2.0, "trainer_threads": 1.0},  # 2 trainers x 1 thread fit 2 CPUs
        {"trainers_runqueue_share": 0.1},  # beyond the CPUs, but the threads hardly wait
        {"trainer_count": 1.0},  # one trainer: cpu-oversubscribed's case
        {"trainer_count": 0.0, "trainer_busy_threads": None},
    ],
)
def test_the_trainers_rule_is_silent_where_they_fit_the_cpus(change: dict[str, float | None]) -> None:
    assert _settled(["cpu-oversubscribed-trainers"], **{**HOGWILD, **change})[0] == []


# -- ranks: the CPU work of CPU collectives is communication ------------------------------------


def test_gloos_threads_are_read_as_collective_threads() -> None:
    from tests.unit.procs import _named_thread

    stop = threading.Event()
    gloo = threading.Thread(target=_named_thread, args=(b"pt_gloo_runloop", threading.Event(), stop), daemon=True)
    other = threading.Thread(target=_named_thread, args=(b"pt_tcpstore_uv", threading.Event(), stop), daemon=True)
    gloo.start()
    other.start()
    try:
        time.sleep(0.1)
        src = ThreadStateSource(ProcessTree(os.getpid()), interval=0.1, all_interval=1.0)
        full = {s.tid: s for s in src.sample(100.0) if isinstance(s, ThreadSample)}
        assert full[gloo.native_id].collective and full[gloo.native_id].run_s is not None
        assert not full[other.native_id].collective and not full[os.getpid()].collective
    finally:
        stop.set()
        gloo.join(5)
        other.join(5)


def _rank_window(comm_cpu: float, compute_cpu: float) -> Window:
    """4 ranks, each a main thread computing ``compute_cpu`` of a core and a gloo thread
    ``comm_cpu`` (run time per second), read once a second for 10 s."""
    threads = []
    for t in range(11):
        for r in range(4):
            pid = 30 + r
            threads.append(
                ThreadSample(float(t), pid, pid, Role.MAIN, True, "R", Wait.RUNNING, run_s=t * compute_cpu, runq_s=0.0)
            )
            gloo = ThreadSample(float(t), pid, pid * 10, Role.MAIN, False, "R", Wait.RUNNING, run_s=t * comm_cpu)
            threads.append(dataclasses.replace(gloo, runq_s=0.0, collective=True))
    return Window(0.0, 10.0, threads=threads)


def test_collective_cpu_share_is_the_gloo_threads_part_of_the_ranks_cpu() -> None:
    assert collective_cpu(_rank_window(0.3, 0.1))["collective_cpu_share"] == pytest.approx(0.75)
    assert collective_cpu(_rank_window(0.0, 0.5))["collective_cpu_share"] == 0.0
    assert collective_cpu(Window(0.0, 10.0))["collective_cpu_share"] is None


def _steps_window(blocked_s: float, step_s: float = 0.24, n: int = 20) -> Window:
    """A rank of a 4-rank CPU job (DDP): ``n`` steps of ``step_s``, ``blocked_s`` of each blocked
    in backward (the reducer's all-reduce)."""
    rec = hook_record(30, rank={"rank": 0, "world_size": 4}, cuda_initialized=False)
    steps = tuple(RankStep(1.0 + i * step_s, step_s, 0.0, blocked_s + 0.05, blocked_s, 0.0) for i in range(n))
    state = HookState(1.0 + n * step_s, 30, n, n, 0.0, 0.0, record=rec, rank_steps=steps)
    return Window(0.0, 1.0 + n * step_s + 0.1, hook=[state])


def test_a_main_thread_queueing_behind_gloos_threads_waits_on_communication() -> None:
    """4 gloo ranks on 2 cores (tests/scenarios/distributed/gloo_4_ranks.py under torchrun read
    175 of 235 ms blocked, main thread run-queue 0.41): the run-queue wait that gloo's CPU work
    causes is no longer taken out of the collective wait."""
    window = _steps_window(0.175, 0.235)
    base = {"main_runqueue_share": 0.41}
    alone = _collective_wait(window, 30, {**base, "collective_cpu_share": 0.0})["collective_wait_share"]
    assert alone == pytest.approx(0.745 - 0.41, abs=0.01)
    behind_gloo = _collective_wait(window, 30, {**base, "collective_cpu_share": 0.7})["collective_wait_share"]
    assert behind_gloo == pytest.approx(0.745 - 0.41 * 0.3, abs=0.01)


OVERSUBSCRIBED = {"cpu_threads_wanted": 4.0, "intra_op_threads": 1.0, "local_ranks": 4.0, "worker_count": 0.0,
                  "usable_cpus": 2.0, "cpu_wait_share": 0.45, "main_runqueue_share": 0.41,
                  "threads_runqueue_share": 0.45}  # fmt: skip


def test_ranks_queueing_behind_their_all_reduce_are_communication_not_oversubscription() -> None:
    assert _settled(["cpu-oversubscribed"], **OVERSUBSCRIBED, collective_cpu_share=0.1)[0] == ["cpu-oversubscribed"]
    assert _settled(["cpu-oversubscribed"], **OVERSUBSCRIBED, collective_cpu_share=0.6)[0] == []
    found, _, _ = _settled(
        ["ranks-collective-wait"], **OVERSUBSCRIBED, collective_cpu_share=0.6, collective_wait_share=0.62
    )
    assert found == ["ranks-collective-wait"]

"""Collectives: the share of the step a rank waits on its peers, and the CPU the collectives'
own threads use."""

from __future__ import annotations

from collections import defaultdict

from torchwatch.analysis.features.catalogue import Features
from torchwatch.analysis.features.steps import Step, step
from torchwatch.analysis.features.threads import _growth
from torchwatch.analysis.store import Window
from torchwatch.model.readings import Role, ThreadSample
from torchwatch.wire import HookRecord, RankStep


def backward_is_comm(rec: HookRecord | None) -> bool:
    """Whether the blocked part of a rank's backward is DDP's gradient all-reduce: a rank of a job
    of several processes whose backward runs on the CPU (CUDA not initialised), per its hook's
    record ``rec`` (:meth:`RankStep.collective_wait`)."""
    info = rec.rank if rec is not None else None
    multi = info is not None and (info.world_size or 0) > 1
    return multi and rec is not None and not rec.cuda_initialized


def rank_collective_wait(rec: HookRecord | None, step: RankStep) -> float:
    """Time ``step`` of a rank spent blocked on its peers, s (:meth:`RankStep.collective_wait`):
    the blocked part of backward counts only where :func:`backward_is_comm`."""
    return step.collective_wait(backward_is_comm(rec))


def collective_cpu(window: Window) -> Features:
    """``collective_cpu_share``: of the CPU time (schedstat run time) of every thread of the
    training processes (role main) in ``window``, the part of the threads that run CPU
    collectives (:attr:`ThreadSample.collective`: gloo's). Every thread's counters are read once
    a second. ``None`` when no thread's counters cover 1 s, or the processes used no CPU.

    Gloo over loopback does its all-reduce on the CPU: ring copies and sums on its own threads.
    On a machine with fewer cores than ranks those threads hold the CPUs the ranks' main threads
    queue for, and that queueing is communication, not oversubscription (issue 47: 4 gloo ranks
    on 2 cores read "cpu-oversubscribed" while accumulating 5 steps per all-reduce ran 2.55x
    faster and halving the compute 1.01x).
    """
    threads: dict[tuple[int, int], list[ThreadSample]] = defaultdict(list)
    for th in window.threads:
        if th.role is Role.MAIN and th.run_s is not None:
            threads[(th.pid, th.tid)].append(th)
    total = comm = 0.0
    seen = False
    for samples in threads.values():
        rate = _growth(samples, "run_s")
        if rate is None or rate < 0:
            continue
        seen = True
        total += rate
        if samples[-1].collective:
            comm += rate
    if not seen or total <= 0:
        return {"collective_cpu_share": None}
    return {"collective_cpu_share": min(1.0, comm / total)}


def _collective_wait(window: Window, main_pid: int | None, f: Features) -> Features:
    """Share of the step time blocked on peers, less the main thread's run-queue share that
    the collectives' own CPU work does not explain.

    A thread that lost its core counts as blocked in the hook's estimate (wall minus thread
    CPU time), so on an oversubscribed machine every rank looks as if it waited in backward;
    the main thread's run-queue wait (schedstat) over the same window is that part, and is taken
    out, but only for the share of the training's CPU that is not the CPU collectives' own
    (``collective_cpu_share``): a main thread queueing behind gloo's threads waits on
    communication (4 gloo ranks on 2 cores: runq 0.41 of the step left 0.33 of a measured 0.75 all
    taken out). ``None`` without per-step readings; 0 for a process that is no rank and calls no
    collective.
    """
    n, total, waited = 0, 0.0, 0.0  # one pass over the window's steps (hundreds a second on a fast loop)
    for h in window.hook:
        if main_pid is not None and h.pid != main_pid:
            continue
        comm = backward_is_comm(h.record)  # one record a reading: its steps share it
        for s in h.rank_steps:
            if window.start <= s.end <= window.end:
                n += 1
                total += s.duration
                waited += s.collective_wait(comm)
    if n < 2 or total <= 0:
        return {"collective_wait_share": None}
    blocked = waited / total
    runq = (f.get("main_runqueue_share") or 0.0) * (1.0 - (f.get("collective_cpu_share") or 0.0))
    return {"collective_wait_share": max(0.0, min(1.0, blocked - runq))}


STEPS: tuple[Step, ...] = (
    step("collective_cpu", lambda w, pid, f: collective_cpu(w), ("collective_cpu_share",)),
    step(
        "collective_wait",
        _collective_wait,
        ("collective_wait_share",),
        needs=("main_runqueue_share", "collective_cpu_share"),
    ),
)
"""The collectives' own CPU, then the step's wait on peers less the run-queue wait it does not explain."""

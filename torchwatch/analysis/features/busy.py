"""Trainers on a busy machine: the threads each training process keeps busy and the share of
their time spent waiting for a CPU (many ranks or trainers on few cores)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

from torchwatch.analysis.features.catalogue import Features
from torchwatch.analysis.features.common import _mean
from torchwatch.analysis.features.steps import Step, step
from torchwatch.analysis.features.threads import BUSY_THREAD_SHARE, _sched_shares
from torchwatch.analysis.store import Window
from torchwatch.model.readings import ThreadSample


def trainer_features(window: Window, usable_cpus: float | None) -> Features:
    """The trainers of the window (processes marked ``trainer``: children of a training process
    whose stacks showed training steps, :mod:`torchwatch.analysis.roles`) and how their threads
    share the CPUs.

    A trainer started by ``multiprocessing`` has no hook (its ``torch.get_num_threads()`` is not
    published), so its threads are counted from outside: a thread on a CPU or waiting for one
    (schedstat ``run_s + runq_s``) >= :data:`BUSY_THREAD_SHARE` of the window is one the trainer
    runs at once (an intra-op thread spinning at its barrier counts: it holds a CPU). Every
    thread's counters are read once a second (:class:`~torchwatch.sources.proc.ThreadStateSource`).

    Returns:
        ``trainer_count`` (0 without trainers), ``trainer_busy_threads``, ``trainer_threads``,
        ``trainers_runqueue_share`` (run-queue time / (run + run-queue time) of the busy threads,
        summed: the share of their demand the CPUs did not serve), ``trainers_cpu_pct`` and
        ``trainer_suggested_threads``; the thread figures ``None`` when no trainer thread's
        counters cover 1 s.
    """
    none: Features = dict.fromkeys(
        ("trainer_busy_threads", "trainer_threads", "trainers_runqueue_share", "trainers_cpu_pct"), None
    )
    if not window.processes:
        return {"trainer_count": None, "trainer_suggested_threads": None, **none}
    last_t = window.processes[-1].t
    trainers = {p.pid for p in window.processes if p.t == last_t and p.trainer}
    out: Features = {"trainer_count": float(len(trainers)), **none}
    out["trainer_suggested_threads"] = (
        float(max(1, math.floor(usable_cpus / len(trainers)))) if trainers and usable_cpus else None
    )
    if not trainers:
        return out
    cpu: dict[float, float] = defaultdict(float)
    for p in window.processes:
        if p.pid in trainers and p.cpu_pct is not None:
            cpu[p.t] += p.cpu_pct
    out["trainers_cpu_pct"] = _mean(cpu.values())
    threads: dict[tuple[int, int], list[ThreadSample]] = defaultdict(list)
    for th in window.threads:
        if th.pid in trainers and th.runq_s is not None:
            threads[(th.pid, th.tid)].append(th)
    per_trainer: dict[int, int] = dict.fromkeys(trainers, 0)
    run_sum = queued_sum = 0.0
    seen = False
    for (pid, _tid), samples in threads.items():
        sched = _sched_shares(samples)
        if sched is None:
            continue
        seen = True
        if sum(sched) >= BUSY_THREAD_SHARE:
            per_trainer[pid] += 1
            run_sum, queued_sum = run_sum + sched[0], queued_sum + sched[1]
    if not seen:
        return out
    out["trainer_busy_threads"] = float(sum(per_trainer.values()))
    out["trainer_threads"] = float(statistics.median(per_trainer.values()))
    out["trainers_runqueue_share"] = queued_sum / (run_sum + queued_sum) if run_sum + queued_sum > 0 else 0.0
    return out


TRAINER_FEATURES = (
    "trainer_count", "trainers_cpu_pct", "trainer_busy_threads", "trainer_threads", "trainers_runqueue_share",
    "trainer_suggested_threads",
)  # fmt: skip

STEPS: tuple[Step, ...] = (
    step(
        "trainers",
        lambda w, pid, f: trainer_features(w, f.get("usable_cpus")),
        TRAINER_FEATURES,
        needs=("usable_cpus",),
    ),
)
"""Training processes that are not DataLoader workers, and how their threads share the CPUs."""

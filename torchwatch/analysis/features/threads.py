"""The loop's threads as ``/proc`` and schedstat see them (10 Hz): running, waiting for a CPU, on
storage, asleep, on a socket; the intra-op threads' run-queue wait; the CPU wait of the loop."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from torchwatch.analysis.features.catalogue import MIN_THREAD_SAMPLES, Features
from torchwatch.analysis.features.steps import Step, step
from torchwatch.analysis.store import Window
from torchwatch.model.readings import Role, ThreadSample, Wait


def _growth(samples: Sequence[ThreadSample], *counters: str) -> float | None:
    """Growth of the sum of one thread's cumulative ``counters`` (s) per second of wall time, from
    the first sample that has them all to the last; ``None`` when those span < 1 s. Not clipped."""
    # the first and the last sample that have them all, scanned from each end (called for every
    # thread at every analysis: no list of the samples between)
    i = next((i for i, s in enumerate(samples) if all(getattr(s, c) is not None for c in counters)), None)
    if i is None:
        return None
    j = next(j for j in range(len(samples) - 1, i - 1, -1) if all(getattr(samples[j], c) is not None for c in counters))
    first, last = samples[i], samples[j]
    if j == i or last.t - first.t < 1.0:
        return None
    grown = sum(float(getattr(last, c)) - float(getattr(first, c)) for c in counters)
    return grown / (last.t - first.t)


def _rate(samples: list[ThreadSample], counter: str) -> float | None:
    """Growth of one thread's cumulative counter (``sys_s``, ``runq_s``) per second of wall time."""
    rate = _growth(samples, counter)
    return None if rate is None else max(0.0, min(1.0, rate))


def _io_kernel(sys_share: float | None, disk_share: float) -> float:
    """Kernel CPU time attributed to storage reads: system time, at most the disk wait itself.

    A storage read costs kernel CPU (syscall, page pinning for O_DIRECT, DMA mapping) beside
    its disk wait, and the thread is in state R, not D, for that part: measured on a 2-core
    virtual machine, ~25-30 us of kernel CPU per ~75 us 4 KiB O_DIRECT read. System time also
    comes from page faults of fresh allocations (41 % of a CPU-bound augmentation loop here),
    so only as much as the disk wait is attributed: with no disk wait, nothing.
    """
    return 0.0 if sys_share is None else min(sys_share, disk_share)


def _sched_shares(samples: Sequence[ThreadSample]) -> tuple[float, float] | None:
    """``(on a CPU, waiting for a CPU)``: shares of wall time of one thread, from the growth of its
    ``schedstat`` counters (``run_s``, ``runq_s``) from the first sample to the last. ``None`` as
    :func:`_busy_share` says."""
    if len({(s.pid, s.tid) for s in samples}) > 1:
        return None
    run, queued = _growth(samples, "run_s"), _growth(samples, "runq_s")
    if run is None or queued is None or run < 0 or queued < 0:
        return None
    return min(1.0, run), min(1.0 - min(1.0, run), queued)


def _busy_share(samples: Sequence[ThreadSample]) -> float | None:
    """Share of wall time one thread was on a CPU or ready for one (state R), from the growth of
    its ``schedstat`` counters (``run_s + runq_s``) from the first sample to the last.

    The scheduler counts these in nanoseconds, so the share is exact where the state letters,
    read at 5-10 Hz, are a sample: ~100 letters in a 10 s window stray +-0.04 for a thread busy
    15 % of the time, and more when the reads keep one phase of a periodic loop. A loop sleeping
    80 ms of each 96 ms step read 0.19-0.36 R from its letters on the tick grid, 0.15 from these
    counters.

    Returns:
        share in [0, 1]; ``None`` when the samples are of several threads, lack the counters,
        span < 1 s, or the counters went back (another thread behind a reused TID).
    """
    if len({(s.pid, s.tid) for s in samples}) > 1:
        return None
    busy = _growth(samples, "run_s", "runq_s")
    return None if busy is None or busy < 0 else min(1.0, busy)


def _state_shares(samples: Sequence[ThreadSample]) -> dict[str, float]:
    """Shares of one thread's (or one group's) time in each state: ``running`` (on a CPU) less
    the kernel time of storage reads, ``runqueue`` (ready to run, waiting for a CPU), ``disk``
    (state D, file reads, plus that kernel time), ``sleep``, ``sync``, ``net``, ``other``. The one
    math behind the loop's and the workers' state features and the states every face shows.

    State R is a thread on a CPU *or* waiting for one: the scheduler's counters tell the two
    apart (:func:`_sched_shares`), so a loop that waits for a CPU a neighbour holds is not taken
    for a loop that computes. The rest of the time is split between the waits in proportion to
    the samples that found the thread waiting (``other`` when none did). Without the counters (a
    group of threads, an old kernel) every share is its share of the samples and ``runqueue`` is
    0: not measured, the R samples count as ``running``."""
    counts = Counter(th.wait for th in samples)
    n = len(samples)
    sched = _sched_shares(samples)
    waiting = n - counts[Wait.RUNNING]
    if sched is None:
        oncpu, queued = counts[Wait.RUNNING] / n, 0.0
        scale = 1.0 / n
    else:
        oncpu, queued = sched
        scale = (1.0 - oncpu - queued) / waiting if waiting else 0.0
    disk = (counts[Wait.DISK] + counts[Wait.FILE]) * scale
    io_kernel = _io_kernel(_rate(list(samples), "sys_s"), disk)
    return {
        "running": max(0.0, oncpu - io_kernel),
        "runqueue": queued,
        "disk": min(1.0, disk + io_kernel),
        "sleep": counts[Wait.SLEEP] * scale,
        "sync": counts[Wait.SYNC] * scale,
        "net": counts[Wait.NET] * scale,
        "other": counts[Wait.OTHER] * scale + (max(0.0, 1.0 - oncpu - queued) if not waiting else 0.0),
    }


def _autograd_busy(window_threads: Iterable[ThreadSample], main_pid: int | None) -> float | None:
    """Share of wall time the loop's autograd engine threads (:attr:`ThreadSample.autograd`) were
    on a CPU or ready for one, from their ``schedstat`` counters, summed over the threads and
    capped at 1; ``None`` when the training has none (a CPU training: its backward runs on the
    thread that called it) or their counters do not cover 1 s."""
    threads: dict[tuple[int, int], list[ThreadSample]] = defaultdict(list)
    for th in window_threads:
        if th.autograd and th.role is Role.MAIN and (main_pid is None or th.pid == main_pid):
            threads[(th.pid, th.tid)].append(th)
    shares = [b for samples in threads.values() if (b := _busy_share(samples)) is not None]
    return min(1.0, sum(shares)) if shares else None


def _loop_shares(main: Sequence[ThreadSample], autograd: float | None) -> dict[str, float]:
    """The loop's state shares (:func:`_state_shares` of its main thread), with the time its
    autograd engine thread was busy moved from ``sync`` to ``running``.

    On CUDA, ``loss.backward()`` hands the graph to the engine's device thread (``pt_autograd_0``)
    and the calling thread sleeps on a futex until it is done: on an H200 (torch 2.11, recorded
    2026-11-26) demo/launch_bound.py's main thread read 45 % running and 55 % waiting on another
    thread, which the rules took for "the loop waits elsewhere", while the loop's CPU work, forward
    on one thread and backward on the other, was the whole step. What the main thread waits on
    while that thread runs is the loop's own CPU work, so at most the busy share of the engine
    thread moves, and never more than the main thread's sync share."""
    shares = _state_shares(main)
    if autograd:
        moved = min(autograd, shares["sync"])
        shares["running"] += moved
        shares["sync"] -= moved
    return shares


def _main_threads(
    window_threads: Iterable[ThreadSample], main_pid: int | None
) -> tuple[list[ThreadSample], dict[int, list[ThreadSample]]]:
    """The loop's main-thread samples (of ``main_pid``, or of any main when ``None``) and each
    DataLoader worker's main-thread samples (the thread that runs the dataset), by worker pid."""
    main: list[ThreadSample] = []
    workers: dict[int, list[ThreadSample]] = defaultdict(list)
    for th in window_threads:
        if not th.is_main_thread:
            continue
        if th.role is Role.MAIN and (main_pid is None or th.pid == main_pid):
            main.append(th)
        elif th.role is Role.WORKER:
            workers[th.pid].append(th)
    return main, workers


def thread_states(
    window_threads: Iterable[ThreadSample], main_pid: int | None
) -> tuple[tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]]:
    """``(state, share)`` of the loop's main thread and of the workers' main threads (each worker
    weighted by its samples), largest first, states with no sample left out: the shares the
    state features are made of (:func:`_state_shares`), for the faces.

    Args:
        window_threads: thread samples of the window.
        main_pid: the diagnosed training process; ``None`` takes any main.
    """
    window_threads = list(window_threads)  # read twice: the main threads, then the autograd threads
    main, workers = _main_threads(window_threads, main_pid)

    def ordered(shares: dict[str, float]) -> tuple[tuple[str, float], ...]:
        return tuple(sorted(((k, v) for k, v in shares.items() if v > 0), key=lambda kv: -kv[1]))

    loop = ordered(_loop_shares(main, _autograd_busy(window_threads, main_pid))) if main else ()
    total = sum(len(s) for s in workers.values())
    mixed: dict[str, float] = defaultdict(float)
    for samples in workers.values():
        for state, share in _state_shares(samples).items():
            mixed[state] += share * len(samples) / total
    return loop, ordered(mixed)


def _thread_features(window: Window, main_pid: int | None) -> Features:
    main, workers = _main_threads(window.threads, main_pid)
    n = len(main)
    out: Features = {"thread_samples": float(n)}
    autograd = _autograd_busy(window.threads, main_pid)
    out["autograd_running_share"] = autograd
    if n >= MIN_THREAD_SAMPLES:
        shares = _loop_shares(main, autograd)
        out["main_sys_share"] = _rate(main, "sys_s")
        out["main_runqueue_share"] = _rate(main, "runq_s")
        out["main_running_share"] = shares["running"]
        out["main_disk_share"] = shares["disk"]
        out["main_sleep_share"] = shares["sleep"]
        out["main_sync_share"] = shares["sync"]
        out["main_net_share"] = shares["net"]
    out["threads_runqueue_share"] = _threads_runqueue(window.threads, main_pid)

    running = disk_w = other = queued = 0.0
    wn = 0
    for samples in workers.values():
        k = len(samples)
        w = _state_shares(samples)  # weight each worker by its number of samples
        # A worker waiting for a CPU is still producing on the CPU side: the pipeline's CPU work
        # is what the loop waits for, whether the worker computes or waits to compute.
        running += k * (w["running"] + w["runqueue"])
        queued += k * w["runqueue"]
        disk_w += k * w["disk"]
        other += k * (w["sleep"] + w["net"])
        wn += k
    producing = running + disk_w + other
    out["workers_busy_share"] = producing / wn if wn >= MIN_THREAD_SAMPLES else None
    good = wn >= MIN_THREAD_SAMPLES and producing >= 0.05 * wn
    out["workers_running_fraction"] = running / producing if good else None
    out["workers_runqueue_fraction"] = queued / producing if good else None
    out["workers_disk_fraction"] = disk_w / producing if good else None
    out["workers_other_wait_fraction"] = other / producing if good else None
    return out


BUSY_THREAD_SHARE = 0.1  # threads on a CPU or waiting for one less than this are not the step's


def _threads_runqueue(window_threads: Iterable[ThreadSample], main_pid: int | None) -> float | None:
    """The largest run-queue share (schedstat) among the diagnosed training process's threads busy
    >= :data:`BUSY_THREAD_SHARE` of the window: the intra-op pool's threads meet at a barrier at
    the end of every parallel op, so the one that waits longest for a CPU sets the op's time while
    the others spin or sleep at the barrier (the classic oversubscription slowdown: the main
    thread reads "running" while it spins). Every thread's counters are read once a second
    (:class:`~torchwatch.sources.proc.ThreadStateSource`); ``None`` when no thread's cover 1 s."""
    threads: dict[tuple[int, int], list[ThreadSample]] = defaultdict(list)
    for th in window_threads:
        if th.role is Role.MAIN and (main_pid is None or th.pid == main_pid) and th.runq_s is not None:
            threads[(th.pid, th.tid)].append(th)
    worst: float | None = None
    for samples in threads.values():
        sched = _sched_shares(samples)
        if sched is None:
            continue
        worst = worst or 0.0
        if sum(sched) >= BUSY_THREAD_SHARE:
            worst = max(worst, sched[1])
    return worst


def _cpu_wait(f: Features) -> Features:
    """``cpu_wait_share``: the loop's time lost waiting for a CPU, the largest of three readings of
    it (each a share of wall time, schedstat): its main thread's run-queue wait, the wait of the
    intra-op thread that waited most (the barrier at the end of each op waits for it), and, when
    the loop waits on DataLoader workers, that wait times the part of the workers' work spent
    waiting for a CPU. ``None`` when none of them is measured."""
    readings = [f.get("main_runqueue_share"), f.get("threads_runqueue_share")]
    queue, wq = f.get("data_wait_queue_share"), f.get("workers_runqueue_fraction")
    if queue is not None and wq is not None:
        readings.append(queue * wq)
    known = [r for r in readings if r is not None]
    return {"cpu_wait_share": max(known) if known else None}


THREAD_SHARES = (
    "thread_samples", "main_running_share", "main_disk_share", "main_sys_share", "main_runqueue_share",
    "threads_runqueue_share", "main_sleep_share", "main_sync_share", "autograd_running_share", "main_net_share",
    "workers_running_fraction", "workers_runqueue_fraction", "workers_disk_fraction",
    "workers_other_wait_fraction", "workers_busy_share",
)  # fmt: skip

STEPS: tuple[Step, ...] = (
    step("threads", lambda w, pid, f: _thread_features(w, pid), THREAD_SHARES),
    step(
        "cpu_wait",
        lambda w, pid, f: _cpu_wait(f),
        ("cpu_wait_share",),
        needs=("main_runqueue_share", "threads_runqueue_share", "data_wait_queue_share", "workers_runqueue_fraction"),
    ),
)
"""The loop's and the workers' thread states, then the loop's CPU wait from them."""

"""Predict the steps/s a fix should buy, from the window's features (pure functions, no I/O).

The model (``docs/predict.md`` gives the equations and where they fail) takes the step as the
features measure it, in units of the step time now (T = 1): the loop's data wait ``w``
(``data_wait_share``), split into the time the main thread fetches (``data_wait_fetch_share``,
``num_workers=0``) and the time it waits on DataLoader workers (``data_wait_queue_share``); the
rest, ``C = 1 - w``, is the consumer: forward, backward, optimizer, host-device waits, sleeps. CPU
use per step is in cores x T: the main process's ``main_cpu_pct / 100``, the workers'
``workers_cpu_pct / 100``; the CPUs left to the training are the usable CPUs less what others use
(``foreign_cpu_cores``, from half a core on) and what torchwatch uses (``own_cpu_cores``).

Every prediction is a ratio, steps/s after the fix / steps/s now, with an interval: the inputs
that are sampled shares move by 1.645 standard errors of a proportion over their sample count
(py-spy's stack samples, ``/proc``'s thread samples), the ratio is taken at the corners, and the
ends widen by the model's own error (:data:`MODEL_ERROR`) and the step time's spread
(``step_time_p95_ms`` against ``step_time_p50_ms``, over the window's steps). A ratio the model
cannot give is ``None`` with the reason (a GPU-bound step, a storage device's queue, a change to
the user's code of unknown size).

Costs: a few hundred float operations per fix; the predictions of a whole analysis tick took
3-530 us on the recorded windows (``python bench/predict.py --cost``), under the 1 ms of issue 53.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from torchwatch.analysis.fix_kinds import FIX_KINDS, TRIAL_KINDS, WHY_NOT
from torchwatch.model.predicted import Predicted

__all__ = ["KINDS", "MODEL_ERROR", "Loop", "knee", "loop_of", "predict_fix", "predict_kind", "workers_rate"]

KINDS = ("num_workers", "pin_memory", "threads", "neighbour", "quota", "cache", "sleep")
"""The fixes the model predicts (see :func:`predict_kind`)."""

Z = 1.645
"""Standard normal quantile of a two-sided 90 % interval."""
MODEL_ERROR = 0.10
"""Relative error the model is taken to have beyond its inputs' spread (its equations leave out
memory bandwidth, the GIL, caches, the scheduler's fairness); widens every interval by this much
each way. A first calibration: ``bench/predict.py`` (docs/predict.md)."""
MAX_WORKERS = 64
"""Most DataLoader workers the knee scans."""
KNEE_SHARE = 0.95
"""The knee: the fewest workers whose predicted rate is within 5 % of the best (issue 53)."""
NEIGHBOUR_FLOOR = 0.5
"""Cores others use below which they are taken as noise, not a CPU taken (as cpu-contention)."""
EPS = 1e-6
NO_WAIT = "the loop waits on no worker: the workers' time per batch is not measured"


@dataclass(frozen=True)
class Loop:
    """The loop's step as the model sees it, in units of the step time now (T = 1).

    Attributes:
        wait: share of the step in DataLoader ``__next__`` (0..1).
        fetch: share the main thread fetches batches itself (``num_workers=0``), 0..1.
        fetch_cpu: of that, share on a CPU (dataset and collate code), 0..1.
        queue: share the loop waits on DataLoader workers, 0..1.
        workers: DataLoader workers now (as set, else alive).
        worker_busy: share of the time the workers produce (not idle on their index queue), 0..1.
        worker_run: of their producing time, share on a CPU or waiting for one, 0..1.
        worker_runqueue: of their producing time, share waiting for a CPU, 0..1.
        main_cores: cores the main process uses (all its threads), mean over the window.
        worker_cores: cores the workers use together.
        cpus: CPUs the training may use (affinity, quota); foreign: cores others use; own:
            cores torchwatch uses.
        cpu_wait: share of the step the loop waits for a CPU (``cpu_wait_share``), 0..1.
        sleep: share the main thread sleeps on a timer (``main_sleep_share``), 0..1.
        run, runqueue: shares the main thread is on a CPU / waits for one (schedstat), 0..1.
        throttled: share of wall time the cgroup quota stopped the training, 0..1.
        threads: intra-op threads (``torch.get_num_threads()``), ``None`` without the hook.
        prefetch: batches each worker keeps ready (``prefetch_factor``, 2 when not read).
        n_stack, n_thread: samples behind the stack and thread shares (their standard errors).
        step_cv: the per-step time's coefficient of variation, from p50 and p95.
        n_steps: steps in the window (spread of the mean step time).
        consumer_cut: share of the step the consumer stops waiting for a CPU after the fix (0 now).
        worker_cpu_kept: the part of the workers' CPU per batch left after the fix (1 now).
    """

    wait: float
    fetch: float
    fetch_cpu: float
    queue: float
    workers: int
    worker_busy: float | None
    worker_run: float | None
    worker_runqueue: float
    main_cores: float | None
    worker_cores: float
    cpus: float | None
    foreign: float
    own: float
    cpu_wait: float | None
    sleep: float | None
    run: float | None
    runqueue: float | None
    throttled: float | None
    threads: float | None
    prefetch: float
    n_stack: float
    n_thread: float
    step_cv: float | None
    n_steps: float | None
    consumer_cut: float = 0.0
    worker_cpu_kept: float = 1.0

    @property
    def left(self) -> float | None:
        """CPUs left to the training: usable less others (from half a core on) and torchwatch, and
        never less than the training uses now (its main process and workers: a neighbour's use is
        measured while the training holds the rest, so it is no floor the training cannot cross),
        >= 0.1."""
        if self.cpus is None:
            return None
        foreign = self.foreign if self.foreign >= NEIGHBOUR_FLOOR else 0.0
        return max(0.1, self.cpus - foreign - self.own, (self.main_cores or 0.0) + self.worker_cores)

    @property
    def fair_share(self) -> float | None:
        """The CPU a runnable thread of the training gets beside others' runnable threads: the main
        thread's run time over its run and run-queue time (the scheduler shares the CPUs per
        thread), or ``None`` when others hold less than half a core or it is not measured."""
        if self.foreign < NEIGHBOUR_FLOOR or self.run is None or self.runqueue is None:
            return None
        busy = self.run + self.runqueue
        return None if busy <= EPS else self.run / busy

    def cpus_for(self, threads: int) -> float | None:
        """CPUs the training gets with ``threads`` runnable threads (main thread + busy workers):
        :attr:`left`, or, beside others' runnable threads, ``threads`` x :attr:`fair_share` when
        that is more (each thread it adds takes its share), within the usable CPUs less torchwatch's."""
        left, share = self.left, self.fair_share
        if left is None or self.cpus is None or share is None:
            return left
        return max(left, min(self.cpus - self.own, share * threads))


def _f(values: Mapping[str, Any], name: str) -> float | None:
    v = values.get(name)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _share(v: float | None) -> float:
    return 0.0 if v is None else min(1.0, max(0.0, v))


def loop_of(values: Mapping[str, Any]) -> Loop:
    """The :class:`Loop` of a window's features (``{name: value}``, missing or ``None`` allowed)."""
    workers = max(_f(values, "dl_num_workers") or 0.0, _f(values, "worker_count") or 0.0)
    p50, p95 = _f(values, "step_time_p50_ms"), _f(values, "step_time_p95_ms")
    cv = (p95 - p50) / (Z * p50) if p50 and p95 is not None and p95 >= p50 else None
    rate = _f(values, "hook_steps_per_s")
    main = _f(values, "main_cpu_pct")
    return Loop(
        wait=_share(_f(values, "data_wait_share")),
        fetch=_share(_f(values, "data_wait_fetch_share")),
        fetch_cpu=_share(_f(values, "fetch_cpu_share")),
        queue=_share(_f(values, "data_wait_queue_share")),
        workers=int(workers),
        worker_busy=_f(values, "workers_busy_share"),
        worker_run=_f(values, "workers_running_fraction"),
        worker_runqueue=_share(_f(values, "workers_runqueue_fraction")),
        main_cores=None if main is None else main / 100.0,
        worker_cores=(_f(values, "workers_cpu_pct") or 0.0) / 100.0,
        cpus=_f(values, "usable_cpus"),
        foreign=_f(values, "foreign_cpu_cores") or 0.0,
        own=_f(values, "own_cpu_cores") or 0.0,
        cpu_wait=_f(values, "cpu_wait_share"),
        sleep=_f(values, "main_sleep_share"),
        run=_f(values, "main_running_share"),
        runqueue=_f(values, "main_runqueue_share"),
        throttled=_f(values, "cpu_throttled_share"),
        threads=_f(values, "intra_op_threads"),
        prefetch=_f(values, "dl_prefetch_factor") or 2.0,
        n_stack=_f(values, "stack_samples") or 0.0,
        n_thread=_f(values, "thread_samples") or 0.0,
        step_cv=cv,
        n_steps=None if rate is None else rate * 10.0,  # the default 10 s window
    )


def _move(p: float | None, n: float) -> float:
    """1.645 standard errors of a sampled share ``p`` over ``n`` samples (of 0.1 when none are counted)."""
    p = _share(p)
    return Z * (0.1 if n < 1 else math.sqrt(max(p * (1.0 - p), 0.0) / n) + 0.5 / n)


# -- num_workers: a producer/consumer pipeline ------------------------------------------------------
def _pipeline(loop: Loop) -> tuple[float, float, float, float] | None:
    """``(consumer s, producer s per batch per worker, loop cores x s, worker cores x s per batch)``
    in units of T, or ``None`` when the workers' time per batch cannot be told (no wait on them)."""
    if loop.workers == 0:
        consumer = max(EPS, 1.0 - loop.wait)
        # the fetch's CPU is at most the process's (stack shares count a wait for a CPU as running)
        fetch_cpu = loop.fetch_cpu if loop.main_cores is None else min(loop.fetch_cpu, loop.main_cores)
        loop_cpu = max(0.0, (loop.main_cores or 0.0) - fetch_cpu)
        return consumer, max(EPS, loop.fetch), loop_cpu, fetch_cpu
    consumer = max(EPS, 1.0 - loop.queue - loop.consumer_cut)
    busy = loop.worker_busy if loop.worker_busy is not None else (1.0 if loop.queue >= 0.01 else None)
    if busy is None:
        return None
    # k0 workers together finish one batch per step: each takes k0 x busy steps per batch, of
    # which the part waiting for a CPU is the CPUs' shortage, not the batch's own time.
    per_batch = max(EPS, loop.workers * busy * (1.0 - loop.worker_runqueue))
    return consumer, per_batch, loop.main_cores or 0.0, loop.worker_cores * loop.worker_cpu_kept


def workers_rate(loop: Loop, k: int) -> float | None:
    """Steps per T with ``k`` DataLoader workers: ``min(1 / C, k / F, A / (L + W))``.

    ``C``: the consumer's time per step; ``F``: one worker's wall time per batch (with
    ``num_workers=0``, the main thread's fetch time; the workers run torch with 1 thread);
    ``A``: CPUs the training gets with ``1 + k`` runnable threads (:meth:`Loop.cpus_for`);
    ``L``: the loop's CPU per step; ``W``: the workers' CPU per
    batch (cores x T). ``k = 0``: the main thread fetches, ``1 / (C + F)``. Assumes the queue of
    ``k x prefetch_factor`` batches absorbs the fetch time's variation (the interval widens near
    the balance point, :func:`predict_kind`) and that waits on storage or timers overlap across
    workers without limit (a disk's queue depth is not modelled). ``None``: unknown."""
    pipe = _pipeline(loop)
    if pipe is None:
        return None
    consumer, per_batch, loop_cpu, worker_cpu = pipe
    if k == 0:
        return 1.0 / (consumer + (per_batch if loop.workers == 0 else per_batch / max(1, loop.workers)))
    limits = [1.0 / consumer, k / per_batch]
    cpus = loop.cpus_for(1 + k)
    if cpus is not None and loop_cpu + worker_cpu > EPS:
        limits.append(cpus / (loop_cpu + worker_cpu))
    return min(limits)


def knee(loop: Loop) -> int | None:
    """The fewest workers (1..:data:`MAX_WORKERS`) whose :func:`workers_rate` is within 5 % of the
    best, given the CPUs; ``None`` when the rate is unknown.

    Solved, not scanned: every term of ``min(1 / C, k / F, A(k) / (L + W))`` grows with ``k``, so
    the best is the rate at :data:`MAX_WORKERS` and the knee the fewest ``k`` with
    ``k / F >= 0.95 x best`` and ``A(k) / (L + W) >= 0.95 x best``."""
    pipe = _pipeline(loop)
    best = workers_rate(loop, MAX_WORKERS)
    if pipe is None or best is None:
        return None
    target = KNEE_SHARE * best
    k = max(1, math.ceil(target * pipe[1] - 1e-9))
    cpu = pipe[2] + pipe[3]
    share = loop.fair_share
    if cpu > EPS and share is not None and share > EPS:
        while k < MAX_WORKERS and (loop.cpus_for(1 + k) or 0.0) / cpu < target - 1e-12:
            k = max(k + 1, math.ceil(target * cpu / share - 1 - 1e-9))
    return min(MAX_WORKERS, k)


def _ratio_workers(loop: Loop, k: int) -> float | None:
    now, after = workers_rate(loop, loop.workers), workers_rate(loop, k)
    return None if now is None or after is None or now <= 0 else after / now


def _queue_cut(loop: Loop, runnable_now: float, runnable_after: float) -> float:
    """The share of the step the loop's thread stops waiting for a CPU when the training's runnable
    threads go from ``runnable_now`` to ``runnable_after``, beside others' (per-thread fair share):
    others' runnable threads ``f = usable / s - d`` from the share ``s`` its thread gets now, then
    ``s' = min(1, usable / (f + d'))`` and its wait ``run x (1 / s' - 1)``. 0 without others."""
    share = loop.fair_share
    if share is None or share <= EPS or loop.cpus is None or loop.run is None or loop.runqueue is None:
        return 0.0
    others = max(0.0, loop.cpus / share - runnable_now)
    after = min(1.0, loop.cpus / max(EPS, others + runnable_after))
    return max(0.0, loop.runqueue - loop.run * (1.0 / after - 1.0))


# -- threads=k: Amdahl on the loop's parallel part ----------------------------------------------------
def _parallel_part(loop: Loop, n_eff: float) -> float:
    """The share of the loop's CPU work that runs on its intra-op threads (Amdahl's p), from the
    cores the main process uses while it computes: ``U = 1 / ((1 - p) + p / n)``, solved for p."""
    busy = max(EPS, 1.0 - loop.wait - (loop.cpu_wait or 0.0))
    used = (loop.main_cores or 0.0) / busy
    if n_eff <= 1.0 + EPS or used <= 1.0:
        return 0.0
    return min(1.0, max(0.0, (1.0 - 1.0 / used) / (1.0 - 1.0 / n_eff)))


def _amdahl(p: float, n: float) -> float:
    return (1.0 - p) + p / max(1.0, n)


def _ratio_threads(
    loop: Loop, k: float, left_after: float | None = None, p_shift: float = 0.0, others_stay: bool = True
) -> float | None:
    """Steps/s with ``k`` intra-op threads on ``left_after`` CPUs (default: the CPUs left now) over now.

    The loop's compute now is ``C0 = 1 - w - rho`` (``rho``: its wait for a CPU); its work runs
    at ``amdahl(p, min(n, A))``; after, at ``amdahl(p, min(k, A'))``. When ``k`` fits the CPUs (one
    thread always does: it meets no barrier) the wait at each op's barrier for a thread without a
    CPU goes; what stays, while others' threads stay (``others_stay``), is the main thread's own
    wait for a CPU (``main_runqueue_share``). More threads than CPUs keep the whole wait.
    """
    left_now = loop.left
    if loop.threads is None or left_now is None or loop.main_cores is None:
        return None
    after = left_now if left_after is None else left_after
    rho = min(_share(loop.cpu_wait), max(0.0, 1.0 - loop.wait))
    compute = max(EPS, 1.0 - loop.wait - rho)
    n_now = min(loop.threads, left_now)
    p = min(1.0, max(0.0, _parallel_part(loop, n_now) + p_shift))
    compute_after = compute * _amdahl(p, min(k, after)) / _amdahl(p, n_now)
    own_wait = _share(loop.runqueue) if others_stay and loop.fair_share is not None else 0.0
    rho_after = min(rho, own_wait) if k <= max(1.0, after) + 1e-9 else rho
    return 1.0 / (loop.wait + compute_after + rho_after)


# -- the kinds --------------------------------------------------------------------------------------
def _interval(
    loop: Loop, model: Callable[[Loop], float | None], moves: dict[str, float]
) -> tuple[float, float, float] | None:
    """``(ratio, low, high)``: ``model`` at ``loop`` and at every corner of ``loop``'s fields moved
    by ``±moves[field]`` (clipped to 0..1), widened by the factor ``1 + rel`` each way, ``rel`` of
    :data:`MODEL_ERROR` and the step time's spread (so ``0 < low`` whatever the spread)."""
    mid = model(loop)
    if mid is None or not math.isfinite(mid):
        return None
    seen = [mid]
    names = list(moves)
    for signs in itertools.product((-1.0, 1.0), repeat=len(names)):
        moved: dict[str, Any] = {n: _share(getattr(loop, n) + s * moves[n]) for n, s in zip(names, signs, strict=True)}
        r = model(replace(loop, **moved))
        if r is not None and math.isfinite(r):
            seen.append(r)
    spread = 0.0
    if loop.step_cv is not None and loop.n_steps:
        spread = Z * loop.step_cv / math.sqrt(max(1.0, loop.n_steps))
    rel = math.hypot(MODEL_ERROR, spread)
    # by a factor each way: a ratio's error is relative, and 1 - rel went below zero once the step
    # times spread wide over few steps (beside two busy processes: low -0.06 in a report)
    return mid, min(seen) / (1.0 + rel), max(seen) * (1.0 + rel)


def _made(kind: str, got: tuple[float, float, float] | None, assumption: str, why_none: str = "") -> Predicted:
    if got is None:
        return Predicted(kind=kind, reason=why_none or "the model gave no finite ratio")
    mid, low, high = got
    return Predicted(kind=kind, ratio=round(mid, 3), low=round(low, 3), high=round(high, 3), reason=assumption)


def predict_kind(kind: str, values: Mapping[str, Any], value: float | None = None) -> Predicted:
    """Predict the fix ``kind`` (one of :data:`KINDS`) on the window's features ``values``.

    Args:
        kind: ``num_workers`` (``value``: the workers to try; the suggestion when ``None``:
            usable CPUs less one), ``threads`` (``value``: intra-op threads), ``pin_memory``,
            ``neighbour`` (the processes outside the training gone), ``quota`` (the cgroup quota
            lifted), ``cache`` (the per-sample CPU work cached: its cost taken to zero, an upper
            bound), ``sleep`` (the loop's timer sleeps removed).
        values: features (``{name: value}``), as the rules see them.

    Returns:
        The prediction, or one with ``ratio None`` and the reason.
    """
    loop = loop_of(values)
    stack, thread = loop.n_stack, loop.n_thread
    if kind == "num_workers":
        if loop.cpus is None:
            return Predicted(kind=kind, reason="the usable CPUs are not known")
        k = int(value) if value is not None else max(1, math.floor(loop.cpus) - 1)
        moves = {"queue": _move(loop.queue, stack)} if loop.workers else {"fetch": _move(loop.fetch, stack)}
        got = _interval(loop, lambda lp: _ratio_workers(lp, k), moves)
        kn = knee(loop)
        if got is not None:
            consumer_rate = 1.0 / max(EPS, 1.0 - (loop.queue if loop.workers else loop.wait))
            after = workers_rate(loop, k) or 0.0
            if after >= 0.8 * consumer_rate:  # near the balance: the queue's depth decides the rest
                depth = max(1.0, k * loop.prefetch)
                mid, low, high = got
                got = (mid, low * (1.0 - min(0.5, (loop.step_cv or 0.2) / math.sqrt(depth))), high)
        p = _made(kind, got, f"a pipeline of {k} workers, each as fast per batch as now, on the CPUs left", NO_WAIT)
        return replace(p, knee=kn) if p.ratio is not None else p
    if kind == "threads":
        if loop.threads is None:
            return Predicted(kind=kind, reason="the intra-op threads are not known (no hook)")
        if loop.main_cores is None or loop.cpus is None:
            return Predicted(kind=kind, reason="the process's CPU or the usable CPUs are not known")
        threads = value if value is not None else max(1.0, math.floor(loop.left or 1.0))
        cw = _share(loop.cpu_wait)
        got = _interval(loop, lambda lp: _ratio_threads(lp, threads), {"cpu_wait": _move(cw, thread)})
        if got is not None:  # Amdahl's p is read from CPU use that counts spinning threads: move it too
            ends = [x for x in (_ratio_threads(loop, threads, p_shift=d) for d in (-0.15, 0.15)) if x is not None]
            lo, hi = (1.0 - MODEL_ERROR) * min(ends, default=got[1]), (1.0 + MODEL_ERROR) * max(ends, default=got[2])
            got = (got[0], min(got[1], lo), max(got[2], hi))
        return _made(kind, got, f"Amdahl on the loop's threads: {threads:.0f} on {loop.left or 0:.1f} CPUs left")
    if kind == "neighbour":
        if loop.cpu_wait is None:
            return Predicted(kind=kind, reason="the loop's wait for a CPU is not measured (no schedstat)")

        def gone(lp: Loop) -> float | None:
            rho = min(_share(lp.cpu_wait), 0.95)
            base = 1.0 / (1.0 - rho)
            if lp.threads is not None and lp.cpus is not None and lp.main_cores is not None:
                more = _ratio_threads(lp, lp.threads, left_after=max(0.1, lp.cpus - lp.own), others_stay=False)
                return max(base, more or base)
            return base

        got = _interval(loop, gone, {"cpu_wait": _move(loop.cpu_wait, thread)})
        return _made(kind, got, "the loop's wait for a CPU goes with the others' load")
    if kind == "quota":
        if loop.throttled is None:
            return Predicted(kind=kind, reason="the quota's throttled time is not read (no cgroup CPU statistics)")
        # throttled_usec is counted exactly: only the model's own error widens it
        got = _interval(loop, lambda lp: 1.0 / (1.0 - min(0.95, _share(lp.throttled))), {})
        return _made(kind, got, "the time the quota stopped the training is given back; the CPUs without it unread")
    if kind == "cache":
        if loop.workers == 0:
            if loop.fetch_cpu <= 0.0:
                return Predicted(kind=kind, reason="no per-sample CPU work is measured in the main thread")
            got = _interval(
                loop, lambda lp: 1.0 / max(EPS, 1.0 - lp.fetch_cpu), {"fetch_cpu": _move(loop.fetch_cpu, stack)}
            )
            return _made(kind, got, "the per-sample CPU work goes to zero (an upper bound: a cache costs its reads)")
        if loop.worker_run is None:
            return Predicted(kind=kind, reason="the workers' CPU share of their producing time is not measured")

        def cached(lp: Loop) -> float | None:
            busy = lp.worker_busy if lp.worker_busy is not None else 1.0
            cut = _queue_cut(lp, 1.0 + lp.workers * busy * _share(lp.worker_run), 1.0)
            cheap = replace(
                lp,
                worker_busy=busy * (1.0 - _share(lp.worker_run)),
                worker_cpu_kept=0.0,
                worker_runqueue=0.0,
                consumer_cut=cut,
            )
            now, after = workers_rate(lp, lp.workers), workers_rate(cheap, lp.workers)
            return None if now is None or after is None or now <= 0 else after / now

        got = _interval(loop, cached, {"queue": _move(loop.queue, stack)})
        return _made(
            kind,
            got,
            "the workers' per-sample CPU work goes to zero (an upper bound: a cache costs its reads)",
            NO_WAIT,
        )
    if kind == "sleep":
        if loop.sleep is None:
            return Predicted(kind=kind, reason="the main thread's sleeps are not measured (no thread states)")
        got = _interval(
            loop, lambda lp: 1.0 / (1.0 - min(0.95, _share(lp.sleep))), {"sleep": _move(loop.sleep, thread)}
        )
        return _made(kind, got, "the loop's timer sleeps are removed and nothing else changes")
    if kind == "pin_memory":
        h = _f(values, "burst_pageable_h2d_share")
        if h is None:
            return Predicted(kind=kind, reason="no profiler burst measured the pageable copies")
        idle = _f(values, "burst_gpu_idle_share")
        save = min(_share(h), _share(idle) if idle is not None else 1.0)
        # pinned DMA runs at about twice the pageable copy's bandwidth (central: half the copy
        # time saved); overlapped with the step (non_blocking): all of it; at worst a quarter
        mid, low, high = 1.0 / (1.0 - 0.5 * save), 1.0 / (1.0 - 0.25 * save), 1.0 / max(0.05, 1.0 - save)
        got = (mid, low * (1.0 - MODEL_ERROR), high * (1.0 + MODEL_ERROR))
        return _made(kind, got, "pinned copies at about twice the pageable bandwidth, overlapped with the step at best")
    raise ValueError(f"unknown fix kind {kind!r} (known: {', '.join(KINDS)})")


def predict_fix(rule: str, title: str, trial: str | None, values: Mapping[str, Any]) -> Predicted:
    """The prediction for one fix of a finding.

    Args:
        rule: the finding's rule id. title: the fix's title (as the rule file writes it).
        trial: ``SETTING=VALUE`` when the fix has a live setting (its value is the one predicted).
        values: the window's features (template values may be among them).
    """
    if trial:
        name, _, raw = trial.partition("=")
        kind = TRIAL_KINDS.get(name.strip())
        if kind is not None:
            try:
                number = float(raw) if kind != "pin_memory" else None
            except ValueError:
                number = None
            return predict_kind(kind, values, number)
    kind = FIX_KINDS.get((rule, title))
    if kind is not None:
        if kind == "threads":
            wanted = values.get("suggested_threads")
            return predict_kind(kind, values, float(wanted) if isinstance(wanted, (int, float)) else None)
        return predict_kind(kind, values)
    for prefix, why in WHY_NOT:
        if rule.startswith(prefix):
            return Predicted(kind="none", reason=why)
    return Predicted(kind="none", reason="a change to the training's code whose size the model does not know")

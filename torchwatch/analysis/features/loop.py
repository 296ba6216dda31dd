"""The loop's time by phase, from py-spy's stacks of its main thread (forward, backward, optimizer,
DataLoader wait and its queue/fetch/start parts), the window from the first step on
(:func:`loop_window`), the hook's measured DataLoader wait preferred to the stacks' estimate, and
the split of in-thread fetching into CPU, storage and other waits."""

from __future__ import annotations

from collections import Counter
from typing import Any

from torchwatch.analysis import producers, stacks
from torchwatch.analysis.features.catalogue import MIN_STACK_SAMPLES, PRODUCER_CATALOGUE, Features
from torchwatch.analysis.features.common import _share
from torchwatch.analysis.features.steps import Step, step
from torchwatch.analysis.store import Window
from torchwatch.model.readings import HookState


def _stack_features(window: Window, main_pid: int | None) -> Features:
    phases: Counter[str] = Counter()
    parts: Counter[str] = Counter()
    for s in window.stacks:
        if not s.is_main_thread or (main_pid is not None and s.pid != main_pid):
            continue
        ph = stacks.phase(s.frames)
        phases[ph] += s.count
        if ph == "data":
            parts[stacks.data_part(s.frames) or "other"] += s.count
    startup = phases.pop("startup", 0)
    total = sum(phases.values())
    out: Features = {
        "stack_samples": float(total),
        "startup_share": startup / (startup + total) if startup + total else None,
    }
    enough = total >= MIN_STACK_SAMPLES
    for key, name in (
        ("data", "data_wait_share"),
        ("forward", "forward_share"),
        ("backward", "backward_share"),
        ("optimizer", "optimizer_share"),
        ("other", "other_code_share"),
    ):
        out[name] = _share(phases, key, total) if enough else None
    for key, name in (
        ("queue", "data_wait_queue_share"),
        ("fetch", "data_wait_fetch_share"),
        ("start", "data_wait_start_share"),
    ):
        out[name] = _share(parts, key, total) if enough else None
    return out


def _attribute_fetch(f: Features) -> Features:
    """Split main-thread data fetching (``num_workers=0``) into CPU, disk and other waits.

    Stacks say *where* the main thread is, ``/proc`` states say *how* it spends the time; they
    are sampled apart, so waits are attributed to the DataLoader first: storage, sleep and
    socket waits happen while fetching samples far more often than in forward/backward.
    """
    fetch, disk = f.get("data_wait_fetch_share"), f.get("main_disk_share")
    if fetch is None or disk is None:
        return {"fetch_cpu_share": None, "fetch_disk_share": None, "fetch_other_wait_share": None}
    other = (f.get("main_sleep_share") or 0.0) + (f.get("main_net_share") or 0.0)
    fetch_disk = min(disk, fetch)
    fetch_other = min(other, fetch - fetch_disk)
    return {
        "fetch_disk_share": fetch_disk,
        "fetch_other_wait_share": fetch_other,
        "fetch_cpu_share": max(0.0, fetch - fetch_disk - fetch_other),
    }


def _combine(f: Features) -> Features:
    queue = f.get("data_wait_queue_share")
    wrun, wdisk, wother = (
        f.get("workers_running_fraction"),
        f.get("workers_disk_fraction"),
        f.get("workers_other_wait_fraction"),
    )
    fetch_cpu, fetch_disk, fetch_other = (
        f.get("fetch_cpu_share"),
        f.get("fetch_disk_share"),
        f.get("fetch_other_wait_share"),
    )
    out: Features = {}

    def via_workers(frac: float | None) -> float | None:
        if queue is None:
            return None
        if queue < 0.01:
            return 0.0
        return None if frac is None else queue * frac

    def add(a: float | None, b: float | None) -> float | None:
        return None if a is None and b is None else (a or 0.0) + (b or 0.0)

    main_disk = f.get("main_disk_share")
    # Main-thread storage waits outside the DataLoader (reads in the loop) count as well.
    out["storage_wait_async_share"] = via_workers(wdisk)
    out["storage_wait_share"] = add(main_disk if main_disk is not None else fetch_disk, via_workers(wdisk))
    out["input_cpu_share"] = add(fetch_cpu, via_workers(wrun))
    out["input_other_wait_share"] = add(fetch_other, via_workers(wother))
    running = f.get("main_running_share")
    out["loop_cpu_share"] = None if running is None or fetch_cpu is None else max(0.0, running - fetch_cpu)
    return out


def _prefer_measured_wait(f: Features) -> Features:
    """Scale the stack estimate of the DataLoader's share to the hook's measurement.

    py-spy samples where the loop is (20 Hz); the hook times every ``__next__``. When both exist,
    the measured total wins and the stacks only split it (queue vs in-thread fetch). With
    ``num_workers=0`` (the hook reads it from the DataLoader) the split is known without stacks.
    """
    measured, estimated = f.get("data_wait_fraction"), f.get("data_wait_share")
    if measured is None:
        return {}
    if f.get("dl_num_workers") == 0:
        # num_workers=0: every __next__ runs the dataset and collate in the loop's own thread, so
        # the whole measured wait is in-thread fetching; no stacks are needed to split it.
        return {
            "data_wait_share": measured,
            "data_wait_fetch_share": measured,
            "data_wait_queue_share": 0.0,
            "data_wait_start_share": 0.0,
        }
    if estimated is None or estimated < 0.02:
        return {}
    k = measured / estimated
    out: Features = {"data_wait_share": measured}
    for name in ("data_wait_queue_share", "data_wait_fetch_share", "data_wait_start_share"):
        v = f.get(name)
        out[name] = None if v is None else min(1.0, v * k)
    return out


def loop_window(window: Window, main_pid: int | None) -> Window:
    """``window`` from the training's first step on, when that step ended inside it.

    A window that reaches back before the first step mixes the training's start (imports, model
    set-up, CUDA initialisation, all on the loop's thread and on the CPU) with its loop, and its
    means then describe neither. Recorded on an H200 (2026-11-26), demo/gpu_bound.py took 9 s to
    its first step; over the 10 s window the GPU's utilization climbed 11 -> 62 % while the loop's
    thread read 96 -> 66 % running, and the rules called that GPU-bound training cpu-bound at
    confidence 0.95 for 8 s. From the first step on, every reading is of the loop. The hook's
    reading just before the step is kept as the base of its counters (steps, data wait).
    ``window`` as it is without the hook, before the first step, or when it began after it.
    """
    reads = [h for h in window.hook if main_pid is None or h.pid == main_pid]
    first = reads[-1].first_step_t if reads else 0.0
    if not window.start < first < window.end:
        return window

    def since(items: list[Any]) -> list[Any]:
        return [x for x in items if x.t >= first]

    before: dict[int, HookState] = {}  # each process's last reading before the step
    for h in window.hook:
        if h.t < first:
            before[h.pid] = h
    base = sorted(before.values(), key=lambda h: h.t)
    return Window(
        start=first,
        end=window.end,
        processes=since(window.processes),
        threads=since(window.threads),
        system=since(window.system),
        gpus=since(window.gpus),
        stacks=since(window.stacks),
        hook=base + since(window.hook),
    )


STACK_SHARES = (
    "stack_samples", "startup_share", "data_wait_share", "forward_share", "backward_share", "optimizer_share",
    "other_code_share", "data_wait_queue_share", "data_wait_fetch_share", "data_wait_start_share",
)  # fmt: skip
DATA_WAIT_PARTS = ("data_wait_share", "data_wait_fetch_share", "data_wait_queue_share", "data_wait_start_share")

STEPS: tuple[Step, ...] = (
    step("stacks", lambda w, pid, f: _stack_features(w, pid), STACK_SHARES),
    step(
        "producers",
        lambda w, pid, f: producers.producer_features(w, pid, MIN_STACK_SAMPLES),
        (name for name, *_ in PRODUCER_CATALOGUE),
    ),
    step(
        "measured_wait",
        lambda w, pid, f: _prefer_measured_wait(f),
        DATA_WAIT_PARTS,
        needs=(*DATA_WAIT_PARTS, "data_wait_fraction", "dl_num_workers"),
    ),
    step(
        "attribute_fetch",
        lambda w, pid, f: _attribute_fetch(f),
        ("fetch_cpu_share", "fetch_disk_share", "fetch_other_wait_share"),
        needs=("data_wait_fetch_share", "main_disk_share", "main_sleep_share", "main_net_share"),
    ),
    step(
        "combine",
        lambda w, pid, f: _combine(f),
        (
            "storage_wait_async_share",
            "storage_wait_share",
            "input_cpu_share",
            "input_other_wait_share",
            "loop_cpu_share",
        ),
        needs=(
            "data_wait_queue_share",
            "workers_running_fraction",
            "workers_disk_fraction",
            "workers_other_wait_fraction",
            "fetch_cpu_share",
            "fetch_disk_share",
            "fetch_other_wait_share",
            "main_disk_share",
            "main_running_share",
        ),
    ),
)
"""The loop's phases from stacks, a hand-written producer's wait and CPU
(:mod:`torchwatch.analysis.producers`), the hook's measured wait preferred, in-thread fetching
split, and the input pipeline's shares combined."""

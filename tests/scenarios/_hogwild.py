"""Shared driver of the Hogwild scenarios (tests/scenarios/hogwild_*.py).

Hogwild-style training, as pytorch/examples' ``mnist_hogwild`` does it: the main process builds
one model, puts its parameters in shared memory (``model.share_memory()``) and starts
:data:`TRAINERS` trainer processes with ``multiprocessing``; each trainer runs its own loop
(forward, backward, ``torch.optim.SGD`` step on the shared parameters) and the main process only
joins them. How the trainers start is the scenario: ``spawn`` (``mp.Process``), ``fork``
(``mp.Process``) or a ``multiprocessing.Pool`` of trainers.

Each trainer keeps torch's default intra-op threads (one per usable CPU, set explicitly so that
an ``OMP_NUM_THREADS`` in the environment does not change the scenario): :data:`TRAINERS`
trainers x that many threads on the usable CPUs is oversubscription, and every op's threads meet
at a barrier behind threads that lost their core.

``--relieve``: each trainer calls ``torch.set_num_threads(max(1, usable_cpus // TRAINERS))``,
the fix for this shape (the threads of all trainers together fit the CPUs).

The main process prints ``demo NAME: step N, R steps/s`` about every 2 s (steps of all trainers
together, counted in shared memory) and, at the end (also on SIGINT / SIGTERM), the final line
bench scripts parse::

    demo NAME: done, STEPS steps in SECONDS s, RATE steps/s
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "demo"))
import _common  # noqa: E402

say = _common.say
REPORT_EVERY_S = _common.REPORT_EVERY_S
TRAINERS = 4
BATCH, DIM, HIDDEN, CLASSES = 64, 256, 512, 10


def usable_cpus() -> int:
    """CPUs this process may run on (affinity)."""
    return len(os.sched_getaffinity(0)) or 1


def make_model() -> nn.Module:
    """The shared model: a 3-layer MLP (0.4 M parameters), big enough that torch splits its
    matmuls across intra-op threads."""
    return nn.Sequential(
        nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES)
    )


def train(index: int, model: nn.Module, counter: Any, stop: Any, relieve: bool) -> int:
    """One trainer: SGD steps on the shared ``model`` until the main process sets ``stop``
    (a shared flag); returns its step count."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process stops the trainers
    cpus = usable_cpus()
    torch.set_num_threads(max(1, cpus // TRAINERS) if relieve else cpus)
    torch.manual_seed(index)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(BATCH * 8, DIM)
    y = torch.randint(0, CLASSES, (BATCH * 8,))
    steps = 0
    while not stop.value:
        j = (steps * BATCH) % len(x)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[j : j + BATCH]), y[j : j + BATCH]).backward()  # type: ignore[no-untyped-call]
        opt.step()
        steps += 1
        with counter.get_lock():
            counter.value += 1
    return steps


def _pool_init(model: nn.Module, counter: Any, stop: Any, relieve: bool) -> None:
    global _POOL_ARGS
    _POOL_ARGS = (model, counter, stop, relieve)


_POOL_ARGS: tuple[Any, ...] = ()


def _pool_train(index: int) -> int:
    return train(index, *_POOL_ARGS)


def parse_args(name: str, doc: str | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"tests/scenarios/{name}.py", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="train this long, then exit 0 (default 30)")
    parser.add_argument("--relieve", action="store_true", help="one intra-op thread share per trainer")
    return parser.parse_args()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(name: str, doc: str | None, how: str) -> None:
    """Run the scenario: ``how`` is ``spawn``, ``fork`` (``mp.Process`` with that start method)
    or ``pool`` (a ``multiprocessing.Pool`` of the fork context)."""
    args = parse_args(name, doc)
    signal.signal(signal.SIGTERM, _interrupt)
    ctx = mp.get_context("fork" if how in ("fork", "pool") else "spawn")
    # The main process only joins: one thread, and no OpenMP team before a fork (GNU OpenMP's
    # team does not survive fork: a forked trainer's first parallel op would hang).
    torch.set_num_threads(1)
    model = make_model()
    model.share_memory()
    counter, stop = ctx.Value("q", 0), ctx.Value("b", 0)
    t0, base = time.perf_counter(), 0
    procs: list[Any] = []
    pool: Any = None
    result: Any = None
    try:
        if how == "pool":
            pool = ctx.Pool(TRAINERS, initializer=_pool_init, initargs=(model, counter, stop, args.relieve))
            result = pool.map_async(_pool_train, range(TRAINERS))
        else:
            for i in range(TRAINERS):
                p = ctx.Process(target=train, args=(i, model, counter, stop, args.relieve))
                p.start()
                procs.append(p)
        # The clock starts at the first step of any trainer (a spawned trainer imports torch
        # first), so the rate compares the loops, not their start-up.
        while not counter.value and (any(p.is_alive() for p in procs) or (result is not None and not result.ready())):
            time.sleep(0.05)
        t0 = time.perf_counter()
        base = counter.value
        last_t, last_steps = t0, 0
        while time.perf_counter() - t0 < args.seconds:
            time.sleep(0.2)
            now = time.perf_counter()
            if now - last_t >= REPORT_EVERY_S:
                steps = counter.value - base
                say(name, f"step {steps}, {(steps - last_steps) / (now - last_t):.1f} steps/s")
                last_t, last_steps = now, steps
        steps = counter.value - base
    except KeyboardInterrupt:
        stop.value = 1
        for p in procs:
            p.terminate()
        if pool is not None:
            pool.terminate()
        _final(name, counter.value - base, t0)
        sys.exit(130)
    elapsed = time.perf_counter() - t0
    stop.value = 1
    for p in procs:
        p.join()
    if pool is not None:
        pool.close()
        pool.join()
    _final(name, steps, t0, elapsed)


def _final(name: str, steps: int, t0: float, elapsed: float | None = None) -> None:
    elapsed = time.perf_counter() - t0 if elapsed is None else elapsed
    say(name, f"done, {steps} steps in {elapsed:.1f} s, {steps / elapsed if elapsed > 0 else 0.0:.1f} steps/s")

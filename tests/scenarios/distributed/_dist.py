"""Shared driver of the distributed scenario trainings in tests/scenarios/distributed/.

Each scenario is one small data-parallel training (DDP, gloo, on the CPU) that runs either way:

    python -m torch.distributed.run --standalone --nproc_per_node 2 \
        tests/scenarios/distributed/NAME.py [--seconds S] [--relieve]
    python tests/scenarios/distributed/NAME.py [--seconds S] [--relieve] [--ranks N]   (torch.multiprocessing.spawn)

A rank started by torchrun finds ``RANK`` in its environment; without it the script is the
launcher and starts ``--ranks`` ranks with ``torch.multiprocessing.spawn``. Every rank uses one
intra-op thread (``torch.set_num_threads(1)``), so 2 ranks fit 2 cores.

Rank 0 prints ``demo NAME: step N, R steps/s`` about every 2 s and, at the end (also on SIGINT /
SIGTERM), the final line that bench scripts parse::

    demo NAME: done, STEPS steps in SECONDS s, RATE steps/s

All ranks stop at the same step (rank 0's clock decides, told to the others every
:data:`STOP_EVERY` steps by a broadcast), so none is left waiting in a collective.

Each scenario module has ``EXPECTED`` (the job's label), ``STRAGGLER`` (the rank that paces the
job, or ``None``) and a ``--relieve`` flag whose speed-up (≥ 1.5×) proves that ground truth.
They are not in bench/scenarios.py's single-process matrix (which reads tests/scenarios/*.py only).
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.utils.data import Dataset

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "demo"))
import _common  # noqa: E402

say = _common.say
REPORT_EVERY_S = _common.REPORT_EVERY_S
STOP_EVERY = 8  # steps between two checks of rank 0's clock (one tiny broadcast each)

Step = Callable[[int], None]  # runs one step (its argument: the step's number)
Setup = Callable[[int, int, argparse.Namespace], Step]  # (rank, world size, args) -> step


def parse_args(name: str, doc: str | None, ranks: int = 2) -> argparse.Namespace:
    """``--seconds``, ``--relieve`` and ``--ranks`` (mp.spawn only; default ``ranks``)."""
    parser = argparse.ArgumentParser(
        prog=f"tests/scenarios/distributed/{name}.py",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="train this long, then exit 0 (default 30)")
    parser.add_argument("--relieve", action="store_true", help="remove this scenario's bottleneck")
    parser.add_argument("--ranks", type=int, default=ranks, help=f"ranks to spawn without torchrun (default {ranks})")
    return parser.parse_args()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _rank_main(index: int, name: str, setup: Setup, args: argparse.Namespace) -> None:
    """One rank: join the group, build the scenario, step until rank 0's clock says stop."""
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    if "RANK" in os.environ:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    else:
        dist.init_process_group("gloo", rank=index, world_size=args.ranks, timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    step = setup(rank, dist.get_world_size(), args)
    steps, t0 = 0, time.perf_counter()
    last_t, last_steps = t0, 0
    stop = torch.zeros(1)
    try:
        while True:
            step(steps)
            steps += 1
            now = time.perf_counter()
            if rank == 0 and now - last_t >= REPORT_EVERY_S:
                say(name, f"step {steps}, {(steps - last_steps) / (now - last_t):.1f} steps/s")
                last_t, last_steps = now, steps
            if steps % STOP_EVERY == 0:
                stop.fill_(float(rank == 0 and now - t0 >= args.seconds))
                dist.broadcast(stop, 0)
                if stop.item():
                    break
    except KeyboardInterrupt:
        _final(name, rank, steps, t0)
        os._exit(130)  # a peer may be gone: no clean-up that waits on it
    _final(name, rank, steps, t0)
    dist.destroy_process_group()


def _final(name: str, rank: int, steps: int, t0: float) -> None:
    if rank == 0:
        elapsed = time.perf_counter() - t0
        say(name, f"done, {steps} steps in {elapsed:.1f} s, {steps / elapsed if elapsed > 0 else 0.0:.1f} steps/s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(name: str, doc: str | None, setup: Setup, ranks: int = 2) -> None:
    """Run the scenario: as a torchrun rank, or as the launcher of ``--ranks`` spawned ranks
    (default ``ranks``: a scenario module's ``RANKS``, which bench/scenarios.py also gives torchrun)."""
    args = parse_args(name, doc, ranks)
    if "RANK" in os.environ:
        _rank_main(int(os.environ.get("LOCAL_RANK", "0")), name, setup, args)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    try:
        mp.spawn(_rank_main, args=(name, setup, args), nprocs=args.ranks)
    except KeyboardInterrupt:
        sys.exit(130)


def batches(loader: Iterable[Any]) -> Iterator[Any]:
    """The loader's batches, epoch after epoch."""
    while True:
        yield from loader


def busy(seconds: float) -> None:
    """Compute on the CPU for ``seconds`` of this thread's CPU time (a stand-in for per-sample
    work such as decoding or augmenting: it takes longer, not less work, when the core is shared)."""
    end = time.thread_time() + seconds
    x = torch.randn(32, 32)
    while time.thread_time() < end:
        x = torch.tanh(x @ x) * 0.5


class BusyRows(Dataset[tuple[torch.Tensor, int]]):
    """``n`` in-memory rows of ``dim`` features (the same on every rank), labelled ``i % classes``;
    each sample costs ``per_sample_s`` of CPU to prepare (:func:`busy`)."""

    def __init__(self, n: int, dim: int, classes: int, per_sample_s: float) -> None:
        self.x = torch.randn(n, dim, generator=torch.Generator().manual_seed(0))
        self.classes = classes
        self.per_sample_s = per_sample_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        busy(self.per_sample_s)
        return self.x[i], i % self.classes


def sgd_steps(model: torch.nn.Module, data: Iterator[Any], lr: float = 0.01) -> Step:
    """One DDP step a call: the next batch, forward, cross-entropy, backward (the gradient
    all-reduce), ``torch.optim.SGD`` step."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step(i: int) -> None:
        x, y = next(data)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()

    return step

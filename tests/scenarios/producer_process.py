"""Scenario producer_process (expected label: dataloader-bound).

Bottleneck: a hand-written producer *process* (``multiprocessing``, fork) "decodes" and
augments samples in numpy and Python (tests/scenarios/_producer.py) and puts whole batches
as numpy arrays into a ``multiprocessing.Queue(maxsize=4)``; the loop takes them with
``queue.get()`` (a pipe read) and trains a small CNN with gradient accumulation (an
optimizer step every 4 micro-batches). No DataLoader. The producer needs several times the
loop's compute per batch, so the loop waits on the pipe most of its time.

--relieve: the batches are made before the loop (24, cycled): no producer.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import queue
import sys
from collections.abc import Iterator

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _producer as pr
import _scenario as sc

EXPECTED = "dataloader-bound"
SUB_CAUSE = "loader-producer-thread"
NAME = "producer_process"


def produce(out: mp.Queue, stop: mp.Event) -> None:  # type: ignore[type-arg]
    torch.set_num_threads(1)
    rng = np.random.default_rng(1)
    while not stop.is_set():
        x, y = pr.make_batch(rng)
        item = (x.numpy(), y.numpy())
        while not stop.is_set():
            try:
                out.put(item, timeout=0.5)
                break
            except queue.Full:
                continue


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    torch.set_num_threads(1)  # the loop on one core; the producer process has the other
    net = pr.model().to(device)
    step = pr.accumulating_step(net, torch.optim.SGD(net.parameters(), lr=0.01), device)
    if args.relieve:
        return sc.Loop(pr.precomputed(), step)
    ctx = mp.get_context("fork")  # the child starts at once, torch already imported
    ready = ctx.Queue(maxsize=4)
    stop = ctx.Event()
    producer = ctx.Process(target=produce, args=(ready, stop), name="producer", daemon=True)
    producer.start()

    def taken() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            x, y = ready.get()
            yield torch.from_numpy(x), torch.from_numpy(y)

    def end() -> None:
        stop.set()
        with contextlib.suppress(Exception):
            while True:
                ready.get_nowait()
        producer.join(timeout=3)
        if producer.is_alive():
            producer.kill()

    return sc.Loop(taken(), step, end)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup, device="cpu")

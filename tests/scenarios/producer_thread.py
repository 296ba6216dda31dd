"""Scenario producer_thread (expected label: dataloader-bound).

Bottleneck: the data comes from a hand-written producer, not a DataLoader: a
``threading.Thread`` "decodes" and augments samples in numpy and Python
(tests/scenarios/_producer.py: crops, flips, jitter, a blur, an annotation
parsed in Python per sample) and puts whole batches into a
``queue.Queue(maxsize=4)``; the loop takes them with ``queue.get()`` and trains a
small CNN with gradient accumulation (an optimizer step every 4 micro-batches).
The producer needs several times the loop's compute per batch, so the loop's
main thread waits in ``queue.get()`` (a ``threading.Condition`` wait) most of
the time, and the producer's Python work competes with the loop for the GIL.
The loop computes on one intra-op thread: the producer has the other core.

--relieve: the batches are made before the loop (24 of them, cycled): no
producer, no wait.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
from collections.abc import Iterator

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _producer as pr
import _scenario as sc

EXPECTED = "dataloader-bound"
SUB_CAUSE = "loader-producer-thread"
NAME = "producer_thread"


def produce(out: queue.Queue, stop: threading.Event) -> None:
    for batch in pr.batches():
        while not stop.is_set():
            try:
                out.put(batch, timeout=0.5)
                break
            except queue.Full:
                continue
        if stop.is_set():
            return


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    torch.set_num_threads(1)  # the loop on one core; the producer thread has the other
    net = pr.model().to(device)
    step = pr.accumulating_step(net, torch.optim.SGD(net.parameters(), lr=0.01), device)
    if args.relieve:
        return sc.Loop(pr.precomputed(), step)
    stop = threading.Event()
    ready: queue.Queue = queue.Queue(maxsize=4)
    producer = threading.Thread(target=produce, args=(ready, stop), name="producer", daemon=True)
    producer.start()

    def taken() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield ready.get()

    def end() -> None:
        stop.set()
        producer.join(timeout=2)

    return sc.Loop(taken(), step, end)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup, device="cpu")

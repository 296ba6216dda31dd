"""Scenario prefetch_generator (expected label: dataloader-bound).

Bottleneck: a generator of batches (numpy/Python per-sample "decode" and augmentation,
tests/scenarios/_producer.py) wrapped in a background prefetcher written here the way
prefetch_generator's ``BackgroundGenerator`` is: a daemon thread runs the generator and
puts each item into a ``queue.Queue(maxsize=2)``, and ``__next__`` takes it with
``queue.get()``. The loop iterates the prefetcher and trains a small CNN with gradient
accumulation (an optimizer step every 4 micro-batches). The generator needs several times
the loop's compute per batch: the loop waits in ``__next__`` -> ``queue.get()``.

--relieve: the generator's batches are made before the loop (24, cycled): no prefetcher.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _producer as pr
import _scenario as sc

EXPECTED = "dataloader-bound"
SUB_CAUSE = "loader-producer-thread"
NAME = "prefetch_generator"


class BackgroundGenerator(threading.Thread):
    """Runs ``generator`` on a daemon thread, ``max_prefetch`` items ahead of its reader."""

    def __init__(self, generator: Iterator[Any], max_prefetch: int = 2) -> None:
        super().__init__(daemon=True, name="prefetch")
        self.queue: queue.Queue = queue.Queue(max_prefetch)
        self.generator = generator
        self.start()

    def run(self) -> None:
        for item in self.generator:
            self.queue.put(item)
        self.queue.put(None)

    def __iter__(self) -> BackgroundGenerator:
        return self

    def __next__(self) -> Any:
        item = self.queue.get()
        if item is None:
            raise StopIteration
        return item


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    torch.set_num_threads(1)  # the loop on one core; the prefetcher's thread has the other
    net = pr.model().to(device)
    step = pr.accumulating_step(net, torch.optim.SGD(net.parameters(), lr=0.01), device)
    return sc.Loop(pr.precomputed() if args.relieve else BackgroundGenerator(pr.batches()), step)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup, device="cpu")

"""Scenario producer_keeps_up (expected label: cpu-bound).

A hand-written producer that is *not* the bottleneck (the control for the producer scenarios): a
``threading.Thread`` fills a ``queue.Queue(maxsize=4)`` with cheap batches (random tensors, a
normalisation: well under a millisecond each), and the loop takes them with ``queue.get()`` and
trains a wide MLP (4 hidden layers of 1024 on batches of 256) on the CPU. The queue is always
full: the loop never waits for data, it computes, and its own CPU sets the step.

--relieve: the same MLP 4x narrower (hidden width 256, ~16x fewer FLOPs); the producer unchanged.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "cpu-bound"
NAME = "producer_keeps_up"
BATCH, FEATURES, WIDTH = 256, 256, 1024


def produce(out: queue.Queue, stop: threading.Event) -> None:  # type: ignore[type-arg]
    g = torch.Generator().manual_seed(0)
    while not stop.is_set():
        x = torch.randn(BATCH, FEATURES, generator=g)
        batch = ((x - x.mean()) / (x.std() + 1e-5), torch.randint(0, 10, (BATCH,), generator=g))
        while not stop.is_set():
            try:
                out.put(batch, timeout=0.5)
                break
            except queue.Full:
                continue


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    width = WIDTH // 4 if args.relieve else WIDTH
    layers: list[nn.Module] = [nn.Linear(FEATURES, width), nn.ReLU()]
    for _ in range(3):
        layers += [nn.Linear(width, width), nn.ReLU()]
    net = nn.Sequential(*layers, nn.Linear(width, 10)).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        loss = F.cross_entropy(net(batch[0].to(device)), batch[1].to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        return loss.detach()

    stop = threading.Event()
    ready: queue.Queue = queue.Queue(maxsize=4)  # type: ignore[type-arg]
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

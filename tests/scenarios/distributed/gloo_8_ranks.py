"""Distributed scenario gloo_8_ranks (expected: communication-bound, no straggler).

8 ranks (DDP, gloo over loopback, one intra-op thread each) on a 2-core machine train a model
with many parameters and little compute per step: one 2048 x 2048 linear layer and a small head
(4.2 M parameters, 17 MB of gradients) on batches of 4 in-memory rows. Every step all-reduces the
gradients; gloo's ring all-reduce over loopback is itself CPU work (copies and sums on gloo's
threads) and the ranks spend most of their step in it, waiting on each other. 8 ranks x 1
thread on 2 CPUs: the ranks also queue for CPUs, but the queueing is the all-reduce's.

--relieve: gradient accumulation: DDP's ``no_sync()`` for 4 of every 5 batches (one all-reduce
per 5 batches, the steps counted are batches: the same work as without the flag).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _dist

EXPECTED = "communication-bound"
STRAGGLER = None
NAME = "gloo_8_ranks"
RANKS = 8
BATCH, DIM, CLASSES, ACCUMULATE = 4, 2048, 10, 5


def setup(rank: int, world: int, args: argparse.Namespace) -> _dist.Step:
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh(), nn.Linear(DIM, CLASSES)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x_all = torch.randn(256, DIM)
    y_all = torch.randint(0, CLASSES, (256,))
    every = ACCUMULATE if args.relieve else 1

    def step(i: int) -> None:
        j = (i * BATCH) % len(x_all)
        x, y = x_all[j : j + BATCH], y_all[j : j + BATCH]
        last = (i + 1) % every == 0
        with contextlib.nullcontext() if last else model.no_sync():
            (F.cross_entropy(model(x), y) / every).backward()
        if last:
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step


if __name__ == "__main__":
    _dist.main(NAME, __doc__, setup, RANKS)

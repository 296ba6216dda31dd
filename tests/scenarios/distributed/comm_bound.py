"""Distributed scenario comm_bound (expected: communication-bound, no straggler).

Two ranks (DDP, gloo, one intra-op thread each) train a model with many parameters and
little compute per step: one 4096 x 4096 linear layer and a small head (16.8 M parameters,
67 MB of gradients) on batches of 2 in-memory rows. Forward and backward take a few ms; the
gradient all-reduce of 67 MB through gloo over loopback takes most of the step, and both ranks
wait in it alike.

--relieve: gradient accumulation: DDP's ``no_sync()`` for 7 of every 8 batches, so the
all-reduce runs once per 8 batches (the steps counted are batches, the same work as without
the flag); fewer, larger all-reduces are a standard fix for a communication-bound job.
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
NAME = "comm_bound"
BATCH, DIM, CLASSES, ACCUMULATE = 2, 4096, 10, 8


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
    _dist.main(NAME, __doc__, setup)

"""Distributed scenario balanced (expected: cpu-bound on every rank, no straggler).

Two ranks (DDP, gloo, one intra-op thread each) train the same wide MLP (512 -> 1024 -> 1024
-> 10, about 1.6 M parameters) on in-memory batches of 256 through a DataLoader with
num_workers=0 and a cheap per-sample step (0.02 ms of CPU). Every rank does exactly the same
work: the matmuls of forward and backward (~2.4 GFLOP a step) dominate, the gradient
all-reduce (6 MB) and the data (5 ms a batch) are small, and no rank waits long on another.

--relieve: the same network 4x narrower (width 256), about 16x fewer FLOPs in its hidden
layers: each rank's own compute was the bottleneck.
"""

from __future__ import annotations

import argparse
import os
import sys

from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _dist

EXPECTED = "cpu-bound"
STRAGGLER = None
NAME = "balanced"
N_SAMPLES, BATCH, DIM, CLASSES = 4096, 256, 512, 10


def setup(rank: int, world: int, args: argparse.Namespace) -> _dist.Step:
    width = 256 if args.relieve else 1024
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(DIM, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, CLASSES))
    )
    rows = _dist.BusyRows(N_SAMPLES, DIM, CLASSES, 0.00002)
    return _dist.sgd_steps(model, _dist.batches(DataLoader(rows, batch_size=BATCH, shuffle=True, drop_last=True)))


if __name__ == "__main__":
    _dist.main(NAME, __doc__, setup)

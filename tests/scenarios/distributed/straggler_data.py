"""Distributed scenario straggler_data (expected: dataloader-bound, straggler rank 1).

Two ranks (DDP, gloo, one intra-op thread each) train a small MLP on batches of 32 from a
DataLoader with num_workers=0, so each sample's preparation (a stand-in for decoding and
augmenting: 0.5 ms of CPU) runs in the rank's own loop. Rank 1's samples cost 4x as much
(2 ms: 64 ms a batch against rank 0's 16 ms). The model's compute and the all-reduce take a few
ms. In synchronous DDP both ranks' steps last as long as rank 1's: rank 0 finishes its batch
and its backward early and waits in the gradient all-reduce for ~48 ms of every step, the time
rank 1 spends more on its data. Rank 1 paces the job; its own data pipeline is why.

--relieve: rank 1's samples cost what rank 0's do (0.5 ms), the job then runs at rank 0's pace.
"""

from __future__ import annotations

import argparse
import os
import sys

from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _dist

EXPECTED = "dataloader-bound"
STRAGGLER = 1
NAME = "straggler_data"
N_SAMPLES, BATCH, DIM, CLASSES = 2048, 32, 256, 10
PER_SAMPLE_S = 0.0005
SLOW_FACTOR = 4


def setup(rank: int, world: int, args: argparse.Namespace) -> _dist.Step:
    slow = rank == 1 and not args.relieve
    dataset = _dist.BusyRows(N_SAMPLES, DIM, CLASSES, PER_SAMPLE_S * (SLOW_FACTOR if slow else 1))
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(DIM, 512), nn.ReLU(), nn.Linear(512, CLASSES)))
    return _dist.sgd_steps(model, _dist.batches(loader))


if __name__ == "__main__":
    _dist.main(NAME, __doc__, setup)

"""Scenario sleepy_dataset (expected label: undetermined).

Bottleneck: a remote wait.  Dataset.__getitem__ sleeps about 5 ms per sample
(standing in for a call to a remote feature/label service) and then returns a
cheap in-memory sample; num_workers=0, 16 samples a batch, so the main thread
sleeps inside DataLoader.__next__ for ~80 ms a step.  Neither CPU work, disk
reads nor the data pipeline's computation limits the step: it waits on a timer
(DESIGN: a loop that waits on a timer or a remote call is undetermined).

--relieve: no sleep.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "undetermined"
NAME = "sleepy_dataset"
N_SAMPLES, BATCH, DIM, LATENCY = 4096, 16, 128, 0.005


class Remote(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, relieve: bool) -> None:
        self.x = torch.randn(N_SAMPLES, DIM, generator=torch.Generator().manual_seed(0))
        self.latency = 0.0 if relieve else LATENCY

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.latency:
            time.sleep(self.latency)  # "remote service" round trip
        return self.x[i], int(self.x[i, :10].argmax())


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    loader = sc.data_loader(Remote(args.relieve), BATCH)
    model = nn.Sequential(nn.Linear(DIM, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    return sc.Loop(loader, sc.batch_steps(model, sc.adam(model), device))


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

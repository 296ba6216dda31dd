"""Scenario sleepy_loop (expected label: undetermined).

Bottleneck: a timer.  The model is small and the data in memory (no DataLoader),
but the loop calls time.sleep(0.05) after every step (a rate limiter / polling
wait), so the main thread sleeps most of the wall time; no CPU, disk or data
pipeline limits the step.

--relieve: no sleep.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "undetermined"
NAME = "sleepy_loop"
N_SAMPLES, BATCH, DIM, PAUSE = 8192, 64, 128, 0.05


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    x_all = torch.randn(N_SAMPLES, DIM)
    y_all = x_all[:, :10].argmax(1)
    model = nn.Sequential(nn.Linear(DIM, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    train = sc.row_steps(model, sc.adam(model), x_all, y_all, BATCH, device)

    def step(i: int) -> torch.Tensor:
        loss = train(i)
        if not args.relieve:
            time.sleep(PAUSE)  # rate limiter
        return loss

    return sc.Loop(itertools.count(), step)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

"""Scenario sleepy_loop (expected label: undetermined).

Bottleneck: a timer.  The model is small and the data in memory (no DataLoader),
but the loop calls time.sleep(0.05) after every step (a rate limiter / polling
wait), so the main thread sleeps most of the wall time; no CPU, disk or data
pipeline limits the step.

--relieve: no sleep.
"""

from __future__ import annotations

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


def main() -> None:
    args = sc.parse_args(NAME, __doc__)
    sc.seed()
    device = torch.device(args.device)
    with sc.Run(NAME, device) as run:
        x_all = torch.randn(N_SAMPLES, DIM)
        y_all = x_all[:, :10].argmax(1)
        model = nn.Sequential(nn.Linear(DIM, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step(i: int) -> torch.Tensor:
            x, y = sc.batch_at(x_all, y_all, i, BATCH, device)
            loss = sc.sgd_step(model, opt, x, y)
            if not args.relieve:
                time.sleep(PAUSE)  # rate limiter
            return loss

        run.train(itertools.count(), step, args.seconds)


if __name__ == "__main__":
    main()

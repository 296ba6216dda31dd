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
import torch.nn.functional as F
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
            j = (i * BATCH) % N_SAMPLES
            x, y = x_all[j : j + BATCH].to(device), y_all[j : j + BATCH].to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            if not args.relieve:
                time.sleep(PAUSE)  # rate limiter
            return loss.detach()

        run.train(itertools.count(), step, args.seconds)


if __name__ == "__main__":
    main()

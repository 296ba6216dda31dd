"""Scenario item_every_op (expected label: cpu-bound).

Bottleneck: framework overhead from many tiny ops.  The loss is built scalar by
scalar: for every sample of the batch a few 0-d tensor ops (index, subtract,
square, clamp, add) and a ``.item()`` to log each term in a Python list, then
the terms are summed one by one into the loss.  Hundreds of tiny dispatches and
their autograd nodes per step, in the main thread; data is in memory, the MLP
is small, no DataLoader.

--relieve: the same loss computed batched (one vectorised expression, no
per-sample ``.item()``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "cpu-bound"
NAME = "item_every_op"
N_SAMPLES, BATCH, DIM = 8192, 64, 32


def scalar_loss(pred: torch.Tensor, y: torch.Tensor, log: list[float]) -> torch.Tensor:
    total = pred.new_zeros(())
    for i in range(pred.shape[0]):
        d = pred[i, 0] - y[i]
        term = d * d + 0.1 * (pred[i, 1] - 1.0).clamp(min=0.0)
        log.append(term.item())
        total = total + term
    return total / pred.shape[0]


def batched_loss(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((pred[:, 0] - y) ** 2 + 0.1 * (pred[:, 1] - 1.0).clamp(min=0.0)).mean()


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    x_all = torch.randn(N_SAMPLES, DIM)
    y_all = x_all[:, :4].sum(1)
    model = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 2)).to(device)
    opt = sc.adam(model)
    log: list[float] = []

    def step(i: int) -> torch.Tensor:
        x, y = sc.batch_at(x_all, y_all, i, BATCH, device)
        pred = model(x)
        loss = sc.optimize(opt, batched_loss(pred, y) if args.relieve else scalar_loss(pred, y, log))
        del log[:-1000]
        return loss

    return sc.Loop(itertools.count(), step)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

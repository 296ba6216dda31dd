"""Scenario slow_collate (expected label: dataloader-bound).

Bottleneck: samples are cheap (a row sliced from an in-memory tensor) but the
DataLoader's collate_fn is expensive pure Python: it turns every sample into
Python lists (tolist), clips, rescales and pads each value one by one, builds
per-sample dicts of statistics and then a tensor from the nested lists.  With
num_workers=0 this runs in the main process inside DataLoader.__next__ and
dominates the step; the MLP is small.

--relieve: the same work vectorised in torch (clamp, scale, pad, torch.stack)
as the collate_fn.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "dataloader-bound"
NAME = "slow_collate"
N_SAMPLES, BATCH, DIM, PAD = 4096, 32, 384, 400


class Rows(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self) -> None:
        self.x = torch.randn(N_SAMPLES, DIM, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], i % 10


def slow_collate(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    rows, labels = [], []
    for x, y in samples:
        values = x.tolist()
        stats = {"min": min(values), "max": max(values), "n": len(values)}
        span = (stats["max"] - stats["min"]) or 1.0
        row = []
        for v in values:
            v = max(-3.0, min(3.0, v))
            row.append((v - stats["min"]) / span * 2.0 - 1.0)
        row.extend([0.0] * (PAD - len(row)))
        rows.append(row)
        labels.append(y)
    return torch.tensor(rows), torch.tensor(labels)


def fast_collate(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.stack([s[0] for s in samples])
    lo, hi = x.min(1, keepdim=True).values, x.max(1, keepdim=True).values
    x = (x.clamp(-3.0, 3.0) - lo) / (hi - lo).clamp_min(1e-12) * 2.0 - 1.0
    x = torch.nn.functional.pad(x, (0, PAD - DIM))
    return x, torch.tensor([s[1] for s in samples])


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    loader = sc.data_loader(Rows(), BATCH, collate_fn=fast_collate if args.relieve else slow_collate)
    model = nn.Sequential(nn.Linear(PAD, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
    return sc.Loop(loader, sc.batch_steps(model, sc.adam(model), device))


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

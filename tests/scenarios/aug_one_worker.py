"""Scenario aug_one_worker (expected label: dataloader-bound).

Bottleneck: every sample gets a heavy CPU augmentation in Dataset.__getitem__
(two rounds of grid_sample rotation, colour jitter, an unfold blur + unsharp
mask: about 10 ms of torch CPU work per 3x64x64 sample, 16 samples a batch)
done in ONE DataLoader worker process; the tiny CNN in the main process waits
for batches most of the time.

--relieve: the samples are augmented once, up front, and __getitem__ returns the
precomputed tensor (still num_workers=1), so the producer costs nearly nothing.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "dataloader-bound"
NAME = "aug_one_worker"
WORKERS = 1
N_SAMPLES, BATCH, PRECOMPUTED = 1024, 16, 64


class Augmented(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, relieve: bool) -> None:
        g = torch.Generator().manual_seed(0)
        self.base = torch.randn(N_SAMPLES, 3, 64, 64, generator=g)
        self.cache = torch.stack([sc.heavy_augment(self.base[i], 2) for i in range(PRECOMPUTED)]) if relieve else None

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.cache is not None:
            return self.cache[i % PRECOMPUTED], i % 10
        return sc.heavy_augment(self.base[i], 2), i % 10


def setup(args: argparse.Namespace, device: torch.device, workers: int = WORKERS) -> sc.Loop:
    loader = sc.data_loader(Augmented(args.relieve), BATCH, workers, persistent_workers=True)
    model = sc.small_cnn().to(device)
    return sc.Loop(loader, sc.batch_steps(model, sc.adam(model), device))


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

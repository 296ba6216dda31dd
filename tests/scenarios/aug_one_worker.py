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

import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset

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


def main(name: str = NAME, workers: int = WORKERS, doc: str | None = __doc__) -> None:
    args = sc.parse_args(name, doc)
    sc.seed()
    device = torch.device(args.device)
    with sc.Run(name, device) as run:
        loader = DataLoader(
            Augmented(args.relieve),
            batch_size=BATCH,
            shuffle=True,
            drop_last=True,
            num_workers=workers,
            persistent_workers=True,
        )
        model = sc.small_cnn().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            x, y = sc.to_device(batch, device)
            return sc.sgd_step(model, opt, x, y)

        run.train(loader, step, args.seconds)


if __name__ == "__main__":
    main()

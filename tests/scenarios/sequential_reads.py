"""Scenario sequential_reads (expected label: io-bound).

Bottleneck: each sample is one large contiguous 2 MiB O_DIRECT read (no page
cache) from a 1 GiB random-bytes file, samples walked in file order so the reads
are sequential, in Dataset.__getitem__ with num_workers=0: the main thread sits
in uninterruptible disk wait (state D) for most of each step.  The model on top
(a strided mean-pool of the bytes into an MLP) is small.  Falls back to
fadvise(DONTNEED) + buffered reads where O_DIRECT is refused.

Data file: $TORCHWATCH_DEMO_DIR (else $TMPDIR/torchwatch-demo)/scn_sequential.bin,
created once.

--relieve: the first 64 MiB of the file (32 samples) are read once up front into
RAM and __getitem__ returns slices of it: the same bytes per sample, no disk wait
in the loop.
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

EXPECTED = "io-bound"
NAME = "sequential_reads"
FILE_SIZE, SAMPLE, BATCH, CACHED = 1 << 30, 2 << 20, 4, 32
N_SAMPLES = FILE_SIZE // SAMPLE
FEAT = 1024


STRIDE = SAMPLE // (FEAT * 16)  # bytes of a sample the model looks at: every STRIDE-th


class Chunks(Dataset[torch.Tensor]):
    def __init__(self, path: str, relieve: bool, subsample: bool = False) -> None:
        self.subsample = subsample  # keep every STRIDE-th byte here (in the worker), not in the step
        self.reader = sc.DirectReader(path, SAMPLE, NAME)
        self.ram = (
            torch.stack(
                [torch.frombuffer(self.reader.read([i * SAMPLE], SAMPLE), dtype=torch.uint8) for i in range(CACHED)]
            )
            if relieve
            else None
        )

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.ram is not None:
            data = self.ram[i % CACHED]
        else:
            data = torch.frombuffer(self.reader.read([i * SAMPLE], SAMPLE), dtype=torch.uint8)
        return data[::STRIDE].clone() if self.subsample else data


def setup(
    args: argparse.Namespace, device: torch.device, name: str = NAME, workers: int = 0, batch: int = BATCH
) -> sc.Loop:
    """Train on the file's chunks with ``workers`` DataLoader workers, ``batch`` samples a step."""
    chunks = Chunks(sc.data_file("scn_sequential.bin", FILE_SIZE, name), args.relieve, subsample=workers > 0)
    loader = sc.data_loader(chunks, batch, workers, shuffle=False)  # sequential through the file
    model = nn.Sequential(nn.Linear(FEAT, 128), nn.ReLU(), nn.Linear(128, 2)).to(device)
    opt = sc.adam(model)

    def step(batch: torch.Tensor) -> torch.Tensor:
        raw = sc.to_device(batch, device)  # (BATCH, SAMPLE) or, subsampled, (BATCH, SAMPLE // STRIDE) uint8
        if raw.shape[1] == SAMPLE:
            raw = raw[:, ::STRIDE]
        x = raw.reshape(raw.shape[0], FEAT, 16).float().mean(-1) / 255.0
        y = (x[:, :64].mean(1) > 0.5).long()
        return sc.sgd_step(model, opt, (x - 0.5) * 10, y)

    return sc.Loop(loader, step)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

"""Scenario random_reads_workers (expected label: io-bound).

Bottleneck: each sample is 32 scattered 4 KiB records of a 256 MiB random-bytes
file, read with O_DIRECT (no page cache) one pread at a time (queue depth 1) in
Dataset.__getitem__, in 2 DataLoader worker processes.  The workers sleep in
uninterruptible disk wait (state D) most of the time; the MLP is tiny.  If the
filesystem refuses O_DIRECT it falls back to fadvise(DONTNEED) + buffered reads.

Data file: $TORCHWATCH_DEMO_DIR (else $TMPDIR/torchwatch-demo)/scn_random_reads.bin,
created once.

--relieve: the whole file is read once up front (8 MiB sequential reads) into RAM
and __getitem__ gathers the same records from memory (still num_workers=2).
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys

import torch
from torch import nn
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "io-bound"
SUB_CAUSE = "storage-latency"
NAME = "random_reads_workers"
FILE_SIZE, BLOCK, READS, N_SAMPLES, BATCH = 256 << 20, 4096, 32, 4096, 32


class Records(Dataset[torch.Tensor]):
    def __init__(self, path: str, relieve: bool) -> None:
        g = torch.Generator().manual_seed(1)
        self.offsets = torch.randint(FILE_SIZE // BLOCK, (N_SAMPLES, READS), generator=g)
        self.blocks = (self.offsets * BLOCK).tolist()
        self.reader = sc.DirectReader(path, READS * BLOCK, NAME)
        self.ram = self._read_all(path) if relieve else None

    def _read_all(self, path: str) -> torch.Tensor:
        reader = sc.DirectReader(path, 8 << 20, NAME)
        ram = mmap.mmap(-1, FILE_SIZE)
        for off in range(0, FILE_SIZE, 8 << 20):
            ram[off : off + (8 << 20)] = reader.read([off], 8 << 20)
        return torch.frombuffer(ram, dtype=torch.uint8).view(-1, BLOCK)

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.ram is not None:
            return self.ram[self.offsets[i]]
        return torch.frombuffer(self.reader.read(self.blocks[i], BLOCK), dtype=torch.uint8).view(READS, BLOCK)


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    records = Records(sc.data_file("scn_random_reads.bin", FILE_SIZE, NAME), args.relieve)
    loader = sc.data_loader(records, BATCH, 2, persistent_workers=True)
    model = nn.Sequential(nn.Linear(READS * 64, 64), nn.ReLU(), nn.Linear(64, 2)).to(device)
    opt = sc.adam(model)

    def step(batch: torch.Tensor) -> torch.Tensor:
        raw = sc.to_device(batch, device)
        x = raw.view(BATCH, READS, 64, 64).float().mean(-1).flatten(1) / 255.0
        y = (x[:, :64].mean(1) > 0.5).long()
        return sc.sgd_step(model, opt, (x - 0.5) * 10, y)

    return sc.Loop(loader, step)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

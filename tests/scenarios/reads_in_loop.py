"""Scenario reads_in_loop (expected label: io-bound).

Bottleneck: no DataLoader.  The training loop itself reads each batch from disk:
32 samples x 8 scattered 4 KiB records of a 256 MiB random-bytes file, read with
O_DIRECT (no page cache) one pread at a time in the main thread, right before the
forward pass; the MLP is tiny, so the main thread is in disk wait (state D) most
of every step.  Falls back to fadvise(DONTNEED) + buffered reads where O_DIRECT is
refused.

Data file: shared with random_reads_workers,
$TORCHWATCH_DEMO_DIR (else $TMPDIR/torchwatch-demo)/scn_random_reads.bin.

--relieve: the whole file is read once up front (8 MiB sequential reads) into RAM
and the loop gathers the same records from memory.
"""

from __future__ import annotations

import argparse
import itertools
import mmap
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "io-bound"
SUB_CAUSE = "storage-latency"
NAME = "reads_in_loop"
FILE_SIZE, BLOCK, READS, BATCH = 256 << 20, 4096, 8, 32


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    path = sc.data_file("scn_random_reads.bin", FILE_SIZE, NAME)
    reader = sc.DirectReader(path, BATCH * READS * BLOCK, NAME)
    ram = None
    if args.relieve:
        whole = sc.DirectReader(path, 8 << 20, NAME)
        buf = mmap.mmap(-1, FILE_SIZE)
        for off in range(0, FILE_SIZE, 8 << 20):
            buf[off : off + (8 << 20)] = whole.read([off], 8 << 20)
        ram = torch.frombuffer(buf, dtype=torch.uint8).view(-1, BLOCK)
    g = torch.Generator().manual_seed(2)
    model = nn.Sequential(nn.Linear(READS * 64, 64), nn.ReLU(), nn.Linear(64, 2)).to(device)
    opt = sc.adam(model)

    def step(_: int) -> torch.Tensor:
        blocks = torch.randint(FILE_SIZE // BLOCK, (BATCH * READS,), generator=g)
        if ram is not None:
            raw = ram[blocks]
        else:  # the loop itself waits on each read
            raw = torch.frombuffer(reader.read((blocks * BLOCK).tolist(), BLOCK), dtype=torch.uint8)
        x = raw.view(BATCH, READS, 64, 64).float().mean(-1).flatten(1).to(device) / 255.0
        y = (x[:, :64].mean(1) > 0.5).long()
        return sc.sgd_step(model, opt, (x - 0.5) * 10, y)

    return sc.Loop(itertools.count(), step)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

"""Scenario decode_in_workers (expected label: dataloader-bound).

Bottleneck: samples live in memory as compressed bytes (PNG-like: a row-delta
filter, then zlib), 3x256x256 uint8 images.  Dataset.__getitem__ decodes each one
(zlib.decompress, undo the delta filter with a cumulative sum, to float,
per-channel normalisation, antialiased resize to 96x96) -- a few ms of CPU per
sample, 32 samples a batch -- in 2 DataLoader worker processes; the small CNN in
the main process waits for batches.

--relieve: the samples are decoded once, up front, and __getitem__ returns the
decoded tensor (still num_workers=2).
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "dataloader-bound"
NAME = "decode_in_workers"
N_SAMPLES, DISTINCT, BATCH, SIDE, OUT = 2048, 64, 32, 256, 96


def encode(img: torch.Tensor) -> bytes:
    """uint8 (3, SIDE, SIDE) -> zlib(row deltas), like PNG's Sub filter."""
    delta = torch.diff(img.to(torch.int16), dim=-1, prepend=torch.zeros(3, SIDE, 1, dtype=torch.int16))
    return zlib.compress((delta % 256).to(torch.uint8).numpy().tobytes(), 1)


def decode(blob: bytes) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(zlib.decompress(blob)), dtype=torch.uint8).view(3, SIDE, SIDE)
    img = (raw.to(torch.int32).cumsum(-1) % 256).float() / 255.0
    img = (img - img.mean((1, 2), keepdim=True)) / (img.std((1, 2), keepdim=True) + 1e-5)
    return F.interpolate(img[None], size=(OUT, OUT), mode="bilinear", antialias=True)[0]


def make_images() -> list[bytes]:
    g = torch.Generator().manual_seed(0)
    x = torch.linspace(0, 1, SIDE)
    blobs = []
    for i in range(DISTINCT):
        f = 5 + i % 17
        base = (torch.sin(x[:, None] * f) + torch.cos(x[None, :] * (f + 3))) * 60 + 128
        img = torch.stack([base, base.T, base.flip(0)]) + torch.randint(0, 6, (3, SIDE, SIDE), generator=g)
        blobs.append(encode(img.clamp(0, 255).to(torch.uint8)))
    return blobs


class Compressed(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, relieve: bool) -> None:
        self.blobs = make_images()  # sample i is blob i % DISTINCT: decoded anew on every access
        self.decoded = torch.stack([decode(b) for b in self.blobs]) if relieve else None

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.decoded is not None:
            return self.decoded[i % DISTINCT], i % 10
        return decode(self.blobs[i % DISTINCT]), i % 10


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    loader = sc.data_loader(Compressed(args.relieve), BATCH, 2, persistent_workers=True)
    model = sc.small_cnn().to(device)
    return sc.Loop(loader, sc.batch_steps(model, sc.adam(model), device))


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

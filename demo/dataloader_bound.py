"""Demo training bottlenecked on the DataLoader (expected torchwatch label: dataloader-bound).

Bottleneck: every sample is "decoded" (a JPEG-like 8x8 block inverse DCT) and then
augmented on the CPU inside Dataset.__getitem__ (random resized crop, rotation via
grid_sample, colour jitter, an unfold-based Gaussian blur, an unsharp mask,
normalisation): about 5 ms of CPU work per sample, redone every epoch, with the
classic DEFAULT num_workers=0, so the main thread spends most of its time inside
DataLoader.__next__ while the tiny CNN waits.  With --num-workers N the same
transforms run in worker processes and still dominate on a 2-core machine.

--relieve removes the per-sample pipeline from the loop: the dataset is decoded and
preprocessed ONCE up front (vectorised, cached as one tensor) and __getitem__ only
does a cheap random flip + shifted crop by slicing the cached tensor (the costly
geometric/blur augmentations are what it gives up).  It deliberately does NOT add
workers: on 2 cores that alone would not give a reliable 1.5x.
"""

from __future__ import annotations

import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common

NAME = "dataloader_bound"
N_SAMPLES, BATCH, K = 2048, 32, 13  # K: blur kernel size
# Low DCT frequencies (row, col) that carry the class label.
LABEL_FREQ = [(0, 1), (1, 0), (1, 1), (0, 2), (2, 0), (1, 2), (2, 1), (2, 2), (0, 3), (3, 0)]


def _dct_basis(n: int = 8) -> torch.Tensor:
    k, x = torch.arange(n).float(), torch.arange(n).float()
    c = torch.cos(math.pi * (2 * x[None, :] + 1) * k[:, None] / (2 * n)) * math.sqrt(2 / n)
    c[0] /= math.sqrt(2)
    return torch.kron(c, c)  # (64 coefficients, 64 pixels) of one 8x8 block


IDCT = _dct_basis()
DECAY = torch.exp(-torch.arange(64).float() / 8)
_g = torch.exp(-((torch.arange(K).float() - K // 2) ** 2) / (2 * 3.0**2))
GAUSS = torch.outer(_g, _g).flatten() / torch.outer(_g, _g).sum()


def decode(idx: torch.Tensor) -> torch.Tensor:
    """'Decode' images idx -> (n, 3, 64, 64): random DCT coefficients + block IDCT."""
    coef = torch.stack([torch.randn(3, 64, 64, generator=torch.Generator().manual_seed(int(i))) for i in idx]) * DECAY
    for j, i in enumerate(idx.tolist()):
        r, c = LABEL_FREQ[i % 10]
        coef[j, :, :, r * 8 + c] += 4.0
    pix = (coef @ IDCT).view(len(idx), 3, 8, 8, 8, 8)  # (n, ch, block y, block x, y, x)
    return pix.permute(0, 1, 2, 4, 3, 5).reshape(len(idx), 3, 64, 64)


def blur(img: torch.Tensor) -> torch.Tensor:
    cols = F.unfold(F.pad(img[None], (K // 2,) * 4, mode="reflect"), K)  # (1, 3*K*K, 4096)
    return (cols.view(3, K * K, 4096) * GAUSS[None, :, None]).sum(1).view(3, 64, 64)


def augment(img: torch.Tensor) -> torch.Tensor:
    """The expensive per-sample CPU chain (uses the global, seeded RNG)."""
    s = int(torch.randint(40, 65, (1,)))
    y0, x0 = (int(v) for v in torch.randint(0, 65 - s, (2,)))
    img = F.interpolate(img[None, :, y0 : y0 + s, x0 : x0 + s], size=(64, 64), mode="bilinear")[0]
    if torch.rand(1) < 0.5:
        img = img.flip(-1)
    a = float(torch.rand(1)) * 0.6 - 0.3
    theta = torch.tensor([[[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]]])
    grid = F.affine_grid(theta, [1, 3, 64, 64], align_corners=False)
    img = F.grid_sample(img[None], grid, padding_mode="reflection", align_corners=False)[0]
    img = img * (1 + 0.2 * torch.randn(3, 1, 1)) + 0.1 * torch.randn(3, 1, 1)
    img = blur(img)
    img = img + 0.5 * (img - blur(img))  # unsharp mask
    return (img - img.mean((1, 2), keepdim=True)) / (img.std((1, 2), keepdim=True) + 1e-5)


class SlowImages(Dataset[tuple[torch.Tensor, int]]):
    """Decode + augment every sample on access (the default)."""

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return augment(decode(torch.tensor([i]))[0]), i % 10


class CachedImages(Dataset[tuple[torch.Tensor, int]]):
    """--relieve: decode + normalise once, up front; cheap flip/crop on access."""

    def __init__(self) -> None:
        x = torch.cat([decode(torch.arange(c, min(c + 256, N_SAMPLES))) for c in range(0, N_SAMPLES, 256)])
        x = (x - x.mean((2, 3), keepdim=True)) / (x.std((2, 3), keepdim=True) + 1e-5)
        self.x = F.pad(x, (4, 4, 4, 4), mode="reflect")

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        y0, x0 = (int(v) for v in torch.randint(0, 9, (2,)))
        img = self.x[i, :, y0 : y0 + 64, x0 : x0 + 64]
        return (img.flip(-1) if torch.rand(1) < 0.5 else img), i % 10


def main() -> None:
    args = _common.parse_args(NAME, __doc__, num_workers=True)
    _common.seed()
    device = torch.device(args.device)
    with _common.Run(NAME, device) as run:
        data = CachedImages() if args.relieve else SlowImages()
        loader = DataLoader(
            data,
            batch_size=BATCH,
            shuffle=True,
            drop_last=True,
            num_workers=args.num_workers,
            persistent_workers=args.num_workers > 0,
            pin_memory=device.type == "cuda",
        )
        model = _common.small_cnn().to(device)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)

        def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            x, y = _common.to_device(batch, device)
            return _common.sgd_step(model, opt, x, y)

        run.train(loader, step, args.seconds)


if __name__ == "__main__":
    main()

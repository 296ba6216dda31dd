"""Shared helpers for the scenario trainings in tests/scenarios/.

Re-exports demo/_common.py (argument parsing with ``--seconds``/``--relieve``,
the ``Run`` context manager that handles SIGINT/SIGTERM and prints the final
``demo NAME: done, STEPS steps in SECONDS s, RATE steps/s`` line) and adds a
few pieces several scenarios share: the data-file location, an O_DIRECT reader
and a heavy per-sample CPU augmentation.

These scenarios score torchwatch on trainings it was not tuned on; their
ground truth is what they do (proven by --relieve), never what torchwatch says.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "demo"))
import _common  # noqa: E402

parse_args = _common.parse_args
seed = _common.seed
say = _common.say
to_device = _common.to_device
Run = _common.Run
small_cnn = _common.small_cnn
sgd_step = _common.sgd_step


def batch_at(
    x_all: torch.Tensor, y_all: torch.Tensor, i: int, size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch ``i`` of ``size`` rows of in-memory data, wrapping around, on ``device``."""
    j = (i * size) % len(x_all)
    return x_all[j : j + size].to(device), y_all[j : j + size].to(device)


DATA_DIR = os.environ.get("TORCHWATCH_DEMO_DIR") or os.path.join(tempfile.gettempdir(), "torchwatch-demo")


def data_file(name: str, size: int, who: str) -> str:
    """Path of a random-bytes data file of ``size`` bytes, created atomically if missing."""
    path = os.path.join(DATA_DIR, name)
    if os.path.exists(path) and os.path.getsize(path) == size:
        return path
    os.makedirs(DATA_DIR, exist_ok=True)
    say(who, f"creating {size >> 20} MiB data file {path}")
    tmp = f"{path}.{os.getpid()}.tmp"
    chunk = os.urandom(1 << 20)
    with open(tmp, "wb") as f:
        for i in range(size // (1 << 20)):
            # cheap but not trivially compressible/dedupable: vary each MiB
            f.write(chunk[i % 4096 :] + chunk[: i % 4096])
    os.replace(tmp, path)
    return path


class DirectReader:
    """Per-process O_DIRECT reader into a page-aligned buffer (falls back to
    posix_fadvise(DONTNEED) + buffered reads where O_DIRECT is refused)."""

    def __init__(self, path: str, bufsize: int, who: str) -> None:
        self.path, self.bufsize, self.who = path, bufsize, who
        self.pid, self.fd, self.direct, self.buf = -1, -1, True, None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "buf": None, "pid": -1, "fd": -1}

    def _open(self) -> None:
        if self.pid == os.getpid():
            return
        self.pid, self.buf = os.getpid(), mmap.mmap(-1, self.bufsize)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            os.preadv(self.fd, [memoryview(self.buf)[:4096]], 0)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            if self.fd >= 0:
                os.close(self.fd)
            self.fd, self.direct = os.open(self.path, os.O_RDONLY), False
            say(self.who, "warning: O_DIRECT not supported here; using fadvise(DONTNEED) + buffered reads")

    def read(self, offsets: list[int], size: int) -> bytearray:
        """Read ``size`` bytes at each offset (aligned), one pread at a time; return a copy."""
        self._open()
        assert self.buf is not None
        view = memoryview(self.buf)
        for j, off in enumerate(offsets):
            if not self.direct:
                os.posix_fadvise(self.fd, off, size, os.POSIX_FADV_DONTNEED)
            os.preadv(self.fd, [view[j * size : (j + 1) * size]], off)
        return bytearray(view[: len(offsets) * size])


# ---- heavy per-sample CPU augmentation (torch ops), ~5-15 ms per 3x64x64 sample ----

K = 11
_g = torch.exp(-((torch.arange(K).float() - K // 2) ** 2) / (2 * 2.5**2))
GAUSS = (torch.outer(_g, _g) / torch.outer(_g, _g).sum()).flatten()


def _blur(img: torch.Tensor) -> torch.Tensor:
    c, h, w = img.shape
    cols = F.unfold(F.pad(img[None], (K // 2,) * 4, mode="reflect"), K)
    return (cols.view(c, K * K, h * w) * GAUSS[None, :, None]).sum(1).view(c, h, w)


def heavy_augment(img: torch.Tensor, rounds: int = 3) -> torch.Tensor:
    """Random rotate (grid_sample), colour jitter, blur + unsharp mask, repeated ``rounds`` times."""
    for _ in range(rounds):
        a = float(torch.rand(1)) * 0.6 - 0.3
        theta = torch.tensor([[[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]]])
        grid = F.affine_grid(theta, [1, *img.shape], align_corners=False)
        img = F.grid_sample(img[None], grid, padding_mode="reflection", align_corners=False)[0]
        img = img * (1 + 0.2 * torch.randn(img.shape[0], 1, 1)) + 0.1 * torch.randn(img.shape[0], 1, 1)
        b = _blur(img)
        img = img + 0.5 * (img - b)
    return (img - img.mean((1, 2), keepdim=True)) / (img.std((1, 2), keepdim=True) + 1e-5)

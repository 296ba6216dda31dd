"""The harness of the scenario trainings in tests/scenarios/, and the pieces several share.

Every scenario is one call of :func:`main` with a function that builds what makes it that
scenario (its data, model and step); the harness gives the rest, the same for all:

- the arguments: ``--seconds S`` (train this long, default 30), ``--steps N`` (or stop after N
  steps, whichever comes first; 0: by ``--seconds`` only), ``--device``, ``--relieve`` (remove the
  scenario's bottleneck) and any the scenario adds;
- the seed, the loop and its timing, progress lines about every 2 s, SIGINT/SIGTERM handled
  (demo/_common.py's ``Run``, shared with the demos), and the final line that tests and bench
  scripts parse, on stderr::

      demo NAME: done, STEPS steps in SECONDS s, RATE steps/s

It also holds what several scenarios share: building a DataLoader, the classification step of a
DataLoader's batches or of in-memory rows, the data-file location, an O_DIRECT reader and a heavy
per-sample CPU augmentation.

These scenarios score torchwatch on trainings it was not tuned on; their ground truth is what
they do (proven by ``--relieve``), never what torchwatch says.
"""

from __future__ import annotations

import argparse
import errno
import math
import mmap
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "demo"))
import _common  # noqa: E402

seed = _common.seed
say = _common.say
to_device = _common.to_device
Run = _common.Run
small_cnn = _common.small_cnn
sgd_step = _common.sgd_step

Step = Callable[[Any], torch.Tensor]
"""One training step: takes what the loop's batches give (a DataLoader's batch, or the step's
number for an in-memory scenario), returns the loss (detached)."""


@dataclass
class Loop:
    """What a scenario trains: ``batches`` (iterated epoch after epoch; ``itertools.count()`` for
    a scenario that slices in-memory data by step number), the ``step`` run on each, and ``end``,
    called once after the loop (also when it is interrupted), or ``None``."""

    batches: Iterable[Any]
    step: Step
    end: Callable[[], None] | None = None


Setup = Callable[[argparse.Namespace, torch.device], Loop]
"""Builds a scenario's training from its parsed arguments, on the device it trains on."""


def parse_args(
    name: str, doc: str | None, extra: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.Namespace:
    """Every scenario's flags (``--seconds``, ``--steps``, ``--device``, ``--relieve``) and the
    ones ``extra`` adds to the parser."""

    def add(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--steps", type=int, default=0, help="stop after this many steps, if before --seconds (default 0: no limit)"
        )
        if extra is not None:
            extra(parser)

    return _common.parse_args(name, doc, extra=add)


def main(
    name: str,
    doc: str | None,
    setup: Setup,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
    device: str | None = None,
) -> None:
    """Run scenario ``name``: parse its arguments (``doc`` is its ``--help``), seed torch, build
    its training with ``setup`` and train it for ``--seconds`` s (or ``--steps`` steps), then
    print the final line. ``device`` forces a device (a CPU-only scenario), else ``--device``.

    Setup, loop and ``Loop.end`` all run inside ``Run``: a SIGINT or SIGTERM at any point prints
    the final line and exits 130.
    """
    args = parse_args(name, doc, extra)
    seed()
    where = torch.device(device or args.device)
    with Run(name, where) as run:
        loop = setup(args, where)
        try:
            run.train(loop.batches, loop.step, args.seconds, args.steps)
        finally:
            if loop.end is not None:
                loop.end()


def data_loader(dataset: Dataset[Any], batch: int, workers: int = 0, **options: Any) -> DataLoader[Any]:
    """A DataLoader of ``batch`` samples a batch in ``workers`` worker processes, shuffled (unless
    ``options`` says ``shuffle=False``), the last short batch dropped; other DataLoader
    ``options`` as given."""
    options.setdefault("shuffle", True)
    return DataLoader(dataset, batch_size=batch, drop_last=True, num_workers=workers, **options)


def adam(model: torch.nn.Module, lr: float = 1e-3) -> torch.optim.Optimizer:
    """``torch.optim.Adam`` over the model's parameters."""
    return torch.optim.Adam(model.parameters(), lr=lr)


def optimize(opt: torch.optim.Optimizer, loss: torch.Tensor) -> torch.Tensor:
    """One optimizer step on ``loss`` (gradients zeroed, backward, step); returns it detached."""
    opt.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    return loss.detach()


def batch_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, device: torch.device) -> Step:
    """The step of a DataLoader's ``(inputs, labels)`` batches: moved to ``device``, one
    classification step (:func:`sgd_step`)."""

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = to_device(batch, device)
        return sgd_step(model, opt, x, y)

    return step


def row_steps(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    x_all: torch.Tensor,
    y_all: torch.Tensor,
    size: int,
    device: torch.device,
) -> Step:
    """The step of in-memory data: step ``i`` trains on batch ``i`` of ``size`` rows
    (:func:`batch_at`), one classification step (:func:`sgd_step`)."""

    def step(i: int) -> torch.Tensor:
        x, y = batch_at(x_all, y_all, i, size, device)
        return sgd_step(model, opt, x, y)

    return step


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
        self.pid, self.fd, self.direct = -1, -1, True
        self.buf: mmap.mmap | None = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "buf": None, "pid": -1, "fd": -1}

    def _open(self) -> None:
        if self.pid == os.getpid():
            return
        buf = mmap.mmap(-1, self.bufsize)
        self.pid, self.buf = os.getpid(), buf
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            os.preadv(self.fd, [memoryview(buf)[:4096]], 0)
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

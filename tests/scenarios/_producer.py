"""What the hand-written-producer scenarios share: per-sample "decode + augment" work in numpy
and Python (no torch: what a PIL/numpy pipeline does), a model and a step with gradient
accumulation.

The producer scenarios (producer_thread, prefetch_generator, producer_process) make batches
with :func:`make_batch` outside any DataLoader (a thread, a generator on a thread, a process)
and hand them to the loop through a queue; their ``--relieve`` precomputes :data:`RELIEF_BATCHES`
batches before the loop and cycles them, so the loop never waits for data. The truth: the
loop waits on the producer, and the producer's CPU work sets the step (dataloader-bound).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

BATCH, SIZE, CROP = 16, 64, 56
ACCUM = 4  # micro-batches per optimizer step (gradient accumulation)
RELIEF_BATCHES = 24


def augment(raw: bytes, rng: np.random.Generator) -> np.ndarray:
    """One sample: "decode" ``raw`` to a 3 x SIZE x SIZE image, parse its annotation in Python,
    random crop and flip, colour jitter, a 3 x 3 blur and an unsharp mask (numpy)."""
    img = np.frombuffer(raw, dtype=np.uint8).reshape(3, SIZE, SIZE).astype(np.float32) / 255.0
    # the annotation: pure Python per sample, as a JSON/XML parse would be (holds the GIL)
    boxes = []
    for k in range(120):
        x0, y0 = (k * 7919) % SIZE, (k * 104729) % SIZE
        boxes.append(
            {"x": x0, "y": y0, "w": 1 + k % 9, "h": 1 + (k * 3) % 11, "area": (1 + k % 9) * (1 + (k * 3) % 11)}
        )
    keep = sorted(boxes, key=lambda b: -b["area"])[:8]
    for _ in range(3):
        i, j = rng.integers(0, SIZE - CROP + 1, size=2)
        crop = img[:, i : i + CROP, j : j + CROP]
        if rng.random() < 0.5:
            crop = crop[:, :, ::-1]
        crop = crop * (1 + 0.2 * rng.standard_normal((3, 1, 1))) + 0.1 * rng.standard_normal((3, 1, 1))
        pad = np.pad(crop, ((0, 0), (1, 1), (1, 1)), mode="reflect")
        blur = sum(pad[:, a : a + CROP, b : b + CROP] for a in range(3) for b in range(3)) / 9.0
        img = np.pad(crop + 0.5 * (crop - blur), ((0, 0), (0, SIZE - CROP), (0, SIZE - CROP)), mode="edge")
    out = img[:, :CROP, :CROP]
    out = (out - out.mean(axis=(1, 2), keepdims=True)) / (out.std(axis=(1, 2), keepdims=True) + 1e-5)
    return np.ascontiguousarray(out * (1.0 + 0.0 * len(keep)), dtype=np.float32)


def make_batch(rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of :data:`BATCH` augmented samples and their labels (CPU tensors)."""
    xs = [augment(rng.bytes(3 * SIZE * SIZE), rng) for _ in range(BATCH)]
    y = rng.integers(0, 10, size=BATCH)
    return torch.from_numpy(np.stack(xs)), torch.from_numpy(y)


def batches(seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches forever (:func:`make_batch`)."""
    rng = np.random.default_rng(seed)
    while True:
        yield make_batch(rng)


def precomputed(seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The relief: :data:`RELIEF_BATCHES` batches made before the loop, cycled."""
    return itertools.cycle(list(itertools.islice(batches(seed), RELIEF_BATCHES)))


def model() -> nn.Module:
    """A small CNN for 3 x CROP x CROP inputs."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def accumulating_step(net: nn.Module, opt: torch.optim.Optimizer, device: torch.device):  # type: ignore[no-untyped-def]
    """The step of one micro-batch: forward and backward, and every :data:`ACCUM` micro-batches
    the optimizer step (gradient accumulation)."""
    count = itertools.count(1)

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch[0].to(device), batch[1].to(device)
        loss = F.cross_entropy(net(x), y) / ACCUM
        loss.backward()  # type: ignore[no-untyped-call]
        if next(count) % ACCUM == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step

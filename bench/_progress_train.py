"""A small MNIST-like CPU training for ``bench/progress.py``: a two-layer conv net on random 1x28x28
images (the shapes of pytorch/examples' mnist), batches of 32 from a DataLoader, ``--epochs`` epochs
of ``--batches`` batches. Each step prints, to stderr::

    progress_train: epoch E batch B step N loss X

``--tqdm``: epochs and batches through tqdm bars (drawn on ``os.devnull``). ``--uneven``: every 10th
step takes 3 forward passes more (a batch of long samples), so the step time is not constant.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batches", type=int, default=150)
    ap.add_argument("--tqdm", action="store_true")
    ap.add_argument("--uneven", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    n = args.batches * 32
    data = TensorDataset(torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=32, shuffle=True)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 5 * 5, 10),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    screen = open(os.devnull, "w")  # noqa: SIM115
    epochs: object = range(1, args.epochs + 1)
    if args.tqdm:
        from tqdm import tqdm

        epochs = tqdm(epochs, desc="Epochs", file=screen)
    step = 0
    for epoch in epochs:  # type: ignore[attr-defined]
        batches = tqdm(loader, desc="batches", leave=False, file=screen) if args.tqdm else loader
        for batch, (x, y) in enumerate(batches, 1):
            step += 1
            if args.uneven and step % 10 == 0:
                with torch.no_grad():
                    for _ in range(3):
                        model(x)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            print(f"progress_train: epoch {epoch} batch {batch} step {step} loss {loss.item()!r}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Scenario loss_nan: a small CPU training whose loss turns NaN at a known step, then recovers.

A linear model on a DataLoader of 50 batches an epoch (``--samples`` / 4), 0.05 s of sleep per step (the loop waits,
it computes little). From step ``--nan-at`` on, for 10 steps, one input of the batch is NaN, so the
loss is NaN; the loop skips the optimizer step then, as ``torch.amp.GradScaler`` skips a step whose
gradients are not finite, and the loss is finite again afterwards. Each step prints, to stderr::

    loss_nan: epoch E batch B step N loss X t T

(E and B from 1, N the global step from 1, T ``time.monotonic()``), so a test can compare what torchwatch read with what
the script printed. After the last step the script waits ``--linger`` s, then exits 0.
``--lr-jump-at N``: from step N, for ``--lr-jump-steps`` steps, the learning rate is ``--lr-jump`` times
its own (a warm-up or schedule bug: the loss jumps, then comes back); ``--lr``: the learning rate (0:
a frozen model, whose loss stays flat). ``--tqdm``: the epochs and the batches of each go through
``tqdm`` bars (``Epochs``, ``batches``; drawn on ``os.devnull``), as many scripts show their progress.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--nan-at", type=int, default=70)
    parser.add_argument("--sleep", type=float, default=0.05)
    parser.add_argument("--linger", type=float, default=3.0)
    parser.add_argument("--samples", type=int, default=200, help="samples in the dataset (4 a batch)")
    parser.add_argument("--tqdm", action="store_true", help="epochs and batches through tqdm bars")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--lr-jump-at", type=int, default=0, help="the step the learning rate jumps at (0: never)")
    parser.add_argument("--lr-jump", type=float, default=100.0, help="by this factor")
    parser.add_argument("--lr-jump-steps", type=int, default=10, help="for this many steps")
    args = parser.parse_args()
    epochs: object = range(1, args.epochs + 1)
    screen = open(os.devnull, "w")  # noqa: SIM115 (open for the whole run)
    if args.tqdm:
        from tqdm import tqdm

        epochs = tqdm(epochs, desc="Epochs", file=screen)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loader = DataLoader(TensorDataset(torch.randn(args.samples, 16), torch.randn(args.samples, 1)), batch_size=4)
    step = 0
    for epoch in epochs:  # type: ignore[attr-defined]
        batches = tqdm(loader, desc="batches", leave=False, file=screen) if args.tqdm else loader
        for batch, (x, y) in enumerate(batches, 1):
            step += 1
            if args.nan_at <= step < args.nan_at + 10:
                x = x.clone()
                x[0, 0] = math.nan
            jump = args.lr_jump_at and args.lr_jump_at <= step < args.lr_jump_at + args.lr_jump_steps
            for group in opt.param_groups:
                group["lr"] = args.lr * (args.lr_jump if jump else 1.0)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            value = loss.item()
            if math.isfinite(value):
                opt.step()
            print(
                f"loss_nan: epoch {epoch} batch {batch} step {step} loss {value!r} t {time.monotonic():.3f}",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(args.sleep)
    time.sleep(args.linger)


if __name__ == "__main__":
    main()

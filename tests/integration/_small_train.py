"""A small CPU training for the hook's integration tests.

Usage: python _small_train.py [--seconds S] [--stop-file PATH] [--user-profiler]
With --user-profiler the whole loop runs inside the user's own torch.profiler.profile().
With --stop-file the loop also ends, as at its time limit, at the first step after PATH exists
(a test ends the training when it has checked what it needed, not at a time guessed for a
loaded machine). The last line on stdout is ``small_train: STEPS steps``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=60.0)
parser.add_argument("--user-profiler", action="store_true")
parser.add_argument("--stop-file", default="")
args = parser.parse_args()


def over() -> bool:
    """The time is up, or the stop file is there."""
    return time.monotonic() >= end or bool(args.stop_file and os.path.exists(args.stop_file))


loader = DataLoader(TensorDataset(torch.randn(512, 64), torch.randint(0, 4, (512,))), batch_size=16)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ctx = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if args.user_profiler else None
end = time.monotonic() + args.seconds
steps = 0
with ctx if ctx is not None else contextlib.nullcontext():
    while not over():
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            time.sleep(0.01)
            if over():
                break
print(f"small_train: {steps} steps", flush=True)

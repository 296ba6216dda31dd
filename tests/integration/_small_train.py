"""A small CPU training for the hook's integration tests.

Usage: python _small_train.py [--seconds S] [--user-profiler]
With --user-profiler the whole loop runs inside the user's own torch.profiler.profile().
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=60.0)
parser.add_argument("--user-profiler", action="store_true")
args = parser.parse_args()

loader = DataLoader(TensorDataset(torch.randn(512, 64), torch.randint(0, 4, (512,))), batch_size=16)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ctx = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if args.user_profiler else None
end = time.monotonic() + args.seconds
steps = 0
with ctx if ctx is not None else contextlib.nullcontext():
    while time.monotonic() < end:
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            time.sleep(0.01)
            if time.monotonic() >= end:
                break
print(f"small_train: {steps} steps", flush=True)

"""Scenario slow_import (expected label: cpu-bound).

Bottleneck: dense math on the CPU (big_cpu_matmul's wide MLP: 1024 -> 2048 x 3 -> 10,
batch 128, in-memory data), after a slow start: before it builds its data and model, the
script imports a module that takes 8 s (tests/scenarios/_slow_module.py: cold file reads and
Python work at import time). Before its first step no label may be given (the start's
reads and CPU are no loop's); after it the loop is cpu-bound.

One intra-op thread (on a shared 2-core machine two threads measured the barrier waits, not
the math: 1.0 vs 1.2 steps/s; one thread 0.4-1.0 vs 3.9-4.5).

--relieve: the same network 4x narrower (the loop's relief; the import stays).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "cpu-bound"
NAME = "slow_import"
N_SAMPLES, BATCH, DIM, WIDTH, CLASSES = 4096, 128, 1024, 2048, 10


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    importlib.import_module("_slow_module")  # 8 s of import before the first step
    torch.set_num_threads(1)  # one intra-op thread: the relief measures the math, not a shared machine's barrier waits
    x_all = torch.randn(N_SAMPLES, DIM)
    y_all = x_all[:, :CLASSES].argmax(1)
    w = WIDTH // 4 if args.relieve else WIDTH
    model = nn.Sequential(
        nn.Linear(DIM, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, CLASSES)
    ).to(device)
    return sc.Loop(itertools.count(), sc.row_steps(model, sc.adam(model, 1e-4), x_all, y_all, BATCH, device))


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

"""Scenario big_cpu_matmul (expected label: cpu-bound).

Bottleneck: dense math on the CPU.  A wide MLP (1024 -> 2048 -> 2048 -> 2048 -> 10,
about 10.5 M parameters) trains on in-memory data with batch 128: each step is
about 8 GFLOP of matmuls (forward, backward, Adam) on the CPU's cores, in the
training process itself; no DataLoader, the data is sliced from one tensor.

--relieve: the same network 4x narrower (hidden width 512), about 16x fewer
FLOPs in the hidden layers.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "cpu-bound"
NAME = "big_cpu_matmul"
N_SAMPLES, BATCH, DIM, WIDTH, CLASSES = 4096, 128, 1024, 2048, 10


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    x_all = torch.randn(N_SAMPLES, DIM)
    y_all = x_all[:, :CLASSES].argmax(1)
    w = WIDTH // 4 if args.relieve else WIDTH
    model = nn.Sequential(
        nn.Linear(DIM, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, CLASSES)
    ).to(device)
    return sc.Loop(itertools.count(), sc.row_steps(model, sc.adam(model, 1e-4), x_all, y_all, BATCH, device))


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

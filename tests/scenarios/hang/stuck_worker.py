"""Hang scenario stuck_worker (expected: a hang, DataLoader worker 0 stuck in ``__getitem__``).

One training process reads in-memory samples through a DataLoader with 2 workers, 16 samples a
batch. ``TORCHWATCH_SCENARIO_HANG_AFTER_S`` seconds after the training started (default 6) worker
0's ``__getitem__`` calls a "remote label service" that does not answer (:func:`fetch_label` sleeps
``TORCHWATCH_SCENARIO_STALL_S``, default an hour: a stand-in for a network read with no timeout, or a
lock a forked worker inherited held). Only a sample asked for in the 2 s after that moment stalls,
so a shorter stall ends and the training steps on (a stall, not a hang).
The main loop waits in ``DataLoader.__next__`` for that worker's batch (batches come back in
order), worker 1 has filled its prefetch slots and waits for more indices: nothing steps.

--relieve: the label service answers; the training runs ``--seconds`` and exits.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import _scenario as sc

NAME = "stuck_worker"
STUCK_WORKER = 0
HANG_AFTER_S = float(os.environ.get("TORCHWATCH_SCENARIO_HANG_AFTER_S", "6"))
STALL_S = float(os.environ.get("TORCHWATCH_SCENARIO_STALL_S", "3600"))
STARTED = time.monotonic()  # in the training process: the forked workers inherit it
N_SAMPLES, BATCH, DIM = 4096, 16, 64


def fetch_label(i: int, never_answers: bool) -> int:
    """The label of sample ``i`` from a "remote service"; with ``never_answers``, it hangs."""
    if never_answers:
        time.sleep(STALL_S)
    return i % 10


class RemoteLabels(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, relieve: bool) -> None:
        self.x = torch.randn(N_SAMPLES, DIM, generator=torch.Generator().manual_seed(0))
        self.relieve = relieve

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        info = get_worker_info()
        late = HANG_AFTER_S < time.monotonic() - STARTED < HANG_AFTER_S + 2.0
        stuck = not self.relieve and late and info is not None and info.id == STUCK_WORKER
        time.sleep(0.001)
        return self.x[i], fetch_label(i, stuck)


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    loader = sc.data_loader(RemoteLabels(args.relieve), BATCH, 2)
    model = nn.Sequential(nn.Linear(DIM, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    return sc.Loop(loader, sc.batch_steps(model, torch.optim.SGD(model.parameters(), lr=1e-2), device))


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

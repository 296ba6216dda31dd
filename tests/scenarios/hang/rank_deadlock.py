"""Hang scenario rank_deadlock (expected: a hang, rank 1 the odd one out).

Two ranks (DDP, gloo, one intra-op thread each) train a small MLP on in-memory batches. After
``--hang-at`` steps rank 1 blocks on a queue nothing ever fills (:func:`wait_for_token`, a
stand-in for a rank waiting on a lock, a file or a message that never comes); rank 0 goes on
into its next backward pass and waits there in DDP's gradient all-reduce for a rank 1 that
never arrives. Neither steps again until the process group's timeout (120 s, set in
``_dist.py``) ends the job.

Run it under torchrun (``python -m torch.distributed.run --standalone --nproc_per_node 2
tests/scenarios/hang/rank_deadlock.py``) or alone (it spawns its 2 ranks).

--relieve: rank 1 does not block; the job trains ``--seconds`` and exits.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import time

from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "distributed"))
import _dist

NAME = "rank_deadlock"
HANG_RANK = 1
HANG_AFTER_S = float(os.environ.get("TORCHWATCH_SCENARIO_HANG_AFTER_S", "6"))
N_SAMPLES, BATCH, DIM, CLASSES = 2048, 32, 128, 10


def wait_for_token(tokens: queue.Queue[int]) -> int:
    """Block until a token comes: none ever does (the deadlock)."""
    return tokens.get()


def setup(rank: int, world: int, args: argparse.Namespace) -> _dist.Step:
    dataset = _dist.BusyRows(N_SAMPLES, DIM, CLASSES, 0.0001)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, drop_last=True)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(DIM, 256), nn.ReLU(), nn.Linear(256, CLASSES)))
    train = _dist.sgd_steps(model, _dist.batches(loader))
    tokens: queue.Queue[int] = queue.Queue()
    started = time.monotonic()

    def step(i: int) -> None:
        if rank == HANG_RANK and not args.relieve and time.monotonic() - started > HANG_AFTER_S:
            _dist.say(NAME, f"rank {rank} blocks at step {i}")
            wait_for_token(tokens)
        train(i)

    return step


if __name__ == "__main__":
    _dist.main(NAME, __doc__, setup)

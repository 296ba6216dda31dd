"""Scenario lock_wait (expected label: undetermined).

Bottleneck: waiting on another thread that waits on a timer.  A background Python
thread plays a fake "parameter server": every 50 ms (time.sleep) it hands a fresh
copy of reference weights through a queue.Queue(maxsize=1).  The main loop blocks
in queue.get() for them before every step (mixing them into the model), then
does a small MLP step on in-memory data; no DataLoader.  The main thread spends
most of the wall time blocked on the queue's lock, the helper thread sleeping:
neither CPU, disk nor a data pipeline limits the step.

--relieve: no wait: the loop uses the last weights it has (get_nowait, which is
empty almost always) and never blocks.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import queue
import sys
import threading
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc

EXPECTED = "undetermined"
NAME = "lock_wait"
N_SAMPLES, BATCH, DIM, PERIOD = 8192, 64, 128, 0.05


def server(model: nn.Module, out: queue.Queue, stop: threading.Event) -> None:
    ref = [p.detach().clone() for p in model.parameters()]
    while not stop.is_set():
        time.sleep(PERIOD)
        with contextlib.suppress(queue.Full):
            out.put([r.clone() for r in ref], timeout=0.5)


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    stop = threading.Event()
    x_all = torch.randn(N_SAMPLES, DIM)
    y_all = x_all[:, :10].argmax(1)
    model = nn.Sequential(nn.Linear(DIM, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    train = sc.row_steps(model, sc.adam(model), x_all, y_all, BATCH, device)
    weights: queue.Queue = queue.Queue(maxsize=1)
    helper = threading.Thread(target=server, args=(model, weights, stop), name="param-server", daemon=True)
    helper.start()

    def step(i: int) -> torch.Tensor:
        try:
            ref = weights.get_nowait() if args.relieve else weights.get()
        except queue.Empty:
            ref = None
        if ref is not None:
            with torch.no_grad():
                for p, r in zip(model.parameters(), ref, strict=False):
                    p.mul_(0.99).add_(r, alpha=0.01)
        return train(i)

    def end() -> None:
        stop.set()
        helper.join(timeout=2)

    return sc.Loop(itertools.count(), step, end)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

"""Scenario threadpool_prefetch (expected label: dataloader-bound).

Bottleneck: batches made ahead by a ``concurrent.futures.ThreadPoolExecutor`` (one thread), the
way many hand-written loaders prefetch: three futures of :func:`_producer.make_batch` (numpy and
Python per-sample "decode" and augmentation) are kept in flight, and the loop takes the oldest
with ``future.result()``, then submits the next. The loop trains a small CNN with gradient
accumulation on one intra-op thread; making a batch takes several times the loop's compute, so
the loop's main thread waits in ``Future.result()`` (a ``threading.Condition`` wait) most of the
time.

--relieve: the batches are made before the loop (24 of them, cycled): no executor, no wait.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _producer as pr
import _scenario as sc

EXPECTED = "dataloader-bound"
SUB_CAUSE = "loader-producer-thread"
NAME = "threadpool_prefetch"
AHEAD = 3  # futures in flight


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    torch.set_num_threads(1)  # the loop on one core; the executor's thread has the other
    net = pr.model().to(device)
    step = pr.accumulating_step(net, torch.optim.SGD(net.parameters(), lr=0.01), device)
    if args.relieve:
        return sc.Loop(pr.precomputed(), step)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
    rng = np.random.default_rng(0)
    ahead: collections.deque[Future[tuple[torch.Tensor, torch.Tensor]]] = collections.deque(
        pool.submit(pr.make_batch, rng) for _ in range(AHEAD)
    )

    def taken() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            batch = ahead.popleft().result()
            ahead.append(pool.submit(pr.make_batch, rng))
            yield batch

    def end() -> None:
        for f in ahead:
            f.cancel()
        pool.shutdown(wait=False, cancel_futures=True)

    return sc.Loop(taken(), step, end)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup, device="cpu")

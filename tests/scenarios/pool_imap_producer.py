"""Scenario pool_imap_producer (expected label: dataloader-bound).

Bottleneck: batches made by a ``multiprocessing.Pool`` of one process through ``pool.imap`` (an
endless iterator of batch indices, ``chunksize=1``), a common way to move per-sample work off the
loop without a DataLoader. The pool's process makes each batch with :func:`_producer.make_batch`
(numpy and Python per-sample "decode" and augmentation, several times the loop's compute per
batch); the loop trains a small CNN with gradient accumulation on one intra-op thread and waits
in ``IMapIterator.next()`` (a ``threading.Condition`` wait that the pool's result-handler thread
ends when the child's batch arrives through its pipe) most of the time.

--relieve: the batches are made before the loop (24 of them, cycled): no pool, no wait.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import sys
from collections.abc import Iterator

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _producer as pr
import _scenario as sc

EXPECTED = "dataloader-bound"
SUB_CAUSE = "loader-producer-thread"
NAME = "pool_imap_producer"


def make(index: int) -> tuple[np.ndarray, np.ndarray]:
    """Batch number ``index`` as numpy arrays (what the pool's process returns through its pipe)."""
    torch.set_num_threads(1)
    x, y = pr.make_batch(np.random.default_rng(index))
    return x.numpy(), y.numpy()


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    torch.set_num_threads(1)  # the loop on one core; the pool's process has the other
    net = pr.model().to(device)
    step = pr.accumulating_step(net, torch.optim.SGD(net.parameters(), lr=0.01), device)
    if args.relieve:
        return sc.Loop(pr.precomputed(), step)
    pool = mp.get_context("fork").Pool(processes=1)
    made = pool.imap(make, itertools.count(), chunksize=1)

    def taken() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y in made:
            yield torch.from_numpy(x), torch.from_numpy(y)

    def end() -> None:
        pool.terminate()
        pool.join()

    return sc.Loop(taken(), step, end)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup, device="cpu")

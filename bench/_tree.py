"""A synthetic training tree for bench/footprint.py: 8 "ranks" x 8 forked workers (72 processes).

    python bench/_tree.py [--ranks 8] [--workers 8] [--seconds 60]

Each process does a little CPU work every 10 ms (a light load on a small machine), so the tree
looks like a multi-rank training to torchwatch without needing torch or GPUs.

--torch: each rank (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` set as torchrun sets them) also
runs a tiny training loop (a 64x64 linear layer, SGD, one intra-op thread, a step every ~10 ms)
with torchwatch's hook pre-loaded (as ``torchwatch run`` passes it on), so that it publishes
per-rank steps: torchwatch then reads and diagnoses every rank (the per-rank readings' cost).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time


def _busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        for i in range(2000):
            x += i * i
        time.sleep(0.01)


def _train(seconds: float) -> None:
    import torch  # after the workers are forked: they stay light

    torch.set_num_threads(1)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        loss = model(torch.randn(32, 64)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.01)


def rank(workers: int, seconds: float, train: bool = False) -> None:
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_busy, args=(seconds,)) for _ in range(workers)]
    for p in procs:
        p.start()
    if train:
        _train(seconds)
    else:
        _busy(seconds)
    for p in procs:
        p.join()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--torch", action="store_true", help="ranks run a tiny training loop (see above)")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank(args.workers, args.seconds, args.torch)
        return
    cmd = [sys.executable, __file__, "--rank", "--workers", str(args.workers), "--seconds", str(args.seconds)]
    env = dict(os.environ)
    if args.torch:
        # the hook pre-loaded in the ranks, as a launcher passes it on (this process has none)
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from torchwatch.watch.lifecycle import hook_env

        env = hook_env()
    ranks = [
        subprocess.Popen(
            cmd + (["--torch"] if args.torch else []),
            env={**env, "RANK": str(i), "LOCAL_RANK": str(i), "WORLD_SIZE": str(args.ranks)},
        )
        for i in range(args.ranks)
    ]
    for r in ranks:
        r.wait()


if __name__ == "__main__":
    main()

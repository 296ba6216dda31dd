"""A synthetic training tree for bench/footprint.py: 8 "ranks" x 8 forked workers (72 processes).

    python bench/_tree.py [--ranks 8] [--workers 8] [--seconds 60]

Each process does a little CPU work every 10 ms (a light load on a small machine), so the tree
looks like a multi-rank training to torchwatch without needing torch or GPUs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
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


def rank(workers: int, seconds: float) -> None:
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_busy, args=(seconds,)) for _ in range(workers)]
    for p in procs:
        p.start()
    _busy(seconds)
    for p in procs:
        p.join()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank(args.workers, args.seconds)
        return
    ranks = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank", "--workers", str(args.workers), "--seconds", str(args.seconds)]
        )
        for _ in range(args.ranks)
    ]
    for r in ranks:
        r.wait()


if __name__ == "__main__":
    main()

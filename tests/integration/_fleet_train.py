"""A data-parallel training over several nodes for the fleet test (test_fleet_netns.py).

Usage (on every node)::

    torchrun --nnodes N --nproc-per-node M ... _fleet_train.py --slow-rank R --slow-ms MS --hang-file PATH

DDP over gloo on the CPU, one intra-op thread a rank, a small MLP on in-memory batches. Global rank
``--slow-rank`` sleeps ``--slow-ms`` before each forward pass (a stand-in for a slower input
pipeline or GPU): it reaches backward last and the others wait for it in the gradient all-reduce.
Once ``--hang-file`` exists, that rank blocks on a queue nothing fills (a rank stuck outside any
collective: the deadlock) and the others wait for it in backward until the process group's
timeout (``--seconds`` + 60 s). Without a hang, every rank stops after ``--seconds`` at the same
step (rank 0's clock decides, told by a broadcast every 8 steps).
"""

from __future__ import annotations

import argparse
import datetime
import os
import queue
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--slow-ms", type=float, default=0.0)
parser.add_argument("--hang-file", default="")
parser.add_argument("--seconds", type=float, default=180.0)


def main() -> None:
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.seconds + 60))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
    never: queue.Queue[int] = queue.Queue()
    stop, start, steps = torch.zeros(1), time.monotonic(), 0
    while True:
        if rank == args.slow_rank:
            if args.hang_file and os.path.exists(args.hang_file):
                print(f"rank {rank} blocks at step {steps}", flush=True)
                never.get()  # the deadlock: nothing ever comes
            time.sleep(args.slow_ms / 1000)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
        steps += 1
        if steps % 8 == 0:
            stop.fill_(float(rank == 0 and time.monotonic() - start >= args.seconds))
            dist.broadcast(stop, 0)
            if stop.item():
                break
    print(f"rank {rank}: {steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

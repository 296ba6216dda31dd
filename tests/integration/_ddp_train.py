"""A 2-rank gloo DDP training on the CPU for the hook's distributed tests.

Usage:
    torchrun --standalone --nproc_per_node 2 _ddp_train.py --out DIR [options]
    python _ddp_train.py --spawn --port P --out DIR [options]      (torch.multiprocessing.spawn)

Options: ``--seconds S`` (train this long, and at least ``--min-steps`` steps), ``--workers N``
(DataLoader workers started with the ``spawn`` context; each writes ``worker-<pid>.json`` into
DIR saying whether it carries a hook),
``--rank1-sleep-ms M`` (rank 1 sleeps M ms before each forward: the other rank waits for it in
DDP's all-reduce).

At the end each rank writes ``rank-<r>.json`` into DIR: its hook's ``hook.json`` as torchwatch
reads it, and its counters (steps, step source, per-step times).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--seconds", type=float, default=4.0)
parser.add_argument("--min-steps", type=int, default=20)
parser.add_argument("--workers", type=int, default=0)
parser.add_argument("--rank1-sleep-ms", type=float, default=0.0)
parser.add_argument("--spawn", action="store_true")
parser.add_argument("--port", type=int, default=0)


def worker_probe(worker_id: int) -> None:
    """In each DataLoader worker: does it carry a hook, or the rank mark?"""
    from torchwatch.hook import runtime

    probe = {
        "hooked": runtime.current() is not None,
        "mark": os.environ.get("TORCHWATCH_SPAWNED_RANK"),
        "preload": os.environ.get("TORCHWATCH_HOOK"),
    }
    with open(os.path.join(os.environ["DDP_TRAIN_OUT"], f"worker-{os.getpid()}.json"), "w") as f:
        json.dump(probe, f)


def hook_view() -> dict[str, Any]:
    from torchwatch.hook import runtime
    from torchwatch.sources.hook import HookReader

    hook = runtime.current()
    if hook is None:
        return {"hooked": False}
    reader = HookReader(os.getpid(), hook.dir)
    snap = reader.counters()
    out: dict[str, Any] = {"hooked": True, "state": reader.info(), "reason": reader.reason}
    if snap is not None:
        steps = snap.rank_steps()[2:]  # past the first steps (gloo's connections, warm-up)
        out.update(
            steps=snap.steps,
            step_source=snap.step_source,
            backward_calls=snap.backward_calls,
            median={
                k: statistics.median(getattr(s, k) for s in steps) if steps else None
                for k in ("duration", "data_wait", "backward", "backward_blocked", "collective")
            },
        )
    return out


def run(index: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    os.environ["DDP_TRAIN_OUT"] = args.out
    if args.spawn:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(args.port)
        dist.init_process_group("gloo", rank=index, world_size=2)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(512, 64), torch.randint(0, 4, (512,)))
    kw: dict[str, Any] = {}
    if args.workers:
        kw = {
            "num_workers": args.workers,
            "multiprocessing_context": "spawn",
            "worker_init_fn": worker_probe,
            "persistent_workers": True,
        }
    loader = DataLoader(data, batch_size=16, **kw)
    end = time.monotonic() + args.seconds
    done = torch.zeros(1)
    steps = 0
    while not done.item():
        for x, y in loader:
            if rank == 1 and args.rank1_sleep_ms:
                time.sleep(args.rank1_sleep_ms / 1000)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            # every rank stops at the same step: rank 0's clock decides
            done.fill_(float(rank == 0 and time.monotonic() >= end and steps >= args.min_steps))
            dist.broadcast(done, 0)
            if done.item():
                break
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "index": index, "pid": os.getpid(), **hook_view()}, f)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    args = parser.parse_args()
    if args.spawn:
        mp.spawn(run, args=(args,), nprocs=2)
        from torchwatch.hook import runtime

        hook = runtime.current()
        with open(os.path.join(args.out, "launcher.json"), "w") as f:
            json.dump({"hooked": hook is not None, "spawned_ranks": hook.spawned_ranks if hook else []}, f)
    else:
        run(int(os.environ["LOCAL_RANK"]), args)


if __name__ == "__main__":
    main()

"""A training whose DataLoader workers copy the dataset page by page (pytorch/pytorch#13246), or not.

    python tests/scenarios/memory/memory_cow.py --dataset objects --mib 600 --rate-mib-s 2 --seconds 300
    python tests/scenarios/memory/memory_cow.py --dataset numpy   --mib 600 --rate-mib-s 2 --seconds 300

``objects``: the Dataset holds its samples as Python lists of floats; ``__getitem__`` iterates one
(as user code does: ``[v for v in row]``), which writes every float's reference count, so each
worker's copy-on-write turns the pages it reads private: its private memory grows by the bytes
of the samples it reads, at ``--rate-mib-s`` per worker (``__getitem__`` is paced to it).
``numpy``: the same values as one float64 array read by slicing: nothing is written, nothing is
copied. Sequential sampling (no shuffle): within an epoch the growth is linear until the epoch ends
(the workers exit, their copies with them, and the next epoch's start shared again: a saw-tooth) or
until a memory limit kills a worker. ``--churn-mib``: each step also builds that many MiB of Python
objects and keeps the last three steps' (garbage the collector frees in waves). ``--worker-cache-mib``:
each worker also holds that much of its own (a cache of decoded samples, as many Datasets keep), so
a worker, not the main process, is the largest when the limit is reached and the one the kernel's
OOM killer chooses (the workers' shared pages count in their resident size too).

Writes ``--ready-file`` (the workers are running) once the first batch arrived, then trains;
prints ``memory_cow: done, N steps in S s, R steps/s`` at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

_CACHE = bytearray()
WIDTH = 256  # floats per sample: a Python list of 256 floats is ~8.2 KiB (32 B per value), two pages


class _Paced(Dataset[torch.Tensor]):
    """Rows read at one per ``per_sample_s`` in each worker (a steady growth rate)."""

    def __init__(self, rows: object, per_sample_s: float) -> None:
        self.rows = rows
        self.per_sample_s = per_sample_s
        self.next_t = 0.0

    def __len__(self) -> int:
        return len(self.rows)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> torch.Tensor:
        now = time.monotonic()
        self.next_t = max(self.next_t, now - 1.0) + self.per_sample_s
        if self.next_t > now:
            time.sleep(self.next_t - now)
        return self.read(i)

    def read(self, i: int) -> torch.Tensor:
        raise NotImplementedError


class ObjectRows(_Paced):
    """Python lists of floats: iterating one writes every float's reference count."""

    def __init__(self, rows: int, per_sample_s: float) -> None:
        super().__init__([[float(i * WIDTH + j) + 0.5 for j in range(WIDTH)] for i in range(rows)], per_sample_s)

    def read(self, i: int) -> torch.Tensor:
        return torch.tensor([v for v in self.rows[i]], dtype=torch.float32)  # type: ignore[index]


class ArrayRows(_Paced):
    """One float64 array read by slicing: nothing is written."""

    def __init__(self, rows: int, per_sample_s: float) -> None:
        super().__init__(np.arange(rows * WIDTH, dtype=np.float64).reshape(rows, WIDTH) + 0.5, per_sample_s)

    def read(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.rows[i].astype(np.float32))  # type: ignore[index]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=("objects", "numpy"), default="objects")
    ap.add_argument("--mib", type=float, default=600.0, help="dataset size as Python objects, MiB")
    ap.add_argument("--rate-mib-s", type=float, default=2.0, help="private growth per worker, MiB/s (objects)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--churn-mib", type=float, default=0.0)
    ap.add_argument("--worker-cache-mib", type=float, default=0.0)
    ap.add_argument("--ready-file", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    row_bytes = WIDTH * 32
    rows = int(args.mib * (1 << 20) / row_bytes)
    per_sample_s = row_bytes / (args.rate_mib_s * (1 << 20))
    ds = ObjectRows(rows, per_sample_s) if args.dataset == "objects" else ArrayRows(rows, per_sample_s)
    cache_bytes = int(args.worker_cache_mib * (1 << 20))

    def worker_init(_: int) -> None:
        global _CACHE
        _CACHE = bytearray(b"\x01") * cache_bytes  # touched: resident, private

    loader = DataLoader(ds, batch_size=16, num_workers=args.workers, shuffle=False, worker_init_fn=worker_init)
    model = torch.nn.Linear(WIDTH, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    t0 = time.monotonic()
    steps = 0
    churn: list[list[float]] = []
    per_churn = int(args.churn_mib * (1 << 20) / 32)
    while time.monotonic() - t0 < args.seconds:
        for batch in loader:
            if steps == 0 and args.ready_file:
                with open(args.ready_file, "w") as f:
                    f.write(f"{os.getpid()}\n")
            loss = model(batch).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if per_churn:
                churn = [*churn[-2:], [float(i) for i in range(per_churn)]]
            if time.monotonic() - t0 >= args.seconds:
                break
    s = time.monotonic() - t0
    print(f"memory_cow: done, {steps} steps in {s:.1f} s, {steps / s:.1f} steps/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

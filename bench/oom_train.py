"""A training that runs out of CUDA memory at a known pace: its batch grows with wall time.

    python bench/oom_train.py --seconds-to-oom 150

The first steps measure the peak device memory per row of the batch; from then on the batch is
``rows(t) = rows0 + R * t`` with ``R`` chosen so that the peak reaches 95 % of the device's memory
``--seconds-to-oom`` seconds after the start: the peak grows linearly in time, and the training
dies of ``torch.cuda.OutOfMemoryError`` (exit status 1, the error's traceback), as one whose batch
or sequence length grows would. Prints one line per 5 s (rows, peak) and, at the error, one JSON
line ``{"oom_at_monotonic": ..., "rows": ...}`` on stderr for ``bench/gpu_oom.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch import nn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds-to-oom", type=float, default=150.0)
    ap.add_argument("--width", type=int, default=4096)
    args = ap.parse_args()
    dev = torch.device("cuda")
    w = args.width
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(w, w), nn.ReLU())]).to(dev, torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step(rows: int) -> None:
        x = torch.randn(rows, w, device=dev, dtype=torch.bfloat16)
        loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    rows0 = 4096
    for _ in range(3):
        step(rows0)
    torch.cuda.synchronize()
    base = torch.cuda.max_memory_allocated()
    step(2 * rows0)
    torch.cuda.synchronize()
    per_row = max(1.0, (torch.cuda.max_memory_allocated() - base) / rows0)
    total = torch.cuda.get_device_properties(dev).total_memory
    rate = (0.95 * total - base) / per_row / args.seconds_to_oom
    expected = f"OOM expected in ~{args.seconds_to_oom:.0f} s"
    print(f"oom_train: {per_row / 1024:.0f} KiB per row, +{rate:.0f} rows/s, {expected}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    last_say = t0
    rows = rows0
    try:
        while True:
            now = time.monotonic()
            rows = int(rows0 + rate * (now - t0))
            step(rows)
            torch.cuda.synchronize()
            if now - last_say >= 5:
                last_say = now
                peak = torch.cuda.max_memory_allocated() / 2**30
                print(f"oom_train: {now - t0:.0f} s, {rows} rows, peak {peak:.1f} GiB", file=sys.stderr, flush=True)
    except torch.cuda.OutOfMemoryError:
        print(json.dumps({"oom_at_monotonic": time.monotonic(), "since_start_s": time.monotonic() - t0, "rows": rows}),
              file=sys.stderr, flush=True)  # fmt: skip
        raise


if __name__ == "__main__":
    sys.exit(main())

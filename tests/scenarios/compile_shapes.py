"""Scenario compile_shapes (expected: finding compile-recompiles, the batch's shape named).

A compiled model (torch.compile's defaults) whose batch size changes every few steps from
``--change-after`` seconds after its first step on: batches of variable-length data cut by a
token budget, or the short batches at the end of each bucket. The first change fails the guard on
the batch's size: dynamo recompiles forward and backward (and, its automatic dynamic shapes on,
with that dimension symbolic from then on). Those compiles run in the loop's thread.

--relieve: ``torch._dynamo.mark_dynamic(x, 0)`` on every batch: the first compile is already the
dynamic one and no shape change recompiles.

Inductor's on-disk caches are off here (tests/scenarios/_compile.py): a recompile costs what it
costs on a fresh machine (1-3 s on a loaded 2-core one), run after run.
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _compile as cc
import _scenario as sc

NAME = "compile_shapes"
BATCH = cc.BATCH
SIZES = (1024, 800, 1024, 928, 1024, 704, 1024, 992)


def add_args(parser: object) -> None:
    parser.add_argument("--change-after", type=float, default=3.0, help="seconds after the first step (default 3)")  # type: ignore[attr-defined]


def main() -> None:
    args = sc.parse_args(NAME, __doc__, extra=add_args)
    cc.no_cache()  # every recompile costs what it costs on a fresh machine
    sc.seed()
    device = torch.device(args.device)
    x_all, y_all = (t.to(device) for t in cc.data())
    model = cc.Net().to(device)
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    first = [0.0]

    def step(i: int) -> torch.Tensor:
        if not first[0] and i:
            first[0] = time.monotonic()
        changing = first[0] and time.monotonic() - first[0] >= args.change_after
        size = SIZES[(i // 3) % len(SIZES)] if changing else BATCH
        j = (i * BATCH) % (len(x_all) - BATCH)
        x, y = x_all[j : j + size].clone(), y_all[j : j + size].clone()  # fresh tensors, as a DataLoader gives
        if args.relieve:
            torch._dynamo.mark_dynamic(x, 0)
        if changing and size != BATCH and not getattr(step, "said", False):
            step.said = True  # type: ignore[attr-defined]
            cc.event(NAME, f"batch size {BATCH} -> {size}")
        loss = torch.nn.functional.mse_loss(compiled(x), y)  # the call that recompiles
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        return loss.detach()

    cc.train(NAME, args.seconds, step, device)


if __name__ == "__main__":
    main()

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

import argparse
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


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    cc.no_cache()  # every recompile costs what it costs on a fresh machine
    x_all, y_all = (t.to(device) for t in cc.data())
    model = cc.Net().to(device)
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    first, said = [0.0], [False]

    def step(i: int) -> torch.Tensor:
        if not first[0] and i:
            first[0] = time.monotonic()
        changing = first[0] and time.monotonic() - first[0] >= args.change_after
        size = SIZES[(i // 3) % len(SIZES)] if changing else BATCH
        x, y = (t.clone() for t in cc.batch(x_all, y_all, i, size))  # fresh tensors, as a DataLoader gives
        if args.relieve:
            torch._dynamo.mark_dynamic(x, 0)
        if changing and size != BATCH and not said[0]:
            said[0] = True
            cc.event(NAME, f"batch size {BATCH} -> {size}")
        out = compiled(x)  # the call that recompiles
        return cc.fit(opt, out, y)

    return cc.loop(step)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup, extra=cc.change_after)

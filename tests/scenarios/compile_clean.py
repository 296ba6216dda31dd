"""Scenario compile_clean (expected: no torch.compile finding).

The same compiled model at one batch shape, nothing in forward that breaks the graph: it
compiles once (forward and backward) at the first step and never again. torchwatch must name
nothing about compiling (the first compile is no recompile).

--relieve: the model not compiled (the baseline the compiled one is compared with).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _compile as cc
import _scenario as sc

NAME = "compile_clean"
BATCH = cc.BATCH


def main() -> None:
    args = sc.parse_args(NAME, __doc__)
    sc.seed()
    device = torch.device(args.device)
    x_all, y_all = (t.to(device) for t in cc.data())
    model = cc.Net().to(device)
    compiled = model if args.relieve else torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(i: int) -> torch.Tensor:
        j = (i * BATCH) % (len(x_all) - BATCH)
        loss = torch.nn.functional.mse_loss(compiled(x_all[j : j + BATCH]), y_all[j : j + BATCH])
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        return loss.detach()

    cc.train(NAME, args.seconds, step, device)


if __name__ == "__main__":
    main()

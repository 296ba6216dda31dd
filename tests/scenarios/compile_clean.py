"""Scenario compile_clean (expected: no torch.compile finding).

The same compiled model at one batch shape, nothing in forward that breaks the graph: it
compiles once (forward and backward) at the first step and never again. torchwatch must name
nothing about compiling (the first compile is no recompile).

--relieve: the model not compiled (the baseline the compiled one is compared with).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _compile as cc
import _scenario as sc

NAME = "compile_clean"


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    x_all, y_all = (t.to(device) for t in cc.data())
    model = cc.Net().to(device)
    compiled = model if args.relieve else torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(i: int) -> torch.Tensor:
        x, y = cc.batch(x_all, y_all, i)
        return cc.fit(opt, compiled(x), y)

    return cc.loop(step)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

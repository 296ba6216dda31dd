"""Scenario compile_item_break (expected: finding compile-graph-breaks, the .item() named).

A compiled model whose forward rescales its hidden activations when their mean is large, decided
in Python with ``.item()``: dynamo cannot put a tensor's value into a graph, so it breaks the
graph there: the model runs as two compiled pieces with the ``.item()`` (a device sync on a
GPU) and the Python branch between them, every step.

--relieve: the same rescaling with ``torch.where`` (no ``.item()``): one graph.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _compile as cc
import _scenario as sc

NAME = "compile_item_break"


class Rescaled(cc.Net):
    def __init__(self, relieve: bool) -> None:
        super().__init__()
        self.relieve = relieve

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.hidden(x)
        if self.relieve:
            h = torch.where(h.mean() > 10.0, h / 10.0, h)
        elif h.mean().item() > 10.0:  # the graph break
            h = h / 10.0
        return self.head(h)


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    x_all, y_all = (t.to(device) for t in cc.data())
    model = Rescaled(args.relieve).to(device)
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(i: int) -> torch.Tensor:
        x, y = cc.batch(x_all, y_all, i)
        loss = cc.fit(opt, compiled(x), y)
        if i == 0:  # the first step compiled the model: the graph break was met there
            cc.event(NAME, "the model compiled, in two graphs")
        return loss

    return cc.loop(step)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup)

"""Scenario compile_limit (expected: finding compile-cache-limit).

A compiled model called with a per-step tag string (``f"step{i}"``, the kind of bookkeeping a
training passes along) that forward looks up in a dict: dynamo guards on the string's value, so
every step recompiles (the graphs are alike: inductor's cache serves them after the first, tens of
ms each), until ``torch._dynamo.config.recompile_limit`` (8): from then on torch runs the
model eagerly. It starts ``--change-after`` seconds after the first step.

--relieve: the tag stays out of the compiled call (one graph).
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

NAME = "compile_limit"


class Tagged(cc.Net):
    def __init__(self) -> None:
        super().__init__()
        self.scales = {"warm": 0.5}

    def forward(self, x: torch.Tensor, tag: str = "") -> torch.Tensor:  # type: ignore[override]
        return super().forward(x) * self.scales.get(tag[:4], 1.0)


def setup(args: argparse.Namespace, device: torch.device) -> sc.Loop:
    x_all, y_all = (t.to(device) for t in cc.data())
    model = Tagged().to(device)
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    first, tags = [0.0], [0]
    limit = torch._dynamo.config.recompile_limit

    def step(i: int) -> torch.Tensor:
        if not first[0] and i:
            first[0] = time.monotonic()
        tagging = first[0] and time.monotonic() - first[0] >= args.change_after and not args.relieve
        x, y = cc.batch(x_all, y_all, i)
        out = compiled(x, f"step{i}") if tagging else compiled(x)
        loss = cc.fit(opt, out, y)
        if tagging:
            tags[0] += 1
            if tags[0] == limit:  # the untagged graph and limit - 1 tagged ones are cached: this call fell back
                cc.event(NAME, f"the {limit}th tag: torch hit its recompile limit ({limit})")
        return loss

    return cc.loop(step)


if __name__ == "__main__":
    sc.main(NAME, __doc__, setup, extra=cc.change_after)

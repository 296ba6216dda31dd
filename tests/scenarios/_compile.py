"""Shared pieces of the torch.compile scenarios (tests/scenarios/compile_*.py).

A small MLP regressor (:class:`Net`) trained with SGD on in-memory data and compiled with
``torch.compile`` (inductor: gcc on the CPU), so that compiling costs seconds on a small machine,
not minutes, and the compiled model is faster than the eager one (a fix that keeps it compiled
shows as a faster step).
:func:`no_cache` turns inductor's on-disk caches off for a scenario whose finding rests on what a
compile costs: it then costs what it costs on a fresh machine, run after run, not what a previous
run left on disk.

Each scenario prints ``scenario NAME: event: WHAT at wall T`` (stderr, ``time.time()``) when its
event happens, so a test can time how soon torchwatch named it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from collections.abc import Callable

import _scenario as sc
import torch
from torch import nn


def no_cache() -> None:
    """Inductor's FX-graph and AOTAutograd caches off (unless the caller set them): call before the
    first compile."""
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")


DIM, HIDDEN, BATCH = 32, 256, 1024


class Net(nn.Module):
    """Two linear layers with elementwise work between them (GELU, a gate, a square, LayerNorm):
    what inductor fuses, so the compiled model is faster than the eager one even this small
    (measured on 2 CPUs: 1.1 ms a step compiled, 1.8 ms eager). ``forward`` takes the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(DIM, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, 1)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.fc1(x))
        return h * torch.sigmoid(h) + 0.1 * h.pow(2)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(h)).squeeze(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(x))


def event(name: str, what: str) -> None:
    """``scenario NAME: event: WHAT at wall T`` on stderr."""
    sc.say(name, f"event: {what} at wall {time.time():.3f}")


def data(n: int = 16384) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets (a fixed linear teacher)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, DIM, generator=g)
    return x, x[:, :4].sum(1)


def batch(x_all: torch.Tensor, y_all: torch.Tensor, i: int, size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``i``'s ``size`` rows of inputs and targets (views, no copy)."""
    j = (i * BATCH) % (len(x_all) - BATCH)
    return x_all[j : j + size], y_all[j : j + size]


def fit(opt: torch.optim.Optimizer, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One SGD step on the mean squared error of ``out`` against ``y``; the loss, detached."""
    return sc.optimize(opt, torch.nn.functional.mse_loss(out, y))


def change_after(parser: argparse.ArgumentParser) -> None:
    """``--change-after S``: the scenario's event starts S s after its first step."""
    parser.add_argument("--change-after", type=float, default=3.0, help="seconds after the first step (default 3)")


STEPS_ENV = "COMPILE_SCENARIO_STEPS"
"""A path: the scenario writes each step's ``[end, duration]`` (monotonic s) there as JSON at its
end (bench/compile_flops.py reads them)."""


def loop(step: Callable[[int], torch.Tensor]) -> sc.Loop:
    """``step(i)`` for i = 0, 1, ...; timed, and the times written at the end, where
    :data:`STEPS_ENV` names a file."""
    path = os.environ.get(STEPS_ENV)
    if not path:
        return sc.Loop(itertools.count(), step)
    times: list[tuple[float, float]] = []

    def timed(i: int) -> torch.Tensor:
        t0 = time.monotonic()
        out = step(i)
        t1 = time.monotonic()
        times.append((t1, t1 - t0))
        return out

    def end() -> None:
        with open(path, "w") as f:
            json.dump(times, f)

    return sc.Loop(itertools.count(), timed, end)

"""Demo training bottlenecked on device compute (expected torchwatch label: gpu-bound on
CUDA; on a CPU-only machine the same model runs on the CPU and is expected to be
labelled cpu-bound).

Bottleneck: a wide MLP (4 hidden layers of WIDTH x WIDTH matmuls, batch 512) whose
forward + backward dominates the step; the data is in memory (TensorDataset,
whole batches fetched by one index, pinned and copied non_blocking on CUDA), so the
host mostly waits for the device.  WIDTH defaults to 4096 on CUDA and 1024 on the
CPU (--width to override) so a step takes a fraction of a second either way.

--relieve = "less device compute per step" for the same data, task and steps:
the width is cut 4x (16x fewer FLOPs in the hidden layers) and, on CUDA, bf16
autocast is used as well.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common

NAME = "gpu_bound"
N_SAMPLES, BATCH, IN_DIM, CLASSES, LAYERS = 8192, 512, 256, 10, 4


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--width",
        type=int,
        default=0,
        help="hidden width (default 4096 on cuda, 1024 on cpu; --relieve divides by 4)",
    )


def make_data() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N_SAMPLES, IN_DIM, generator=g)
    teacher = torch.randn(IN_DIM, CLASSES, generator=g)
    return TensorDataset(x, (torch.tanh(x) @ teacher).argmax(1))


def mlp(width: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(IN_DIM, width), nn.ReLU()]
    for _ in range(LAYERS):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, CLASSES))


def main() -> None:
    args = _common.parse_args(NAME, __doc__, extra=add_args)
    _common.seed()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    width = args.width or (4096 if cuda else 1024)
    if args.relieve:
        width //= 4
    with _common.Run(NAME, device) as run:
        data = make_data()
        loader = DataLoader(
            data,
            batch_size=None,
            sampler=BatchSampler(RandomSampler(data), BATCH, drop_last=True),
            pin_memory=cuda,
        )
        model = mlp(width).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)

        def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            x, y = _common.to_device(batch, device)
            autocast = (
                torch.autocast("cuda", dtype=torch.bfloat16) if cuda and args.relieve else contextlib.nullcontext()
            )
            with autocast:
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            return loss.detach()

        run.train(loader, step, args.seconds)


if __name__ == "__main__":
    main()

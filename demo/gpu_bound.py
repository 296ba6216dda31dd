"""Demo training bottlenecked on device compute (expected torchwatch label: gpu-bound on
CUDA; on a CPU-only machine the same model runs on the CPU and is expected to be
labelled cpu-bound).

Bottleneck: a wide MLP (4 hidden WIDTH x WIDTH layers) whose forward + backward
matmuls dominate the step.

- On CUDA it is gpu-bound by construction: WIDTH 8192, batch 4096, bf16 autocast (the
  matmuls run on tensor cores), and the data already on the device (random batches
  indexed on the GPU, no DataLoader, no host-to-device copy). One step is 4 layers x 3
  matmuls (forward, two in backward) x 2 x 4096 x 8192^2 = 6.6 TFLOP, about 10 ms of
  tensor-core work on an H100 (~990 TFLOP/s dense bf16 peak, less in practice), against
  some 60 kernel launches (well under 1 ms of host time): the SMs stay busy and the host
  waits for the device.
- On the CPU: WIDTH 1024, batch 512, data in memory through a DataLoader (whole batches
  fetched by one index), no autocast, so a step takes a fraction of a second.

--width overrides the width.  --relieve = "less device compute per step" for the same
data, task and steps: the width is cut 4x (16x fewer FLOPs in the hidden layers).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common

NAME = "gpu_bound"
N_SAMPLES, IN_DIM, CLASSES, LAYERS = 8192, 256, 10, 4
CPU_BATCH, CPU_WIDTH = 512, 1024
CUDA_BATCH, CUDA_WIDTH = 4096, 8192


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--width",
        type=int,
        default=0,
        help=f"hidden width (default {CUDA_WIDTH} on cuda, {CPU_WIDTH} on cpu; --relieve divides by 4)",
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
    width = args.width or (CUDA_WIDTH if cuda else CPU_WIDTH)
    if args.relieve:
        width //= 4
    with _common.Run(NAME, device) as run:
        data = make_data()
        loader: Iterable[tuple[torch.Tensor, torch.Tensor]]
        if cuda:
            x, y = (t.to(device) for t in data.tensors)
            loader = _common.DeviceBatches(x, y, CUDA_BATCH)
        else:
            loader = DataLoader(
                data, batch_size=None, sampler=BatchSampler(RandomSampler(data), CPU_BATCH, drop_last=True)
            )
        model = mlp(width).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)

        def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            x, y = _common.to_device(batch, device)
            autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
            with autocast:
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            return loss.detach()

        run.train(loader, step, args.seconds)


if __name__ == "__main__":
    main()

"""Demo training bottlenecked on launching many tiny kernels (expected torchwatch label: cpu-bound,
through gpu-launch-bound on CUDA; plain loop-cpu on a CPU-only machine).

Bottleneck: an ensemble of 64 small MLP classifiers (32 -> 64 -> 10), each an ordinary
nn.Sequential trained on the same batch of 64 samples, run one after the other in a Python
loop: some 15 operators per member in forward and backward, ~1000 per step, each doing a
few thousand multiply-adds. The data is already where the model is (random batches indexed
on the device, no DataLoader). On CUDA every operator is a kernel of a few microseconds
that costs the host more to dispatch and launch than the GPU to run: NVML reports the GPU
busy while its SMs mostly idle, and the GPU waits on the host between kernels (host wait).
On the CPU the same loop is framework overhead on tiny ops: cpu-bound.

--relieve = the same ensemble, same initial weights, loss and optimizer, run as one
batched computation: the members' parameters stacked (torch.func.stack_module_state) and
the model applied with torch.vmap, so each layer is one batched kernel for all 64 members
(PyTorch's "model ensembling" recipe): ~60x fewer operators and kernel launches per step.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common

NAME = "launch_bound"
N_SAMPLES, BATCH, MEMBERS, IN_DIM, HIDDEN, CLASSES = 4096, 64, 64, 32, 64, 10


def member() -> nn.Sequential:
    return nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def make_data(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(N_SAMPLES, IN_DIM, generator=g)
    y = (x @ torch.randn(IN_DIM, CLASSES, generator=g)).argmax(1)
    return x.to(device), y.to(device)


def one_by_one(
    members: nn.ModuleList,
) -> tuple[list[torch.Tensor], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """The slow way: each member's forward and loss on its own (a Python loop of tiny ops)."""

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses = [F.cross_entropy(m(x), y) for m in members]
        return torch.stack(losses).mean()

    return list(members.parameters()), loss_of


def batched(members: nn.ModuleList) -> tuple[list[torch.Tensor], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """The relief: the same members' weights stacked, every layer one batched op over all members."""
    params, buffers = stack_module_state(list(members))
    leaves = [p.requires_grad_() for p in params.values()]
    template = member().to("meta")

    def run(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = functional_call(template, (p, b), (x,))
        return out

    ensemble = torch.vmap(run, in_dims=(0, 0, None))

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = ensemble(params, buffers, x)  # (MEMBERS, BATCH, CLASSES)
        return F.cross_entropy(logits.reshape(-1, CLASSES), y.repeat(MEMBERS))

    return leaves, loss_of


def main() -> None:
    args = _common.parse_args(NAME, __doc__)
    _common.seed()
    device = torch.device(args.device)
    with _common.Run(NAME, device) as run:
        x, y = make_data(device)
        members = nn.ModuleList(member() for _ in range(MEMBERS)).to(device)
        params, loss_of = (batched if args.relieve else one_by_one)(members)
        # foreach: the optimizer step is a few multi-tensor kernels in both variants, so only the
        # model's own operators differ
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9, foreach=True)

        def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            loss = loss_of(*batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            return loss.detach()

        run.train(_common.DeviceBatches(x, y, BATCH), step, args.seconds)


if __name__ == "__main__":
    main()

"""Demo training bottlenecked on CPU work in the training loop (expected torchwatch label: cpu-bound).

Bottleneck: the data is in memory with a light per-sample augmentation (noise and
feature dropout, num_workers=0), but the step itself is Python-heavy: a
"mixture" model of 64 tiny Linear(16, 16) experts applied one by one in a Python
loop, a per-sample Python loop for the loss, and a per-parameter Python loop for
gradient clipping.  Each op is tiny, so the main thread is busy on the CPU with
interpreter and op-dispatch overhead, outside DataLoader.__next__.  (On CUDA the
same loop is kernel-launch bound: still CPU-bound.)

--relieve does the same math vectorized: the 64 experts as one batched matmul
(torch.bmm over stacked weights), one batched cross_entropy, and
clip_grad_norm_ (foreach) instead of the per-parameter loop. The step then gets
several times faster and the per-sample augmentation in the main process, a small
share before, becomes the largest cost: the next bottleneck is the input pipeline
(torchwatch then says dataloader-bound), as it often is after fixing a slow loop.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common

NAME = "cpu_bound"
N_SAMPLES, BATCH, EXPERTS, DIM, CLASSES = 8192, 64, 64, 16, 10


class Experts(nn.Module):
    """EXPERTS independent DIM->DIM layers, expert e sees input chunk e."""

    def __init__(self, vectorized: bool) -> None:
        super().__init__()
        self.vectorized = vectorized
        self.w = nn.Parameter(torch.randn(EXPERTS, DIM, DIM) / DIM**0.5)
        self.b = nn.Parameter(torch.zeros(EXPERTS, 1, DIM))
        self.head = nn.Linear(EXPERTS * DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, EXPERTS*DIM)
        chunks = x.view(-1, EXPERTS, DIM)
        if self.vectorized:
            h = torch.bmm(chunks.transpose(0, 1), self.w) + self.b  # (EXPERTS, B, DIM)
            h = h.transpose(0, 1)
        else:
            h = torch.stack([chunks[:, e] @ self.w[e] + self.b[e] for e in range(EXPERTS)], dim=1)
        out: torch.Tensor = self.head(torch.tanh(h).flatten(1))
        return out


class Augmented(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """In-memory features with a light per-sample augmentation: noise and feature dropout."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(2)
        self.x = torch.randn(N_SAMPLES, EXPERTS * DIM, generator=g)
        self.y = (self.x @ torch.randn(EXPERTS * DIM, CLASSES, generator=g)).argmax(1)

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[i] + 0.05 * torch.randn(EXPERTS * DIM)
        x = x * (torch.rand(EXPERTS * DIM) > 0.1)
        return x, self.y[i]


def main() -> None:
    args = _common.parse_args(NAME, __doc__)
    _common.seed()
    device = torch.device(args.device)
    with _common.Run(NAME, device) as run:
        loader = DataLoader(
            Augmented(), batch_size=BATCH, shuffle=True, drop_last=True, pin_memory=device.type == "cuda"
        )
        model = Experts(vectorized=args.relieve).to(device)
        params = list(model.parameters())
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)

        def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            x, y = _common.to_device(batch, device)
            logits = model(x)
            if args.relieve:
                loss = F.cross_entropy(logits, y)
            else:  # per-sample loss, summed in Python
                loss = torch.stack([F.cross_entropy(logits[i : i + 1], y[i : i + 1]) for i in range(len(y))]).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            if args.relieve:
                torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
            else:  # the same clipping, one parameter (and one expert slice) at a time
                full = [p.grad for p in params if p.grad is not None]
                grads = [g[e] for g in full[:2] for e in range(EXPERTS)] + full[2:]
                total = torch.stack([(g * g).sum() for g in grads]).sum().sqrt()
                scale = torch.clamp(1.0 / (total + 1e-6), max=1.0)
                for g in grads:
                    g.mul_(scale)
            opt.step()
            return loss.detach()

        run.train(loader, step, args.seconds)


if __name__ == "__main__":
    main()

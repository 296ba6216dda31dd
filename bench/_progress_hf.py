"""An HF ``Trainer`` on CPU for ``bench/progress.py``: a tiny MLP classifier on random vectors,
``--epochs`` epochs of ``--batches`` batches of 32 (``max_steps`` follows), the Trainer's own tqdm bar
(total: the run's steps), no evaluation, no saving. A callback prints each step, to stderr::

    progress_train: epoch E batch B step N

(the Trainer logs its loss averaged over ``logging_steps``, not per step: no loss is printed).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments


class Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 256, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Print(TrainerCallback):  # type: ignore[misc]
    def __init__(self, batches: int) -> None:
        self.batches = batches

    def on_step_end(self, args: object, state: object, control: object, **kw: object) -> None:
        step = state.global_step  # type: ignore[attr-defined]
        epoch, batch = (step - 1) // self.batches + 1, (step - 1) % self.batches + 1
        print(f"progress_train: epoch {epoch} batch {batch} step {step}", file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out, num_train_epochs=args.epochs, per_device_train_batch_size=32, learning_rate=1e-3,
            logging_steps=50, save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
            disable_tqdm=False,
        )  # fmt: skip
        data = Data(args.batches * 32)
        trainer = Trainer(model=Model(), args=targs, train_dataset=data, callbacks=[Print(args.batches)])
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (the Trainer's log lines)
        trainer.train()


if __name__ == "__main__":
    main()

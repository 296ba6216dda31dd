"""A PyTorch Lightning training on CPU for ``bench/progress.py``: the MNIST-shaped conv net of
``_progress_train.py`` as a ``LightningModule``, ``--epochs`` epochs of ``--batches`` batches of 32, a
validation loader of 20 batches each epoch, Lightning's own progress bar (rich's where rich is
installed, as it is with ``lightning``: not a tqdm bar, so the run's total stays unknown), no
checkpoints. A callback prints each training step, to stderr::

    progress_train: epoch E batch B step N loss X
"""

from __future__ import annotations

import argparse
import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 5 * 5, 10),
        )  # fmt: skip

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Print(L.Callback):
    def on_train_batch_end(
        self, trainer: L.Trainer, module: L.LightningModule, out: object, batch: object, idx: int
    ) -> None:
        loss = out["loss"].item() if isinstance(out, dict) else float(out)  # type: ignore[arg-type]
        step = trainer.global_step
        print(
            f"progress_train: epoch {trainer.current_epoch + 1} batch {idx + 1} step {step} loss {loss!r}",
            file=sys.stderr,
            flush=True,
        )


def loader(n: int, seed: int) -> DataLoader:  # type: ignore[type-arg]
    g = torch.Generator().manual_seed(seed)
    data = TensorDataset(torch.randn(n * 32, 1, 28, 28, generator=g), torch.randint(0, 10, (n * 32,), generator=g))
    return DataLoader(data, batch_size=32, shuffle=seed == 0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batches", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    trainer = L.Trainer(
        max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_model_summary=False, callbacks=[Print()],
    )  # fmt: skip
    trainer.fit(Net(), loader(args.batches, 0), loader(20, 1))


if __name__ == "__main__":
    main()

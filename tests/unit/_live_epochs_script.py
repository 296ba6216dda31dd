"""A training whose DataLoader lives in a function (its locals: unreadable to the live install
before Python 3.13) and that installs the live hook in itself mid-epoch: ``_live_epochs_script.py
DIR``. Prints one JSON object: the hook's progress record after 3 epochs of 32 batches, and its
DataLoader records."""

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

os.environ["TORCHWATCH_DIR"] = sys.argv[1]

from torchwatch.hook import live, runtime


def main() -> dict:
    loader = DataLoader(TensorDataset(torch.randn(512, 8), torch.randn(512, 1)), batch_size=16)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out: dict = {}
    for epoch in range(3):
        for batch, (x, y) in enumerate(loader, 1):
            if epoch == 0 and batch == 5:
                out["install"] = live.install()  # from inside the loop: its iterator was made before
            (model(x) - y).square().mean().backward()
            opt.step()
            opt.zero_grad()
    hook = runtime.current()
    progress = hook.progress()
    out["progress"] = progress.to_json() if progress is not None else None
    out["records"] = [r.info().batches for r in hook.loaders.values()]
    out["detach"] = live.detach()
    return out


print(json.dumps(main(), default=str))

"""Small hooked trainings for tests/unit/test_hook_progress.py: the loss and epoch the hook reads.

Usage: python _progress_script.py MODE DIR  (prints one JSON object on its last stdout line)

Modes:
- ``every``: the loss read at every backward (``wire.LOSS_EVERY_S`` set to 0), a DataLoader of
  10 batches for 2 epochs and 3 batches, the weights set to NaN before step 20; prints each
  step's loss as the script computed it;
- ``paced``: the default rate, 12 steps 0.1 s apart;
- ``not_scalar``: ``backward(gradient=...)``, several tensors, and a non-scalar ``backward()``
  without a gradient (torch's own error, which must reach the script unchanged);
- ``scaler``: ``scaler.scale(loss).backward()`` with a CPU ``GradScaler`` (scale 1024);
- ``persistent``: a DataLoader with a persistent worker for 3 epochs; an ``IterableDataset``.

What the hook published is read back from its files as torchwatch reads them (``HookReader``).
"""

from __future__ import annotations

import json
import os
import sys
import time

MODE, DIR = sys.argv[1], sys.argv[2]

import torchwatch.hook  # noqa: E402
from torchwatch import wire  # noqa: E402
from torchwatch.hook import runtime  # noqa: E402
from torchwatch.sources.hook import HookReader  # noqa: E402

installed = torchwatch.hook.install(directory=DIR)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, IterableDataset, TensorDataset  # noqa: E402

torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(40, 8), torch.randn(40, 1))


def step(x: torch.Tensor, y: torch.Tensor) -> float:
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return float(loss.item())


def published() -> dict[str, object]:
    hook = runtime.current()
    assert hook is not None
    hook.publish()
    rec = HookReader(os.getpid(), hook.dir).record()
    assert rec is not None
    return {
        "progress": None if rec.progress is None else rec.progress.to_json(),
        "errors": list(rec.errors),
    }


out: dict[str, object] = {"installed": installed}
if MODE == "every":
    wire.LOSS_EVERY_S = 0.0
    printed = {}
    n = 0
    loader = DataLoader(data, batch_size=4)
    for epoch in range(3):
        for i, (x, y) in enumerate(loader):
            n += 1
            if n == 20:
                with torch.no_grad():
                    model.weight.fill_(float("nan"))
            printed[n] = step(x, y)
            last = (epoch + 1, i + 1)
            if epoch == 2 and i == 2:
                break
    out.update(published(), printed={str(k): (v if v == v else "nan") for k, v in printed.items()}, last=last)
elif MODE == "paced":
    loader = DataLoader(data, batch_size=4)
    for i, (x, y) in enumerate(loader):
        if i == 12:
            break
        step(x, y)
        time.sleep(0.1)
    out.update(published())
elif MODE == "not_scalar":
    wire.LOSS_EVERY_S = 0.0
    notes = []
    x = torch.randn(4, 8)
    model(x).squeeze(1).backward(torch.ones(4))
    notes.append(published()["progress"])
    a, b = model(x).sum(), model(x).mean()
    torch.autograd.backward([a, b])
    notes.append(published()["progress"])
    try:
        model(x).backward()
    except RuntimeError as exc:
        out["error"] = str(exc)
    notes.append(published()["progress"])
    out.update(notes=notes, errors=published()["errors"])
elif MODE == "scaler":
    wire.LOSS_EVERY_S = 0.0
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    printed = {}
    for n, (x, y) in enumerate(DataLoader(data, batch_size=4), 1):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        printed[str(n)] = loss.item()
    out.update(published(), printed=printed, scale=scaler.get_scale())
elif MODE == "persistent":
    loader = DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True)
    for _ in range(3):
        for i, (x, y) in enumerate(loader):
            if i == 5:
                break
            step(x, y)
    out["persistent"] = published()

    class Stream(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            for _ in range(100):
                yield torch.randn(8), torch.randn(1)

    for i, (x, y) in enumerate(DataLoader(Stream(), batch_size=4)):
        if i == 30:  # more batches than the other loader's: the busiest
            break
        step(x, y)
    out["iterable"] = published()
print(json.dumps(out))

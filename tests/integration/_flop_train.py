"""A CPU training that counts its own FLOPs around each whole step, ``optimizer.step()`` included
(``torch.utils.flop_counter.FlopCounterMode``, as a user measuring MFU writes it), with the hook
installed at its top: ``_flop_train.py STOP_FILE``. It runs until STOP_FILE exists (at most 120 s),
then prints one JSON line: the dispatch-mode stacks seen after each step's block (by class
name), its own FLOP counts per step, and its step count."""

import json
import os
import sys
import time

import torchwatch.hook

torchwatch.hook.install()

import torch  # noqa: E402
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

stop = sys.argv[1]
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
stacks: set[tuple[str, ...]] = set()
counts: set[int] = set()
steps = 0
end = time.monotonic() + 120
while time.monotonic() < end and not os.path.exists(stop):
    counter = FlopCounterMode(display=False)
    with counter:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    stacks.add(tuple(type(m).__name__ for m in _get_current_dispatch_mode_stack()))
    counts.add(counter.get_total_flops())
    steps += 1
    time.sleep(0.01)
print(json.dumps({"stacks": sorted(stacks), "flop_counts": sorted(counts), "steps": steps}), flush=True)

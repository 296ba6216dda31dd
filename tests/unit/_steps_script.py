"""Small hooked training loops for tests/unit/test_hook_steps.py: where step boundaries come from,
and what the backward and collective wrappers count.

Usage: python _steps_script.py MODE DIR  (prints one JSON object on its last stdout line)

Modes: ``manual`` (manual SGD, no torch.optim), ``optimizer``, ``accumulate`` (4 backward passes
per optimizer step), ``never_stepped`` (an optimizer is made but parameters are updated by hand;
the decision thresholds are lowered), ``switch`` (manual SGD first, then an optimizer),
``collectives`` (a one-rank gloo group: explicit, nested, async and in-backward collectives).
"""

from __future__ import annotations

import json
import os
import sys
import time

MODE, DIR = sys.argv[1], sys.argv[2]

import torchwatch.hook  # noqa: E402
from torchwatch.hook import runtime, steps  # noqa: E402
from torchwatch.sources.hook import HookReader  # noqa: E402

installed = torchwatch.hook.install(directory=DIR)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ITERATIONS = 30
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))


def manual_step() -> None:
    """As pytorch/examples' word_language_model: backward, clip, then update by hand."""
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.1)


def snapshot() -> dict[str, object]:
    hook = runtime.current()
    assert hook is not None
    reader = HookReader(os.getpid(), hook.dir)
    snap = reader.counters()
    assert snap is not None, reader.reason
    return {
        "steps": snap.steps,
        "step_source": snap.step_source,
        "backward_calls": snap.backward_calls,
        "backward_s": snap.backward_s,
        "collective_calls": snap.collective_calls,
        "collective_s": snap.collective_s,
        "in_backward_since": snap.in_backward_since,
        "in_collective_since": snap.in_collective_since,
        "rank_steps": [s._asdict() for s in snap.rank_steps()],
        "state": reader.info(),
    }


def main() -> None:
    out: dict[str, object] = {"installed": installed}
    if MODE == "manual":
        for _ in range(ITERATIONS):
            manual_step()
    elif MODE in ("optimizer", "accumulate"):
        every = 4 if MODE == "accumulate" else 1
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(ITERATIONS * every):
            (F.cross_entropy(model(x), y) / every).backward()
            if (i + 1) % every == 0:
                opt.step()
                opt.zero_grad()
    elif MODE == "never_stepped":
        steps.BACKWARD_DECIDE_CALLS, steps.BACKWARD_DECIDE_S = 5, 0.2
        torch.optim.SGD(model.parameters(), lr=0.1)  # made, never stepped
        for _ in range(ITERATIONS):
            manual_step()
            time.sleep(0.01)
    elif MODE == "switch":
        for _ in range(10):
            manual_step()
        out["before"] = snapshot()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(10):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    elif MODE == "collectives":
        import torch.distributed as dist

        store = torch.distributed.FileStore(os.path.join(DIR, "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        t = torch.ones(4)
        before = snapshot()
        dist.all_reduce(t)  # 1
        dist.all_gather_object([None], {"a": 1})  # 2: calls all_gather inside, counted once
        dist.all_reduce(t, async_op=True).wait()  # 3 and 4: the call, then its wait
        dist.barrier()  # 5
        out["between"] = snapshot()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for _ in range(5):
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()  # DDP's all-reduce runs inside: not a collective call
            opt.step()
        out["before"] = before
        dist.destroy_process_group()
    out.update(snapshot())
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""A training that measures its own FLOPs around each whole step, and torchwatch's hook put in and
taken out of it again and again: ``TORCHWATCH_DIR=DIR _state_script.py CYCLES``.

Each step, ``optimizer.step()`` included, runs inside the training's own
``torch.utils.flop_counter.FlopCounterMode`` (as a user measuring MFU writes it). Each of the
CYCLES cycles installs the hook live (what ``torchwatch attach`` injects), runs two profiler
bursts and two live trials (``threads``, then the DataLoader's ``num_workers``), each asked for
as torchwatch asks (``request.json`` and the burst signal, :class:`HookReader`), and takes the
hook out again: the second cycle while a burst records, the third while a trial runs.

Prints one JSON object: :func:`snapshot` of every kind of state the hook touches, before any
hook (``unhooked``), after each detach (``detached``), right after each install (``hooked``) and
after its bursts and trials (``after``); the dispatch-mode stacks seen outside the training's
block at every step; what each burst and trial published.
"""

import contextlib
import gc
import importlib
import json
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed.distributed_c10d as dc
import torch.multiprocessing as tmp
import torch.optim.optimizer as optim_mod
import torch.utils.data.dataloader as dl
from torch.amp import autocast_mode, grad_scaler
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

sp = importlib.import_module("torch.multiprocessing.spawn")  # the module (its name is also a function's)

cycles = int(sys.argv[1])
assert os.environ.get("TORCHWATCH_DIR")  # given at start: torchwatch reads it from /proc/PID/environ
torch.set_num_threads(1)
loader = DataLoader(TensorDataset(torch.randn(64, 32), torch.randn(64, 1)), batch_size=16)  # 4 batches an epoch
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
stacks: set[tuple[str, ...]] = set()
flop_counts: set[int] = set()
it = iter(loader)


def step() -> None:
    global it
    try:
        x, y = next(it)
    except StopIteration:
        it = iter(loader)  # a new epoch: where a DataLoader trial switches its setting
        x, y = next(it)
    counter = FlopCounterMode(display=False)
    with counter:
        (model(x) - y).square().mean().backward()
        opt.step()
        opt.zero_grad()
    stacks.add(tuple(type(m).__name__ for m in _get_current_dispatch_mode_stack()))
    flop_counts.add(counter.get_total_flops())
    time.sleep(0.002)


def _name(value: object) -> str:
    return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}@{id(value)}"


def snapshot() -> dict:
    """Every kind of state the hook touches, as comparable values."""
    import torch.distributed as dist

    from torchwatch.hook import patches

    patched = {
        "Optimizer.__init__": optim_mod.Optimizer.__dict__["__init__"],
        "Optimizer.step": optim_mod.Optimizer.__dict__.get("step"),
        "_BaseDataLoaderIter.__next__": dl._BaseDataLoaderIter.__dict__["__next__"],
        "DataLoader._get_iterator": dl.DataLoader.__dict__["_get_iterator"],
        "DataLoader.__iter__": dl.DataLoader.__dict__["__iter__"],
        "torch.autograd.backward": torch.autograd.backward,
        "Tensor.backward": torch.Tensor.backward,
        "autocast.__enter__": autocast_mode.autocast.__dict__["__enter__"],
        "GradScaler.scale": grad_scaler.GradScaler.__dict__["scale"],
        "init_process_group": dc.init_process_group,
        "dist.init_process_group": dist.init_process_group,
        "spawn.spawn": sp.spawn,
        "spawn.start_processes": sp.start_processes,
        "torch.multiprocessing.spawn": tmp.spawn,
        "Work.wait": dc.Work.__dict__.get("wait"),
        **{f"c10d.{n}": getattr(dc, n, None) for n in patches.COLLECTIVES},
        **{f"dist.{n}": getattr(dist, n, None) for n in patches.COLLECTIVES},
    }
    handlers = {}
    for sig in sorted(signal.valid_signals()):
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError):
            handlers[int(sig)] = _name(signal.getsignal(sig))
    return {
        "dispatch_modes": [type(m).__name__ for m in _get_current_dispatch_mode_stack()],
        "function_modes": [type(m).__name__ for m in torch.overrides._get_current_function_mode_stack()],
        "profiler_enabled": bool(torch.autograd._profiler_enabled()),
        "trace_and_profile": [_name(sys.gettrace()), _name(sys.getprofile())],
        "optimizer_post_hooks": sorted(optim_mod._global_optimizer_post_hooks),
        "optimizer_pre_hooks": sorted(optim_mod._global_optimizer_pre_hooks),
        "patched": {k: _name(v) for k, v in patched.items()},
        "signal_handlers": handlers,
        "threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
        "gc": [list(gc.get_threshold()), gc.get_freeze_count()],
        "backends": [
            torch.backends.cudnn.benchmark,
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision(),
        ],
        "loader": {k: repr(v) for k, v in sorted(vars(loader).items()) if not k.startswith("_Data")},
        "meta_path": [type(f).__name__ for f in sys.meta_path],
        "torchwatch_threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("torchwatch")),
    }


def until(done, limit_s: float = 60.0) -> bool:
    """Step until ``done()`` (at most ``limit_s``)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if done():
            return True
        step()
    return False


def quiet_threads(limit_s: float = 15.0) -> None:
    """Wait for the hook's summary threads to end (a burst's summary after a detach)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end and any(t.name.startswith("torchwatch") for t in threading.enumerate()):
        time.sleep(0.05)


def published_idle(reader, count: int) -> bool:
    """``hook.json`` says burst ``count + 1`` has ended (what torchwatch burst waits for)."""
    rec = reader.record()
    return rec is not None and rec.burst is not None and rec.burst.count > count and rec.burst.state == "idle"


from torchwatch import wire  # noqa: E402
from torchwatch.hook import live, runtime  # noqa: E402
from torchwatch.sources.hook import HookReader  # noqa: E402

for _ in range(12):
    step()
out: dict = {"unhooked": snapshot(), "detached": [], "hooked": [], "after": [], "bursts": [], "trials": []}
trial_id = 1
for cycle in range(cycles):
    assert live.install()["installed"]
    hook = runtime.current()
    assert hook is not None
    for _ in range(6):
        step()
    out["hooked"].append(snapshot())
    reader = HookReader(os.getpid())
    for _ in range(2):
        count = hook.burster.count
        sent, why = reader.request_burst(wire.BurstRequest(steps=2))
        assert sent, why
        until(lambda c=count, r=reader: published_idle(r, c))
        out["bursts"].append(hook.burster.last.to_json() if hook.burster.last else None)
    for setting, value in (("threads", "2"), ("num_workers", "1")):
        trial_id += 1
        req = wire.TrialRequest(trial_id, setting, value, block_steps=2, warmup=0, max_s=20.0, min_pairs=2,
                                max_blocks=4)  # fmt: skip
        sent, why = reader.request_trial(req)
        assert sent, why
        until(lambda i=trial_id, h=hook: h.trials.state is not None and h.trials.state.id == i
              and h.trials.state.finished)  # fmt: skip
        out["trials"].append(hook.trials.state.to_json() if hook.trials.state else None)
    for _ in range(6):
        step()
    out["after"].append(snapshot())
    if cycle == 1:  # taken out while a burst records
        reader.request_burst(wire.BurstRequest(steps=5))
        until(lambda h=hook: h.burster.state == "running", 10.0)
        out["burst_state_at_detach"] = hook.burster.state
    elif cycle == 2:  # taken out while a trial runs: the training's value comes back
        trial_id += 1
        req = wire.TrialRequest(trial_id, "threads", "2", block_steps=40, warmup=0, max_s=60.0)
        reader.request_trial(req)
        until(lambda h=hook: h.trials.state is not None and h.trials.state.state == "running", 10.0)
        step()
        out["trial_at_detach"] = [hook.trials.state.state, torch.get_num_threads()]
    assert live.detach()["detached"]
    quiet_threads()
    for _ in range(6):
        step()
    out["detached"].append(snapshot())
out["stacks"] = sorted(stacks)
out["training_flop_counts"] = sorted(flop_counts)
print(json.dumps(out, default=str))

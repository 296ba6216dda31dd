"""SIMULATED (no GPU): a training that dies of ``torch.cuda.OutOfMemoryError``, on a CPU build of torch.

    python tests/scenarios/memory/cuda_oom_simulated.py --steps 60 [--no-observer]

torch's CUDA surface that torchwatch's hook reads is replaced by a fake 80 GiB device whose
allocator's peak grows each step (``torch.cuda.is_initialized``, ``memory_stats_as_nested_dict``,
``get_device_properties``, ``memory_stats``, ``memory._snapshot``, and the allocator's
out-of-memory observers ``torch._C._cuda_attach_out_of_memory_observer``). At ``--steps`` the
"allocator" does what the real one does: it calls every observer, then raises
``torch.cuda.OutOfMemoryError`` (uncaught: the training exits with it). ``--no-observer``: a torch
without observers (the hook records the error at exit instead). The real error on a device:
``bench/gpu_oom.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
import types

import torch

GIB = 1 << 30
observers: list = []
state = {"peak": 10 * GIB}


def _nested(dev: int = 0) -> dict:
    return {
        "allocated_bytes": {"all": {"current": state["peak"] - GIB, "peak": state["peak"]}},
        "reserved_bytes": {"all": {"current": state["peak"] + GIB}},
        "num_alloc_retries": 0,
    }


def _flat(dev: int = 0) -> dict:
    return {
        "allocated_bytes.all.current": state["peak"] - GIB,
        "allocated_bytes.all.peak": state["peak"],
        "reserved_bytes.all.current": state["peak"] + GIB,
        "num_alloc_retries": 3,
        "num_ooms": 1,
    }


def fake_cuda(with_observer: bool) -> None:
    cuda = torch.cuda
    cuda.is_initialized = lambda: True
    cuda.current_device = lambda: 0
    cuda.device_count = lambda: 1
    cuda.memory_stats_as_nested_dict = _nested
    cuda.memory_stats = _flat
    cuda.get_device_properties = lambda dev=0: types.SimpleNamespace(total_memory=80 * GIB, name="Fake 80GB")
    cuda.memory._snapshot = lambda dev=None: {
        "segments": [{"device": 0, "total_size": state["peak"], "blocks": [
            {"size": state["peak"] - 2 * GIB, "state": "active_allocated"}, {"size": GIB, "state": "inactive"}]}]
    }  # fmt: skip
    if with_observer:
        torch._C._cuda_attach_out_of_memory_observer = observers.append
    elif hasattr(torch._C, "_cuda_attach_out_of_memory_observer"):
        delattr(torch._C, "_cuda_attach_out_of_memory_observer")


def allocate(rows: int) -> torch.Tensor:
    """The allocation that fails: observers first, then the error (as CUDACachingAllocator does)."""
    if state["peak"] + rows * 1024 > 78 * GIB:
        for obs in list(observers):
            obs(0, rows * 1024, 80 * GIB, 2 * GIB)
        raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {rows * 1024 / GIB:.2f} GiB.")
    return torch.zeros(4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--no-observer", action="store_true")
    args = ap.parse_args()
    fake_cuda(not args.no_observer)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    grow = (60 * GIB) // args.steps  # 70 GiB at --steps: the next 16 GiB do not fit in 78
    for step in range(10**9):
        state["peak"] += grow
        allocate(16 * 1024 * 1024 if step >= args.steps else 1)
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Small CUDA probes recorded alongside ``bench/gpu_session.sh`` (needs a GPU and torch with CUDA).

Each prints one JSON object on stdout (and progress on stderr), so a GPU session brings back
readings that later work (out-of-memory, FLOP rates, torch.compile) can be checked against:

    python bench/gpu_probe.py oom       # a training whose batch grows each step until CUDA OOM:
                                        # memory per step, the allocator's stats at the OOM, and the
                                        # cost of torch.cuda.memory._record_memory_history + _snapshot
    python bench/gpu_probe.py flops     # demo/gpu_bound.py's step (width 8192, batch 4096, bf16
                                        # autocast): FLOPs from FlopCounterMode, from the profiler's
                                        # with_flops, by hand (2*m*n*k per matmul), and the step time
    python bench/gpu_probe.py compile   # a compiled function fed a new shape each call: dynamo's
                                        # counters, recompile reasons and compile times as torch keeps them

``oom`` ends with exit status 1 (the OOM re-raised), as a training that dies of it would.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _emit(result: dict[str, Any]) -> None:
    print(json.dumps(result, default=str), flush=True)


def _timed_steps(step: Any, n: int) -> float:
    """Median seconds of ``n`` calls of ``step`` (CUDA synchronised around each)."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def oom(args: argparse.Namespace) -> int:
    """Grow the batch by ``args.grow`` rows a step until CUDA OOM; record memory and snapshot cost."""
    dev = torch.device("cuda")
    width = 2048
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU()).to(dev)
    model = model.to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(rows: int) -> None:
        x = torch.randn(rows, width, device=dev, dtype=torch.bfloat16)
        loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    fixed = args.grow
    plain_s = _timed_steps(lambda: step(fixed), 20)
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    history_s = _timed_steps(lambda: step(fixed), 20)
    result: dict[str, Any] = {
        "probe": "oom",
        "device": torch.cuda.get_device_name(),
        "total_bytes": torch.cuda.get_device_properties(dev).total_memory,
        "fixed_rows": fixed,
        "step_s_plain": plain_s,
        "step_s_with_history": history_s,
        "steps": [],
    }
    k = 0
    t0 = time.monotonic()
    try:
        while True:
            k += 1
            torch.cuda.reset_peak_memory_stats()
            step(fixed * k)
            torch.cuda.synchronize()
            result["steps"].append(
                {
                    "step": k,
                    "rows": fixed * k,
                    "t_s": round(time.monotonic() - t0, 3),
                    "allocated": torch.cuda.memory_allocated(),
                    "reserved": torch.cuda.memory_reserved(),
                    "peak": torch.cuda.max_memory_allocated(),
                }
            )
            print(f"oom probe: step {k}, peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", file=sys.stderr)
    except torch.OutOfMemoryError as err:
        result["oom_step"] = k
        result["oom_message"] = str(err).splitlines()[0][:400]
        stats = torch.cuda.memory_stats()
        result["stats_at_oom"] = {
            key: stats.get(key)
            for key in ("num_alloc_retries", "num_ooms", "allocated_bytes.all.peak", "reserved_bytes.all.peak")
        }
        t = time.perf_counter()
        snap = torch.cuda.memory._snapshot()
        result["snapshot_s"] = time.perf_counter() - t
        with tempfile.NamedTemporaryFile(suffix=".pickle", delete=False) as f:
            t = time.perf_counter()
            pickle.dump(snap, f)
            result["snapshot_write_s"] = time.perf_counter() - t
            result["snapshot_bytes"] = f.tell()
        os.unlink(f.name)
        result["snapshot_segments"] = len(snap.get("segments", []))
        result["snapshot_trace_entries"] = sum(len(t) for t in snap.get("device_traces", []))
        _emit(result)
        raise
    return 0


def flops(args: argparse.Namespace) -> int:
    """FLOPs of one gpu_bound step three ways, and its step time (see the module docstring)."""
    from torch.utils.flop_counter import FlopCounterMode

    dev = torch.device("cuda")
    width, batch, in_dim, classes, layers = 8192, 4096, 256, 10, 4
    mods: list[nn.Module] = [nn.Linear(in_dim, width), nn.ReLU()]
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*mods, nn.Linear(width, classes)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    x = torch.randn(batch, in_dim, device=dev)
    y = torch.randint(0, classes, (batch,), device=dev)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    step_s = _timed_steps(step, 30)
    counter = FlopCounterMode(display=False)
    t = time.perf_counter()
    with counter:
        step()
    torch.cuda.synchronize()
    counted_s = time.perf_counter() - t
    by_op = {str(k): v for k, v in counter.get_flop_counts().get("Global", {}).items()}
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA], with_flops=True
    ) as prof:
        step()
        torch.cuda.synchronize()
    profiler_flops = sum(getattr(e, "flops", 0) or 0 for e in prof.key_averages())
    # by hand: forward 2*m*n*k per Linear; backward twice that (grad of input and of weight),
    # except the first layer, whose input needs no gradient (once: its weight's)
    dims = [(in_dim, width)] + [(width, width)] * layers + [(width, classes)]
    fwd = sum(2 * batch * a * b for a, b in dims)
    bwd = sum(2 * 2 * batch * a * b for a, b in dims[1:]) + 2 * batch * in_dim * width
    _emit(
        {
            "probe": "flops",
            "device": torch.cuda.get_device_name(),
            "capability": torch.cuda.get_device_capability(),
            "step_s": step_s,
            "flop_counter_total": counter.get_total_flops(),
            "flop_counter_by_op": by_op,
            "flop_counter_step_s": counted_s,
            "profiler_with_flops_total": profiler_flops,
            "by_hand_total": fwd + bwd,
            "achieved_tflops_by_hand": (fwd + bwd) / step_s / 1e12,
        }
    )
    return 0


def compile_probe(args: argparse.Namespace) -> int:
    """A compiled function called with a new shape each time; what torch keeps about it."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    dev = torch.device("cuda")

    def f(x: torch.Tensor, n: int) -> torch.Tensor:
        y = (x.sin() + 1).relu()
        if n > 3:  # a Python int that changes: a guard on its value
            y = y * 2
        return y.sum()

    fc = torch.compile(f)
    times = []
    for i, size in enumerate([32, 17, 64, 5, 100, 33, 7, 8, 9, 10]):
        t = time.perf_counter()
        fc(torch.randn(size, device=dev), i)
        torch.cuda.synchronize()
        times.append(round(time.perf_counter() - t, 4))
    out: dict[str, Any] = {
        "probe": "compile",
        "torch": torch.__version__,
        "call_s": times,
        "counters": {k: dict(v) for k, v in counters.items() if v},
    }
    utils = torch._dynamo.utils
    for name in ("compilation_time_metrics", "guard_failures"):
        value = getattr(utils, name, None)
        if value is not None:
            out[name] = {str(k): v for k, v in dict(value).items()}
    config = torch._dynamo.config
    out["limits"] = {n: getattr(config, n, None) for n in ("recompile_limit", "cache_size_limit")}
    _emit(out)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("probe", choices=("oom", "flops", "compile"))
    parser.add_argument("--grow", type=int, default=262_144, help="oom: rows the batch grows by each step")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_probe.py: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    return {"oom": oom, "flops": flops, "compile": compile_probe}[args.probe](args)


if __name__ == "__main__":
    sys.exit(main())

"""What the in-process hook costs the training: per-call cost, steps/s with vs without, burst cost.

Four tables, printed; ``--json PATH`` writes them too. Rerun:

    python bench/hook_cost.py [--pairs 5] [--seconds 15] [--demos cpu_bound,dataloader_bound] [--bursts 5]
    python bench/hook_cost.py --demos '' --bursts 0      (the per-call table alone: a few seconds)
    python bench/hook_cost.py --device-memory-only

1. Per call: the optimizer step hook, the DataLoader ``__next__`` wrapper, the
   ``torch.autograd.backward`` wrapper (with optimizer steps, and as the step boundary of a loop
   without ``torch.optim``; and what one reading of the loss adds to it) and a collective wrapper
   (``all_reduce`` of one number in a one-rank gloo group), in microseconds (median of 5 rounds
   of 20 000 calls, in this process; each wrapper as the difference to the same calls with the
   hook switched off).
2. Steps/s of each demo alone vs with the hook pre-loaded (``torchwatch run`` without the outside
   samplers), as the median ratio of interleaved pairs (A B A B ...): this machine is shared.
3. Bursts on ``demo/dataloader_bound.py``: extra wall time per burst (the burst's steps minus as
   many normal steps), trace bytes (raw and gzip), summary seconds (off the main thread), and
   the training's RSS before the first and after the last burst.
4. Device memory and GPU settings read at step boundaries (``--device-memory-only`` prints just
   this): the step hook with the reads off vs on, and the cost of one read without and with CUDA
   initialised (see :func:`device_memory_us`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from overhead import _steps_per_s  # noqa: E402

from torchwatch.watch.lifecycle import hook_env  # noqa: E402


def per_call_us(rounds: int = 5, calls: int = 20_000) -> dict[str, float]:
    """Median cost of one step-hook call and of the ``__next__`` wrapper over the original, us."""
    with tempfile.TemporaryDirectory() as tmp:
        from torchwatch.hook import runtime

        hook = runtime.start(12, (), Path(tmp))
        import torch
        import torch.utils.data.dataloader as dl
        from torch.utils.data import DataLoader, TensorDataset

        if hook.torch is None:
            hook.on_torch(torch)
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        step_us = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                hook._on_step(opt, (), {})
            step_us.append((time.perf_counter() - t0) / calls * 1e6)
        loader = DataLoader(TensorDataset(torch.zeros(10**6, 1)), batch_size=1)
        it = iter(loader)
        wrapped, orig = dl._BaseDataLoaderIter.__next__, dl._BaseDataLoaderIter.__next__.__wrapped__
        next_us = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                orig(it)
            t1 = time.perf_counter()
            for _ in range(calls):
                wrapped(it)
            t2 = time.perf_counter()
            next_us.append(((t2 - t1) - (t1 - t0)) / calls * 1e6)
        backward = _backward_us(hook, rounds, calls)
        collective = _collective_us(Path(tmp), rounds, calls)
        hook.close()
    return {
        "step_hook_us": statistics.median(step_us),
        "next_wrapper_us": statistics.median(next_us),
        **backward,
        "collective_wrapper_us": collective,
    }


def _extra_us(call: Any, rounds: int, calls: int) -> float:
    """Median over ``rounds`` of the extra time per ``call()`` with the hook on, us: the same
    call timed with the hook switched off (its wrappers then only pass the call on) and on."""
    from torchwatch.hook import patches

    extra = []
    try:
        for _ in range(rounds):
            patches._active = False
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            t1 = time.perf_counter()
            patches._active = True
            for _ in range(calls):
                call()
            t2 = time.perf_counter()
            extra.append(((t2 - t1) - (t1 - t0)) / calls * 1e6)
    finally:
        patches._active = True
    return statistics.median(extra)


def _backward_us(hook: Any, rounds: int, calls: int) -> dict[str, float]:
    """The backward wrapper's cost per call, us: with optimizer steps (the wrapper only times
    the pass) and as the step boundary of a loop without ``torch.optim``."""
    import torch

    x = torch.ones(4, requires_grad=True)
    out = {}
    for source in ("optimizer", "backward"):
        hook.step_source = source
        out[f"backward_wrapper_{source}_us"] = _extra_us(lambda: (x * 2).sum().backward(), rounds, calls)
    hook.step_source = "optimizer"
    out["loss_read_us"] = _loss_read_us(hook, lambda: (x * 2).sum().backward(), rounds, calls)
    return out


def _loss_read_us(hook: Any, call: Any, rounds: int, calls: int) -> float:
    """What one reading of the loss adds to a backward call, us (a CPU scalar's ``item()`` and
    the sample kept): the same calls with the reading never due, then due at every call
    (``wire.LOSS_EVERY_S`` = 0). In a training it is taken at most every 0.25 s."""
    from torchwatch import wire

    every = wire.LOSS_EVERY_S
    extra = []
    try:
        for _ in range(rounds):
            wire.LOSS_EVERY_S = 1e9
            hook.loss.due = float("inf")
            t0 = time.perf_counter()
            for _ in range(calls):
                call()
            t1 = time.perf_counter()
            wire.LOSS_EVERY_S = 0.0
            hook.loss.due = 0.0
            for _ in range(calls):
                call()
            t2 = time.perf_counter()
            extra.append(((t2 - t1) - (t1 - t0)) / calls * 1e6)
    finally:
        wire.LOSS_EVERY_S = every
        hook.loss.due = 0.0
    return statistics.median(extra)


def _collective_us(tmp: Path, rounds: int, calls: int) -> float:
    """The collective wrapper's cost per call, us (``all_reduce`` of one number, one rank: the
    wrapper times the call, and the ``Work.wait()`` inside it is left alone)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp / "store"), 1), rank=0, world_size=1)
    try:
        t = torch.zeros(1)
        return _extra_us(lambda: dist.all_reduce(t), rounds, calls)
    finally:
        dist.destroy_process_group()


def _nested_memory_stats() -> dict[str, Any]:
    """A nested dict in the shape ``torch._C._cuda_memoryStats`` returns (FABRICATED values: no GPU
    here): every stat type x pool x (current, peak, allocated, freed), and the scalar counters."""
    pools = {p: {"current": 2**33, "peak": 2**34, "allocated": 2**40, "freed": 2**40 - 2**33} for p in
             ("all", "large_pool", "small_pool")}  # fmt: skip
    stats: dict[str, Any] = {
        name: pools
        for name in (
            "allocation",
            "segment",
            "active",
            "inactive_split",
            "allocated_bytes",
            "reserved_bytes",
            "active_bytes",
            "inactive_split_bytes",
            "requested_bytes",
        )
    }
    stats["oversize_allocations"] = stats["oversize_segments"] = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
    for name in ("num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams", "num_device_alloc",
                 "num_device_free"):  # fmt: skip
        stats[name] = 0
    return stats


def device_memory_us(rounds: int = 5, calls: int = 20_000) -> dict[str, float]:
    """What reading device memory and GPU settings adds to the optimizer step hook, us.

    - ``step_hook_off_us`` / ``step_hook_on_us``: one step-hook call with the GPU reads disabled /
      enabled but not due (the rate-limit check alone: what most steps pay);
    - ``read_no_cuda_us``: one read in this CPU-only process (settings; CUDA not initialised, so
      no memory read);
    - ``read_cuda_us``: one read as in a training that initialised CUDA: the real
      ``torch.cuda.memory_stats_as_nested_dict`` returning a nested dict of the real shape
      (FABRICATED values: the C++ copy of the allocator's counters, a few microseconds, is not
      timed here), plus the settings; ``memory_stats_cuda_us``: the same through the flattening
      ``torch.cuda.memory_stats`` (what the hook avoids).
      Reads happen at most every :data:`torchwatch.hook.gpu.SAMPLE_EVERY_S`.
    """
    with tempfile.TemporaryDirectory() as tmp:
        from torchwatch.hook import gpu, runtime

        hook = runtime.start(12, (), Path(tmp))
        import torch
        import torch.cuda.memory as cuda_memory

        if hook.torch is None:
            hook.on_torch(torch)
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)

        def per_call(fn: Any) -> float:
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                times.append((time.perf_counter() - t0) / calls * 1e6)
            return statistics.median(times)

        watch = hook.gpu
        real_due = watch.due
        watch.due = lambda now: False  # type: ignore[method-assign]
        off = per_call(lambda: hook._on_step(opt, (), {}))
        watch.due = real_due  # type: ignore[method-assign]
        watch.sample(torch, opt, time.monotonic())  # the next read is 0.5 s away: the calls below only check
        on = per_call(lambda: hook._on_step(opt, (), {}))
        no_cuda = per_call(lambda: gpu.GpuWatch().sample(torch, opt, 0.0))
        nested = _nested_memory_stats()
        saved = {name: getattr(torch.cuda, name) for name in ("is_initialized", "current_device", "device_count",
                                                               "get_device_properties")}  # fmt: skip
        saved_nested = cuda_memory.memory_stats_as_nested_dict
        try:
            props = type("Props", (), {"total_memory": 80 << 30})()
            torch.cuda.is_initialized = lambda: True  # type: ignore[assignment]
            torch.cuda.current_device = lambda: 0  # type: ignore[assignment]
            torch.cuda.device_count = lambda: 1  # type: ignore[assignment]
            torch.cuda.get_device_properties = lambda device=None: props  # type: ignore[assignment]
            for module in (torch.cuda, cuda_memory):  # the hook's name, and memory_stats's own
                module.memory_stats_as_nested_dict = lambda device=None: nested  # type: ignore[attr-defined]
            fake = gpu.GpuWatch()
            assert fake.sample(torch, opt, 0.0) and fake.memory is not None, "the fake CUDA read nothing"
            cuda = per_call(lambda: fake.sample(torch, opt, 0.0))
            flat = per_call(lambda: torch.cuda.memory_stats(0))
        finally:
            for name, fn in saved.items():
                setattr(torch.cuda, name, fn)
            torch.cuda.memory_stats_as_nested_dict = cuda_memory.memory_stats_as_nested_dict = saved_nested
        hook.close()
    return {
        "step_hook_off_us": off,
        "step_hook_on_us": on,
        "read_no_cuda_us": no_cuda,
        "read_cuda_us": cuda,
        "memory_stats_cuda_us": flat,
    }


def run_demo(demo: str, seconds: float, hooked: bool) -> float:
    """Steps/s of one demo run, with or without the hook pre-loaded."""
    cmd = [sys.executable, str(REPO / "demo" / f"{demo}.py"), "--device", "cpu", "--seconds", str(seconds)]
    env = hook_env() if hooked else dict(os.environ)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, check=False)
    return _steps_per_s(proc.stderr)


def burst_cost(n: int, seconds: float) -> dict[str, Any]:
    """Run ``n`` bursts on the dataloader demo, one every few seconds; their costs."""
    from torchwatch.sources.hook import HookReader
    from torchwatch.watch.bursts import wait_for_burst

    cmd = [sys.executable, str(REPO / "demo" / "dataloader_bound.py"), "--device", "cpu", "--seconds", str(seconds)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=hook_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows: list[dict[str, Any]] = []
    try:
        reader = HookReader(proc.pid)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            reader = HookReader(proc.pid)  # again: the process instance is known once it runs
            snap = reader.counters() if reader.record() is not None else None
            if snap is not None and snap.steps >= 10:
                break
            time.sleep(0.2)
        for i in range(n):
            time.sleep(5.5)  # past the hook's cooldown
            before = reader.counters()
            assert before is not None
            normal = statistics.median(e[1] for e in before.entries[-20:])
            ok, msg = reader.request_burst()
            if not ok:
                raise SystemExit(f"bench/hook_cost.py: {msg}")
            s = wait_for_burst(reader, i, 120).to_json()
            after = reader.counters()
            assert after is not None
            steps = [e for e in after.entries if e[0] > before.last_step_t]
            burst_steps = steps[: 1 + int(s.get("steps") or 0) + 1]  # warmup + active + the one that ends it
            extra = sum(e[1] for e in burst_steps) - normal * len(burst_steps)
            rows.append(
                {
                    "id": s.get("id"),
                    "error": s.get("error"),
                    "extra_wall_s": round(extra, 3),
                    "normal_step_s": round(normal, 4),
                    "trace_bytes": s.get("trace_bytes"),
                    "trace_gz_bytes": s.get("trace_gz_bytes"),
                    "summary_s": s.get("summary_s"),
                    "rss_before_bytes": s.get("rss_before_bytes"),
                    "rss_after_bytes": s.get("rss_after_bytes"),
                }
            )
    finally:
        proc.terminate()
        proc.wait(30)
    return {"bursts": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--demos", default="cpu_bound,dataloader_bound")
    parser.add_argument("--bursts", type=int, default=5)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--device-memory-only", action="store_true", help="only table 4 (fast)")
    args = parser.parse_args()
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}

    dm = device_memory_us(rounds=3 if args.device_memory_only else 5, calls=5_000)
    result["device_memory"] = dm
    from torchwatch.hook.gpu import SAMPLE_EVERY_S

    print(
        f"device memory + GPU settings: step hook {dm['step_hook_off_us']:.2f} us with the reads off, "
        f"{dm['step_hook_on_us']:.2f} us on (no read due); one read {dm['read_no_cuda_us']:.1f} us without CUDA, "
        f"{dm['read_cuda_us']:.1f} us with CUDA initialised (fake CUDA surface; torch.cuda.memory_stats "
        f"would take {dm['memory_stats_cuda_us']:.1f} us); at most one read per {SAMPLE_EVERY_S:g} s, so with CUDA: "
        + ", ".join(
            f"{dm['read_cuda_us'] * min(1.0, step / SAMPLE_EVERY_S):.2f} us per {step * 1000:g} ms step"
            f" ({dm['read_cuda_us'] * min(1.0, step / SAMPLE_EVERY_S) / (step * 1e6):.4%})"
            for step in (0.01, 0.1, 1.0)
        )
    )
    if args.device_memory_only:
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
        return 0

    calls = per_call_us()
    result["per_call"] = calls
    print(
        f"per call: optimizer step hook {calls['step_hook_us']:.1f} us, "
        f"__next__ wrapper +{calls['next_wrapper_us']:.1f} us, "
        f"backward wrapper +{calls['backward_wrapper_optimizer_us']:.1f} us "
        f"(as the step boundary +{calls['backward_wrapper_backward_us']:.1f} us), "
        f"collective wrapper +{calls['collective_wrapper_us']:.1f} us"
    )
    read = calls["loss_read_us"]
    print(
        f"loss reading: +{read:.1f} us per reading (included in the backward wrapper's figure once due), "
        f"at most 4 a second: {read * 4 * 0.01:.2f} us per 10 ms step, {read:.1f} us per step of 250 ms or more"
    )

    demos = [d for d in args.demos.split(",") if d]
    if demos:
        print(
            f"\n{'demo':17s} {'alone':>8s} {'hooked':>8s} {'ratio':>6s}  "
            f"(medians of {args.pairs} interleaved pairs, {args.seconds:g} s each)"
        )
    result["demos"] = []
    for demo in demos:
        alone, hooked, ratios = [], [], []
        for _ in range(args.pairs):
            a = run_demo(demo, args.seconds, False)
            h = run_demo(demo, args.seconds, True)
            alone.append(a)
            hooked.append(h)
            ratios.append(h / a)
        row = {
            "demo": demo,
            "alone": statistics.median(alone),
            "hooked": statistics.median(hooked),
            "ratio": statistics.median(ratios),
            "ratios": ratios,
        }
        result["demos"].append(row)
        print(f"{demo:17s} {row['alone']:8.2f} {row['hooked']:8.2f} {row['ratio']:6.3f}")

    if args.bursts:
        bc = burst_cost(args.bursts, seconds=60 + 8 * args.bursts)
        result["burst_cost"] = bc
        print(
            f"\n{'burst':>5s} {'extra wall s':>12s} {'step s':>7s} {'trace MB':>8s} {'gz MB':>6s} "
            f"{'summary s':>9s} {'RSS MB':>7s}"
        )
        for r in bc["bursts"]:
            print(
                f"{r['id']!s:>5s} {r['extra_wall_s']:12.3f} {r['normal_step_s']:7.3f} "
                f"{(r['trace_bytes'] or 0) / 1e6:8.2f} {(r['trace_gz_bytes'] or 0) / 1e6:6.2f} "
                f"{r['summary_s'] or 0:9.3f} {(r['rss_after_bytes'] or 0) / 1e6:7.1f}"
                + (f"  error: {r['error']}" if r["error"] else "")
            )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

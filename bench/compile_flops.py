"""torch.compile findings and FLOP counting (issue 33): what they cost, and whether the fixes help.

Three tables, printed; ``--json PATH`` writes them too. Rerun:

    python bench/compile_flops.py                       (all three, about 7 minutes on 2 cores)
    python bench/compile_flops.py --only flops,hook     (the first two, under a minute)
    python bench/compile_flops.py --only truth --pairs 3

1. ``flops``: the FLOP count's extra cost, in steps, and how complete each way of counting is, on
   an MLP, a conv net and a transformer block (the unit tests' models) and demo/gpu_bound.py's CPU
   model: interleaved pairs (a plain step, then the same step counted) in this process, the median
   of the ratios minus one, with their spread (25th-75th percentile) as the noise. The counters:
   the hook's (a dispatch mode in the burst's warmup step, :mod:`torchwatch.hook.flops`), torch's
   ``FlopCounterMode``, and the profiler's own estimate (``with_flops`` + ``record_shapes``, whose
   extra cost is that of a profiled step over a profiled step without them). Completeness is the
   count over the analytic count. The CPU peak's one-time cost is printed beside it.
2. ``hook``: the hook's steady cost before / after this change, in this process after a real
   compile: the optimizer step hook when no read is due (what most steps pay) and when every step
   reads (the worst case; reads happen at most every 0.5 s), with ``CompileWatch.read`` switched off
   ("before") and on ("after"); and one read of torch.compile's counters when nothing changed.
3. ``truth``: each scenario of tests/scenarios/compile_*.py run plain and with ``--relieve`` (its
   fix), interleaved pairs in fresh processes, steps timed by the scenario (``_compile.STEPS_ENV``):
   shapes: the slowest step after the change (the recompile) and the median step; item break and
   limit: the median step once steady; clean: compiled vs not compiled (no fix: context).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SCEN = REPO / "tests" / "scenarios"


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return q[0], statistics.median(values), q[2]


# -- 1. the FLOP count's cost and completeness --------------------------------------------------------
def _models() -> dict[str, Callable[[], tuple[Any, Any, float]]]:
    from tests.unit import test_flops as tf

    def gpu_bound_cpu() -> tuple[Any, Any, float]:
        sys.path.insert(0, str(REPO / "demo"))
        import gpu_bound
        import torch

        width, batch = gpu_bound.CPU_WIDTH, gpu_bound.CPU_BATCH
        model = gpu_bound.mlp(width)
        x = torch.randn(batch, gpu_bound.IN_DIM)
        return model, x, analytic_mlp(batch, gpu_bound.IN_DIM, width, gpu_bound.LAYERS, gpu_bound.CLASSES)

    return {"mlp": tf._mlp, "conv": tf._conv, "transformer block": tf._block, "gpu_bound (cpu)": gpu_bound_cpu}


def analytic_mlp(batch: int, inputs: int, width: int, layers: int, classes: int) -> float:
    """FLOPs of one training step of demo/gpu_bound.py's MLP (``Linear(in, w)``, ``layers`` x
    ``Linear(w, w)``, ``Linear(w, classes)``): forward 2·B·(in·w + layers·w² + w·classes); backward
    as much again for the weights' gradients, and for the inputs' gradients of every layer but the
    first (its input needs none)."""
    fwd = 2 * batch * (inputs * width + layers * width * width + width * classes)
    return 2 * fwd + 2 * batch * (layers * width * width + width * classes)


def _step_of(model: Any, x: Any, opt: Any) -> Callable[[], None]:
    def step() -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    return step


def flop_costs(pairs: int) -> list[dict[str, Any]]:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    from torchwatch.hook import flops

    rows = []
    for name, make in _models().items():
        torch.manual_seed(0)
        model, x, analytic = make()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        step = _step_of(model, x, opt)

        def timed(ctx: Callable[[], Any] | None = None, step: Callable[[], None] = step) -> tuple[float, Any]:
            t0 = time.perf_counter()
            if ctx is None:
                step()
                return time.perf_counter() - t0, None
            with ctx() as c:
                step()
            return time.perf_counter() - t0, c

        for _ in range(3):
            step()
        ours, fcm, prof = [], [], []
        counts: dict[str, float] = {}
        for _ in range(pairs):
            base, _ = timed()
            t0 = time.perf_counter()
            fs, _note = flops.FlopStep.start(torch)
            step()
            out = fs.stop(time.monotonic()) if fs is not None else {}
            ours.append((time.perf_counter() - t0) / base - 1)
            counts["hook"] = out.get("flops_per_step", 0.0)
            base, _ = timed()
            t, c = timed(lambda: FlopCounterMode(display=False))
            fcm.append(t / base - 1)
            counts["FlopCounterMode"] = c.get_total_flops()
            plain, _ = timed(lambda: profile(activities=[ProfilerActivity.CPU]))
            t, p = timed(lambda: profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True))
            prof.append(t / plain - 1)
            counts["profiler"] = sum(e.flops for e in p.key_averages() if e.flops)
        rows.append(
            {
                "model": name,
                "analytic_flops": analytic,
                "step_ms": round(base * 1000, 3),
                "hook_extra_steps": _quartiles(ours),
                "flopcountermode_extra_steps": _quartiles(fcm),
                "profiler_extra_per_profiled_step": _quartiles(prof),
                "completeness": {k: round(v / analytic, 4) for k, v in counts.items()},
            }
        )
    peak = flops.cpu_peak(torch, "float32")
    rows.append({"cpu_peak_flops": peak[0] if peak else None, "cpu_peak_ms": peak[1] if peak else None})
    return rows


def print_flops(rows: list[dict[str, Any]]) -> None:
    print("\n1. FLOP count: extra cost of the counted step, in steps (median [25th-75th pct]), completeness")
    print(f"   {'model':<18} {'step ms':>8}  {'hook (burst)':>22}  {'FlopCounterMode':>22}  {'profiler flops*':>22}"
          "  completeness hook / FCM / profiler")  # fmt: skip
    for r in rows:
        if "model" not in r:
            peak = r["cpu_peak_flops"]
            print(f"   CPU matmul peak (hook, once per process): {peak / 1e9:.1f} GFLOP/s in {r['cpu_peak_ms']:.0f} ms")
            continue
        cells = []
        for key in ("hook_extra_steps", "flopcountermode_extra_steps", "profiler_extra_per_profiled_step"):
            lo, mid, hi = r[key]
            cells.append(f"{mid:+.2f} [{lo:+.2f}..{hi:+.2f}]")
        c = r["completeness"]
        print(f"   {r['model']:<18} {r['step_ms']:8.2f}  {cells[0]:>22}  {cells[1]:>22}  {cells[2]:>22}"
              f"  {c['hook']:.3f} / {c['FlopCounterMode']:.3f} / {c['profiler']:.3f}")  # fmt: skip
    print("   * per profiled step, over a profiled step without record_shapes/with_flops (a burst profiles 3)")


# -- 2. the hook's steady cost ---------------------------------------------------------------------
def hook_cost(rounds: int = 5, calls: int = 20_000) -> dict[str, float]:
    import torch

    from torchwatch.hook import compiled, runtime

    with tempfile.TemporaryDirectory() as tmp:
        hook = runtime.start(12, (), Path(tmp))
        if hook.torch is None:
            hook.on_torch(torch)
        torch.compile(lambda t: t * 2, backend="eager")(torch.ones(2))  # dynamo's counters exist
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)

        def per_call(fn: Callable[[], Any], n: int = calls) -> float:
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                times.append((time.perf_counter() - t0) / n * 1e6)
            return statistics.median(times)

        def every_step() -> None:
            hook.gpu._next_t = 0.0  # a read is due at every step: the worst case
            hook._on_step(opt, (), {})

        real = compiled.CompileWatch.read
        out: dict[str, float] = {}
        for label, read in (("before", lambda self, now: False), ("after", real)):
            compiled.CompileWatch.read = read  # type: ignore[method-assign]
            hook.gpu.sample(torch, opt, time.monotonic())  # next read 0.5 s away: steps only check
            out[f"step_not_due_{label}_us"] = per_call(lambda: hook._on_step(opt, (), {}))
            out[f"step_reading_{label}_us"] = per_call(every_step, 2000)
        compiled.CompileWatch.read = real  # type: ignore[method-assign]
        watch = compiled.CompileWatch()
        watch.read(time.monotonic())
        out["read_unchanged_us"] = per_call(lambda: watch.read(time.monotonic()))
        hook.close()
    return out


def print_hook(r: dict[str, float]) -> None:
    print("\n2. The hook's steady cost, us per optimizer step (median of 5 rounds; before = compile reads off)")
    before, after = r["step_not_due_before_us"], r["step_not_due_after_us"]
    print(f"   no read due (most steps):   before {before:.2f}   after {after:.2f}")
    before, after = r["step_reading_before_us"], r["step_reading_after_us"]
    print(f"   a read at every step:       before {before:.1f}   after {after:.1f}   (reads come at most every 0.5 s)")
    print(f"   one read of torch.compile's counters, nothing changed: {r['read_unchanged_us']:.1f} us")


# -- 3. truth by intervention ------------------------------------------------------------------------
SCENARIOS = {
    "compile_shapes": ("mark_dynamic(x, 0)", ["--change-after", "2"]),
    "compile_item_break": ("torch.where instead of .item()", []),
    "compile_limit": ("tag kept out of the compiled call", ["--change-after", "2"]),
    "compile_clean": ("(not compiled: context, no fix)", []),
}


def _run(scenario: str, relieve: bool, seconds: float, extra: list[str]) -> list[tuple[float, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "steps.json"
        cmd = [sys.executable, str(SCEN / f"{scenario}.py"), "--device", "cpu", "--seconds", str(seconds), *extra]
        env = {**os.environ, "COMPILE_SCENARIO_STEPS": str(path)}
        subprocess.run(cmd + (["--relieve"] if relieve else []), env=env, cwd=REPO, check=True, timeout=240,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        return [tuple(x) for x in json.loads(path.read_text())]  # type: ignore[misc]


SETTLED_S = 6.0  # past the event (2 s after the first step) and its recompiles (up to 4 s here)


def _measures(scenario: str, steps: list[tuple[float, float]]) -> dict[str, float]:
    """ms: ``median`` of the steady steps (from ``SETTLED_S`` after the first step on), and for
    shapes ``slowest`` (the slowest step after the first 5: the recompile)."""
    start = steps[0][0]
    settled = [d for t, d in steps if t - start > SETTLED_S]
    out = {"median": statistics.median(settled or [d for _, d in steps[5:]]) * 1000}
    if scenario == "compile_shapes":
        out["slowest"] = max(d for _, d in steps[5:]) * 1000
    return out


def truth(pairs: int, seconds: float) -> list[dict[str, Any]]:
    rows = []
    for scenario, (fix, extra) in SCENARIOS.items():
        plain: list[dict[str, float]] = []
        fixed: list[dict[str, float]] = []
        for _ in range(pairs):
            plain.append(_measures(scenario, _run(scenario, False, seconds, extra)))
            fixed.append(_measures(scenario, _run(scenario, True, seconds, extra)))
        row: dict[str, Any] = {"scenario": scenario, "fix": fix}
        for key in plain[0]:
            row[key] = {
                "plain": [round(m[key], 3) for m in plain],
                "fixed": [round(m[key], 3) for m in fixed],
                "speedup": round(statistics.median(p[key] / f[key] for p, f in zip(plain, fixed, strict=True)), 3),
            }
        rows.append(row)
    return rows


def print_truth(rows: list[dict[str, Any]]) -> None:
    print("\n3. Truth by intervention: plain vs fixed (--relieve), interleaved pairs in fresh processes, ms")
    for r in rows:
        for key in ("slowest", "median"):
            if key in r:
                m = r[key]
                print(f"   {r['scenario']:<19} {key:>7}: plain {m['plain']}  fixed {m['fixed']}  "
                      f"speed-up x{m['speedup']:.2f} (median of pair ratios)   fix: {r['fix']}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="flops,hook,truth", help="comma-separated: flops, hook, truth")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved pairs per scenario (truth; default 3)")
    parser.add_argument("--flop-pairs", type=int, default=15, help="interleaved pairs per model (flops; default 15)")
    parser.add_argument("--seconds", type=float, default=12.0, help="training seconds per scenario run (default 12)")
    parser.add_argument("--json", metavar="PATH", help="also write the tables as JSON")
    args = parser.parse_args()
    only = set(args.only.split(","))
    out: dict[str, Any] = {"machine": f"{os.cpu_count()} CPUs", "load": os.getloadavg()}
    print(f"machine: {out['machine']}, load average {out['load'][0]:.1f} (shared: read the spreads)")
    if "flops" in only:
        out["flops"] = flop_costs(args.flop_pairs)
        print_flops(out["flops"])
    if "hook" in only:
        out["hook"] = hook_cost()
        print_hook(out["hook"])
    if "truth" in only:
        out["truth"] = truth(args.pairs, args.seconds)
        print_truth(out["truth"])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

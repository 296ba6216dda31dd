"""A real CUDA out-of-memory error watched end to end, and what the allocator snapshot costs (GPU).

    python bench/gpu_oom.py OUTDIR [--seconds-to-oom 150]

1. ``torchwatch run --headless --trace --json`` on ``bench/oom_train.py`` (a batch that grows with
   wall time until ``torch.cuda.OutOfMemoryError``). From the trace: when the device-memory
   forecast (``cuda_mem_forecast_s``) first appeared, and at each analysis after it the predicted
   time left against the real one (the error's ``at_s`` in the report's memory record). From the
   report: the record (kind, stack, allocator, ``snapshot_ms``: the snapshot's cost at the error).
2. The snapshot's cost on a full allocator, apart from any error: ``torch.cuda.memory._snapshot()``
   with N live blocks (median of 5), and a step's time with and without the hook's observer
   attached (it does nothing until an error: the two should match).

Prints one JSON object (also written to OUTDIR/gpu_oom.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def watched_run(out: Path, seconds_to_oom: float) -> dict[str, object]:
    trace, report = out / "oom_trace.jsonl", out / "oom_report.json"
    for p in (trace, report):
        p.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "torchwatch", "run", "--headless", "--duration", str(int(seconds_to_oom * 3)),
        "--trace", str(trace), "--json", str(report), "--",
        sys.executable, "bench/oom_train.py", "--seconds-to-oom", str(seconds_to_oom),
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds_to_oom * 3 + 60)
    (out / "oom_stderr.txt").write_text(proc.stderr[-20000:])
    (out / "oom_stdout.txt").write_text(proc.stdout[-20000:])
    res: dict[str, object] = {"exit": proc.returncode, "wall_s": round(time.monotonic() - t0, 1)}
    try:
        data = json.loads(report.read_text())
    except (OSError, ValueError) as exc:
        res["report"] = f"missing: {exc}"
        return res
    mem = data.get("memory") or {}
    records = mem.get("records") or []
    res["records"] = [{k: r.get(k) for k in ("kind", "at_s", "pid", "how")} for r in records]
    cuda = next((r for r in records if r.get("kind") == "cuda"), None)
    if cuda is None:
        res["record"] = "no CUDA record"
        return res
    res["cuda"] = cuda.get("cuda")
    res["stack_tail"] = (cuda.get("stack") or [])[-3:]
    oom_at = float(cuda["at_s"])
    first = None
    errors = []
    for line in trace.read_text().splitlines():
        rec = json.loads(line)
        left = rec["features"].get("cuda_mem_forecast_s")
        if left is None:
            continue
        t = float(rec["t"])
        first = t if first is None else first
        real = oom_at - t
        if real > 5:
            errors.append((t, left, real, (left - real) / real))
    res["oom_at_s"] = oom_at
    res["forecast_first_at_s"] = first
    res["forecast_lead_s"] = None if first is None else round(oom_at - first, 1)
    if errors:
        rel = [e[3] for e in errors]
        res["forecast_error_median"] = round(statistics.median(rel), 3)
        res["forecast_error_worst"] = round(max(rel, key=abs), 3)
        res["forecast_within_25pct"] = round(sum(abs(r) <= 0.25 for r in rel) / len(rel), 3)
        res["forecast_points"] = [(round(t, 1), round(left, 1), round(real, 1)) for t, left, real, _ in errors[::5]]
    return res


def snapshot_cost(blocks: int) -> dict[str, object]:
    import torch

    from torchwatch.hook.oom import OomWatch

    dev = torch.device("cuda")
    keep = [torch.empty(1 << 20, dtype=torch.uint8, device=dev) for _ in range(blocks)]
    keep += [torch.empty(64 << 20, dtype=torch.uint8, device=dev) for _ in range(200)]
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        snap = torch.cuda.memory._snapshot()
        times.append(time.perf_counter() - t)
    segs = len(snap.get("segments", []))
    w = 4096
    model = torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, w)).to(dev)
    x = torch.randn(8192, w, device=dev)

    def step_s(n: int = 30) -> float:
        ts = []
        for _ in range(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            model(x).sum().backward()
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    plain = [step_s()]
    watch = OomWatch(lambda r: None, lambda: (0, []))
    watch.attach(torch)
    observed = [step_s()]
    plain.append(step_s())
    observed.append(step_s())
    del keep
    return {
        "live_blocks": blocks + 200,
        "segments": segs,
        "snapshot_ms_median": round(1000 * statistics.median(times), 2),
        "snapshot_ms_all": [round(1000 * t, 2) for t in times],
        "step_ms_plain": [round(1000 * t, 3) for t in plain],
        "step_ms_observer_attached": [round(1000 * t, 3) for t in observed],
        "observer_attached": watch.attached and watch.error is None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds-to-oom", type=float, default=150.0)
    ap.add_argument("--blocks", type=int, default=20000)
    ap.add_argument("--skip-run", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {"device": os.popen("nvidia-smi --query-gpu=name --format=csv,noheader").read().strip()}
    if not args.skip_run:
        result["watched"] = watched_run(args.out, args.seconds_to_oom)
    result["snapshot"] = snapshot_cost(args.blocks)
    text = json.dumps(result, indent=1)
    (args.out / "gpu_oom.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

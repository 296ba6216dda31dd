"""Issue 33 on a GPU: demo/gpu_bound.py's FLOPs, FLOP/s and MFU, and a torch.compile recompile on CUDA.

Run in the repository root with the repository installed, on a machine with an NVIDIA GPU (no
network needed); at most about 3 minutes, every subprocess bounded:

    python bench/gpu_compile_mfu.py [--out DIR]

1. In this process: demo/gpu_bound.py's model and step (width 8192, batch 4096, bf16 autocast,
   data on the device), its FLOPs counted by the hook's counter (:class:`torchwatch.hook.flops.
   FlopStep`) beside the hand calculation, the step time (CUDA synchronised, median of 20), the
   counted step's time, and the MFU against the table's dense peak (989.4 TFLOP/s BF16 on an
   H100 / H200 SXM).
2. ``torchwatch run --headless --burst-at 60`` on ``demo/gpu_bound.py --device cuda``: the report's
   ``hook.flops`` (the burst's count over the hook's median step) and the gpu-bound finding's MFU.
3. ``torchwatch run --headless`` on ``tests/scenarios/compile_shapes.py --device cuda``: the status
   line that names the recompile, how long after the shape change, and the hook's compile events.

Prints one JSON object per part on stdout (``--out DIR``: also the reports and logs there).
``--device cpu`` is a dry run of the plumbing on a machine without a GPU (the demo's CPU sizes, no
autocast; the MFU then against the CPU's measured matmul peak).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "demo"))
DEADLINE = time.monotonic() + 175.0


def emit(part: str, result: dict[str, Any]) -> None:
    print(json.dumps({"part": part, **result}, default=str), flush=True)


def hand_flops(batch: int, inputs: int, width: int, layers: int, classes: int) -> float:
    """demo/gpu_bound.py's step by hand: every Linear(i, o) costs 2·B·i·o forward, as much for its
    weight's gradient, and as much again for its input's gradient except the first layer's."""
    dims = [(inputs, width)] + [(width, width)] * layers + [(width, classes)]
    fwd = sum(2 * batch * i * o for i, o in dims)
    return 2 * fwd + sum(2 * batch * i * o for i, o in dims[1:])


def direct(device: str, steps: int = 20) -> dict[str, Any]:
    import gpu_bound
    import torch

    from torchwatch.hook import flops
    from torchwatch.model import peaks

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    width, batch = (gpu_bound.CUDA_WIDTH, gpu_bound.CUDA_BATCH) if cuda else (gpu_bound.CPU_WIDTH, gpu_bound.CPU_BATCH)
    model = gpu_bound.mlp(width).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, gpu_bound.IN_DIM, device=dev)
    y = torch.randint(0, gpu_bound.CLASSES, (batch,), device=dev)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def timed() -> float:
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        return time.perf_counter() - t0

    for _ in range(5):
        step()
    times = sorted(timed() for _ in range(steps))
    step_s = times[len(times) // 2]
    sync()
    t0 = time.monotonic()
    fs, note = flops.FlopStep.start(torch, t0)
    step()
    sync()
    out = fs.stop(time.monotonic()) if fs is not None else {"flops_note": note}
    hand = hand_flops(batch, gpu_bound.IN_DIM, width, gpu_bound.LAYERS, gpu_bound.CLASSES)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    peak = peaks.device_peak(name, peaks.math_dtype(out.get("flops_dtype"), None))
    counted = out.get("flops_per_step")
    achieved = (counted or hand) / step_s
    return {
        "torch": torch.__version__,
        "device": name,
        "hand_flops_per_step": hand,
        "counted": out,
        "counted_over_hand": None if not counted else round(counted / hand, 4),
        "step_ms_median": round(step_s * 1000, 3),
        "counted_step_over_plain": round(out.get("flop_step_ms", 0) / (step_s * 1000), 3),
        "achieved_tflops": round(achieved / 1e12, 1),
        "table_peak": None
        if peak is None
        else {
            "tflops": peak.flops_per_s / 1e12,
            "device": peak.device,
            "math": peak.math,
            "source": peak.source,
        },
        "mfu_vs_table": None if peak is None else round(achieved / peak.flops_per_s, 4),
        "mfu_vs_989_4": round(achieved / 989.4e12, 4),
        "hand_mfu_vs_989_4": round(hand / step_s / 989.4e12, 4),
    }


def watch(
    args: list[str], stop_when: str | None, limit_s: float, out: Path
) -> tuple[list[tuple[float, str]], dict[str, Any] | None]:
    """``torchwatch run --headless --json OUT ARGS``: its lines (wall time read, text) until a status
    line holds ``stop_when`` (then 2 s more) or ``limit_s``; SIGINT, then SIGKILL if it lingers."""
    limit_s = max(5.0, min(limit_s, DEADLINE - time.monotonic() - 20.0))
    cmd = [sys.executable, "-m", "torchwatch", "run", "--headless", "--json", str(out), *args]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    lines: queue.Queue[tuple[float, str]] = queue.Queue()
    threading.Thread(target=lambda: [lines.put((time.time(), ln.rstrip())) for ln in proc.stdout or []],
                     daemon=True).start()  # fmt: skip
    got: list[tuple[float, str]] = []
    seen_at = None
    end = time.monotonic() + limit_s
    try:
        while time.monotonic() < end and proc.poll() is None:
            if seen_at is not None and time.monotonic() - seen_at > 2.0:
                break
            try:
                t, line = lines.get(timeout=0.5)
            except queue.Empty:
                continue
            got.append((t, line))
            if stop_when and seen_at is None and line.startswith("torchwatch [") and stop_when in line:
                seen_at = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(25)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    time.sleep(0.2)
    while not lines.empty():
        got.append(lines.get())
    report = json.loads(out.read_text()) if out.exists() else None
    return got, report


def under_torchwatch(outdir: Path, device: str) -> dict[str, Any]:
    cmd = ["--burst-at", "60", "--", sys.executable, "demo/gpu_bound.py", "--device", device, "--seconds", "80"]
    lines, rep = watch(cmd, None, 40.0, outdir / "gpu_bound.json")
    (outdir / "gpu_bound.log").write_text("\n".join(line for _, line in lines))
    if rep is None:
        return {"error": "no report", "tail": [line for _, line in lines[-20:]]}
    hook = rep.get("hook") or {}
    burst = hook.get("last_burst") or {}
    sat = next((f for f in rep["findings"] if f["rule"] == "gpu-saturated"), None)
    return {
        "verdict": rep["verdict"]["label"],
        "flops": hook.get("flops"),
        "burst_flop_fields": {k: v for k, v in burst.items() if "flop" in k or k in ("device_name", "error", "steps")},
        "burst_measured_step_ms": burst.get("measured_step_ms"),
        "step_time_ms": hook.get("step_time_ms"),
        "features": {
            k: rep["features"].get(k)
            for k in ("mfu", "achieved_tflop_per_s", "peak_tflop_per_s", "burst_flops_per_step", "gpu_util_mean")
        },
        "gpu_saturated_evidence_mfu": None if sat is None else sat["evidence"].get("mfu"),
        "gpu_saturated_fixes": None if sat is None else [fx["title"] for fx in sat["fixes"]],
        "status_tail": [line for _, line in lines if line.startswith("torchwatch [")][-3:],
    }


def recompile_on_cuda(outdir: Path, device: str) -> dict[str, Any]:
    cmd = ["--", sys.executable, "tests/scenarios/compile_shapes.py", "--device", device, "--seconds", "150",
           "--change-after", "1.5"]  # fmt: skip
    lines, rep = watch(
        cmd, "compile-recompiles", DEADLINE - time.monotonic() - 15.0, outdir / "compile_shapes_cuda.json"
    )
    (outdir / "compile_shapes_cuda.log").write_text("\n".join(line for _, line in lines))
    event = next((float(m.group(1)) for _, ln in lines if (m := re.search(r"event: .* at wall ([0-9.]+)", ln))), None)
    named = next(((t, ln) for t, ln in lines if ln.startswith("torchwatch [") and "compile-recompiles" in ln), None)
    compile_info = ((rep or {}).get("hook") or {}).get("compile")
    return {
        "event_wall": event,
        "named_line": None if named is None else named[1],
        "named_after_s": None if named is None or event is None else round(named[0] - event, 1),
        "compile": compile_info,
        "tail": [line for _, line in lines[-12:]] if named is None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="folder for the reports and logs (default: a temp folder)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a dry run (default cuda)")
    args = parser.parse_args()
    outdir = Path(args.out or f"/tmp/gpu_compile_mfu.{os.getpid()}")
    outdir.mkdir(parents=True, exist_ok=True)
    dev = args.device
    parts = (
        ("direct", lambda: direct(dev)),
        ("gpu_bound under torchwatch", lambda: under_torchwatch(outdir, dev)),
        (f"recompile on {dev}", lambda: recompile_on_cuda(outdir, dev)),
    )
    for part, fn in parts:
        if DEADLINE - time.monotonic() < 25:
            emit(part, {"skipped": "out of time"})
            continue
        t0 = time.monotonic()
        try:
            result = fn()
        except Exception as exc:  # the next part still runs
            result = {"error": repr(exc)}
        emit(part, {"seconds": round(time.monotonic() - t0, 1), **result})


if __name__ == "__main__":
    main()

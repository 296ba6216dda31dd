"""Live trials against separate runs: does ``torchwatch trial`` measure what two runs measure?

For each scenario (truth by a separate-run A/B):

- ``oversub``: 8 intra-op threads on this machine's CPUs; the trial tries ``threads=2``;
- ``workers``: ``num_workers=0`` with samples that cost 1 ms of CPU each; the trial tries
  ``num_workers=2`` (a DataLoader setting: blocks are epochs);
- ``decoy``: ``cudnn_benchmark=1`` on a CPU training (cuDNN is never called: nothing to gain);
- ``decoy-gc``: ``gc_threshold=5000`` on a training that makes little Python garbage.

The separate-run A/B runs the training without and with the setting, ``--pairs`` times in the
order A B B A A B ... (each run ``--seconds`` s of loop, torch's import not counted, the hook in
both as under ``torchwatch run``), and takes the median of the pairs' rate ratios, with their
range. The trial runs on one more training started with the A setting, after 5 s of warm-up.
Prints one line per scenario, then the verdict on the acceptance (trial within ±15 % of the
separate runs; the decoys read "no difference"; decided within 60 s of training).

    python bench/trial.py [--pairs 3] [--seconds 12] [--only oversub,workers]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "tests" / "scenarios" / "trial_train.py"
BOOT = REPO / "torchwatch" / "hook" / "boot"
STEADY = re.compile(r"trial_train: steady ([0-9.]+) steps/s")
RATE = re.compile(r"trial_train: done, (\d+) steps in ([0-9.]+) s, ([0-9.]+) steps/s")

# TRIAL_DEVICE=cpu TRIAL_IMAGE=3,32,32: a dry run of the GPU scenarios' plumbing on a machine without one
GPU = ["--device", os.environ.get("TRIAL_DEVICE", "cuda"), "--image", os.environ.get("TRIAL_IMAGE", "3,224,224"),
       "--workers", "4", "--batch", "64", "--batches", "100"]  # fmt: skip
GPU_SCENARIOS = {
    # pageable batches against pinned ones (copied with non_blocking=True); a DataLoader setting
    "pin": (GPU, [*GPU, "--pin-memory", "1"], "pin_memory=1", "any"),
    # cuDNN's default algorithms against its benchmarked ones, for a few convolutions
    "cudnn": ([*GPU, "--pin-memory", "1"], [*GPU, "--pin-memory", "1", "--cudnn-benchmark", "1"],
              "cudnn_benchmark=1", "any"),
}  # fmt: skip
SCENARIOS = {
    "oversub": (["--threads", "8"], ["--threads", "2"], "threads=2", "faster"),
    "workers": (
        ["--workers", "0", "--sample-ms", "1"],
        ["--workers", "2", "--sample-ms", "1"],
        "num_workers=2",
        "faster",
    ),
    "decoy": (["--threads", "2"], ["--threads", "2"], "cudnn_benchmark=1", "no difference"),
    "decoy-gc": (["--threads", "2"], ["--threads", "2"], "gc_threshold=5000", "no difference"),
}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(BOOT)
    env["TORCHWATCH_HOOK"] = "1"
    env["TORCHWATCH_HOOK_PATH"] = str(REPO)
    return env


def _rate(args: list[str], seconds: float) -> float:
    out = subprocess.run(
        [sys.executable, str(TRAIN), *args, "--seconds", str(seconds)],
        env=_env(), capture_output=True, text=True, timeout=seconds + 120, check=True,
    )  # fmt: skip
    m = RATE.search(out.stdout)
    if m is None:
        raise RuntimeError(f"no final line: {out.stdout[-300:]} {out.stderr[-300:]}")
    steady = STEADY.search(out.stdout)
    # the steady rate (after the first third of the run: cuDNN's autotuning, workers' first start)
    return float(steady.group(1)) if steady else float(m.group(3))


def separate(a: list[str], b: list[str], pairs: int, seconds: float) -> list[float]:
    """Rate(B) / rate(A) for each pair, runs in the order A B B A A B ..."""
    ratios = []
    for i in range(pairs):
        if i % 2 == 0:
            ra, rb = _rate(a, seconds), _rate(b, seconds)
        else:
            rb, ra = _rate(b, seconds), _rate(a, seconds)
        ratios.append(rb / ra)
    return ratios


def trial(a: list[str], setting: str, tmp: Path, max_s: float = 60.0) -> dict[str, object]:
    """Start the A training, wait 5 s of steps, run the trial; its JSON and timings."""
    proc = subprocess.Popen(
        [sys.executable, str(TRAIN), *a, "--seconds", "150"], env=_env(),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "trial_train: pid N threads T": torch imported, the hook active
        time.sleep(5.0)
        out = tmp / f"trial-{time.monotonic_ns()}.json"
        t0 = time.monotonic()
        run = subprocess.run(
            [sys.executable, "-m", "torchwatch", "trial", str(proc.pid), setting, "--json", str(out), "--max-s",
             str(max_s)],
            capture_output=True, text=True, timeout=150,
        )  # fmt: skip
        took = time.monotonic() - t0
        if not out.exists():
            raise RuntimeError(f"trial gave no JSON (exit {run.returncode}): {run.stderr[-400:]}")
        data = json.loads(out.read_text())
        data["took_s"] = took
        return data
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--only", default="")
    p.add_argument("--gpu", action="store_true", help="the GPU scenarios (pin, cudnn): a CUDA device")
    p.add_argument("--max-s", type=float, default=60.0, help="the trial's --max-s")
    args = p.parse_args()
    table = GPU_SCENARIOS if args.gpu else SCENARIOS
    args.only = args.only or ",".join(table)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start")
    ok_all = True
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            a, b, setting, truth = table[name]
            ratios = separate(a, b, args.pairs, args.seconds)
            sep = statistics.median(ratios)
            t = trial(a, setting, Path(tmp), args.max_s)
            v = t["verdict"] or {}
            speedup = v.get("speedup")
            st = t["ranks"][0]["trial"] or {}
            blocks = st.get("blocks", [])
            trained = sum((bl["steps"] + bl["dropped"]) * bl["mean_s"] for bl in blocks)
            within = speedup is not None and abs(speedup / sep - 1) <= 0.15
            if truth == "no difference":
                good = v.get("result") == "no difference"
            elif truth == "any":  # the truth is whatever the separate runs say
                good = within or (v.get("result") == "no difference" and abs(sep - 1) <= 0.05)
            else:
                good = within and v.get("result") == truth
            ok_all &= good and t["took_s"] <= 75
            sp = "-" if speedup is None else f"{speedup:.3f} [{v['lo']:.3f}-{v['hi']:.3f}]"
            print(
                f"{name:9s} separate runs {sep:.3f} (pairs {', '.join(f'{r:.3f}' for r in ratios)}) | trial {sp} "
                f"-> {v.get('result')!r}, {len(blocks)} blocks, {trained:.0f} s of training, "
                f"{t['took_s']:.0f} s wall | "
                f"trial/separate {'-' if speedup is None else f'{speedup / sep:.3f}'} | {'OK' if good else 'MISS'}",
                flush=True,
            )
    print(f"machine: load average {os.getloadavg()[0]:.2f} at the end")
    print("acceptance:", "met" if ok_all else "NOT met")


if __name__ == "__main__":
    main()

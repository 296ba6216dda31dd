"""How right the progress torchwatch shows is: the time left in the epoch, the time left on the
training's tqdm bar of epochs, and the loss, against what the training itself did (not a test).

Each run is ``torchwatch run --headless -- python bench/_progress_train.py ...`` (an MNIST-shaped
conv net on a DataLoader; ``--tqdm``: its epochs and batches through tqdm bars; ``--uneven``: every
10th step three forward passes longer), with ``--trace``: every analysis (one a second) with its
features. The training's own line per step (stderr) and the trace's new lines are read as they come,
each stamped when it arrives, so both are on this script's clock. For every analysis:

- **epoch ETA**: features ``epoch``, ``epoch_batch``, ``epoch_len``, ``epoch_eta_s`` once
  ``epoch_batch/epoch_len`` >= 20 % (the issue's bar): the predicted end ``arrival + eta`` against
  the arrival of the training's line for the epoch's last batch; the error is
  ``(predicted - actual) / (actual - arrival)``, a share of the time that was left (``of the
  epoch``: the same error over the whole epoch's duration, which does not grow as the end nears);
- **bar ETA**: ``bar_share``, ``bar_eta_s`` (the tqdm bar of epochs) once 20 % of it is done,
  against the arrival of the training's last step;
- **loss**: ``loss`` at ``loss_step`` against the loss the training printed at that step.

Prints, per variant and over all runs: the analyses scored, the median and p90 of |error| and the
share within +-15 %; and the machine's load average before and after, since on 2 shared cores the
step rate moves with what else runs.

    python bench/progress.py --runs 2
    python bench/progress.py --variants hf,lightning --python /path/to/venv-with-them/bin/python

``hf``: an HF ``Trainer`` (``_progress_hf.py``; its tqdm bar counts the run's steps, so the bar's
ETA is the run's); ``lightning``: a ``LightningModule`` (``_progress_lightning.py``; Lightning draws
its bar with rich where rich is installed, which the hook does not read: the epoch's ETA only).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "bench" / "_progress_train.py"
STEP = re.compile(r"progress_train: epoch (\d+) batch (\d+) step (\d+)(?: loss (\S+))?")
VARIANTS = {"plain": [], "tqdm": ["--tqdm"], "uneven+tqdm": ["--tqdm", "--uneven"], "hf": [], "lightning": []}
SCRIPTS = {"hf": REPO / "bench" / "_progress_hf.py", "lightning": REPO / "bench" / "_progress_lightning.py"}
"""The trainers' variants: an interpreter with ``transformers`` (and ``accelerate``) or ``lightning``
installed (``--python``); the others run ``_progress_train.py``."""


def one_run(name: str, epochs: int, batches: int, python: str) -> dict[str, list[float]]:
    """One watched training; the errors of every analysis scored (shares, signed)."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        cmd = [sys.executable, "-m", "torchwatch", "run", "--headless", "--trace", str(trace), "--"]
        script = SCRIPTS.get(name, TRAIN)
        cmd += [python, str(script), "--epochs", str(epochs), "--batches", str(batches), *VARIANTS[name]]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        steps: dict[tuple[int, int], float] = {}
        losses: dict[int, float] = {}
        ticks: list[tuple[float, dict[str, Any]]] = []
        seen = 0
        with subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
        ) as p:
            assert p.stderr is not None
            try:
                for line in p.stderr:
                    now = time.monotonic()
                    m = STEP.search(line)
                    if m:
                        steps[(int(m.group(1)), int(m.group(2)))] = now
                        if m.group(4) is not None:
                            losses[int(m.group(3))] = float(m.group(4))
                    if trace.exists():  # the analyses written since: stamped now (1 a second; steps every ~30 ms)
                        with trace.open() as f:
                            f.seek(seen)
                            text = f.read()
                        whole = text[: text.rfind("\n") + 1]
                        seen += len(whole.encode())
                        ticks += [(now, json.loads(x)["features"]) for x in whole.splitlines() if x]
            finally:
                if p.poll() is None:
                    p.kill()
    last = max(steps.values()) if steps else math.nan
    out: dict[str, list[float]] = {"epoch": [], "epoch_len": [], "bar": [], "loss": []}
    for at, f in ticks:
        epoch, batch, length, left = f.get("epoch"), f.get("epoch_batch"), f.get("epoch_len"), f.get("epoch_eta_s")
        if None not in (epoch, batch, length, left) and batch / length >= 0.2:
            end = steps.get((int(epoch), int(length)))
            start = steps.get((int(epoch), 1))
            if end is not None and end - at > 1.0:
                out["epoch"].append((at + left - end) / (end - at))
                if start is not None:
                    out["epoch_len"].append((at + left - end) / (end - start))
        share, left = f.get("bar_share"), f.get("bar_eta_s")
        if share is not None and left is not None and share >= 0.2 and last - at > 1.0:
            out["bar"].append((at + left - last) / (last - at))
        loss, step = f.get("loss"), f.get("loss_step")
        if loss is not None and step is not None and int(step) in losses and losses[int(step)]:
            out["loss"].append((loss - losses[int(step)]) / losses[int(step)])
    return out


def summary(errors: list[float]) -> str:
    """Count, median |error|, p90, max, the share within +-15 % and the median signed error (bias)."""
    if not errors:
        return "none scored"
    a = sorted(abs(x) for x in errors)
    p90 = a[min(len(a) - 1, math.ceil(0.9 * len(a)) - 1)]
    within = sum(x <= 0.15 for x in a) / len(a)
    return (
        f"{len(a):3d}, median |error| {statistics.median(a):6.1%}, p90 {p90:6.1%}, "
        f"max {a[-1]:6.1%}, within +-15 %: {within:6.1%}, bias {statistics.median(errors):+6.1%}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="runs per variant (interleaved)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batches", type=int, default=300, help="batches an epoch")
    ap.add_argument("--variants", default="plain,tqdm,uneven+tqdm", help=f"of {','.join(VARIANTS)}")
    ap.add_argument("--python", default=sys.executable, help="the training's interpreter (hf, lightning: theirs)")
    args = ap.parse_args()
    names = args.variants.split(",")
    load0 = os.getloadavg()
    got: dict[str, dict[str, list[float]]] = {n: {"epoch": [], "epoch_len": [], "bar": [], "loss": []} for n in names}
    for r in range(args.runs):
        for name in names:
            res = one_run(name, args.epochs, args.batches, args.python)
            for k, v in res.items():
                got[name][k] += v
            print(f"run {r + 1} {name}: " + ", ".join(f"{k} {len(v)}" for k, v in res.items()), flush=True)
    load1 = os.getloadavg()
    print(f"\nload average (1 min) before {load0[0]:.1f}, after {load1[0]:.1f}; {args.runs} run(s) per variant")
    kinds = (
        ("epoch", "epoch ETA"),
        ("epoch_len", "  of the epoch"),
        ("bar", 'tqdm "Epochs" ETA'),
        ("loss", "loss vs printed"),
    )
    for kind, what in kinds:
        every: list[float] = []
        for name in names:
            if got[name][kind]:
                print(f"{what:18s} {name:12s} {summary(got[name][kind])}")
            every += got[name][kind]
        print(f"{what:18s} {'all':12s} {summary(every)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
- **loss**: ``loss`` at ``loss_step`` against the loss the training printed at that step, both to
  the trace's 4 decimals (an error of 0: the same reading).

With ``--attach`` the training starts alone and ``torchwatch attach PID`` joins it after 300 steps
(the hook injected into the running process); the hook counts epochs and steps from then on, so the
scoring first finds the epoch and step offsets that map its counts onto the script's lines (printed
per run). The epoch ETA is also shown for the script's first epoch and for the later ones apart (a
training's first epoch may change pace on its own: the HF Trainer's first runs its first half ~1.8x
faster than its second, alone as under watch). ``script's own``: the same estimate (the batch rate
of the last 30 s) made from the script's own lines at the same moments: where it misses as much,
the training's pace changed, and no reading of it could have known.

Prints, per variant and over all runs: the analyses scored, the median and p90 of |error| and the
share within +-15 %; and the machine's load average before and after, since on 2 shared cores the
step rate moves with what else runs.

    python bench/progress.py --runs 2
    python bench/progress.py --variants hf,lightning --python /path/to/venv-with-them/bin/python
    python bench/progress.py --attach --epochs 3 --batches 1000

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
KINDS = ("epoch", "epoch1", "later", "own", "epoch_len", "bar", "loss")
OWN_RATE_S = 30.0  # own_eta: the window of torchwatch's epoch rate (analysis/progress.py RATE_S)
ATTACH_AFTER_STEPS = 300  # attach: torchwatch joins once the training has taken this many steps
SCRIPTS = {"hf": REPO / "bench" / "_progress_hf.py", "lightning": REPO / "bench" / "_progress_lightning.py"}
"""The trainers' variants: an interpreter with ``transformers`` (and ``accelerate``) or ``lightning``
installed (``--python``); the others run ``_progress_train.py``."""


def one_run(name: str, epochs: int, batches: int, python: str, attach: bool = False) -> dict[str, list[float]]:
    """One watched training; the errors of every analysis scored (shares, signed).

    ``attach``: the training starts alone and ``torchwatch attach PID`` joins it once it has taken
    :data:`ATTACH_AFTER_STEPS` steps (the hook is injected). The hook then counts epochs and steps
    from its install (the epoch running then is not counted, the next is 1): the scoring finds the
    epoch and step offsets that match the script's own lines (printed as ``offsets``)."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        script = SCRIPTS.get(name, TRAIN)
        training = [python, str(script), "--epochs", str(epochs), "--batches", str(batches), *VARIANTS[name]]
        watch = [sys.executable, "-m", "torchwatch", "run" if not attach else "attach", "--headless"]
        watch += ["--trace", str(trace)]
        cmd = training if attach else [*watch, "--", *training]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        steps: dict[tuple[int, int], float] = {}
        losses: dict[int, float] = {}
        ticks: list[tuple[float, dict[str, Any]]] = []
        seen = 0
        watcher: subprocess.Popen[bytes] | None = None
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
                        if attach and watcher is None and int(m.group(3)) >= ATTACH_AFTER_STEPS:
                            watcher = subprocess.Popen(
                                [*watch, str(p.pid)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                            )
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
                if watcher is not None:
                    try:
                        watcher.wait(timeout=60)  # the target exited: attach ends and writes its report
                    except subprocess.TimeoutExpired:
                        watcher.kill()
                        watcher.wait()
    epoch_off, step_off = offsets(steps, losses, ticks) if attach else (0, 0)
    if attach:
        print(f"  attach: epoch offset {epoch_off} (epochs before the hook's first), step offset {step_off}")
    return score(steps, losses, ticks, epoch_off, step_off)


def offsets(
    steps: dict[tuple[int, int], float], losses: dict[int, float], ticks: list[tuple[float, dict[str, Any]]]
) -> tuple[int, int]:
    """The epoch and step offsets that map the hook's counts (from its install) onto the script's:
    the epoch offset under which most analyses' ``(epoch, epoch_batch)`` had been printed in the
    5 s before the analysis arrived, and the step offset under which most ``(loss_step, loss)`` equal a
    printed ``(step, loss)``."""
    epochs = max((e for e, _b in steps), default=0)
    best_e, hits_e = 0, -1
    for off in range(epochs + 1):
        hits = 0
        for at, f in ticks:
            e, b = f.get("epoch"), f.get("epoch_batch")
            if e is not None and b is not None:
                printed = steps.get((int(e) + off, int(b)))
                hits += printed is not None and at - 5.0 <= printed <= at  # the record: <= 2 s old, read 1/s
        if hits > hits_e:
            best_e, hits_e = off, hits
    votes: dict[int, int] = {}
    by_value: dict[float, list[int]] = {}
    for step, value in losses.items():  # the trace keeps 4 decimals
        by_value.setdefault(round(value, 4), []).append(step)
    for _at, f in ticks:
        loss, step = f.get("loss"), f.get("loss_step")
        if loss is not None and step is not None:
            for s in by_value.get(loss, []):
                votes[s - int(step)] = votes.get(s - int(step), 0) + 1
    return best_e, max(votes, key=lambda k: votes[k]) if votes else 0


def own_eta(steps: dict[tuple[int, int], float], epoch: int, length: int, at: float) -> float | None:
    """The same estimate from the script's own lines: the batches it printed in the
    :data:`OWN_RATE_S` before ``at`` over their span, and the batches left after its last line;
    ``None`` under 2 lines or 2 s of them. An error that this shares is the training's pace
    changing, not torchwatch's reading of it."""
    mine = sorted((t, b) for (e, b), t in steps.items() if e == epoch and at - OWN_RATE_S <= t <= at)
    if len(mine) < 2 or mine[-1][0] - mine[0][0] < 2.0:
        return None
    rate = (mine[-1][1] - mine[0][1]) / (mine[-1][0] - mine[0][0])
    return (length - mine[-1][1]) / rate if rate > 0 else None


def score(
    steps: dict[tuple[int, int], float],
    losses: dict[int, float],
    ticks: list[tuple[float, dict[str, Any]]],
    epoch_off: int = 0,
    step_off: int = 0,
) -> dict[str, list[float]]:
    """The signed errors of every analysis (module docstring), the hook's epochs and steps shifted
    by the offsets: ``epoch`` (all epochs), ``epoch1`` / ``later`` (the script's first epoch / the
    others), ``epoch_len``, ``bar``, ``loss`` (a loss at a step the script did not print counts as
    a miss: error 1)."""
    last = max(steps.values()) if steps else math.nan
    out: dict[str, list[float]] = {k: [] for k in KINDS}
    for at, f in ticks:
        epoch, batch, length, left = f.get("epoch"), f.get("epoch_batch"), f.get("epoch_len"), f.get("epoch_eta_s")
        if None not in (epoch, batch, length, left) and batch / length >= 0.2:
            script_epoch = int(epoch) + epoch_off
            end = steps.get((script_epoch, int(length)))
            start = steps.get((script_epoch, 1))
            if end is not None and end - at > 1.0:
                err = (at + left - end) / (end - at)
                out["epoch"].append(err)
                out["epoch1" if script_epoch == 1 else "later"].append(err)
                own = own_eta(steps, script_epoch, int(length), at)
                if own is not None:
                    out["own"].append((at + own - end) / (end - at))
                if start is not None:
                    out["epoch_len"].append((at + left - end) / (end - start))
        share, left = f.get("bar_share"), f.get("bar_eta_s")
        if share is not None and left is not None and share >= 0.2 and last - at > 1.0:
            out["bar"].append((at + left - last) / (last - at))
        loss, step = f.get("loss"), f.get("loss_step")
        if loss is not None and step is not None and losses:
            printed = losses.get(int(step) + step_off)
            if printed is None or not round(printed, 4):
                out["loss"].append(1.0)
            else:  # the trace keeps 4 decimals: 0 where the loss read is the one printed at its step
                out["loss"].append((loss - round(printed, 4)) / round(printed, 4))
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
    ap.add_argument("--attach", action="store_true", help="attach to the running training instead of run")
    args = ap.parse_args()
    names = args.variants.split(",")
    load0 = os.getloadavg()
    got: dict[str, dict[str, list[float]]] = {n: {k: [] for k in KINDS} for n in names}
    for r in range(args.runs):
        for name in names:
            res = one_run(name, args.epochs, args.batches, args.python, args.attach)
            for k, v in res.items():
                got[name][k] += v
            print(f"run {r + 1} {name}: " + ", ".join(f"{k} {len(v)}" for k, v in res.items()), flush=True)
    load1 = os.getloadavg()
    how = "attach" if args.attach else "run"
    print(f"\nload average (1 min) before {load0[0]:.1f}, after {load1[0]:.1f}; {args.runs} run(s) per variant, {how}")
    kinds = (
        ("epoch", "epoch ETA"),
        ("epoch1", "  first epoch"),
        ("later", "  later epochs"),
        ("own", "  script's own"),
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

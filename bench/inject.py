"""The pause that injecting code causes a running training (``torchwatch.inject``).

Starts ``demo/cpu_bound.py`` with plain Python (no torchwatch; ``bench/_stepclock.py`` only
records each optimizer step's end time), lets it warm up, records a baseline, then makes N
windows in each mode (``none``: 40 ms windows without injecting, the control; ``thread``:
the probe payload injected, the injected call starting a thread; ``main``: the payload run
on the held main thread) and prints, per mode:

- the step time (median gap between steps in the baseline) and the baseline's longest gap;
- the median and longest gap of the steps that overlap an injection (target: ≤ 100 ms);
- the injection's wall time in torchwatch (median, max), the longest ptrace stop of the
  main thread, and the stops needed to find a safe moment.

One :class:`~torchwatch.inject.injector.Injector` serves all injections, started before the
baseline, as ``attach`` would use it.

    python bench/inject.py [--injections 20] [--gap 0.5] [--json PATH]
"""

from __future__ import annotations

import argparse
import array
import itertools
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

from torchwatch.inject.injector import Injector, Outcome, Payload  # noqa: E402

WARMUP_S = 12.0  # imports, dataset and the first steps of cpu_bound on a 2-core machine
BASELINE_S = 6.0
# Windows of this length with no injection: the steps overlapping a window are longer than a
# typical step by selection alone (a longer step is more likely to overlap), so the injections
# are compared with the same selection made without injecting.
CONTROL_S = 0.04


def _gaps(stamps: list[float], windows: list[tuple[float, float]]) -> list[float]:
    """Gaps between consecutive steps whose interval overlaps one of ``windows``."""
    out = []
    for a, b in itertools.pairwise(stamps):
        if any(a < end and b > start for start, end in windows):
            out.append(b - a)
    return out


def _phase(
    injector: Injector | None, n: int, gap: float, pid: int, what: Payload
) -> tuple[list[tuple[float, float]], list[Outcome]]:
    """``n`` injections ``gap`` s apart; without an injector, windows of CONTROL_S s with none."""
    windows, outcomes = [], []
    for _ in range(n):
        t0 = time.monotonic()
        if injector is None:
            time.sleep(CONTROL_S)
            outcome = Outcome(True, "", wall_s=CONTROL_S)
        else:
            outcome = injector.inject(pid, what)
        windows.append((t0, time.monotonic()))
        outcomes.append(outcome)
        if not outcome.ok:
            print(f"  injection failed: {outcome.reason}", file=sys.stderr)
        time.sleep(gap)
    return windows, outcomes


def main() -> int:
    """Run the benchmark and print its table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--injections", type=int, default=20, help="injections per mode (default 20)")
    ap.add_argument("--gap", type=float, default=0.5, help="seconds between injections (default 0.5)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = ap.parse_args()
    per_mode = args.injections * (args.gap + 0.3)
    seconds = WARMUP_S + BASELINE_S + 3 * per_mode + 10
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "steps.f64"
        cmd = [sys.executable, str(REPO / "bench/_stepclock.py"), str(out), str(REPO / "demo/cpu_bound.py")]
        log = open(Path(tmp) / "train.log", "wb")  # noqa: SIM115 - closed below
        train = subprocess.Popen([*cmd, "--seconds", f"{seconds:.0f}"], stderr=log)
        injector = Injector()
        try:
            injector.warm_up()  # as attach would: the helper starts before any training is held
            time.sleep(WARMUP_S)
            if train.poll() is not None:
                print(f"the training exited early (status {train.returncode}): {' '.join(cmd)}", file=sys.stderr)
                return 1
            base = (time.monotonic(), time.monotonic() + BASELINE_S)
            time.sleep(BASELINE_S)
            modes = {
                "none": _phase(None, args.injections, args.gap, train.pid, Payload()),
                "thread": _phase(injector, args.injections, args.gap, train.pid, Payload(thread=True)),
                "main": _phase(injector, args.injections, args.gap, train.pid, Payload(thread=False)),
            }
            train.send_signal(2)
            train.wait(60)
        finally:
            injector.close()
            if train.poll() is None:
                train.kill()
        log.close()
        if not out.exists():
            tail = (Path(tmp) / "train.log").read_text(errors="replace")[-3000:]
            print(f"the training died (status {train.returncode}); its stderr ends:\n{tail}", file=sys.stderr)
            return 1
        stamps = list(array.array("d", out.read_bytes()))
    base_gaps = [b - a for a, b in itertools.pairwise(stamps) if base[0] <= a and b <= base[1]]
    step = statistics.median(base_gaps)
    figures: dict[str, Any] = {
        "python": sys.version.split()[0],
        "step_ms": step * 1e3,
        "baseline_max_gap_ms": max(base_gaps) * 1e3,
        "baseline_steps": len(base_gaps),
    }
    print(
        f"cpu_bound step time {step * 1e3:.1f} ms (median of {len(base_gaps)} baseline steps, "
        f"longest {max(base_gaps) * 1e3:.1f} ms)"
    )
    for mode, (windows, outcomes) in modes.items():
        gaps = _gaps(stamps, windows)
        ok = [o for o in outcomes if o.ok]
        walls = [o.wall_s for o in ok]
        held = [o.held_s for o in ok if o.held_s is not None]
        tries = [o.tries for o in ok if o.tries is not None]
        row = {
            "injections": len(outcomes),
            "ok": len(ok),
            "gap_median_ms": statistics.median(gaps) * 1e3 if gaps else None,
            "gap_max_ms": max(gaps) * 1e3 if gaps else None,
            "wall_median_ms": statistics.median(walls) * 1e3 if walls else None,
            "wall_max_ms": max(walls) * 1e3 if walls else None,
            "held_max_ms": max(held) * 1e3 if held else None,
            "tries_median": statistics.median(tries) if tries else None,
            "tries_max": max(tries) if tries else None,
        }
        figures[mode] = row
        held_text = "n/a" if row["held_max_ms"] is None else f"<= {row['held_max_ms']:.1f} ms"
        print(
            f"{mode:6s}: {len(ok)}/{len(outcomes)} ok; steps overlapping a window: gap median "
            f"{row['gap_median_ms']:.1f} ms, max {row['gap_max_ms']:.1f} ms; "
            f"window wall median {row['wall_median_ms']:.0f} ms, max {row['wall_max_ms']:.0f} ms; "
            f"main thread held {held_text}; stops to find a safe moment: "
            f"median {row['tries_median']}, max {row['tries_max']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0 if all(figures[m]["ok"] == args.injections for m in modes if m != "none") else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

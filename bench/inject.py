"""The pause that injecting code causes a running training (``torchwatch.inject``).

Starts ``demo/cpu_bound.py`` with plain Python (no torchwatch; ``bench/_stepclock.py`` only
records each optimizer step's end time), lets it warm up, records a baseline, then makes N
windows in each mode (``none``: 40 ms windows without injecting, the control; ``thread``:
the probe payload injected, the injected call starting a thread; ``main``: the payload run
on the held main thread; ``install``: the full live install as ``attach`` makes it, the
imports in a thread of the training then :func:`torchwatch.hook.live.install` on the held
main thread, the window covering both; ``detach``: :func:`torchwatch.hook.live.detach`, made
``--gap`` s after each install) and prints, per mode:

- the step time (median gap between steps in the baseline) and the baseline's longest gap;
- the median and longest gap of the steps that overlap an injection (target: ≤ 100 ms);
- the injection's wall time in torchwatch (median, max), the longest ptrace stop of the
  main thread, and the stops needed to find a safe moment.

One :class:`~torchwatch.inject.injector.Injector` serves all injections, started before the
baseline, as ``attach`` would use it.

The first install into the process (the one ``attach`` makes; later ones find the modules
imported) is also printed on its own.

    python bench/inject.py [--injections 20] [--gap 0.5] [--modes none,thread,main,install,detach] [--json PATH]
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

from torchwatch.cli.injecting import DETACH, INSTALL, PREPARE  # noqa: E402
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


def _live_phase(
    injector: Injector, n: int, gap: float, pid: int
) -> tuple[tuple[list[tuple[float, float]], list[Outcome]], tuple[list[tuple[float, float]], list[Outcome]]]:
    """``n`` live installs (prepare + install, one window) each followed, ``gap`` s later, by a detach."""
    installs: tuple[list[tuple[float, float]], list[Outcome]] = ([], [])
    detaches: tuple[list[tuple[float, float]], list[Outcome]] = ([], [])
    for _ in range(n):
        t0 = time.monotonic()
        outcome = injector.inject(pid, PREPARE)
        if outcome.ok:
            outcome = injector.inject(pid, INSTALL)
            if outcome.ok and not (isinstance(outcome.value, dict) and outcome.value.get("installed")):
                outcome = Outcome(False, f"not installed: {outcome.value}", outcome.method, held_s=outcome.held_s)
        installs[0].append((t0, time.monotonic()))
        installs[1].append(outcome)
        time.sleep(gap)
        t0 = time.monotonic()
        gone = injector.inject(pid, DETACH, into_hooked=True)
        if gone.ok and not (isinstance(gone.value, dict) and gone.value.get("detached")):
            gone = Outcome(False, f"not detached: {gone.value}", gone.method, held_s=gone.held_s)
        detaches[0].append((t0, time.monotonic()))
        detaches[1].append(gone)
        for o in (outcome, gone):
            if not o.ok:
                print(f"  injection failed: {o.reason}", file=sys.stderr)
        time.sleep(gap)
    return installs, detaches


def main() -> int:
    """Run the benchmark and print its table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--injections", type=int, default=20, help="injections per mode (default 20)")
    ap.add_argument("--gap", type=float, default=0.5, help="seconds between injections (default 0.5)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument("--modes", default="none,thread,main,install,detach", help="which modes to run (default all)")
    args = ap.parse_args()
    wanted = [m for m in args.modes.split(",") if m]
    per_mode = args.injections * (args.gap + 0.3)
    seconds = WARMUP_S + BASELINE_S + len(wanted) * per_mode + 10
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
            modes = {}
            if "none" in wanted:
                modes["none"] = _phase(None, args.injections, args.gap, train.pid, Payload())
            if "thread" in wanted:
                modes["thread"] = _phase(injector, args.injections, args.gap, train.pid, Payload(thread=True))
            if "main" in wanted:
                modes["main"] = _phase(injector, args.injections, args.gap, train.pid, Payload(thread=False))
            if "install" in wanted or "detach" in wanted:
                modes["install"], modes["detach"] = _live_phase(injector, args.injections, args.gap, train.pid)
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
    with open("/proc/loadavg") as f:
        figures_load = f.read().split()[:3]
    print(f"load average at the end (1, 5, 15 min; 2 cores shared with other work): {' '.join(figures_load)}")
    base_gaps = [b - a for a, b in itertools.pairwise(stamps) if base[0] <= a and b <= base[1]]
    step = statistics.median(base_gaps)
    figures: dict[str, Any] = {
        "python": sys.version.split()[0],
        "step_ms": step * 1e3,
        "baseline_max_gap_ms": max(base_gaps) * 1e3,
        "baseline_steps": len(base_gaps),
        "loadavg": figures_load,
    }
    print(
        f"cpu_bound step time {step * 1e3:.1f} ms (median of {len(base_gaps)} baseline steps, "
        f"longest {max(base_gaps) * 1e3:.1f} ms)"
    )
    if "install" in modes and modes["install"][0]:
        first = _gaps(stamps, modes["install"][0][:1])
        figures["first_install_max_gap_ms"] = max(first) * 1e3 if first else None
        print(
            f"first install (what attach does): steps overlapping it {len(first)}, longest gap "
            f"{max(first) * 1e3 if first else float('nan'):.1f} ms, main thread held "
            f"{(modes['install'][1][0].held_s or float('nan')) * 1e3:.1f} ms"
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

"""Check that each demo's --relieve really removes its bottleneck.

For each demo in demo/ (dataloader_bound, io_bound, cpu_bound, gpu_bound, launch_bound) this runs
``python demo/X.py --seconds S --device cpu`` and the same with ``--relieve``,
interleaved (A B A B ...) for --runs pairs, parses the final line
``demo X: done, STEPS steps in SECONDS s, RATE steps/s`` and prints the median
steps/s of each side, the speedup (relieved / default) and PASS if it is >= 1.5.
Standard library only.  Exit status 0 unless a run crashes or prints no final line.

Rerun:  python bench/relieve.py --runs 3 --seconds 8 [--demos a,b] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

DEMOS = ("dataloader_bound", "io_bound", "cpu_bound", "gpu_bound", "launch_bound")
THRESHOLD = 1.5
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FINAL = re.compile(r"^demo (\S+): done, (\d+) steps in ([\d.]+) s, ([\d.]+) steps/s$", re.MULTILINE)


class RunError(Exception):
    pass


def run_once(demo: str, seconds: float, relieve: bool) -> float:
    """Run one demo once; return its steps/s from the final line."""
    cmd = [
        sys.executable,
        os.path.join(ROOT, "demo", f"{demo}.py"),
        "--seconds",
        str(seconds),
        "--device",
        "cpu",
    ] + (["--relieve"] if relieve else [])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=seconds + 120)
    except subprocess.TimeoutExpired as e:
        raise RunError(f"{' '.join(cmd)} timed out") from e
    match = FINAL.search(proc.stderr)
    if proc.returncode != 0 or match is None:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RunError(f"{' '.join(cmd)} exited {proc.returncode}: {last}")
    return float(match.group(4))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="default/relieved pairs per demo (default 3)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per run (default 10)")
    parser.add_argument("--demos", default=",".join(DEMOS), help="comma-separated subset")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    args = parser.parse_args()
    demos = [d.strip() for d in args.demos.split(",") if d.strip()]
    unknown = [d for d in demos if d not in DEMOS]
    if unknown:
        parser.error(f"unknown demo(s): {', '.join(unknown)}; choose from {', '.join(DEMOS)}")

    results = []
    for demo in demos:
        default: list[float] = []
        relieved: list[float] = []
        for i in range(args.runs):
            try:
                default.append(run_once(demo, args.seconds, relieve=False))
                relieved.append(run_once(demo, args.seconds, relieve=True))
            except RunError as e:
                print(f"relieve.py: error: {e}", file=sys.stderr)
                return 1
            print(
                f"  {demo} pair {i + 1}/{args.runs}: {default[-1]:.1f} -> {relieved[-1]:.1f} steps/s",
                file=sys.stderr,
                flush=True,
            )
        med_d, med_r = statistics.median(default), statistics.median(relieved)
        speedup = med_r / med_d if med_d > 0 else float("inf")
        results.append(
            {
                "demo": demo,
                "default_steps_per_s": default,
                "relieved_steps_per_s": relieved,
                "median_default": med_d,
                "median_relieved": med_r,
                "speedup": speedup,
                "pass": speedup >= THRESHOLD,
            }
        )

    print(f"{'demo':<18} {'default':>10} {'relieved':>10} {'speedup':>8}  result")
    for r in results:
        print(
            f"{r['demo']:<18} {r['median_default']:>10.1f} {r['median_relieved']:>10.1f} "
            f"{r['speedup']:>7.1f}x  {'PASS' if r['pass'] else 'FAIL'}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "runs": args.runs,
                    "seconds": args.seconds,
                    "threshold": THRESHOLD,
                    "results": results,
                },
                f,
                indent=2,
            )
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

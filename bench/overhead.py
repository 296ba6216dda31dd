"""What watching costs the training: steps/s of a demo alone vs under ``torchwatch run --headless``.

Interleaved pairs (A B A B ...) with medians, because a shared machine drifts. Also prints the
CPU seconds torchwatch and its py-spy children used per second of watching. Rerun:

    python bench/overhead.py --pairs 5 --seconds 20 [--demos cpu_bound,dataloader_bound] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_DONE = re.compile(r"demo \S+: done, \d+ steps in [\d.]+ s, ([\d.]+) steps/s")


def _steps_per_s(stderr: str) -> float:
    m = _DONE.search(stderr)
    if not m:
        raise SystemExit(f"bench/overhead.py: no final steps/s line in: {stderr.strip()[-300:]}")
    return float(m.group(1))


def run_once(demo: str, seconds: float, watched: bool) -> tuple[float, float | None]:
    """Steps/s of one run, and torchwatch's own CPU + py-spy's (% of one core) when watched."""
    cmd = [sys.executable, str(REPO / "demo" / f"{demo}.py"), "--device", "cpu", "--seconds", str(seconds)]
    if not watched:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
        return _steps_per_s(proc.stderr), None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        proc = subprocess.run(
            [sys.executable, "-m", "torchwatch", "run", "--headless", "--json", str(out), "--", *cmd],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
        )
        own = json.loads(out.read_text())["self"]
    return _steps_per_s(proc.stderr), float(own["cpu_pct_of_core"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--demos", default="cpu_bound,dataloader_bound,io_bound")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    rows = []
    print(
        f"{'demo':17s} {'alone':>8s} {'watched':>8s} {'ratio':>6s} {'loss':>6s} {'tw CPU':>7s}  (medians of "
        f"{args.pairs} interleaved pairs, {args.seconds:g} s each)"
    )
    for demo in args.demos.split(","):
        alone, watched, ratios, cpus = [], [], [], []
        for _ in range(args.pairs):
            a, _ = run_once(demo, args.seconds, watched=False)
            w, cpu = run_once(demo, args.seconds, watched=True)
            alone.append(a)
            watched.append(w)
            ratios.append(w / a)
            cpus.append(cpu or 0.0)
        ratio = statistics.median(ratios)
        row = {
            "demo": demo,
            "alone": statistics.median(alone),
            "watched": statistics.median(watched),
            "ratio": ratio,
            "loss_pct": 100 * (1 - ratio),
            "torchwatch_cpu_pct": statistics.median(cpus),
            "ratios": ratios,
        }
        rows.append(row)
        print(
            f"{demo:17s} {row['alone']:8.1f} {row['watched']:8.1f} {ratio:6.3f} {row['loss_pct']:5.1f}% "
            f"{row['torchwatch_cpu_pct']:6.1f}%",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

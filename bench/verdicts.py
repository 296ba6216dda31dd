"""Run each demo under ``torchwatch run --headless`` several times and print the labels.

Acceptance evidence for the verdicts (not a test): each demo must get its label on every run,
and a different label with ``--relieve``. Also prints the seconds to the first correct label, from
launch and from the training's first optimizer step (the hook), and since when the label held. Rerun:

    python bench/verdicts.py --runs 3 --duration 30 [--demos dataloader_bound,io_bound] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXPECTED = {
    "dataloader_bound": "dataloader-bound",
    "io_bound": "io-bound",
    "cpu_bound": "cpu-bound",
    "gpu_bound": "cpu-bound",
    "launch_bound": "cpu-bound",
}  # gpu_bound computes on the CPU without a GPU; launch_bound's tiny ops are CPU work on a CPU too
# Relieving gpu_bound or launch_bound on a CPU-only machine leaves CPU compute: their label need not
# change there.
RELIEF_CHANGES_LABEL = {
    "dataloader_bound": True,
    "io_bound": True,
    "cpu_bound": True,
    "gpu_bound": False,
    "launch_bound": False,
}


def correct(demo: str, relieve: bool, label: str) -> bool:
    """Default runs must get the expected label; relieved runs must get another one (where relief moves it)."""
    if not relieve:
        return label == EXPECTED[demo]
    return label != EXPECTED[demo] or not RELIEF_CHANGES_LABEL[demo]


def watch(demo: str, relieve: bool, duration: float) -> dict[str, object]:
    """One headless run; returns label, confidence and seconds to the first correct label."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        cmd = [
            sys.executable,
            "-m",
            "torchwatch",
            "run",
            "--headless",
            "--duration",
            str(duration),
            "--json",
            str(out),
            "--",
            sys.executable,
            str(REPO / "demo" / f"{demo}.py"),
            "--device",
            "cpu",
        ]
        if relieve:
            cmd.append("--relieve")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120, cwd=REPO)
        if not out.exists():
            raise SystemExit(f"bench/verdicts.py: {demo} produced no report: {proc.stderr.strip()[-300:]}")
        report = json.loads(out.read_text())
    history = report["verdict_history"]
    first = next((h["t"] for h in history if h["label"] == EXPECTED[demo]), None)
    first_step = (report.get("hook") or {}).get("first_step_after_s")
    return {
        "first_step_s": first_step,
        "after_first_step_s": None if first is None or first_step is None else round(first - first_step, 1),
        "stable_s": history[-1]["t"] if history else None,
        "demo": demo,
        "relieve": relieve,
        "label": report["verdict"]["label"],
        "confidence": report["verdict"]["confidence"],
        "first_correct_s": first,
        "history": history,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--demos", default=",".join(EXPECTED))
    parser.add_argument("--no-relieve", action="store_true", help="skip the --relieve runs")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    rows = []
    for i in range(args.runs):
        for demo in args.demos.split(","):
            for relieve in (False,) if args.no_relieve else (False, True):
                t0 = time.monotonic()
                row = watch(demo, relieve, args.duration)
                row["run"] = i + 1
                rows.append(row)
                ok = correct(demo, relieve, str(row["label"]))
                print(
                    f"run {i + 1} {demo:17s} {'relieved' if relieve else 'default ':8s} -> {row['label']:17s} "
                    f"conf {row['confidence']:.2f}  {'OK' if ok else 'WRONG'}  "
                    f"first correct {row['first_correct_s']} s "
                    f"({row['after_first_step_s']} s after the first step), stable from {row['stable_s']} s "
                    f"({time.monotonic() - t0:.0f} s)",
                    flush=True,
                )
    print()
    print(f"{'demo':17s} {'variant':9s} {'labels':55s} result")
    for demo in args.demos.split(","):
        for relieve in (False,) if args.no_relieve else (False, True):
            labels = [str(r["label"]) for r in rows if r["demo"] == demo and r["relieve"] == relieve]
            good = all(correct(demo, relieve, lab) for lab in labels)
            variant = "relieved" if relieve else "default"
            print(f"{demo:17s} {variant:9s} {', '.join(labels):55s} {'PASS' if good else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

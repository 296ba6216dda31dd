"""Predicted speed-up of a fix (torchwatch.analysis.predict) against the measured one.

For each scenario of tests/scenarios/ named below this

1. watches it with ``torchwatch run --headless --duration D --json OUT`` and keeps the report
   (its final window's features and findings);
2. measures its steps/s in separate runs, plain and with ``--relieve`` (interleaved, --runs
   pairs, the median of each side): the measured speed-up of the scenario's own relief;
3. predicts, from the report's features alone, the speed-up of the fix kind that relief is
   (the per-sample work cached, the sleep taken off the loop, ...) and of every fix of the
   report's first finding, and prints predicted vs measured and |predicted / measured - 1|.

The relief is not always the fix's ideal: slow_collate's relief vectorises the collate (cheaper,
not free), so its predicted ratio, which takes the per-sample CPU work to zero, is an upper bound
there. Each scenario's report and rates can be saved (``--save DIR``) and predicted again later
without running anything (``--from DIR``), e.g. after a change of the model.

``--cost`` prints instead what the predictions cost per analysis tick: every fix of every finding
of the recorded windows (tests/fixtures/windows/predict_*.json) predicted, best of 5 rounds.

Rerun:  python bench/predict.py [--only aug_one_worker,sleepy_loop] [--runs 2] [--seconds 10]
        [--duration 20] [--save DIR | --from DIR] [--json PATH]
        python bench/predict.py --cost
Every process started is ended before the script returns (subprocess.run with timeouts; the
watch stops its training with --duration).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# scenario -> the fix kind its --relieve is (torchwatch.analysis.predict.KINDS) and how close
SCENARIOS: dict[str, tuple[str, str]] = {
    "aug_one_worker": ("cache", "samples precomputed: the per-sample work is gone"),
    "slow_collate": ("cache", "collate vectorised: cheaper, not free (prediction is an upper bound)"),
    "sleepy_loop": ("sleep", "the loop's time.sleep removed"),
    "sleepy_dataset": ("sleep", "the dataset's sleep removed"),
}
FINAL = re.compile(r"done, (\d+) steps in ([\d.]+) s, ([\d.]+) steps/s")


def rate(name: str, seconds: float, relieve: bool) -> float | None:
    """One separate run of the scenario; its steps/s from the final line, or None."""
    cmd = [sys.executable, str(REPO / "tests" / "scenarios" / f"{name}.py"), "--seconds", str(seconds)]
    proc = subprocess.run(
        cmd + (["--relieve"] if relieve else []),
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        cwd=REPO,
        check=False,
    )
    m = FINAL.search(proc.stderr)
    return float(m.group(3)) if m else None


def watch(name: str, duration: float) -> dict[str, Any]:
    """The JSON report of one headless torchwatch run of the scenario."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        script = REPO / "tests" / "scenarios" / f"{name}.py"
        cmd = [
            sys.executable, "-m", "torchwatch", "run", "--headless", "--duration", str(duration),
            "--json", str(out), "--", sys.executable, str(script), "--seconds", str(duration + 60),
        ]  # fmt: skip
        subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120, cwd=REPO, check=False)
        return json.loads(out.read_text()) if out.exists() else {}


def measure(name: str, runs: int, seconds: float, duration: float) -> dict[str, Any]:
    """The report and the plain and relieved rates (steps/s) of one scenario."""
    report = watch(name, duration)
    plain: list[float] = []
    relieved: list[float] = []
    for _ in range(runs):
        for relieve, side in ((False, plain), (True, relieved)):
            r = rate(name, seconds, relieve)
            if r is not None:
                side.append(r)
    return {"report": report, "plain": plain, "relieved": relieved}


def predict_row(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """Predicted vs measured for one scenario's saved data."""
    from torchwatch.analysis import predict
    from torchwatch.analysis.diagnosis import template_values

    kind, how = SCENARIOS[name]
    feats = data["report"].get("features", {})
    measured = (
        statistics.median(data["relieved"]) / statistics.median(data["plain"])
        if data["plain"] and data["relieved"]
        else None
    )
    p = predict.predict_kind(kind, feats)
    values = template_values(feats)
    first = (data["report"].get("findings") or [{}])[0]
    fixes = []
    for fx in first.get("fixes", []):
        q = predict.predict_fix(first.get("rule", ""), fx.get("title", ""), fx.get("trial"), values)
        fixes.append({"title": fx.get("title"), "trial": fx.get("trial"), "predicted": q.to_json(), "text": q.text()})
    error = None if p.ratio is None or not measured else abs(p.ratio / measured - 1.0)
    return {
        "scenario": name,
        "relief": how,
        "kind": kind,
        "measured": measured,
        "plain_steps_per_s": data["plain"],
        "relieved_steps_per_s": data["relieved"],
        "predicted": p.to_json(),
        "text": p.text(),
        "error": error,
        "first_finding": first.get("rule"),
        "first_fixes": fixes,
    }


def cost() -> int:
    """Microseconds the predictions of one analysis tick take on each recorded window."""
    import time

    from torchwatch.analysis import predict
    from torchwatch.analysis.diagnosis import Diagnoser, template_values
    from torchwatch.analysis.features import CATALOGUE
    from torchwatch.analysis.rules_engine import load_rules

    for path in sorted((REPO / "tests" / "fixtures" / "windows").glob("*.json")):
        feats = {**dict.fromkeys(CATALOGUE), **json.loads(path.read_text())["features"]}
        d = Diagnoser(load_rules())
        d.evaluate(feats, 0.0)
        findings = d.evaluate(feats, 10.0).findings
        values = template_values(feats)
        fixes = [(f.rule, fx.title, fx.trial) for f in findings for fx in f.fixes]
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(100):
                for rule, title, trial in fixes:
                    predict.predict_fix(rule, title, trial, values)
            best = min(best, (time.perf_counter() - t0) / 100)
        print(f"{path.stem:32s} {len(fixes):2d} fixes  {best * 1e6:7.0f} us per tick")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios")
    parser.add_argument("--runs", type=int, default=2, help="plain/relieved pairs per scenario (default 2)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per separate run (default 10)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds torchwatch watches (default 20)")
    parser.add_argument("--save", metavar="DIR", help="save each scenario's report and rates here")
    parser.add_argument("--from", dest="source", metavar="DIR", help="predict from saved data, run nothing")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON here")
    parser.add_argument("--cost", action="store_true", help="print what the predictions cost per tick, run nothing")
    args = parser.parse_args()
    if args.cost:
        return cost()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"bench/predict.py: unknown scenario {unknown[0]!r} (known: {', '.join(SCENARIOS)})", file=sys.stderr)
        return 2
    rows = []
    for name in names:
        if args.source:
            path = Path(args.source) / f"{name}.json"
            if not path.exists():
                print(f"{name}: no saved data in {args.source}", file=sys.stderr)
                continue
            data = json.loads(path.read_text())
        else:
            data = measure(name, args.runs, args.seconds, args.duration)
            if args.save:
                os.makedirs(args.save, exist_ok=True)
                (Path(args.save) / f"{name}.json").write_text(json.dumps(data))
        row = predict_row(name, data)
        rows.append(row)
        shown = row["text"]
        meas = "n/a" if row["measured"] is None else f"{row['measured']:.2f}x"
        err = "n/a" if row["error"] is None else f"{row['error']:.0%}"
        print(f"{name:16s} {row['kind']:6s} predicted {shown:28s} measured {meas:7s} |p/m-1| {err}")
        for fx in row["first_fixes"]:
            print(f"    first finding {row['first_finding']}: {fx['title']}: {fx['text']}")
    errors = [r["error"] for r in rows if r["error"] is not None]
    if errors:
        print(f"median |predicted/measured - 1| = {statistics.median(errors):.0%} over {len(errors)} scenarios")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

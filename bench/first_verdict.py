"""Seconds from a demo's first optimizer step to torchwatch's first correct verdict, for this
checkout and for other checkouts of torchwatch, in interleaved runs (not a test).

Each run is ``torchwatch run --headless --duration D --json R --trace T -- python demo/DEMO.py
--device cpu``, started from the checkout under test (its own ``torchwatch`` package; the demos
and the interpreter are this checkout's for every one, so only torchwatch differs). A round runs
every checkout once per demo, in a shuffled order, so a slow minute of a shared machine lands on
all of them alike. For every run it prints the first step (s after launch, from the hook), the
first correct verdict after it, and when the first chunk of stacks with >= 20 samples arrived:
the stack-based rules cannot decide before it, and a rule's hold (``for``, 2 s) runs after it.

To compare with an older commit, check it out beside this one first::

    git worktree add /tmp/tw-old <commit>
    python bench/first_verdict.py --runs 3 --checkouts old=/tmp/tw-old
    git worktree remove /tmp/tw-old

An editable install finds its rules (the package ``torchwatch.rules``, mapped from ``rules/``) in
the checkout it was installed from, whatever the working directory: to compare rules too, give the
other checkout an interpreter of its own, ``NAME=PATH@PYTHON`` (a venv with ``pip install -e PATH``
and the same torch), and it runs both torchwatch and the demo.

The rules run once a second on a grid of whole seconds, so a single run moves by up to a second
with the phase of that grid against the training's first step; compare medians of several runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from verdicts import EXPECTED  # bench/verdicts.py: each demo's label on a CPU-only machine

REPO = Path(__file__).resolve().parents[1]
MIN_STACKS = 20  # torchwatch.analysis.features.MIN_STACK_SAMPLES


def watch(checkout: Path, demo: str, duration: float, python: str = sys.executable) -> dict[str, Any]:
    """One headless run of ``demo`` under the torchwatch of ``checkout``, both run by ``python``.

    Returns:
        ``first_step`` (s after launch), ``first`` (s after launch of the first correct verdict),
        ``after`` (``first - first_step``, s), ``stacks`` (s after the first step when >= 20
        stack samples were first in the window); ``None`` where not seen.

    Raises:
        SystemExit: the run wrote no report.
    """
    with tempfile.TemporaryDirectory() as tmp:
        out, trace = Path(tmp) / "report.json", Path(tmp) / "trace.jsonl"
        cmd = [python, "-m", "torchwatch", "run", "--headless", "--duration", str(duration)]
        cmd += ["--json", str(out), "--trace", str(trace), "--"]
        cmd += [python, str(REPO / "demo" / f"{demo}.py"), "--device", "cpu"]
        proc = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, timeout=duration + 120)
        if not out.exists():
            raise SystemExit(f"bench/first_verdict.py: {checkout} gave no report: {proc.stderr.strip()[-300:]}")
        report = json.loads(out.read_text())
        ticks = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    first_step = (report.get("hook") or {}).get("first_step_after_s")
    first = next((h["t"] for h in report["verdict_history"] if h["label"] == EXPECTED[demo]), None)
    stacks = next((t["t"] for t in ticks if (t["features"].get("stack_samples") or 0) >= MIN_STACKS), None)

    def since_step(t: float | None) -> float | None:
        return None if t is None or first_step is None else round(t - first_step, 2)

    return {"first_step": first_step, "first": first, "after": since_step(first), "stacks": since_step(stacks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--duration", type=float, default=12.0, help="torchwatch --duration per run (default 12)")
    parser.add_argument("--demos", default="dataloader_bound,cpu_bound,launch_bound,gpu_bound")
    parser.add_argument(
        "--checkouts", default="", help="NAME=PATH[@PYTHON],... other checkouts to compare (this one is 'this')"
    )
    parser.add_argument("--json", metavar="PATH", help="also write every run as JSON here")
    args = parser.parse_args()
    checkouts = {"this": (REPO, sys.executable)}  # name: (checkout, the interpreter that runs it)
    for item in filter(None, args.checkouts.split(",")):
        name, _, spec = item.partition("=")
        path, _, python = spec.partition("@")
        checkouts[name] = (Path(path).resolve(), python or sys.executable)
    demos = args.demos.split(",")
    runs: list[dict[str, Any]] = []
    for r in range(args.runs):
        for demo in demos:
            order = list(checkouts)
            random.shuffle(order)
            for name in order:
                checkout, python = checkouts[name]
                run = {"round": r + 1, "checkout": name, "demo": demo, **watch(checkout, demo, args.duration, python)}
                runs.append(run)
                print(
                    f"round {r + 1} {demo:16s} {name:8s} first step {run['first_step']} s, first correct verdict "
                    f"{run['after']} s after it (stacks {run['stacks']} s after it)",
                    flush=True,
                )
    print(f"\n{'demo':16s} {'checkout':8s} median s after the first step (runs)")
    for demo in demos:
        for name in checkouts:
            after = [x["after"] for x in runs if x["demo"] == demo and x["checkout"] == name]
            got = [a for a in after if a is not None]
            median = f"{statistics.median(got):.2f}" if got else "never"
            print(f"{demo:16s} {name:8s} {median} ({', '.join('never' if a is None else f'{a:.2f}' for a in after)})")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()

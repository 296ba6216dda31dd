"""The distributed scenarios (tests/scenarios/distributed/): their reliefs, and what the hook publishes per rank.

Two tables, printed; ``--json PATH`` writes them too. Rerun:

    python bench/ranks.py [--runs 3] [--seconds 12] [--only balanced,comm_bound] [--launchers torchrun,mp.spawn]
                          [--no-relief] [--no-published]

1. Relief: each scenario's steps/s (rank 0's final line) with and without ``--relieve``, as the
   median of ``--runs`` interleaved pairs (A B A B ...: the machine is shared), under each
   launcher; PASS when the relieved run is >= 1.5x faster.
2. Published: each scenario run once per launcher with the hook pre-loaded (as ``torchwatch
   run`` does); every rank's ``hook.json`` and ``counters`` read from outside, as torchwatch
   reads them, once a second; then, per rank, the medians over the steps after the first third
   of the run: step time, data wait, backward wall, backward blocked, explicit collectives,
   collective wait (explicit + backward blocked: gloo on the CPU), the time before the
   collective (step - data wait - backward - explicit collectives: forward, optimizer, other)
   and the time the rank takes to reach its backward pass (data wait + before the collective):
   the straggler is the rank for which that is longest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from torchwatch import wire  # noqa: E402
from torchwatch.sources.hook import HookReader  # noqa: E402
from torchwatch.watch.lifecycle import hook_env  # noqa: E402

SCEN_DIR = REPO / "tests" / "scenarios" / "distributed"
SCENARIOS = ("balanced", "straggler_data", "comm_bound")
LAUNCHERS = ("torchrun", "mp.spawn")
FINAL = re.compile(r"^demo (\S+): done, (\d+) steps in ([\d.]+) s, ([\d.]+) steps/s$", re.MULTILINE)
THRESHOLD = 1.5


def command(name: str, launcher: str, seconds: float, relieve: bool) -> list[str]:
    """The command line of scenario ``name`` under ``launcher`` (2 ranks)."""
    script = [str(SCEN_DIR / f"{name}.py"), "--seconds", str(seconds)] + (["--relieve"] if relieve else [])
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *script]
    return [sys.executable, *script]


def steps_per_s(name: str, launcher: str, seconds: float, relieve: bool) -> float:
    """Rank 0's steps/s from its final line."""
    cmd = command(name, launcher, seconds, relieve)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 180, cwd=REPO, check=False)
    match = FINAL.search(proc.stderr)
    if proc.returncode != 0 or match is None:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"bench/ranks.py: {' '.join(cmd)} exited {proc.returncode}: {last}")
    return float(match.group(4))


def relief(names: list[str], launchers: list[str], runs: int, seconds: float) -> list[dict[str, Any]]:
    rows = []
    print(f"{'scenario':16s} {'launcher':9s} {'default':>8s} {'relieved':>9s} {'ratio':>6s}  (median of {runs} pairs)")
    for name in names:
        for launcher in launchers:
            pairs = []
            for _ in range(runs):
                base = steps_per_s(name, launcher, seconds, False)
                rel = steps_per_s(name, launcher, seconds, True)
                pairs.append((base, rel, rel / base))
            row = {
                "scenario": name,
                "launcher": launcher,
                "pairs": pairs,
                "default": statistics.median(p[0] for p in pairs),
                "relieved": statistics.median(p[1] for p in pairs),
                "ratio": statistics.median(p[2] for p in pairs),
            }
            rows.append(row)
            verdict = "PASS" if row["ratio"] >= THRESHOLD else "FAIL"
            print(
                f"{name:16s} {launcher:9s} {row['default']:8.1f} {row['relieved']:9.1f} {row['ratio']:5.2f}x "
                f"{verdict}  ratios {', '.join(f'{p[2]:.2f}' for p in pairs)}",
                flush=True,
            )
    return rows


def _ranks(root: int) -> dict[int, HookReader]:
    """Readers of the hooked ranks below ``root`` (a process with a rank in its hook.json)."""
    out: dict[int, HookReader] = {}
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return out
    for child in children:
        reader = HookReader(child.pid)
        info = reader.info()
        rank = (info or {}).get("rank") or {}
        if isinstance(rank.get("rank"), int):
            out[rank["rank"]] = reader
    return out


def published(name: str, launcher: str, seconds: float) -> list[dict[str, Any]]:
    """Run once with the hook; per rank, the medians of what it published."""
    proc = subprocess.Popen(
        command(name, launcher, seconds, False),
        cwd=REPO,
        env=hook_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    started = time.monotonic()
    readers: dict[int, HookReader] = {}
    snaps: dict[int, wire.CounterSnapshot] = {}
    infos: dict[int, dict[str, Any]] = {}
    try:
        while proc.poll() is None:
            if len(readers) < 2:
                readers = _ranks(proc.pid)
            for rank, reader in readers.items():
                snap, info = reader.counters(), reader.info()
                if snap is not None and info is not None:
                    snaps[rank], infos[rank] = snap, info
            time.sleep(1.0)
    finally:
        _, err = proc.communicate(timeout=seconds + 120)
    final = FINAL.search(err)
    skip_before = started + seconds / 3
    rows = []
    for rank in sorted(snaps):
        snap, info = snaps[rank], infos[rank]
        on_cpu = not info.get("cuda_initialized")
        ident = info.get("rank") or {}
        comm = on_cpu and (ident.get("world_size") or 1) > 1
        steps = [s for s in snap.rank_steps() if s.end >= skip_before] or list(snap.rank_steps())

        def ms(values: list[float]) -> float:
            return round(1000 * statistics.median(values), 2) if values else float("nan")

        rows.append(
            {
                "scenario": name,
                "launcher": launcher,
                "rank": rank,
                "rank_source": (ident.get("sources") or {}).get("rank"),
                "job": ident.get("job"),
                "step_source": snap.step_source,
                "steps": snap.steps,
                "steps_per_s_own": float(final.group(4)) if final else None,
                "step_ms": ms([s.duration for s in steps]),
                "data_wait_ms": ms([s.data_wait for s in steps]),
                "backward_ms": ms([s.backward for s in steps]),
                "backward_blocked_ms": ms([s.backward_blocked for s in steps]),
                "explicit_collective_ms": ms([s.collective for s in steps]),
                "collective_wait_ms": ms([s.collective_wait(comm) for s in steps]),
                "before_collective_ms": ms([s.before_collective() for s in steps]),
                "reaches_backward_ms": ms([s.data_wait + s.before_collective() for s in steps]),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--launchers", default=",".join(LAUNCHERS))
    parser.add_argument("--no-relief", action="store_true")
    parser.add_argument("--no-published", action="store_true")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    launchers = [n for n in args.launchers.split(",") if n]
    unknown = sorted(set(names) - set(SCENARIOS)) + sorted(set(launchers) - set(LAUNCHERS))
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "load": os.getloadavg()}}
    if not args.no_relief:
        result["relief"] = relief(names, launchers, args.runs, args.seconds)
    if not args.no_published:
        cols = (
            "step_ms", "data_wait_ms", "backward_ms", "backward_blocked_ms", "explicit_collective_ms",
            "collective_wait_ms", "before_collective_ms", "reaches_backward_ms",
        )  # fmt: skip
        print(
            f"\n{'scenario':15s} {'launcher':9s} {'rank':>4s} {'src':>5s} "
            + " ".join(f"{c.removesuffix('_ms'):>12s}" for c in cols)
            + "  (ms, medians per step)"
        )
        rows = []
        for name in names:
            for launcher in launchers:
                for row in published(name, launcher, args.seconds):
                    rows.append(row)
                    print(
                        f"{name:15s} {launcher:9s} {row['rank']:4d} {str(row['rank_source'])[:5]:>5s} "
                        + " ".join(f"{row[c]:12.1f}" for c in cols),
                        flush=True,
                    )
        result["published"] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The scenario matrix on a busy machine: each scenario quiet and under four kinds of CPU scarcity.

Conditions (``--conditions``, default all):

- ``quiet``: nothing else runs.
- ``hog``: one busy process beside the training (``python -c "while True: pass"``).
- ``training``: a second training beside it (tests/scenarios/big_cpu_matmul.py, default threads).
- ``quota``: the training (and torchwatch, as in a container) in a cgroup whose CPU quota is
  1 CPU, below the training's intra-op threads (cgroup v1 ``cpu.cfs_quota_us`` or v2 ``cpu.max``).
- ``oversub``: oversubscribed from inside: the training calls ``torch.set_num_threads`` with 4 x the
  usable CPUs (torch caps ``OMP_NUM_THREADS`` at the cores it sees, so the variable alone does not).

Ground truth by intervention (``--truth``, no torchwatch): steps/s of every scenario quiet, and
under each condition plain and with its own ``--relieve``. The condition's intervention (neighbour
removed, quota lifted, threads back to the default) gives the quiet rate, so under a condition

    environment speed-up = quiet / plain        own speed-up = relieved / plain

and the expected *first finding* is the environment's (cpu-contention, cpu-quota-throttled or
cpu-oversubscribed) where the environment speed-up is the larger and at least 1.25x (below that the
condition is no cause: the quiet runs alone vary by 9 % or more), the scenario's own label
otherwise. Each condition's runs are paired with a quiet run just before them. The figures are kept
in ``bench/results/noisy_truth.json`` (one measurement each: the noise is the spread of a
scenario's quiet runs across the conditions, printed).

``--watch`` runs ``torchwatch run --headless`` on each scenario under each condition and prints
quiet vs noisy side by side: label, confidence, first finding, and OK / WRONG against the truth.
Scored: quiet, the label; under a condition, the first finding (environment expected: one of the
three CPU-scarcity rules first; otherwise: none of them first, and not ``loop-cpu`` first unless the
label expected is cpu-bound). Printed apart: beside one busy process, whether dataloader- and io-bound
scenarios kept their label.

Run nothing else heavy at the same time (2-core machine). Root is needed for ``quota``.

    python bench/noisy.py --truth [--only a,b] [--seconds 8]
    python bench/noisy.py --watch [--only a,b] [--duration 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scenarios as sc  # bench/scenarios.py

REPO = sc.REPO
CONDITIONS = ("quiet", "hog", "training", "quota", "oversub")
ENV_RULES = {"cpu-contention", "cpu-quota-throttled", "cpu-oversubscribed"}
TRUTH = REPO / "bench" / "results" / "noisy_truth.json"
QUOTA_CPUS = 1.0
NEIGHBOUR = REPO / "tests" / "scenarios" / "big_cpu_matmul.py"


def _usable() -> int:
    return len(os.sched_getaffinity(0))


@contextlib.contextmanager
def _started(cmd: list[str], settle_s: float) -> Iterator[None]:
    """A neighbour process group for the block's time, ended (SIGKILL to the group) after it."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(settle_s)  # the neighbour is busy before the training starts
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def _quota_group(cpus: float) -> Iterator[Path]:
    """A fresh cgroup with a CPU quota of ``cpus``; yields its ``cgroup.procs``; removed after."""
    name = f"torchwatch-bench-{os.getpid()}"
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists():
        group = v1 / name
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
    else:
        group = Path("/sys/fs/cgroup") / name
        group.mkdir()
        (group / "cpu.max").write_text(f"{int(cpus * 100000)} 100000")
    try:
        yield group / "cgroup.procs"
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


@contextlib.contextmanager
def condition(name: str) -> Iterator[tuple[list[str], dict[str, str]]]:
    """Set up condition ``name``; yields ``(command prefix, environment additions)`` for what runs in it."""
    if name == "quiet":
        yield [], {}
    elif name == "hog":
        with _started([sys.executable, "-c", "while True: pass"], 0.5):
            yield [], {}
    elif name == "training":
        with _started([sys.executable, str(NEIGHBOUR), "--seconds", "100000"], 4.0):
            yield [], {}
    elif name == "quota":
        with _quota_group(QUOTA_CPUS) as procs:
            yield ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh"], {}
    elif name == "oversub":
        # torch caps OMP_NUM_THREADS at the cores it sees; a training that asks torch for more
        # threads gets them (torch.set_num_threads): the wrapper asks, then runs the script.
        threads = 4 * _usable()
        code = (
            f"import runpy, sys, torch; torch.set_num_threads({threads}); "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        yield ["@python", "-c", code], {}
    else:
        raise SystemExit(f"noisy.py: error: unknown condition {name!r}; have {', '.join(CONDITIONS)}")


def _command(prefix: list[str], script_args: list[str]) -> list[str]:
    """``python SCRIPT ARGS`` under a condition's prefix (``@python`` in it: the interpreter runs
    the prefix's code with the script after it)."""
    if prefix[:1] == ["@python"]:
        return [sys.executable, *prefix[1:], *script_args]
    return [*prefix, sys.executable, *script_args]


def rate(script: Path, seconds: float, relieve: bool, prefix: list[str], env: dict[str, str]) -> float:
    """Steps/s of one scenario run (its final ``demo NAME: done, ...`` line)."""
    cmd = _command(prefix, [str(script), "--seconds", str(seconds)] + (["--relieve"] if relieve else []))
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=seconds + 180, cwd=REPO, env={**os.environ, **env}, check=False
    )
    match = sc.FINAL.search(proc.stderr)
    if proc.returncode != 0 or match is None:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {last}")
    return float(match.group(4))


ENV_MATTERS = 1.25
"""Below this speed-up from the intervention the condition is taken as no cause at all: the
scenarios' quiet runs alone vary by 9 % or more between runs here."""


def first_expected(expected: str, env_x: float, own_x: float) -> str:
    """``environment`` where removing the condition is the larger speed-up and a real one
    (>= :data:`ENV_MATTERS`), else the scenario's own label."""
    return "environment" if env_x > own_x and env_x >= ENV_MATTERS else expected


def truth(scen: dict[str, tuple[Path, str]], conds: list[str], seconds: float) -> dict[str, Any]:
    """Measure the interventions; merges into :data:`TRUTH` and returns the whole table."""
    table: dict[str, Any] = json.loads(TRUTH.read_text()) if TRUTH.exists() else {}
    print(
        f"{'scenario':<24} {'condition':<9} {'plain':>7} {'relieved':>8} {'quiet':>7} {'env x':>6} {'own x':>6}  first"
    )
    for name, (script, expected) in scen.items():
        row = table.setdefault(name, {"expected": expected})
        row["quiet_rates"] = []
        for cond in conds:
            if cond == "quiet":
                continue
            # a quiet run right before each condition's: a pair, so slow drift cancels
            quiet = rate(script, seconds, False, [], {})
            row["quiet_rates"].append(quiet)
            with condition(cond) as (prefix, env):
                plain = rate(script, seconds, False, prefix, env)
                relieved = rate(script, seconds, True, prefix, env)
            env_x, own_x = quiet / plain, relieved / plain
            first = first_expected(expected, env_x, own_x)
            row[cond] = {"plain": plain, "relieved": relieved, "quiet": quiet, "env_x": env_x, "own_x": own_x}
            row[cond]["first"] = first
            print(
                f"{name:<24} {cond:<9} {plain:7.1f} {relieved:8.1f} {quiet:7.1f} {env_x:6.2f} {own_x:6.2f}  {first}",
                flush=True,
            )
        TRUTH.parent.mkdir(parents=True, exist_ok=True)
        TRUTH.write_text(json.dumps(table, indent=1))
    spreads = [max(r["quiet_rates"]) / min(r["quiet_rates"]) for r in table.values() if len(r["quiet_rates"]) > 1]
    if spreads:
        print(f"quiet re-measurements: max/min {min(spreads):.2f}..{max(spreads):.2f} across {len(spreads)} scenarios")
    return table


def watch(name: str, script: Path, cond: str, duration: float) -> dict[str, Any]:
    """One headless torchwatch run of ``script`` under ``cond``: label, confidence, findings."""
    with tempfile.TemporaryDirectory() as tmp, condition(cond) as (prefix, env):
        out = Path(tmp) / "report.json"
        training = sc.training(name, script, duration + 60)
        if prefix[:1] == ["@python"]:
            training, prefix = _command(prefix, training[1:]), []
        cmd = [
            *prefix, sys.executable, "-m", "torchwatch", "run", "--headless", "--duration", str(duration),
            "--json", str(out), "--", *training,
        ]  # fmt: skip
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=duration + 120,
            cwd=REPO,
            env={**os.environ, **env},
            check=False,
        )
        if not out.exists():
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            return {"label": "ERROR", "confidence": 0.0, "findings": [], "error": tail}
        report = json.loads(out.read_text())
        verdict = report.get("verdict", {})
        feats = report.get("features", {})
        keep = (
            "main_running_share", "main_runqueue_share", "threads_runqueue_share", "loop_cpu_share",
            "foreign_cpu_cores", "own_cpu_cores", "cpu_throttled_share", "cpu_threads_wanted", "usable_cpus",
            "data_wait_share", "hook_steps_per_s",
        )  # fmt: skip
        return {
            "label": verdict.get("label", "?"),
            "confidence": float(verdict.get("confidence") or 0.0),
            "findings": [f.get("rule") for f in report.get("findings", [])],
            "summary": (report.get("findings") or [{}])[0].get("summary", ""),
            "features": {k: feats.get(k) for k in keep},
        }


def label_kept(expected: str, cond: str, r: dict[str, Any]) -> bool | None:
    """Beside one busy process, whether a dataloader- or io-bound scenario kept its label (``None``:
    not such a case). Printed apart from the score: where the intervention says the neighbour is the
    larger cause, the physics and this wish disagree, and the table shows both."""
    if cond != "hog" or expected not in ("dataloader-bound", "io-bound"):
        return None
    return bool(r["label"] == expected)


def score(expected: str, cond: str, first_truth: str | None, r: dict[str, Any]) -> tuple[bool, str]:
    """Whether a run's first finding is right by intervention (see the module's docstring), and why not."""
    first = (r["findings"] or [None])[0]
    if cond == "quiet":
        return r["label"] == expected, f"label {r['label']}, expected {expected}"
    if first_truth is None:
        return True, "no truth measured (run --truth)"
    if first_truth == "environment":
        return first in ENV_RULES, f"first finding {first}, expected an environment finding"
    if first in ENV_RULES:
        return False, f"first finding {first}, but the scenario's own relief is larger"
    if first == "loop-cpu" and expected != "cpu-bound":
        return False, "loop-cpu first, but the relief is elsewhere"
    return True, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--truth", action="store_true", help="measure the interventions (no torchwatch)")
    parser.add_argument("--watch", action="store_true", help="run torchwatch under each condition")
    parser.add_argument("--only", help="comma-separated subset of scenarios")
    parser.add_argument("--conditions", default=",".join(CONDITIONS), help="comma-separated conditions")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per --truth run (default 8)")
    parser.add_argument("--duration", type=float, default=20.0, help="torchwatch --duration (default 20)")
    parser.add_argument("--json", metavar="PATH", help="write the --watch results as JSON here")
    args = parser.parse_args()
    conds = [c.strip() for c in args.conditions.split(",") if c.strip()]
    scen = sc.discover(args.only, False, False)
    for script, _ in scen.values():  # warm-up: creates the data files
        subprocess.run([sys.executable, str(script), "--seconds", "0.5"], capture_output=True, cwd=REPO, check=False)
    table = (
        truth(scen, conds, args.seconds) if args.truth else (json.loads(TRUTH.read_text()) if TRUTH.exists() else {})
    )
    if not args.watch:
        return 0
    results: dict[str, dict[str, Any]] = {}
    wrong = total = kept_n = kept_of = 0
    print(f"\n{'scenario':<24} {'condition':<9} {'truth first':<17} {'label':<17} {'conf':>4}  first finding")
    for name, (script, expected) in scen.items():
        for cond in conds:
            r = watch(name, script, cond, args.duration)
            measured = table.get(name, {}).get(cond)
            first_truth = expected if cond == "quiet" else None
            if measured is not None and cond != "quiet":
                first_truth = first_expected(expected, measured["env_x"], measured["own_x"])
            ok, why = score(expected, cond, first_truth, r)
            kept = label_kept(expected, cond, r)
            total += 1
            wrong += not ok
            if kept is not None:
                kept_n, kept_of = kept_n + kept, kept_of + 1
            r.update(ok=ok, why=why, truth_first=first_truth, label_kept=kept)
            results.setdefault(name, {})[cond] = r
            first = (r["findings"] or ["-"])[0]
            line = f"{name:<24} {cond:<9} {first_truth or '?':<17} {r['label']:<17} {r['confidence']:.2f}  {first}"
            line += "" if ok else f"  WRONG ({why})"
            line += "" if kept is None else f"  [label {'kept' if kept else 'NOT kept'} beside one busy process]"
            print(line, flush=True)
    print(f"\nfirst finding (quiet: label) right by intervention: {total - wrong}/{total}")
    print(f"dataloader-/io-bound label kept beside one busy process: {kept_n}/{kept_of}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

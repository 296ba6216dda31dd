"""Score torchwatch's verdicts on the scenario trainings in tests/scenarios/.

Each tests/scenarios/NAME.py is a small real training with one dominant
bottleneck, its expected label in a module constant ``EXPECTED = "..."`` (the
ground truth comes from what the training does, proven by its ``--relieve``
flag, never from what torchwatch says) and, optionally, ``SUB_CAUSE = "<rule id>"``:
the finding that must name the cause under the label (reported, not scored).  For every scenario (and, with
--with-demos, the four demos' default variants) this runs, --runs times::

    python -m torchwatch run --headless --duration D --json OUT --trace TRACE \\
        -- python tests/scenarios/NAME.py --seconds BIG

and prints one line per run (scenario, label, confidence, OK/WRONG), a
confusion matrix (rows: expected label, columns: label given), the accuracy and
the scenarios whose label flipped across runs.  On WRONG the JSON report and the
trace are kept under bench/results/scenarios/ and the path printed, with the
main features of the report.

The distributed scenarios (tests/scenarios/distributed/NAME.py, 2 ranks, gloo on the CPU) run
under torchrun (``python -m torch.distributed.run --standalone --nproc_per_node 2``) and under
torch.multiprocessing.spawn (the script itself), as ``distributed/NAME@LAUNCHER``; each has
``EXPECTED`` (the job's label; ``communication-bound`` is the ranks-collective-wait
finding first among the job's findings, the label contract's five labels staying) and
``STRAGGLER`` (the rank that paces the job, or ``None``): a run is OK when both match the
report's verdict and ``straggler``.
--no-distributed leaves them out.

--check-relief instead measures, once per scenario and without torchwatch, the
steps/s of ``NAME.py --seconds S`` with and without ``--relieve`` (from the final
line ``demo NAME: done, STEPS steps in SECONDS s, RATE steps/s``) and prints the
ratio (PASS when >= 1.5).

Standard library only.  Run nothing else heavy at the same time (2-core machine).

    python bench/scenarios.py --check-relief [--only a,b] [--seconds 10]
    python bench/scenarios.py --runs 3 --duration 25 [--only a,b] [--with-demos] [--json PATH]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCEN_DIR = REPO / "tests" / "scenarios"
DEMO_DIR = REPO / "demo"
RESULTS = REPO / "bench" / "results" / "scenarios"
LABELS = ("gpu-bound", "io-bound", "dataloader-bound", "cpu-bound", "undetermined", "communication-bound")
DIST_DIR = SCEN_DIR / "distributed"
LAUNCHERS = ("torchrun", "mp.spawn")
COMM_RULE = "ranks-collective-wait"  # the job's communication finding
DEMO_EXPECTED = {  # as bench/verdicts.py: gpu_bound computes on the CPU without a GPU
    "dataloader_bound": "dataloader-bound",
    "io_bound": "io-bound",
    "cpu_bound": "cpu-bound",
    "gpu_bound": "cpu-bound",
    "launch_bound": "cpu-bound",
}
FEATURES = (
    "data_wait_share",
    "data_wait_queue_share",
    "data_wait_fetch_share",
    "fetch_cpu_share",
    "loop_cpu_share",
    "storage_wait_share",
    "storage_wait_async_share",
    "main_running_share",
    "main_disk_share",
    "main_sleep_share",
    "main_sync_share",
    "workers_running_fraction",
    "workers_disk_fraction",
    "workers_other_wait_fraction",
    "input_other_wait_share",
    "worker_count",
)
FINAL = re.compile(r"^demo (\S+): done, (\d+) steps in ([\d.]+) s, ([\d.]+) steps/s$", re.MULTILINE)
RELIEF_THRESHOLD = 1.5


def constant_of(path: Path, name: str) -> str | None:
    """A module-level string (or integer, as its text) constant ``NAME = ...`` of a scenario file (read
    with ast, not imported)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, (str, int))
            and not isinstance(node.value.value, bool)
        ):
            return str(node.value.value)
    return None


def straggler_of(path: Path) -> int | None:
    """A distributed scenario's ``STRAGGLER = <rank>`` (``None``: no rank paces the job)."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "STRAGGLER" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, int)
        ):
            return node.value.value
    return None


def expected_of(path: Path) -> str | None:
    """The scenario's ``EXPECTED = "<label>"``; None when it has none (a scenario written for
    another test: the compile and trial ones name findings or take trials, not a label).

    Raises SystemExit: an ``EXPECTED`` that is not one of the labels."""
    label = constant_of(path, "EXPECTED")
    if label is None:
        return None
    if label not in LABELS:
        raise SystemExit(f"scenarios.py: error: {path}: EXPECTED = {label!r} is not one of {', '.join(LABELS)}")
    return str(label)


def discover(only: str | None, with_demos: bool, distributed: bool = True) -> dict[str, tuple[Path, str]]:
    """name -> (script, expected label): every scenario with an ``EXPECTED`` label (those without
    one are not in the matrix; named in ``only`` they are an error)."""
    scripts = [p for p in sorted(SCEN_DIR.glob("*.py")) if not p.stem.startswith("_")]
    found = {p.stem: (p, label) for p in scripts if (label := expected_of(p)) is not None}
    unlabelled = [p.stem for p in scripts if p.stem not in found]
    if distributed:
        for p in sorted(DIST_DIR.glob("*.py")):
            label = expected_of(p) if not p.stem.startswith("_") else None
            if label is not None:
                for launcher in LAUNCHERS:
                    found[f"distributed/{p.stem}@{launcher}"] = (p, label)
    if with_demos:
        for name, label in DEMO_EXPECTED.items():
            found[f"demo/{name}"] = (DEMO_DIR / f"{name}.py", label)
    if only:
        wanted = [w.strip() for w in only.split(",") if w.strip()]
        bare = [w for w in wanted if w in unlabelled]
        if bare:
            raise SystemExit(
                f"scenarios.py: error: {', '.join(bare)}: no EXPECTED = '<label>' constant (not a label scenario)"
            )
        unknown = [w for w in wanted if w not in found]
        if unknown:
            raise SystemExit(f"scenarios.py: error: unknown scenario(s) {', '.join(unknown)}; have {', '.join(found)}")
        found = {w: found[w] for w in wanted}
    return found


def leftovers(script: Path) -> list[int]:
    """PIDs of processes still running the script (should be none after a run)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = (Path("/proc") / entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.decode(errors="replace") == str(script) for part in cmd):
            pids.append(int(entry))
    return pids


def steps_per_s(script: Path, seconds: float, relieve: bool) -> float:
    cmd = [sys.executable, str(script), "--seconds", str(seconds)] + (["--relieve"] if relieve else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 180, cwd=REPO, check=False)
    match = FINAL.search(proc.stderr)
    if proc.returncode != 0 or match is None:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {last}")
    return float(match.group(4))


def check_relief(scen: dict[str, tuple[Path, str]], seconds: float) -> int:
    print(f"{'scenario':<24} {'expected':<17} {'default':>9} {'relieved':>9} {'ratio':>7}")
    bad = 0
    for name, (script, expected) in scen.items():
        try:
            base = steps_per_s(script, seconds, relieve=False)
            rel = steps_per_s(script, seconds, relieve=True)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"{name:<24} ERROR {e}")
            bad += 1
            continue
        ratio = rel / base if base > 0 else float("inf")
        verdict = "PASS" if ratio >= RELIEF_THRESHOLD else "FAIL"
        bad += verdict == "FAIL"
        print(f"{name:<24} {expected:<17} {base:9.1f} {rel:9.1f} {ratio:6.1f}x {verdict}", flush=True)
    return 1 if bad else 0


def training(name: str, script: Path, seconds: float) -> list[str]:
    """The training's command line (a distributed scenario under its launcher, its ``RANKS``
    ranks, 2 when it names none)."""
    args = [str(script), "--seconds", str(seconds)]
    if name.endswith("@torchrun"):
        ranks = constant_of(script, "RANKS") or "2"
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", ranks, *args]
    return [sys.executable, *args]


def job_label(report: dict[str, Any]) -> str:
    """The label scored: the verdict's, or ``communication-bound`` when the job's first finding is
    the communication finding (torchwatch puts it first when no rank paces the job and the ranks
    wait on each other >= 20 % of the step; the verdict's label is then ``undetermined``, or the
    rank's own when the ranks wait less than half their step)."""
    label = str(report.get("verdict", {}).get("label", "?"))
    findings = [f.get("rule") for f in report.get("findings", [])]
    if findings[:1] == [COMM_RULE]:
        return "communication-bound"
    return label


def watch(name: str, script: Path, duration: float) -> dict[str, object]:
    """One headless torchwatch run; returns label, confidence, features and the paths of kept files."""
    with tempfile.TemporaryDirectory() as tmp:
        out, trace = Path(tmp) / "report.json", Path(tmp) / "trace.jsonl"
        cmd = [
            sys.executable, "-m", "torchwatch", "run", "--headless",
            "--duration", str(duration), "--json", str(out), "--trace", str(trace),
            "--", *training(name, script, duration + 60),
        ]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 120, cwd=REPO, check=False)
        wall = time.monotonic() - t0
        time.sleep(0.5)
        left = leftovers(script)
        if not out.exists():
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            return {"label": "ERROR", "confidence": 0.0, "features": {}, "error": tail, "wall": wall, "left": left}
        report = json.loads(out.read_text())
        verdict = report.get("verdict", {})
        straggler = report.get("straggler")
        result: dict[str, object] = {
            "label": job_label(report),
            "straggler": straggler.get("rank") if isinstance(straggler, dict) else None,
            "ranks": len(report.get("ranks") or []),
            "confidence": float(verdict.get("confidence") or 0.0),
            "summary": verdict.get("summary", ""),
            "findings": [f.get("rule") for f in report.get("findings", [])],
            "features": report.get("features", {}),
            "exit_code": proc.returncode,
            "wall": wall,
            "left": left,
            "_report": out.read_text(),
            "_trace": trace.read_text() if trace.exists() else "",
        }
        return result


def keep(name: str, run: int, result: dict[str, object]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"{name.replace('/', '_')}-run{run}-{time.strftime('%Y%m%d-%H%M%S')}"
    Path(f"{stem}.json").write_text(str(result["_report"]))
    Path(f"{stem}.trace.jsonl").write_text(str(result["_trace"]))
    return stem


def fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    return "-" if v is None else str(v)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="torchwatch runs per scenario (default 3)")
    parser.add_argument("--duration", type=float, default=25.0, help="torchwatch --duration (default 25)")
    parser.add_argument("--only", help="comma-separated subset of scenarios")
    parser.add_argument("--with-demos", action="store_true", help="also score the four demos' default variants")
    parser.add_argument(
        "--check-relief", action="store_true", help="measure --relieve speedups instead (no torchwatch)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per --check-relief run (default 10)")
    parser.add_argument("--json", metavar="PATH", help="also write every run's result as JSON here")
    parser.add_argument("--no-distributed", action="store_true", help="leave the 2-rank scenarios out")
    args = parser.parse_args()
    scen = discover(args.only, args.with_demos, not args.no_distributed)

    if args.check_relief:
        return check_relief(scen, args.seconds)

    # Warm-up: creates data files (first run) so the watched runs start training at once.
    for script, _ in scen.values():
        subprocess.run([sys.executable, str(script), "--seconds", "0.5"], capture_output=True, cwd=REPO, check=False)

    results: dict[str, list[dict[str, object]]] = {}
    for run in range(1, args.runs + 1):
        for name, (script, expected) in scen.items():
            r = watch(name, script, args.duration)
            results.setdefault(name, []).append(r)
            ok = r["label"] == expected
            line = f"run {run} {name:<24} expected {expected:<17} got {r['label']:<17} conf {r['confidence']:.2f} "
            if name.startswith("distributed/"):
                want_rank = straggler_of(script)
                want_ranks = int(constant_of(script, "RANKS") or "2")  # all the job's ranks read
                r["straggler_ok"] = r.get("straggler") == want_rank and r.get("ranks") == want_ranks
                ok = ok and bool(r["straggler_ok"])
                line += f"straggler {r.get('straggler')} (expected {want_rank}), {r.get('ranks')} ranks "
            line += "OK" if ok else "WRONG"
            sub = constant_of(script, "SUB_CAUSE")  # optional: the finding that names the sub-cause
            if sub is not None:
                r["sub_cause_found"] = sub in (r.get("findings") or [])
                line += f"  sub-cause {sub}: {'found' if r['sub_cause_found'] else 'MISSING'}"
            if r.get("left"):
                line += f"  LEFTOVER PIDS {r['left']}"
            if r.get("error"):
                line += f"  ({r['error']})"
            print(line, flush=True)
            if not ok and "_report" in r:
                stem = keep(name, run, r)
                feats = r["features"] if isinstance(r["features"], dict) else {}
                print(f"    kept {stem}.json and {stem}.trace.jsonl; findings {r['findings']}")
                print("    " + ", ".join(f"{k}={fmt(feats.get(k))}" for k in FEATURES), flush=True)

    cols = list(LABELS) + sorted({str(r["label"]) for rs in results.values() for r in rs} - set(LABELS))
    matrix: dict[str, dict[str, int]] = {}
    total = correct = 0
    for name, rs in results.items():
        expected = scen[name][1]
        for r in rs:
            matrix.setdefault(expected, {}).setdefault(str(r["label"]), 0)
            matrix[expected][str(r["label"])] += 1
            total += 1
            correct += r["label"] == expected and r.get("straggler_ok", True) is True
    width = max(len(c) for c in cols) + 1
    print("\nconfusion matrix (rows: expected, columns: given)")
    print(f"{'':<20}" + "".join(f"{c:>{width}}" for c in cols))
    for exp in LABELS:
        if exp in matrix:
            print(f"{exp:<20}" + "".join(f"{matrix[exp].get(c, 0):>{width}}" for c in cols))
    print(f"\naccuracy: {correct}/{total} = {100.0 * correct / max(total, 1):.1f}%")
    flipped = {n: [str(r["label"]) for r in rs] for n, rs in results.items() if len({r["label"] for r in rs}) > 1}
    if flipped:
        print("flipped across runs: " + "; ".join(f"{n}: {', '.join(ls)}" for n, ls in flipped.items()))
    else:
        print("flipped across runs: none")
    subs = [bool(r["sub_cause_found"]) for rs in results.values() for r in rs if "sub_cause_found" in r]
    if subs:
        print(f"sub-causes named: {sum(subs)}/{len(subs)}")
    if args.json:
        slim = {n: [{k: v for k, v in r.items() if not k.startswith("_")} for r in rs] for n, rs in results.items()}
        Path(args.json).write_text(json.dumps({"expected": {n: s[1] for n, s in scen.items()}, "runs": slim}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

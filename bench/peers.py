"""torchwatch beside TraceML on the same demos: what each costs the training and what it says.

    python bench/peers.py --traceml /path/to/venv/bin/traceml [--pairs 3] [--seconds 20]
        [--demos cpu_bound,dataloader_bound] [--json out.json]

TraceML (``traceml-ai``, https://github.com/traceopt-ai/traceml) is the nearest peer: a launcher
(``traceml run``: torchrun with one process, and an aggregator process) and instrumentation inside
the training. It needs an environment of its own with torch (``python -m venv V && V/bin/pip
install torch==2.13.0 traceml-ai``); torchwatch runs from this checkout's interpreter. The code its
quick start asks for in a custom loop is added by ``bench/_traceml_demo.py`` (``traceml.init`` and a
``trace_step`` around each step), not by editing the demos.

Each round runs the demo three ways, in an order that rotates from round to round (a drifting
machine then favours no arm): alone (``bench/_stepclock.py``), under ``torchwatch run
--headless``, and under ``traceml run`` (its default, summary mode). For each arm and round:

- steps/s over the whole run (the demo's own last line) and its ratio to the round's alone run;
- CPU outside the training: everything the arm started (the tool's processes: torchwatch, its
  guard and py-spy; TraceML's launcher, torchrun's agent and its aggregator) less the training's
  own, as % of one core over the run's wall time;
- CPU inside the training: the training's CPU per step (its process and DataLoader workers,
  written at its exit) against the round's alone run (a tool that instruments the loop costs there);
- the tool's resident memory (its processes' RSS summed, the peak of 0.5 s samples), MiB;
- the verdict and when: torchwatch's first status line with the demo's label (s after the start);
  TraceML's summary verdict, printed at the end of the run.

Medians over the rounds are printed side by side, with each ratio's spread (min-max). On 2 shared
cores the ratios are noisy (a demo alone varies 8-10 % run to run): a few rounds rank neither tool
on throughput; the CPU figures are steadier.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
_DONE = re.compile(r"demo \S+: done, (\d+) steps in ([\d.]+) s, ([\d.]+) steps/s")
_STATUS = re.compile(r"torchwatch \[\s*(\d+)s\] (\S+)")
_TRACEML_VERDICT = re.compile(r"Verdict:\s*([A-Z][A-Z_-]+)")
# The cause each demo was built with (docs/demos.md), in each tool's words.
EXPECTED = {
    "cpu_bound": ("cpu-bound", ("COMPUTE-BOUND", "COMPUTE_BOUND")),
    "dataloader_bound": ("dataloader-bound", ("INPUT-BOUND", "INPUT_BOUND")),
    "io_bound": ("io-bound", ("INPUT-BOUND", "INPUT_BOUND")),
}
ARMS = ("alone", "torchwatch", "traceml")


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class _ToolMemory:
    """Samples, every 0.5 s, the RSS of the arm's processes other than the training (the process
    whose PID the step clock wrote to ``pid_file``, and its descendants); keeps the peak of their sum."""

    def __init__(self, root: int, pid_file: Path) -> None:
        self.root, self.pid_file, self.peak = root, pid_file, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                procs = [psutil.Process(self.root), *psutil.Process(self.root).children(recursive=True)]
            except psutil.Error:
                continue
            training: set[int] = set()
            try:
                pid = int(self.pid_file.read_text())
                training = {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}
            except (OSError, ValueError, psutil.Error):
                continue  # the training has not started yet, or has ended
            total = 0
            for p in procs:
                if p.pid in training:
                    continue
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    continue
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5.0)
        return self.peak


def run_arm(arm: str, demo: str, seconds: float, traceml: str | None) -> dict[str, Any]:
    """One run of ``demo`` by ``arm``; its figures (see the module's docstring)."""
    with tempfile.TemporaryDirectory(prefix="tw-peers-") as tmp:
        clock = str(Path(tmp) / "steps.bin")
        script = [str(REPO / "demo" / f"{demo}.py"), "--device", "cpu", "--seconds", str(seconds)]
        report = Path(tmp) / "report.json"
        if arm == "alone":
            cmd = [sys.executable, str(REPO / "bench" / "_stepclock.py"), clock, *script]
        elif arm == "torchwatch":
            inner = [sys.executable, str(REPO / "bench" / "_stepclock.py"), clock, *script]
            cmd = [sys.executable, "-m", "torchwatch", "run", "--headless", "--json", str(report), "--", *inner]
        else:
            assert traceml is not None
            cmd = [traceml, "run", str(REPO / "bench" / "_traceml_demo.py"), "--logs-dir", str(Path(tmp) / "logs"),
                   "--run-name", f"peers-{demo}", "--args", clock, *script]  # fmt: skip
        cpu0, t0 = _children_cpu_s(), time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)
        memory = _ToolMemory(proc.pid, Path(clock + ".pid"))
        out, err = proc.communicate()
        wall, total_cpu = time.monotonic() - t0, _children_cpu_s() - cpu0
        tool_rss = memory.stop()
        text = out + "\n" + err
        done = _DONE.search(text)
        if proc.returncode != 0 or done is None:
            raise SystemExit(f"bench/peers.py: {arm} on {demo} failed (exit {proc.returncode}): {text.strip()[-800:]}")
        steps = int(done.group(1))
        training_cpu = float(Path(clock + ".cpu").read_text())
        row: dict[str, Any] = {
            "steps_per_s": float(done.group(3)),
            "steps": steps,
            "wall_s": round(wall, 2),
            "training_cpu_s": round(training_cpu, 3),
            "training_cpu_per_step_ms": 1000 * training_cpu / max(1, steps),
            "outside_cpu_s": round(total_cpu - training_cpu, 3),
            "tool_rss_mib": tool_rss / 2**20 if arm != "alone" else 0.0,
        }
        want_tw, want_tm = EXPECTED.get(demo, ("", ()))
        if arm == "torchwatch":
            first = next((int(m.group(1)) for m in _STATUS.finditer(err) if m.group(2) == want_tw), None)
            final = json.loads(report.read_text())["verdict"]["label"] if report.exists() else None
            row.update(verdict=final, right=final == want_tw, right_after_s=first)
        elif arm == "traceml":
            m = _TRACEML_VERDICT.search(text)
            verdict = m.group(1) if m else None
            row.update(
                verdict=verdict, right=verdict in want_tm, right_after_s=round(wall, 1) if verdict in want_tm else None
            )
        return row


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def bench(demo: str, pairs: int, seconds: float, traceml: str) -> dict[str, Any]:
    """``pairs`` rounds of the three arms on ``demo``, the order rotating; per-round rows and medians."""
    rounds = []
    for r in range(pairs):
        order = ARMS[r % 3 :] + ARMS[: r % 3]
        rows = {arm: run_arm(arm, demo, seconds, traceml) for arm in order}
        print(f"  round {r + 1}: " + ", ".join(f"{a} {rows[a]['steps_per_s']:.1f} steps/s" for a in order), flush=True)
        rounds.append(rows)
    return summarize(demo, rounds)


def summarize(demo: str, rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Each tool's figures against the alone run of its round, and their medians.

    What the arm used outside the training is less the alone run's own (the training's interpreter
    tearing down after its exit hook wrote its CPU: ~0.7 CPU-s here), so that it is the tool's."""
    for rows in rounds:
        alone = rows["alone"]
        for arm in ("torchwatch", "traceml"):
            row = rows[arm]
            row["ratio"] = row["steps_per_s"] / alone["steps_per_s"]
            row["inside_pct"] = 100 * (row["training_cpu_per_step_ms"] / alone["training_cpu_per_step_ms"] - 1)
            row["outside_cpu_pct"] = 100 * max(0.0, row["outside_cpu_s"] - alone["outside_cpu_s"]) / row["wall_s"]
            row["extra_wall_s"] = row["wall_s"] - alone["wall_s"]
    summary: dict[str, Any] = {}
    for arm in ("torchwatch", "traceml"):
        rows = [rd[arm] for rd in rounds]
        ratios = [x["ratio"] for x in rows]
        summary[arm] = {
            "ratio": _median(ratios),
            "ratio_spread": (min(ratios), max(ratios)),
            "outside_cpu_pct": _median([x["outside_cpu_pct"] for x in rows]),
            "inside_pct": _median([x["inside_pct"] for x in rows]),
            "tool_rss_mib": _median([x["tool_rss_mib"] for x in rows]),
            "extra_wall_s": _median([x["extra_wall_s"] for x in rows]),
            "right": sum(bool(x["right"]) for x in rows),
            "right_after_s": _median([x["right_after_s"] for x in rows if x["right_after_s"] is not None]),
            "verdicts": sorted({str(x["verdict"]) for x in rows}),
        }
    summary["alone_steps_per_s"] = _median([rd["alone"]["steps_per_s"] for rd in rounds])
    return {"demo": demo, "rounds": rounds, "summary": summary}


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--traceml", help="the traceml command of an environment with torch (needed unless --from-json)"
    )
    parser.add_argument("--pairs", type=int, default=3, help="rounds of the three arms per demo")
    parser.add_argument("--seconds", type=float, default=20.0, help="each run's training time, s")
    parser.add_argument("--demos", default="cpu_bound,dataloader_bound")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--from-json", type=Path, default=None, help="print the figures of an earlier --json again")
    args = parser.parse_args()
    results = []
    if args.from_json is not None:
        results = [summarize(res["demo"], res["rounds"]) for res in json.loads(args.from_json.read_text())]
    for demo in args.demos.split(",") if args.from_json is None else []:
        print(f"{demo}: {args.pairs} rounds of {args.seconds:g} s (alone, torchwatch, TraceML; order rotating)")
        results.append(bench(demo, args.pairs, args.seconds, args.traceml))
    print()
    print(f"{'demo':17s} {'tool':11s} {'steps/s ratio (spread)':25s} {'CPU outside':>12s} {'CPU inside':>11s} "
          f"{'RSS MiB':>8s} {'+wall':>6s}  verdict (right runs, first right at)")  # fmt: skip
    for res in results:
        s = res["summary"]
        for arm in ("torchwatch", "traceml"):
            a = s[arm]
            lo, hi = a["ratio_spread"]
            print(
                f"{res['demo']:17s} {arm:11s} {_fmt(a['ratio'], '.3f')} ({lo:.3f}-{hi:.3f})       "
                f"{_fmt(a['outside_cpu_pct'], '10.1f')} % {_fmt(a['inside_pct'], '+9.1f')} % "
                f"{_fmt(a['tool_rss_mib'], '8.0f')} {_fmt(a['extra_wall_s'], '5.1f')}s  "
                f"{'/'.join(a['verdicts'])} ({a['right']}/{len(res['rounds'])}, "
                f"{_fmt(a['right_after_s'], '.0f')} s{' (its summary, at exit)' if arm == 'traceml' else ''})"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

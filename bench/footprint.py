"""What torchwatch itself uses: each sampler's CPU share, and the whole tool on a 72-process tree.

    python bench/footprint.py [--seconds 20] [--json out.json]

1. Per sampler, alone, on ``demo/dataloader_bound.py`` (hook pre-loaded): CPU % of one core
   (this process's threads, plus py-spy's children reaped with wait4) at several rates, so the
   defaults are chosen from data.
2. The whole tool (``torchwatch attach --headless``, defaults) on a synthetic tree of 8 training
   processes x 8 workers (``bench/_tree.py``): CPU % of one core and peak RSS, from the report's
   ``self`` key; then again with per-rank data on: the 8 ranks train with the hook pre-loaded
   (``_tree.py --torch``), so every rank's hook is read and every rank diagnosed. Budget
   (issue 6): <= 15 % of a core. ``--tree-only`` runs part 2 alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
_CLK_TCK = float(os.sysconf("SC_CLK_TCK"))
sys.path.insert(0, str(REPO))

from torchwatch.analysis.rules_engine import load_rules  # noqa: E402
from torchwatch.watch.lifecycle import hook_env  # noqa: E402
from torchwatch.watch.session import Session, SessionOptions  # noqa: E402


def _cpu_s() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def sampler_cost(name: str, opts: SessionOptions, seconds: float, pid: int, interval: float | None = None) -> float:
    """CPU % of one core used by one source sampling ``pid`` for ``seconds`` (``interval``: s
    between samples, default the source's own)."""
    s = Session(pid, [], opts)
    src = {"psutil": s.proc, "hook": s.hook, "py-spy": s.pyspy}.get(name) or next(
        x for x in s.sources if x.name == name
    )
    if interval is not None:
        src.interval = interval
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            s.store.add(src.sample(t0))
            stop.wait(max(0.0, src.interval - (time.monotonic() - t0)))

    if name == "threads":
        s.proc.sample(time.monotonic())  # roles and tree, as the session would have them
    c0, p0, t0 = _cpu_s(), s.pyspy.cpu_s, time.monotonic()
    th = threading.Thread(target=loop, daemon=True)
    th.start()
    time.sleep(seconds)
    stop.set()
    th.join(10)
    src.close()
    used = (_cpu_s() - c0) + (s.pyspy.cpu_s - p0)
    return 100.0 * used / (time.monotonic() - t0)


def _thread_cpu_s(native_id: int) -> float:
    """CPU s (user + system) of one thread of this process, from ``/proc/self/task/TID/stat``."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def session_shares(seconds: float, pid: int, warmup: float = 0.0) -> dict[str, float]:
    """A whole session (every source and the analysis thread, rules loaded) on ``pid``: each
    thread's CPU % of one core over ``seconds`` after ``warmup`` s, py-spy's children, and the
    whole process (``all``: threads + the interpreter's main thread + py-spy).

    Per-thread CPU comes from ``/proc/self/task/TID/stat`` (clock ticks, 10 ms each), so shares
    under ~0.05 % of a core read as 0 over 20 s.
    """
    s = Session(pid, load_rules(), SessionOptions())
    s.start()
    time.sleep(warmup)
    threads = {t.name.removeprefix("torchwatch-"): t.native_id for t in s._threads if t.native_id}
    c0, p0, t0 = _cpu_s(), s.pyspy.cpu_s, time.monotonic()
    before = {name: _thread_cpu_s(tid) for name, tid in threads.items()}
    sampling = []
    end = t0 + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        sampling.append(s.cadence.mode)
    after = {name: _thread_cpu_s(tid) for name, tid in threads.items()}
    wall = time.monotonic() - t0
    py_spy = s.pyspy.cpu_s - p0
    total = _cpu_s() - c0 + py_spy
    s.stop()
    out = {name: 100.0 * (after[name] - before[name]) / wall for name in threads}
    out["py-spy children"] = 100.0 * py_spy / wall
    out["all"] = 100.0 * total / wall
    out["steady_share"] = sampling.count("steady") / max(1, len(sampling))
    return out


def whole_tool_on_tree(seconds: float, ranks: bool = False) -> dict[str, Any]:
    """``torchwatch attach --headless`` on bench/_tree.py: the report's ``self`` key.

    ``ranks``: the tree's ranks train (``--torch``) with the hook pre-loaded, so torchwatch reads
    every rank's hook and diagnoses each (per-rank data on); ``ranks_read`` says how many ranks
    the report compared.
    """
    cmd = [sys.executable, str(REPO / "bench" / "_tree.py"), "--seconds", str(seconds + 30)]
    import psutil

    tree = subprocess.Popen(cmd + (["--torch"] if ranks else []))
    try:
        time.sleep(15 if ranks else 5)  # 8 ranks importing torch on a small machine
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "r.json"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "torchwatch",
                    "attach",
                    "--headless",
                    "--duration",
                    str(seconds),
                    "--json",
                    str(out),
                    str(tree.pid),
                ],
                capture_output=True,
                text=True,
                cwd=REPO,
                check=False,
            )
            report = json.loads(out.read_text())
        children = psutil.Process(tree.pid).children(recursive=True)
        procs = 1 + len(children)
    finally:
        # only what this benchmark started: the tree's root and its own descendants, by PID
        for child in psutil.Process(tree.pid).children(recursive=True) if tree.poll() is None else []:
            with contextlib.suppress(psutil.Error):
                child.terminate()
        tree.terminate()
        tree.wait()
    return {"processes": procs, "ranks_read": len(report.get("ranks") or []), **report["self"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--tree-only", action="store_true", help="only the whole tool on the 8 x 8 trees")
    parser.add_argument("--no-tree", action="store_true", help="leave the 8 x 8 trees out")
    parser.add_argument("--session-only", action="store_true", help="only the whole session's per-thread shares")
    parser.add_argument(
        "--warmup",
        type=float,
        default=25.0,
        help="seconds the whole session runs before measuring (default 25: steady)",
    )
    args = parser.parse_args()
    if args.tree_only:
        return trees(args.seconds, [], args.json)
    fast = SessionOptions()
    configs: list[tuple[str, str, SessionOptions, float | None]] = [
        ("psutil", "1 Hz", fast, None),
        ("psutil", "0.5 Hz", fast, 2.0),
        ("threads", "10 Hz", SessionOptions(thread_interval_s=0.1), None),
        ("threads", "5 Hz", SessionOptions(thread_interval_s=0.2), None),
        ("threads", "2 Hz", SessionOptions(thread_interval_s=0.5), None),
        ("hook", "2 Hz", fast, None),
        ("hook", "1 Hz", fast, 1.0),
        ("nvml", "1 Hz", fast, None),
        ("py-spy", "20 Hz, 3 s chunks", SessionOptions(pyspy_rate=20, pyspy_chunk_s=3.0), None),
        ("py-spy", "10 Hz, 3 s chunks", SessionOptions(pyspy_rate=10, pyspy_chunk_s=3.0), None),
        ("py-spy", "10 Hz, 6 s chunks", SessionOptions(pyspy_rate=10, pyspy_chunk_s=6.0), None),
        ("py-spy", "5 Hz, 10 s chunks", SessionOptions(pyspy_rate=5, pyspy_chunk_s=10.0), None),
    ]
    demo = [sys.executable, str(REPO / "demo" / "dataloader_bound.py"), "--device", "cpu", "--seconds", "600"]
    target = subprocess.Popen(demo, cwd=REPO, env=hook_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        time.sleep(8)  # past imports
        print(f"{'sampler':8s} {'rate':18s} {'CPU % of a core':>16s}   (alone, {args.seconds:g} s on dataloader_bound)")
        for name, rate, opts, interval in [] if args.session_only else configs:
            pct = sampler_cost(name, opts, args.seconds, target.pid, interval)
            rows.append({"sampler": name, "rate": rate, "cpu_pct_of_core": round(pct, 2)})
            print(f"{name:8s} {rate:18s} {pct:16.2f}", flush=True)
        shares = session_shares(args.seconds, target.pid, warmup=args.warmup)
        print(f"\nwhole session in this process, defaults, per thread ({args.seconds:g} s after {args.warmup:g} s):")
        for name, pct in shares.items():
            print(f"  {name:18s} {pct:6.2f}" + ("" if name == "steady_share" else " % of a core"))
        rows.append({"sampler": "session", "shares": shares})
    finally:
        target.kill()
        target.wait()
    if args.no_tree or args.session_only:
        if args.json:
            Path(args.json).write_text(json.dumps({"samplers": rows}, indent=2))
        return 0
    return trees(args.seconds, rows, args.json)


def trees(seconds: float, rows: list[dict[str, Any]], json_path: str | None) -> int:
    """The whole tool on the 8 x 8 tree, without and with per-rank data (hooked, training ranks)."""
    out = {}
    for key, ranks in (("tree", False), ("tree_ranks", True)):
        tree = out[key] = whole_tool_on_tree(seconds + 10, ranks)
        what = f"{tree['ranks_read']} ranks read and diagnosed" if ranks else "no hooks"
        print(
            f"\nwhole tool, headless, on a tree of {tree['processes']} processes ({what}): "
            f"{tree['cpu_pct_of_core']:.1f} % of a core "
            f"(budget 15 %), peak RSS {tree['max_rss_bytes'] / 1e6:.0f} MB",
            flush=True,
        )
    if json_path:
        Path(json_path).write_text(json.dumps({"samplers": rows, **out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
3. The Prometheus exporter (``--prometheus``), scraped once a second as a Prometheus server with a
   1 s scrape interval would: the whole tool on the 8-rank tree again with the exporter on, beside
   the same run without it (the difference is the exporter's cost, within the machine's noise),
   the scrapes' size and latency, and the CPU one scrape costs (rendering an Observation of the
   8 ranks, measured in-process over 200 renders: at one scrape a second, that CPU time per
   second is the exporter's share of a core). ``--exporter-only`` runs part 3 alone.
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
import urllib.request
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
    src = s.sources.get(name)
    assert src is not None, f"no source named {name}"
    if interval is not None:
        src.interval = interval
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            s.store.add(s.read(src, t0))  # py-spy and the hook read the session's focus process
            stop.wait(max(0.0, src.interval - (time.monotonic() - t0)))

    if name == "threads":
        s.sources.tree_source.sample(time.monotonic())  # roles and tree, as the session would have them
    c0, p0, t0 = _cpu_s(), s.sources.helper_cpu_s(), time.monotonic()
    th = threading.Thread(target=loop, daemon=True)
    th.start()
    time.sleep(seconds)
    stop.set()
    th.join(10)
    src.close()
    used = (_cpu_s() - c0) + (s.sources.helper_cpu_s() - p0)
    return 100.0 * used / (time.monotonic() - t0)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Scraper:
    """Scrapes ``url`` once a second in a thread, as a Prometheus server would: count, bytes, latency."""

    def __init__(self, url: str) -> None:
        self.url, self.failures = url, 0
        self.latencies: list[float] = []
        self.sizes: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    body = r.read()
            except OSError:
                # before the first answer torchwatch is still starting (imports, the hook's injection)
                self.failures += bool(self.latencies)
                continue
            self.latencies.append(time.monotonic() - t0)
            self.sizes.append(len(body))

    def stop(self) -> dict[str, Any]:
        """Stop scraping; the figures."""
        self._stop.set()
        self._thread.join(10)
        lat = sorted(self.latencies) or [float("nan")]
        return {
            "scrapes": len(self.latencies),
            "failed": self.failures,  # after the first answer
            "bytes": max(self.sizes, default=0),
            "latency_ms_p50": round(1000 * lat[len(lat) // 2], 1),
            "latency_ms_max": round(1000 * lat[-1], 1),
        }


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
    c0, p0, t0 = _cpu_s(), s.sources.helper_cpu_s(), time.monotonic()
    before = {name: _thread_cpu_s(tid) for name, tid in threads.items()}
    sampling = []
    end = t0 + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        sampling.append(s.pacer.cadence.mode)
    after = {name: _thread_cpu_s(tid) for name, tid in threads.items()}
    wall = time.monotonic() - t0
    py_spy = s.sources.helper_cpu_s() - p0
    total = _cpu_s() - c0 + py_spy
    s.stop()
    out = {name: 100.0 * (after[name] - before[name]) / wall for name in threads}
    out["py-spy children"] = 100.0 * py_spy / wall
    out["all"] = 100.0 * total / wall
    out["steady_share"] = sampling.count("steady") / max(1, len(sampling))
    return out


def whole_tool_on_tree(seconds: float, ranks: bool = False, exporter: bool = False) -> dict[str, Any]:
    """``torchwatch attach --headless`` on bench/_tree.py: the report's ``self`` key.

    ``ranks``: the tree's ranks train (``--torch``) with the hook pre-loaded, so torchwatch reads
    every rank's hook and diagnoses each (per-rank data on); ``ranks_read`` says how many ranks
    the report compared. ``exporter``: with ``--prometheus``, scraped once a second (``scrape``:
    the scrapes' figures).
    """
    cmd = [sys.executable, str(REPO / "bench" / "_tree.py"), "--seconds", str(seconds + 30)]
    import psutil

    tree = subprocess.Popen(cmd + (["--torch"] if ranks else []))
    try:
        time.sleep(15 if ranks else 5)  # 8 ranks importing torch on a small machine
        scrape: dict[str, Any] = {}
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "r.json"
            port = _free_port()
            extra = ["--prometheus", f"127.0.0.1:{port}"] if exporter else []
            attach = subprocess.Popen(
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
                    *extra,
                    str(tree.pid),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=REPO,
            )
            scraper = Scraper(f"http://127.0.0.1:{port}/metrics") if exporter else None
            attach.wait()
            if scraper is not None:
                scrape = scraper.stop()
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
    return {"processes": procs, "ranks_read": len(report.get("ranks") or []), **report["self"], "scrape": scrape}


def render_cost(renders: int = 200) -> dict[str, Any]:
    """CPU per scrape: an in-process session on the 8-rank tree, its latest Observation rendered
    to the exposition text ``renders`` times (thread CPU time)."""
    import psutil
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from torchwatch.analysis.rules_engine import load_rules
    from torchwatch.faces.prometheus import ObservationCollector

    cmd = [sys.executable, str(REPO / "bench" / "_tree.py"), "--seconds", "120", "--torch"]
    tree = subprocess.Popen(cmd)
    session = None
    try:
        time.sleep(15)
        session = Session(tree.pid, load_rules(), SessionOptions())
        session.start()
        deadline = time.monotonic() + 60
        obs = session.latest_observation
        while time.monotonic() < deadline and (obs is None or len(obs.ranks) < 8):
            time.sleep(1)
            obs = session.latest_observation
        assert obs is not None, "no Observation in 60 s"
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ObservationCollector(lambda: [obs], "bench"))
        t0 = time.thread_time()
        for _ in range(renders):
            text = generate_latest(registry)
        cpu_ms = 1000 * (time.thread_time() - t0) / renders
        return {"ranks": len(obs.ranks), "cpu_ms_per_scrape": round(cpu_ms, 3), "bytes": len(text)}
    finally:
        if session is not None:
            session.stop()
        for child in psutil.Process(tree.pid).children(recursive=True) if tree.poll() is None else []:
            with contextlib.suppress(psutil.Error):
                child.terminate()
        tree.terminate()
        tree.wait()


def exporter(seconds: float) -> dict[str, Any]:
    """Part 3: the exporter's cost, scraped once a second (see the module docstring)."""
    without = whole_tool_on_tree(seconds + 10, ranks=True)
    with_exp = whole_tool_on_tree(seconds + 10, ranks=True, exporter=True)
    render = render_cost()
    sc = with_exp["scrape"]
    diff = with_exp["cpu_pct_of_core"] - without["cpu_pct_of_core"]
    print(
        f"\nexporter (--prometheus, scraped once a second), whole tool on {with_exp['processes']} processes, "
        f"{with_exp['ranks_read']} ranks: {with_exp['cpu_pct_of_core']:.1f} % of a core with it, "
        f"{without['cpu_pct_of_core']:.1f} % without (difference {diff:+.1f} points, two runs apart); "
        f"peak RSS {with_exp['max_rss_bytes'] / 1e6:.0f} MB vs "
        f"{without['max_rss_bytes'] / 1e6:.0f} MB; {sc['scrapes']} scrapes ({sc['failed']} failed) of "
        f"{sc['bytes'] / 1024:.0f} KiB, latency p50 {sc['latency_ms_p50']} ms, max {sc['latency_ms_max']} ms",
        flush=True,
    )
    print(
        f"one scrape of {render['ranks']} ranks renders {render['bytes'] / 1024:.0f} KiB in "
        f"{render['cpu_ms_per_scrape']:.2f} ms of CPU: {render['cpu_ms_per_scrape'] / 10:.2f} % of a core at one "
        "scrape a second (the ranks with steps in the window when it was taken)",
        flush=True,
    )
    return {"without": without, "with": with_exp, "render": render}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--tree-only", action="store_true", help="only the whole tool on the 8 x 8 trees")
    parser.add_argument("--exporter-only", action="store_true", help="only the exporter's cost (part 3)")
    parser.add_argument("--no-tree", action="store_true", help="leave the 8 x 8 trees out")
    parser.add_argument("--session-only", action="store_true", help="only the whole session's per-thread shares")
    parser.add_argument(
        "--warmup",
        type=float,
        default=25.0,
        help="seconds the whole session runs before measuring (default 25: steady)",
    )
    args = parser.parse_args()
    if args.exporter_only:
        figures = exporter(args.seconds)
        if args.json:
            Path(args.json).write_text(json.dumps({"exporter": figures}, indent=2))
        return 0
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
    out["exporter"] = exporter(seconds)
    if json_path:
        Path(json_path).write_text(json.dumps({"samplers": rows, **out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What watching costs the training: steps/s of a demo alone vs under ``torchwatch run --headless``.

Interleaved pairs (A B A B ...) with medians, because a shared machine drifts; every pair's ratio
is printed with the pairs' spread (min-max). Also prints the CPU torchwatch and its py-spy
children used (% of one core, whole run). Rerun:

    python bench/overhead.py --pairs 5 --seconds 20 [--demos cpu_bound,dataloader_bound] [--json out.json]

Steady state (issue 16: the samplers drop to a steady cadence once the verdict settles):

    python bench/overhead.py --pairs 5 --steady-window 30 --threads 1,default --demos cpu_bound,dataloader_bound

``--steady-window S`` runs each demo under ``bench/_stepclock.py`` (every optimizer step's time) for
``--seconds`` (default 46 with a window) and counts the steps/s of both runs of a pair over the
same S seconds: from the moment the watched run's cadence went steady (its report's ``sampling``
changes, after its first step) plus 1 s, in both runs measured from their own first step. The
share of that window the watched run spent steady is printed (1.00: steady throughout).
``--threads 1,default`` repeats every demo with ``OMP_NUM_THREADS=1`` (and ``MKL_NUM_THREADS=1``:
the demo's intra-op pool is one thread, so a foreign CPU-millisecond delays one thread, not a
two-thread op that waits for its slowest half) and with torch's default.

Within one run (``--within-run``): the pairs above compare two processes, and on a shared 2-core
VM the same demo alone varies by 8-10 % from one run to the next (the same seeded work), ten times
the 1 % being measured. ``--within-run`` keeps one process: the demo runs once, its hook
pre-loaded (as ``torchwatch run`` loads it; the hook's own cost, under 1 µs a step, is in both
arms and measured by ``bench/hook_cost.py``), and the bench alternates S s alone with
``torchwatch attach --headless`` (the same session as ``run``, no injection: the hook is there).
Each watched window is S s of the steady cadence (from 1 s after it went steady); its ratio is
taken against the mean of the alone windows just before and just after it (A B A B ... A: a
drift of the machine during the pair cancels to first order):

    python bench/overhead.py --within-run --pairs 5 --steady-window 30 --threads 1,default \
        --demos cpu_bound,dataloader_bound

With ``--toggle`` there is one attach for the whole run: once it went steady, the bench freezes
torchwatch's own session (SIGSTOP: torchwatch and its py-spy children; the training is never
signalled) for each alone window and resumes it (SIGCONT) for each watched one. Nothing starts
or settles between windows, so every second is measured and windows can be short, which matters
because the demo's own speed drifts: in a 460 s stretch of dataloader_bound alone (default
threads, the hook loaded), the ratio of one window to the mean of the two around it, all three
alone, had an SD of 0.079 for 30 s windows, 0.053 for 10 s and 0.064 for 5 s: an hour of 10 s
pairs gives a standard error of 0.004, an hour of the 30 s pairs above 0.010. The attach runs
with a verdict window of 3 W (at least 10 s), so that after a resume its window still holds
readings and the cadence stays steady; each watched window also counts what torchwatch does just
after a resume (its next tick, py-spy's next sample). Both err against torchwatch:

    python bench/overhead.py --within-run --toggle --pairs 130 --steady-window 10 --threads default \
        --demos dataloader_bound      # 45 min; with windows under 30 s it also prints them grouped
                                      # into pairs of 30 s or more watched
"""

from __future__ import annotations

import argparse
import array
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
_DONE = re.compile(r"demo \S+: done, \d+ steps in [\d.]+ s, ([\d.]+) steps/s")


def _steps_per_s(stderr: str) -> float:
    m = _DONE.search(stderr)
    if not m:
        raise SystemExit(f"bench/overhead.py: no final steps/s line in: {stderr.strip()[-300:]}")
    return float(m.group(1))


def _env(threads: str) -> dict[str, str]:
    env = dict(os.environ)
    if threads != "default":
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = threads
    else:
        env.pop("OMP_NUM_THREADS", None)
        env.pop("MKL_NUM_THREADS", None)
    return env


def run_once(
    demo: str, seconds: float, watched: bool, threads: str = "default", stamps: bool = False, device: str = "cpu"
) -> dict[str, Any]:
    """One run: ``steps_per_s`` (whole run), torchwatch's own CPU + py-spy's (``cpu_pct``, % of one
    core) and its report's ``sampling`` and ``first_step_after_s`` when watched, and every
    optimizer step's monotonic time (``stamps``) when asked."""
    with tempfile.TemporaryDirectory() as tmp:
        script = [str(REPO / "demo" / f"{demo}.py"), "--device", device, "--seconds", str(seconds)]
        clock = Path(tmp) / "steps.bin"
        cmd = [sys.executable, *([str(REPO / "bench" / "_stepclock.py"), str(clock)] if stamps else []), *script]
        out = Path(tmp) / "report.json"
        if watched:
            cmd = [sys.executable, "-m", "torchwatch", "run", "--headless", "--json", str(out), "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False, env=_env(threads))
        row: dict[str, Any] = {"steps_per_s": _steps_per_s(proc.stderr)}
        if watched:
            report = json.loads(out.read_text())
            row["cpu_pct"] = float(report["self"]["cpu_pct_of_core"])
            # torchwatch's CPU s by part and py-spy's (SelfUsage.by_part), over the whole run
            row["parts"] = {**(report["self"].get("by_part") or {}), "py-spy run": report["self"]["pyspy_cpu_s"]}
            row["wall_s"] = float(report["self"]["wall_s"])
            row["sampling"] = report.get("sampling") or {}
            row["first_step_after_s"] = (report.get("hook") or {}).get("first_step_after_s")
        if stamps:
            times = array.array("d")
            times.frombytes(clock.read_bytes())
            row["stamps"] = list(times)
    return row


def steady_start(watched: dict[str, Any]) -> float | None:
    """Seconds after the watched run's first step when its cadence first went steady."""
    first = watched.get("first_step_after_s")
    changes = (watched.get("sampling") or {}).get("changes") or []
    t = next((c["t"] for c in changes if c["mode"] == "steady"), None)
    return None if t is None or first is None else max(0.0, t - first)


def steady_share(watched: dict[str, Any], start: float, end: float) -> float:
    """Share of ``[start, end]`` (seconds after watching started) the watched run spent steady."""
    changes = (watched.get("sampling") or {}).get("changes") or []
    mode, t_prev, steady = "fast", start, 0.0
    for c in changes:
        t = min(max(c["t"], start), end)
        if mode == "steady":
            steady += t - t_prev
        mode, t_prev = c["mode"], t
    if mode == "steady":
        steady += end - t_prev
    return steady / (end - start) if end > start else 0.0


def window_rate(stamps: list[float], start: float, seconds: float) -> float:
    """Steps/s over ``[first step + start, + seconds]``: the steps in it over their time span."""
    if not stamps:
        return 0.0
    a = stamps[0] + start
    inside = [t for t in stamps if a <= t <= a + seconds]
    if len(inside) < 2:
        return 0.0
    return (len(inside) - 1) / (inside[-1] - inside[0])


def pair(demo: str, seconds: float, threads: str, window: float | None, device: str = "cpu") -> dict[str, Any]:
    """One interleaved pair: the demo alone, then watched; their steps/s and ratio."""
    alone = run_once(demo, seconds, False, threads, stamps=window is not None, device=device)
    watched = run_once(demo, seconds, True, threads, stamps=window is not None, device=device)
    row = {"alone": alone["steps_per_s"], "watched": watched["steps_per_s"], "cpu_pct": watched["cpu_pct"]}
    row["parts"], row["wall_s"] = watched["parts"], watched["wall_s"]
    if window is not None:
        start = steady_start(watched)
        if start is None:  # never settled: the fast cadence throughout, over the last window
            start = max(0.0, seconds - window - 1.0)
        start += 1.0
        span = min(window, seconds - start)
        row["alone"] = window_rate(alone["stamps"], start, span)
        row["watched"] = window_rate(watched["stamps"], start, span)
        first = watched.get("first_step_after_s") or 0.0
        row["window"] = (round(start, 1), round(start + span, 1))
        row["steady_share"] = steady_share(watched, first + start, first + start + span)
    row["ratio"] = row["watched"] / row["alone"] if row["alone"] else 0.0
    return row


SETTLE_MAX_S = 20.0  # the cadence settles ~10-11 s after attach; past 20 s the window is taken at the end


def _hooked_demo(
    demo: str, threads: str, seconds: float, tmp: Path, stderr: Any, device: str = "cpu"
) -> tuple[subprocess.Popen[str], Path]:
    """``demo`` started for ``seconds`` with the hook pre-loaded (as ``torchwatch run`` loads it)
    under ``bench/_stepclock.py``; the process and the file its step times go to at exit.
    ``stderr``: ``subprocess.PIPE`` or an open file."""
    sys.path.insert(0, str(REPO))
    from torchwatch.watch.lifecycle import hook_env

    clock = tmp / "steps.bin"
    script = [str(REPO / "demo" / f"{demo}.py"), "--device", device, "--seconds", str(seconds)]
    env = {**hook_env(), **{k: v for k, v in _env(threads).items() if k.endswith("_NUM_THREADS")}}
    if threads == "default":
        env.pop("OMP_NUM_THREADS", None)
        env.pop("MKL_NUM_THREADS", None)
    target = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "_stepclock.py"), str(clock), *script],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True,
    )  # fmt: skip
    return target, clock


def within_run(demo: str, threads: str, pairs: int, window: float, device: str = "cpu") -> list[dict[str, Any]]:
    """``pairs`` watched windows in one run of ``demo`` (see the module docstring): for each, the
    steps/s alone before and after it, watched, the ratio, torchwatch's CPU (% of one core, the
    whole attach) and the share of the window it spent steady."""
    attach_s = SETTLE_MAX_S + window + 2.0
    total = 20.0 + pairs * (window + attach_s + 3.0) + window + 15.0
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        target, clock = _hooked_demo(demo, threads, total, Path(tmp), subprocess.PIPE, device)
        try:
            time.sleep(20.0)  # imports, the first steps, the first epoch's warm-up
            alone: list[tuple[float, float]] = []
            watched: list[dict[str, Any]] = []
            for i in range(pairs + 1):
                a = time.monotonic()
                time.sleep(window)
                alone.append((a, time.monotonic()))
                if i == pairs:
                    break
                out = Path(tmp) / f"r{i}.json"
                subprocess.run(
                    [sys.executable, "-m", "torchwatch", "attach", "--headless", "--duration", str(attach_s),
                     "--json", str(out), str(target.pid)],
                    cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=_env(threads),
                )  # fmt: skip
                report = json.loads(out.read_text())
                watched.append(report)
                time.sleep(3.0)  # py-spy's last chunk reaped, the attach gone
            err = target.communicate(timeout=total + 60)[1]
        finally:
            if target.poll() is None:
                target.kill()
                target.wait()
        stamps = _demo_stamps(target, err, clock)
    for i, report in enumerate(watched):
        hook = report.get("hook") or {}
        first = hook.get("first_step_after_s")
        started = stamps[0] - first if first is not None else None  # the session's start, monotonic s
        t_steady = steady_start({"first_step_after_s": 0.0, "sampling": report.get("sampling")})
        if started is None or t_steady is None:
            t_steady = attach_s - window - 1.0  # never settled: the last window of the attach
        w0 = (started or alone[i][1]) + t_steady + 1.0
        rate = _rate_between(stamps, w0, w0 + window)
        rows.append(
            {
                **_pair(stamps, alone[i], alone[i + 1], rate),
                "cpu_pct": float(report["self"]["cpu_pct_of_core"]),
                "steady_share": steady_share(report, t_steady + 1.0, t_steady + 1.0 + window),
                "window": (round(t_steady + 1.0, 1), round(t_steady + 1.0 + window, 1)),
            }
        )
    return rows


def _session_cpu_s(sid: int) -> float:
    """CPU seconds of every process in session ``sid`` (torchwatch and its py-spy children), the
    children it already reaped included (``cutime``, ``cstime`` of /proc/PID/stat)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = (Path("/proc") / entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid:  # field 6 of stat: the session
            total += sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
    return total


def within_run_toggle(demo: str, threads: str, pairs: int, window: float, device: str = "cpu") -> list[dict[str, Any]]:
    """``pairs`` watched windows in one run of ``demo`` and one ``torchwatch attach``: once the
    attach went steady, the bench alternates W s with torchwatch frozen (SIGSTOP to its own
    session: torchwatch and its py-spy children, never the training) and W s running (SIGCONT):
    A B A B ... A. Nothing is started or settled between windows, so every second of the run
    is measured, and a window can be short. Each B window's ratio is taken against the mean of
    the A windows just before and after it; torchwatch's CPU is counted over the B windows only
    (% of one core), and the share of each B window it spent steady comes from its report."""
    import signal

    settle = SETTLE_MAX_S + 5.0
    # A verdict window of 3 W: after a resume it still holds W to 2 W of readings, so the verdict
    # does not go back to collecting evidence (an empty 10 s window would) and the cadence stays
    # steady. A longer window costs the analysis more, so this errs against torchwatch too.
    verdict_window = max(10.0, 3 * window)
    total = 20.0 + settle + (2 * pairs + 1) * window + 10.0
    attach_s = total + 30.0  # the bench stops it (SIGTERM) after the last window
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        demo_log = (Path(tmp) / "demo.log").open("w")  # a file: an hour of progress lines would fill a pipe
        target, clock = _hooked_demo(demo, threads, total, Path(tmp), demo_log, device)
        out = Path(tmp) / "report.json"
        watch = None
        try:
            time.sleep(20.0)  # imports, the first steps, the first epoch's warm-up
            started = time.monotonic()
            log = (Path(tmp) / "attach.log").open("w")
            watch = subprocess.Popen(
                [sys.executable, "-m", "torchwatch", "attach", "--headless", "--duration", str(attach_s),
                 "--window", str(verdict_window), "--json", str(out), str(target.pid)],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=log, env=_env(threads), start_new_session=True,
            )  # fmt: skip
            time.sleep(settle)
            spans: list[tuple[str, float, float, float]] = []  # arm, start, end, torchwatch CPU s in it
            for i in range(2 * pairs + 1):
                arm = "A" if i % 2 == 0 else "B"
                if arm == "A":
                    os.killpg(watch.pid, signal.SIGSTOP)
                cpu0, a = _session_cpu_s(watch.pid), time.monotonic()
                time.sleep(window)
                b, cpu1 = time.monotonic(), _session_cpu_s(watch.pid)
                if arm == "A":
                    os.killpg(watch.pid, signal.SIGCONT)
                spans.append((arm, a, b, cpu1 - cpu0))
            watch.terminate()  # the report is written on SIGTERM
            try:
                watch.wait(timeout=60)
                report = json.loads(out.read_text())
            except (subprocess.TimeoutExpired, OSError, ValueError) as e:  # keep the windows measured
                tail_log = (Path(tmp) / "attach.log").read_text()[-1500:]
                print(f"bench/overhead.py: no report from the attach ({e}); its log ends: {tail_log}", file=sys.stderr)
                report = {}
            target.wait(timeout=total + 60)
            err = (Path(tmp) / "demo.log").read_text()
        finally:
            if watch is not None and watch.poll() is None:
                os.killpg(watch.pid, signal.SIGKILL)  # torchwatch and its py-spy children
                watch.wait()
            if target.poll() is None:
                target.kill()
                target.wait()
        stamps = _demo_stamps(target, err, clock)
    for i in range(1, len(spans), 2):
        _, a, b, cpu = spans[i]
        rows.append(
            {
                **_pair(stamps, spans[i - 1][1:3], spans[i + 1][1:3], _rate_between(stamps, a, b)),
                "cpu_pct": 100 * cpu / (b - a),
                "frozen_cpu_pct": 100 * spans[i - 1][3] / (spans[i - 1][2] - spans[i - 1][1]),
                "sampling_changes": (report.get("sampling") or {}).get("changes") or [],
                "steady_share": steady_share(report, a - started, b - started),
                "window": (round(a - started, 1), round(b - started, 1)),
            }
        )
    return rows


def _demo_stamps(target: subprocess.Popen[str], err: str, clock: Path) -> list[float]:
    """Every optimizer step's monotonic time of a demo that ended (``_hooked_demo``).

    Raises:
        SystemExit: the demo failed (the end of its stderr ``err`` says how).
    """
    if target.returncode != 0:
        raise SystemExit(f"bench/overhead.py: the demo failed: {err.strip()[-300:]}")
    times = array.array("d")
    times.frombytes(clock.read_bytes())
    return list(times)


def _pair(stamps: list[float], before: tuple[float, ...], after: tuple[float, ...], watched: float) -> dict[str, float]:
    """One watched window against the alone windows around it: ``before`` and ``after`` are
    (start, end) monotonic s; the steps/s alone (their mean), each, watched, and the ratio."""
    a, b = _rate_between(stamps, *before), _rate_between(stamps, *after)
    base = (a + b) / 2
    return {
        "alone": base,
        "alone_before": a,
        "alone_after": b,
        "watched": watched,
        "ratio": watched / base if base else 0.0,
    }


def _rate_between(stamps: list[float], a: float, b: float) -> float:
    """Steps/s between monotonic times ``a`` and ``b``: the steps in it over their span."""
    inside = [t for t in stamps if a <= t <= b]
    return (len(inside) - 1) / (inside[-1] - inside[0]) if len(inside) >= 2 else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=float, help="demo run time (default 20; 16 + the window with one)")
    parser.add_argument("--demos", default="cpu_bound,dataloader_bound,io_bound")
    parser.add_argument("--threads", default="default", help="comma-separated: default and/or a thread count")
    parser.add_argument("--steady-window", type=float, metavar="S", help="steps/s over S s of steady state")
    parser.add_argument("--within-run", action="store_true", help="alone and watched windows in one run (A B A ... A)")
    parser.add_argument(
        "--toggle", action="store_true", help="with --within-run: one attach, frozen and resumed every window"
    )
    parser.add_argument("--device", default="cpu", help="the demos' --device: cpu (default) or cuda")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    window = args.steady_window
    if args.within_run and not window:
        parser.error("--within-run needs --steady-window S")
    if args.toggle and not args.within_run:
        parser.error("--toggle needs --within-run")
    seconds = args.seconds or (16.0 + window if window else 20.0)
    what = f"steady-state window of {window:g} s" if window else "whole runs"
    if args.within_run:
        seconds = window
        what = f"steady-state windows of {window:g} s in one run, ratio to the mean of the alone windows around each"
    print(
        f"{'demo':17s} {'threads':7s} {'alone':>7s} {'watched':>7s} {'ratio':>6s} {'loss':>6s} {'tw CPU':>6s}  "
        f"(medians of {args.pairs} interleaved pairs of {seconds:g} s runs, {what}; load "
        f"{os.getloadavg()[0]:.2f}; --device {args.device})",
        flush=True,
    )
    rows = []
    for demo in args.demos.split(","):
        for threads in args.threads.split(","):
            if args.within_run:
                assert window is not None
                run_pairs = within_run_toggle if args.toggle else within_run
                pairs = run_pairs(demo, threads, args.pairs, window, args.device)
            else:
                pairs = [pair(demo, seconds, threads, window, args.device) for _ in range(args.pairs)]
            ratios = [p["ratio"] for p in pairs]
            ratio = statistics.median(ratios)
            row = {
                "demo": demo,
                "threads": threads,
                "alone": statistics.median(p["alone"] for p in pairs),
                "watched": statistics.median(p["watched"] for p in pairs),
                "ratio": ratio,
                "loss_pct": 100 * (1 - ratio),
                "torchwatch_cpu_pct": statistics.median(p["cpu_pct"] for p in pairs),
                "spread": (min(ratios), max(ratios)),
                "pairs": pairs,
                "load": os.getloadavg()[0],
            }
            rows.append(row)
            print(
                f"{demo:17s} {threads:7s} {row['alone']:7.2f} {row['watched']:7.2f} {ratio:6.3f} "
                f"{row['loss_pct']:5.1f}% {row['torchwatch_cpu_pct']:5.1f}%  spread {min(ratios):.3f}-"
                f"{max(ratios):.3f}; pairs " + " ".join(f"{r:.3f}" for r in ratios),
                flush=True,
            )
            if all("parts" in p for p in pairs):  # where torchwatch's CPU went, % of one core of the run
                names = sorted(
                    {k for p in pairs for k in p["parts"]},
                    key=lambda k: -statistics.median(100 * p["parts"].get(k, 0.0) / p["wall_s"] for p in pairs),
                )
                print(
                    f"{'':25s} by part, % of one core over the run (median): "
                    + ", ".join(
                        f"{k} {statistics.median(100 * p['parts'].get(k, 0.0) / p['wall_s'] for p in pairs):.2f}"
                        for k in names
                    ),
                    flush=True,
                )
            if len(ratios) > 1:  # how far the median can be trusted: the pairs' mean and its standard error
                se = statistics.stdev(ratios) / len(ratios) ** 0.5
                print(f"{'':25s} mean of the pairs {statistics.mean(ratios):.3f} +- {se:.3f} (standard error)")
            if window:
                shares = " ".join(f"{p['steady_share']:.2f}" for p in pairs)
                spans = " ".join(f"{p['window'][0]:g}-{p['window'][1]:g}" for p in pairs)
                since = "the attach" if args.within_run else "the first step"
                print(f"{'':25s} steady share of the window: {shares}; windows (s after {since}): {spans}")
                if args.within_run:
                    around = " ".join(f"{p['alone_before']:.2f}/{p['alone_after']:.2f}" for p in pairs)
                    cpu_of = "the watched windows" if args.toggle else "whole attach"
                    print(f"{'':25s} alone before/after each window (steps/s): {around}; tw CPU: {cpu_of}")
                k = -(-30 // int(window))  # windows in 30 s watched
                if args.toggle and window < 30 and len(pairs) >= max(2, k):
                    # the acceptance's pairs are of >= 30 s: consecutive windows taken together,
                    # each group 30 s or more watched against the alone windows interleaved with it
                    groups = [statistics.mean(r for r in ratios[i : i + k]) for i in range(0, len(ratios) - k + 1, k)]
                    row["groups"] = groups
                    g_se = statistics.stdev(groups) / len(groups) ** 0.5 if len(groups) > 1 else 0.0
                    print(
                        f"{'':25s} {len(groups)} pairs of {k * window:g} s watched ({k} windows each): median "
                        f"{statistics.median(groups):.3f}, spread {min(groups):.3f}-{max(groups):.3f}, mean "
                        f"{statistics.mean(groups):.3f} +- {g_se:.3f} (standard error)"
                    )
                if args.toggle:
                    frozen = max(p["frozen_cpu_pct"] for p in pairs)
                    print(f"{'':25s} torchwatch's CPU while frozen: at most {frozen:.2f} % of one core")
            if args.json:  # after every row: a long run stopped early keeps what it measured
                Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the TUI costs while it watches a demo, and how fast it answers a key (printed, not a test).

Runs ``torchwatch run -- python demo/DEMO.py`` in a private tmux server (a real terminal) at
the default refresh, then:

1. CPU, memory and wake-ups: torchwatch's own process (UI, reader thread, samplers; py-spy is a child
   and counted apart) over ``--seconds`` after a warm-up: % of one core from its CPU times,
   its RSS (mean and max of one reading a second), and how often its threads are woken (the
   sum of their voluntary context switches a second: on a machine whose cores the training
   fills, each is a moment a training thread loses its core). Targets: <= 10 % and <= 150 MB.
2. Key latency: ``p`` is sent ``--presses`` times with ``tmux send-keys`` and the pane is
   polled until the top border shows (or stops showing) ``PAUSED``. This includes tmux's own
   delay (measured apart with ``cat``), so it is an upper bound of the app's. Inside the app
   (torchwatch is started through this script, which times each ``p`` in a subclass of
   WatchApp): from the key event to its handler, and to the end of the next screen update.
   Target: < 100 ms.
3. With ``--headless-too`` the same demo under ``torchwatch run --headless`` for the same
   time: the difference is what the TUI adds to sampling.

The warm-up (30 s) covers the fast cadence: the figures are the steady state's, and the key
presses come after them (a key sends the cadence back to fast).

Usage: python bench/tui.py [--demo dataloader_bound] [--seconds 30] [--warmup 30] [--presses 10] [--headless-too]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]


class Tmux:
    """A private tmux server with one window."""

    def __init__(self, width: int, height: int, command: str) -> None:
        self.socket = f"torchwatch-bench-{os.getpid()}"
        self("new-session", "-d", "-x", str(width), "-y", str(height), "-s", "b", command)
        self.shell = int(self("list-panes", "-t", "b", "-F", "#{pane_pid}").split()[0])

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10).stdout

    def screen(self, target: str = "b") -> str:
        return self("capture-pane", "-p", "-t", target)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


def find(parent: int, marker: str, timeout: float = 30.0) -> psutil.Process:
    """The descendant of ``parent`` whose command line contains ``marker``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            for p in psutil.Process(parent).children(recursive=True):
                if marker in " ".join(p.cmdline()):
                    return p
        except psutil.Error:
            pass
        time.sleep(0.1)
    raise SystemExit(f"no process with {marker!r} under {parent}")


def wakes(pid: int) -> dict[int, int]:
    """``{TID: voluntary context switches}`` of every thread of ``pid``: each is one time the
    thread slept and was woken again (``/proc/PID/task/TID/status``; the PID's own ``status``
    counts its main thread only)."""
    out: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for text in f:
                    if text.startswith("voluntary_ctxt_switches:"):
                        out[int(tid)] = int(text.split()[1])
        except OSError:
            pass
    return out


def usage(proc: psutil.Process, seconds: float) -> tuple[float, float, float, float, float]:
    """CPU % of one core of ``proc`` and of its py-spy children, RSS mean and max (MB), and the
    wake-ups of ``proc``'s threads per second (py-spy's own are not counted)."""

    def pyspy_cpu() -> float:
        total = 0.0
        for c in proc.children(recursive=True):
            try:
                if "py-spy" in c.name():
                    t = c.cpu_times()
                    total += t.user + t.system
            except psutil.Error:
                pass
        return total

    t0, c0, s0, w0 = time.monotonic(), proc.cpu_times(), pyspy_cpu(), wakes(proc.pid)
    rss = []
    while time.monotonic() - t0 < seconds:
        rss.append(proc.memory_info().rss / 1e6)
        time.sleep(1.0)
    wall = time.monotonic() - t0
    c1, w1 = proc.cpu_times(), wakes(proc.pid)
    woken = sum(n - w0[tid] for tid, n in w1.items() if tid in w0) / wall
    own = (c1.user - c0.user + c1.system - c0.system) / wall * 100
    # py-spy restarts every chunk: finished ones land in children_* times of the parent
    spy = c1.children_user - c0.children_user + c1.children_system - c0.children_system + pyspy_cpu() - s0
    return own, spy / wall * 100, statistics.fmean(rss), max(rss), woken


def line(name: str, own: float, spy: float, rss_mean: float, rss_max: float, woken: float) -> str:
    """One result line."""
    return (
        f"{name:9} torchwatch {own:5.2f} % of a core (py-spy {spy:4.2f} %), "
        f"RSS mean {rss_mean:.0f} MB, max {rss_max:.0f} MB, its threads woken {woken:.1f} times/s"
    )


def key_latency(tmux: Tmux, presses: int) -> list[float]:
    """Seconds from ``send-keys p`` to the screen showing the pause state flip."""
    out = []
    for i in range(presses):
        want = i % 2 == 0  # even presses pause, odd ones resume
        t0 = time.monotonic()
        tmux("send-keys", "-t", "b", "p")
        while time.monotonic() - t0 < 2.0:
            if ("PAUSED" in tmux.screen()) == want:
                out.append(time.monotonic() - t0)
                break
            time.sleep(0.002)
        time.sleep(0.3)
    return out


def echo_latency(tmux: Tmux, presses: int) -> list[float]:
    """The same round trip to ``cat`` in another window: what tmux itself adds."""
    tmux("new-window", "-d", "-n", "echo", "cat")
    out = []
    for i in range(presses):
        t0 = time.monotonic()
        tmux("send-keys", "-t", "echo", "x")
        while time.monotonic() - t0 < 2.0:
            if tmux.screen("echo").count("x") > i:
                out.append(time.monotonic() - t0)
                break
            time.sleep(0.002)
        time.sleep(0.3)
    return out


def summary(name: str, seconds: list[float], presses: int) -> str:
    """``median / max ms`` of a latency series."""
    if not seconds:
        return f"{name}: none seen within 2 s"
    ms = [v * 1000 for v in seconds]
    missed = presses - len(ms)
    return f"{name}: median {statistics.median(ms):.0f} ms, max {max(ms):.0f} ms over {len(ms)} ({missed} missed)"


def as_torchwatch(log_path: str, argv: list[str]) -> int:
    """Run ``torchwatch ARGV`` with each ``p`` timed: key event → handler → screen updated (ms)."""
    from textual import events

    import torchwatch.faces.tui.app as tui_app
    from torchwatch.cli import main as torchwatch_main

    log = open(log_path, "w")  # noqa: SIM115 - open for the life of the process

    class TimedApp(tui_app.WatchApp):
        # Textual calls the key handler of every class in the MRO: no super() call here.
        async def _on_key(self, event: events.Key) -> None:
            if event.key == "p":
                handled = time.monotonic()

                def painted() -> None:
                    log.write(f"{(handled - event.time) * 1000:.2f} {(time.monotonic() - event.time) * 1000:.2f}\n")
                    log.flush()

                self.call_after_refresh(painted)

    tui_app.WatchApp = TimedApp  # type: ignore[misc]
    sys.argv = ["torchwatch", *argv]
    return torchwatch_main()


def in_app(log_path: Path) -> str:
    """Summary of the in-app timings written by :func:`as_torchwatch`."""
    try:
        rows = [tuple(float(v) for v in ln.split()) for ln in log_path.read_text().splitlines() if ln.strip()]
    except OSError:
        rows = []
    if not rows:
        return "in the app: no timing recorded"
    handled = [r[0] for r in rows]
    painted = [r[1] for r in rows]
    return (
        f"in the app: key to handler median {statistics.median(handled):.1f} ms (max {max(handled):.1f}), "
        f"to screen updated median {statistics.median(painted):.0f} ms (max {max(painted):.0f}) over {len(rows)}"
    )


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--as-torchwatch":
        sys.exit(as_torchwatch(sys.argv[2], sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo", default="dataloader_bound")
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement time (after the warm-up)")
    parser.add_argument(
        "--warmup",
        type=float,
        default=30.0,
        help="seconds before measuring (default 30: torch import, first verdict, and the cadence settled to steady)",
    )
    parser.add_argument("--presses", type=int, default=10)
    parser.add_argument("--size", default="80x24", help="terminal size, WxH")
    parser.add_argument("--headless-too", action="store_true", help="also measure torchwatch --headless")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        raise SystemExit("tmux is not installed")
    width, height = (int(v) for v in args.size.split("x"))
    python = shlex.quote(sys.executable)
    train_s = args.seconds + args.warmup + 48
    demo = f"{python} demo/{args.demo}.py --device cpu --seconds {train_s:.0f}"
    timings = Path(tempfile.mkdtemp(prefix="torchwatch-bench-")) / "keys.txt"
    me = shlex.quote(str(Path(__file__).resolve()))
    cmd = f"cd {shlex.quote(str(REPO))} && {python} {me} --as-torchwatch {timings} run -- {demo}; sleep 30"
    print(f"machine: {psutil.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; terminal {args.size}; demo {args.demo}")
    tmux = Tmux(width, height, cmd)
    try:
        tw = find(tmux.shell, "--as-torchwatch")
        time.sleep(args.warmup)  # torch import, first verdict, the cadence settling
        own, spy, rss_mean, rss_max, woken = usage(tw, args.seconds)
        print(line("TUI:", own, spy, rss_mean, rss_max, woken))
        print(summary("key 'p' to screen, through tmux", key_latency(tmux, args.presses), args.presses))
        print(in_app(timings))
        print(summary("same round trip to cat (tmux alone)", echo_latency(tmux, args.presses), args.presses))
        tmux("send-keys", "-t", "b", "q")
        time.sleep(1.0)
        tmux("send-keys", "-t", "b", "y")
        time.sleep(5.0)
    finally:
        tmux.kill()
    if args.headless_too:
        report = Path(tempfile.mkdtemp(prefix="torchwatch-bench-")) / "report.json"
        proc = subprocess.Popen(
            [sys.executable, "-m", "torchwatch", "run", "--headless", "--json", str(report), "--", *shlex.split(demo)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(args.warmup)
            own, spy, rss_mean, rss_max, woken = usage(psutil.Process(proc.pid), args.seconds)
            print(line("headless:", own, spy, rss_mean, rss_max, woken))
        finally:
            proc.send_signal(2)
            try:
                proc.wait(90)  # it stops the training and writes the report (seconds on a loaded machine)
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait(30)
        if report.exists():  # the cadence over the run: steady through the measurement (after the warm-up)?
            changes = json.loads(report.read_text()).get("sampling", {}).get("changes", [])
            print(
                f"headless sampling (measured from ~{args.warmup:g} s to ~{args.warmup + args.seconds:g} s): "
                + (", ".join(f"{c['mode']} at {c['t']:g} s ({c['reason']})" for c in changes) or "fast throughout")
            )


if __name__ == "__main__":
    main()

"""Soak: ``torchwatch serve --prometheus`` watching 4 trainings, scraped every 5 s, for 15 minutes.

    python bench/soak_serve.py [--seconds 900] [--trainings 4] [--every 30]

Starts ``--trainings`` light trainings (a small MLP with torchwatch's hook pre-loaded, sleeping
200 ms of each step, so the soak does not starve a shared machine) and ``serve`` (a scan every
5 s); as root with ``unshare`` they run in a PID namespace of their own, so serve watches these
and nothing else of the machine. Scrapes ``/metrics`` every 5 s and samples serve's RSS, threads
and open file descriptors every ``--every`` s; prints the series and a verdict: once the stores
have filled (the sessions' stores keep 300 s of readings, the memory watch 5 minutes: from
:data:`FILLED_S` on) RSS must stay within :data:`RSS_SLACK` of its level then, and threads and
descriptors within :data:`COUNT_SLACK`. Every process it starts is ended at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_fleet import _end, _find, _free_port, _rss, _scrape, _start

REPO = Path(__file__).resolve().parents[1]
FILLED_S = 360.0  # the 300 s stores and the 5 min memory watch full, and a minute more
RSS_SLACK = 0.05  # RSS after FILLED_S within 5 % of its level at FILLED_S (noise: the allocator, py-spy chunks)
COUNT_SLACK = 2  # threads / descriptors within 2 of their level at FILLED_S (a py-spy pipe, a scrape's socket)
SCRAPE_EVERY_S = 5.0


def train(seconds: float) -> None:
    """One light training: an MLP step, then 200 ms of sleep, for ``seconds``."""
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad()
        time.sleep(0.2)


def _counts(pid: int) -> tuple[int, int]:
    """``(threads, open descriptors)`` of ``pid``."""
    threads = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            threads = int(line.split()[1])
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=900.0)
    ap.add_argument("--trainings", type=int, default=4)
    ap.add_argument("--every", type=float, default=30.0, help="seconds between two samples of serve")
    ap.add_argument("--train", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.train is not None:
        train(args.train)
        return 0
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("needs root and unshare (serve would watch every training of the machine)", file=sys.stderr)
        return 2
    from torchwatch.watch.lifecycle import hook_env

    tmp = Path(tempfile.mkdtemp(prefix="soak_serve-"))
    env = hook_env()
    env.update(TORCHWATCH_DIR=str(tmp / "tw"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    trainings = [
        f"{shlex.join([sys.executable, __file__, '--train', str(args.seconds + 120)])} >{tmp / f'train{i}.log'} 2>&1 &"
        for i in range(args.trainings)
    ]
    serve_cmd = [sys.executable, "-m", "torchwatch", "serve", "--prometheus", f"127.0.0.1:{port}", "--scan", "5"]
    script = tmp / "node.sh"
    script.write_text(
        "\n".join(trainings)
        + f"\nsleep 2\nenv -u TORCHWATCH_HOOK {shlex.join(serve_cmd)} >{tmp / 'serve.log'} 2>&1 &\n"
        "wait\n"
    )
    node = _start(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "bash", str(script)], env, tmp / "node.log"
    )
    rows: list[tuple[float, int, int, int, int, int]] = []  # t, rss, threads, fds, targets, failed scrapes
    failed = scrapes = 0
    try:
        serve = _find(node.pid, "serve")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # serve listening (it imports and binds in a second or two)
            with contextlib.suppress(OSError):
                _scrape(url)
                break
            time.sleep(0.5)
        t0 = time.monotonic()
        next_sample = 0.0
        targets = 0
        while (now := time.monotonic() - t0) < args.seconds:
            try:
                _took, _size, text = _scrape(url)
                scrapes += 1
                for line in text.splitlines():
                    if line.startswith("torchwatch_targets{"):
                        targets = int(float(line.rsplit(" ", 1)[1]))
            except OSError:
                failed += 1
            if now >= next_sample:
                threads, fds = _counts(serve)
                rows.append((now, _rss(serve), threads, fds, targets, failed))
                print(
                    f"t={now:6.0f} s  rss={rows[-1][1] / 2**20:7.1f} MiB  threads={threads:3d}  fds={fds:3d}  "
                    f"trainings={targets}  failed scrapes={failed}",
                    flush=True,
                )
                next_sample += args.every
            time.sleep(max(0.0, SCRAPE_EVERY_S - (time.monotonic() - t0 - now)))
    finally:
        _end(node, signal.SIGKILL)  # --kill-child: the namespace's PID 1, and so all of it
    after = [r for r in rows if r[0] >= FILLED_S]
    print(f"scrapes: {scrapes} ok, {failed} failed")
    if len(after) < 2:
        print(f"verdict: too short (no samples after {FILLED_S:g} s, when the stores have filled)")
        return 2
    base = after[0]
    rss_drift = max(abs(r[1] - base[1]) for r in after) / base[1]
    thread_drift = max(abs(r[2] - base[2]) for r in after)
    fd_drift = max(abs(r[3] - base[3]) for r in after)
    print(
        f"after {FILLED_S:g} s: RSS {base[1] / 2**20:.1f} -> {after[-1][1] / 2**20:.1f} MiB "
        f"(max drift {rss_drift * 100:.1f} %), threads {base[2]} -> {after[-1][2]} (max drift {thread_drift}), "
        f"fds {base[3]} -> {after[-1][3]} (max drift {fd_drift})"
    )
    flat = rss_drift <= RSS_SLACK and thread_drift <= COUNT_SLACK and fd_drift <= COUNT_SLACK and failed == 0
    print(f"verdict: {'flat' if flat else 'NOT FLAT'} (trainings watched at the end: {rows[-1][4]})")
    with contextlib.suppress(OSError):
        shutil.rmtree(tmp)
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())

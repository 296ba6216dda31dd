"""``torchwatch serve --prometheus`` scraped by the real Prometheus while idle clients hold connections.

    python bench/exporter_idle.py [--idle 200] [--seconds 120] [--interval 5]

Starts ``torchwatch serve --prometheus 127.0.0.1:PORT`` and Prometheus (Debian's ``prometheus``)
scraping it every ``--interval`` s (``scrape_timeout`` 5 s), then holds ``--idle`` TCP connections
to serve open that never send a byte (one the server closes is opened again at once, so the count
stays up) for ``--seconds``. Prints, from Prometheus's own API: the scrapes made, how many
succeeded (``up`` 1) and failed, and the scrape durations (median, max), plus how often the idle
clients were cut and had to reconnect. Every process it starts is ended at the end.

Acceptance (issue 49): 200 idle connections, a scrape every 5 s for 2 minutes: every scrape succeeds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


class Idle:
    """``n`` idle connections held open to ``port`` (reopened when the server closes one)."""

    def __init__(self, port: int, n: int) -> None:
        self.port = port
        self.socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
        self.reopened = 0
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select(self.socks, [], [], 0.2)
            for s in ready:
                with contextlib.suppress(OSError):
                    s.recv(4096)
                s.close()
                try:
                    self.socks[self.socks.index(s)] = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                    self.reopened += 1
                except OSError:
                    self.failed += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for s in self.socks:
            s.close()


def _query(port: int, expr: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as r:
        return list(json.load(r)["data"]["result"])


def _end(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--interval", type=float, default=5.0)
    args = ap.parse_args()
    if shutil.which("prometheus") is None:
        print("prometheus not installed (Debian: apt-get install prometheus)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="exporter_idle-"))
    metrics, prom_port = _free_port(), _free_port()
    serve = prom = None
    idle = None
    try:
        with open(tmp / "serve.log", "wb") as log:
            serve = subprocess.Popen(
                [sys.executable, "-m", "torchwatch", "serve", "--prometheus", f"127.0.0.1:{metrics}", "--scan", "60"],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_port(metrics, 30)
        idle = Idle(metrics, args.idle)  # before the first scrape: every scrape meets them
        interval = f"{args.interval:g}s"
        (tmp / "prometheus.yml").write_text(
            f"global: {{scrape_interval: {interval}, scrape_timeout: {min(args.interval, 5):g}s}}\n"
            f"scrape_configs:\n  - job_name: torchwatch\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{metrics}']\n"
        )
        with open(tmp / "prometheus.log", "wb") as log:
            prom = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        _wait_port(prom_port, 60)
        start = time.monotonic()
        while time.monotonic() - start < args.seconds:
            time.sleep(1)
            if serve.poll() is not None or prom.poll() is not None:
                raise SystemExit("serve or prometheus ended early; logs in " + str(tmp))
        time.sleep(1)
        window = f"{int(args.seconds) + 30}s"
        ups = _query(prom_port, f"up[{window}]")
        durations = _query(prom_port, f"scrape_duration_seconds[{window}]")
        samples = [float(v) for _, v in ups[0]["values"]] if ups else []
        took = [float(v) for _, v in durations[0]["values"]] if durations else []
        connections = len(idle.socks)
        reopened, failed = idle.reopened, idle.failed
    finally:
        if idle is not None:
            idle.close()
        _end(prom)
        _end(serve)
    ok = sum(1 for v in samples if v == 1.0)
    print(f"idle connections held: {connections} (reopened after the server cut them: {reopened}, failed: {failed})")
    made = len(samples)
    print(f"scrapes every {args.interval:g} s for {args.seconds:g} s: {made} made, {ok} ok, {made - ok} failed")
    print(f"up: {samples}")
    if took:
        print(
            f"scrape duration: median {statistics.median(took) * 1000:.1f} ms, "
            f"max {max(took) * 1000:.1f} ms ({len(took)} scrapes)"
        )
    verdict = bool(samples) and ok == len(samples)
    print(f"verdict: {'every scrape succeeded' if verdict else 'SOME SCRAPES FAILED'}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())

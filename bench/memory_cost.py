"""What the memory readings cost torchwatch: CPU time per second of watching, % of one core.

    python bench/memory_cost.py [--seconds 60] [--workers 2] [--mib 1024]

Starts a tree like a training's: a parent holding ``--mib`` MiB of Python objects and ``--workers``
forked children sharing it (each touches a tenth of it: some pages private, most shared), then
runs what the session runs once a second for ``--seconds``: :class:`MemorySource` ``.sample()``
(the limit, the kernel log, ``smaps_rollup`` of every process every 5 rounds) and
:class:`MemoryWatch` ``.update()`` (the forecasts refitted every 5 s). CPU time is
``time.process_time()`` (user + system of this process: ``smaps_rollup`` is kernel time spent
here), so other load on the machine does not count. The issue's budget: 0.2 % of one core.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import time

from torchwatch.analysis.store import Store
from torchwatch.model.readings import ProcessSample, Role
from torchwatch.sources.memory import MemorySource
from torchwatch.watch.memwatch import MemoryWatch


def tree(mib: int, workers: int) -> list[int]:
    """Fork a parent holding ``mib`` MiB of objects and its workers; returns their PIDs."""
    r, w = os.pipe()
    parent = os.fork()
    if parent == 0:
        os.close(r)
        data = [[float(i) for i in range(256)] for _ in range(mib * 4)]  # ~8 KiB a row
        kids = []
        for k in range(workers):
            pid = os.fork()
            if pid == 0:
                for row in data[k :: 10 * workers]:
                    _ = [v for v in row]  # copy-on-write a tenth
                signal.pause()
                os._exit(0)
            kids.append(pid)
        os.write(w, " ".join(map(str, [os.getpid(), *kids])).encode() + b"\n")
        signal.pause()
        os._exit(0)
    os.close(w)
    line = b""
    while not line.endswith(b"\n"):
        line += os.read(r, 100)
    os.close(r)
    time.sleep(2.0)  # the workers' copies
    return [int(p) for p in line.split()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mib", type=int, default=1024)
    args = ap.parse_args()
    pids = tree(args.mib, args.workers)
    try:
        src = MemorySource(lambda: pids)
        store, watch = Store(keep=3600), MemoryWatch()
        sample_s, update_s = [], []
        t0 = time.monotonic()
        for i in range(args.seconds):
            now = t0 + i
            roles = [Role.MAIN] + [Role.WORKER] * (len(pids) - 1)
            store.add(
                [
                    ProcessSample(now, p, 1, r, "python", (), 0.0, 0, None, None, 1)
                    for p, r in zip(pids, roles, strict=True)
                ]
            )
            c = time.process_time()
            store.add(src.sample(now))
            sample_s.append(time.process_time() - c)
            c = time.process_time()
            watch.update(store, now, pids[0])
            update_s.append(time.process_time() - c)
            time.sleep(max(0.0, t0 + i + 1 - time.monotonic()))
        src.close()
    finally:
        os.kill(pids[0], signal.SIGKILL)
        for p in pids[1:]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        os.waitpid(pids[0], 0)
    per_s = (sum(sample_s) + sum(update_s)) / args.seconds
    print(json.dumps({
        "processes": len(pids), "seconds": args.seconds, "tree_mib": args.mib,
        "sample_ms_mean": round(1000 * statistics.mean(sample_s), 3),
        "sample_ms_smaps_rounds_mean": round(1000 * statistics.mean(sample_s[:: 5]), 3),
        "update_ms_mean": round(1000 * statistics.mean(update_s), 3),
        "update_ms_max": round(1000 * max(update_s), 3),
        "cpu_pct_of_core": round(100 * per_s, 3),
        "budget_pct": 0.2,
        "load": os.getloadavg()[0],
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

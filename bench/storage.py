"""How this machine's storage answers more readers: the figures behind storage-latency / storage-bandwidth.

For two read patterns on the scenario data file (1 GiB, no page cache: O_DIRECT), run 1, 2, 4
and 8 reader threads for --seconds each and print, per row, what the readers got (MB/s) and
what the block device's counters say over the same seconds, as iostat(1) derives them:
mean request size (rareq-sz), mean time per request (r_await), requests in flight while
busy (aqu-sz / %util, read part) and busy share (%util).

- 4 KiB random reads: latency-bound. Throughput should grow with readers (the device serves
  requests in parallel); this is what rules/storage-latency.toml tells users to exploit.
- 2 MiB sequential reads: bandwidth-bound. Throughput should stay flat with more readers
  while r_await grows (requests queue); rules/storage-bandwidth.toml tells users that more
  DataLoader workers will not help.

Rerun:  python bench/storage.py [--seconds 3] [--readers 1,2,4,8] [--json PATH]
Needs O_DIRECT (exits 2 on a filesystem that refuses it, e.g. tmpfs: set TORCHWATCH_DEMO_DIR).
Run it on a quiet machine: the device counters are machine-wide.
"""

from __future__ import annotations

import argparse
import errno
import json
import mmap
import os
import random
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "scenarios"))
import _scenario as sc  # noqa: E402

FILE_SIZE = 1 << 30  # the file tests/scenarios/sequential_reads.py reads
PATTERNS = (("4 KiB random", 4096, False), ("2 MiB sequential", 2 << 20, True))


def _reader(path: str, size: int, sequential: bool, idx: int, nreaders: int, seconds: float, done: list[int]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT needs
    rnd, n, nxt = random.Random(idx), 0, idx * size
    end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < end:
            if sequential:  # readers interleave through the file, as DataLoader workers do
                off, nxt = nxt % (FILE_SIZE - size), nxt + size * nreaders
            else:
                off = rnd.randrange(FILE_SIZE // size) * size
            os.preadv(fd, [buf], off)
            n += 1
    finally:
        os.close(fd)
    done[idx] = n


def _device_of(path: str) -> str:
    """The whole block device under ``path`` (``/sys/dev/block/MAJ:MIN``, partition -> its disk)."""
    st = os.stat(path)
    sys_path = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}").resolve()
    return sys_path.parent.name if (sys_path / "partition").exists() else sys_path.name


def measure(path: str, device: str, size: int, sequential: bool, nreaders: int, seconds: float) -> dict[str, float]:
    """One row: ``nreaders`` threads reading ``size``-byte requests for ``seconds``."""
    done = [0] * nreaders
    before, t0 = psutil.disk_io_counters(perdisk=True)[device], time.perf_counter()
    threads = [
        threading.Thread(target=_reader, args=(path, size, sequential, i, nreaders, seconds, done))
        for i in range(nreaders)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after, dt = psutil.disk_io_counters(perdisk=True)[device], time.perf_counter() - t0
    reads = max(1, after.read_count - before.read_count)
    read_s = (after.read_time - before.read_time) / 1000.0
    busy = (after.busy_time - before.busy_time) / 1000.0 / dt
    return {
        "readers": nreaders,
        "mb_per_s": sum(done) * size / dt / 1e6,
        "request_kib": (after.read_bytes - before.read_bytes) / reads / 1024,
        "await_ms": 1000.0 * read_s / reads,
        "in_flight_while_busy": read_s / dt / busy if busy > 0 else float("nan"),
        "busy_pct": 100.0 * busy,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per row (default 3)")
    ap.add_argument("--readers", default="1,2,4,8", help="reader counts (default 1,2,4,8)")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = ap.parse_args()
    path = sc.data_file("scn_sequential.bin", FILE_SIZE, "bench/storage")
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
        device = _device_of(path)
    except OSError as exc:
        why = "O_DIRECT refused" if exc.errno == errno.EINVAL else exc.strerror
        print(f"bench/storage: {path}: {why}; set TORCHWATCH_DEMO_DIR to a disk-backed directory", file=sys.stderr)
        return 2
    print(f"device {device}, file {path}, {args.seconds:g} s per row")
    print(f"{'pattern':<18}{'readers':>8}{'MB/s':>9}{'req KiB':>9}{'await ms':>10}{'in flight':>10}{'busy %':>8}")
    rows = []
    for name, size, sequential in PATTERNS:
        for n in (int(x) for x in args.readers.split(",")):
            r = measure(path, device, size, sequential, n, args.seconds)
            rows.append({"pattern": name, **r})
            print(
                f"{name:<18}{n:>8}{r['mb_per_s']:>9.0f}{r['request_kib']:>9.0f}"
                f"{r['await_ms']:>10.2f}{r['in_flight_while_busy']:>10.1f}{r['busy_pct']:>8.0f}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

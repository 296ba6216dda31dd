"""What building the Observation costs: ms per analysis tick, and that as % of one core at 1 Hz.

The session builds one Observation per analysis tick (once a second) in its analysis thread:
rows of the process tree over the last 3 minutes, the stacks and thread states of the window, GPU
rows, the memory trend, the hook's views. This times :func:`torchwatch.watch.observe.observe` over
the recorded readings the TUI tests use (a DataLoader training with two workers, two GPUs, the
hook's readings: 60 s of processes and GPUs, 10 s of thread states at 4 Hz, four py-spy chunks),
and, for comparison, the analysis itself (rules loaded from rules/, features and two rule
evaluations over the same window).

    python bench/observation.py [--repeat 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.unit.recorded import NOW, analyse, recorded_session  # noqa: E402


def timed(fn: Callable[[], object], repeat: int) -> list[float]:
    """Milliseconds per call of ``fn()``, ``repeat`` times."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(1000 * (time.perf_counter() - t0))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    watched = recorded_session(gpus=True, hooked=True)
    build = timed(watched.observe, args.repeat)
    analysis = timed(lambda: analyse(watched.store), args.repeat)
    for name, ms in (("observation", build), ("analysis (load rules, 2 evals)", analysis)):
        med = statistics.median(ms)
        print(
            f"{name:26s} median {med:6.2f} ms  p95 {sorted(ms)[int(0.95 * (len(ms) - 1))]:6.2f} ms"
            f"  = {med / 10:.2f} % of one core at 1 Hz"
        )
    print(f"readings: {len(watched.store.window(0, NOW).processes)} process samples, NOW = {NOW:g} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

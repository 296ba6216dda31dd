"""How soon torchwatch says what it says: the latencies the test suite once asserted, with their targets.

The tests check what torchwatch says and does (a finding, a record, a report), waiting for it up to a
deadline far above these figures; how soon it comes is measured here, printed beside its target,
and kept in docs/performance.md. Each case runs the same construction as its test (the tests'
own helpers), once per ``--runs``:

- ``compile``: from a torch.compile scenario's event (a batch shape change, a ``.item()`` in
  forward, the recompile limit: tests/scenarios/compile_*.py) to the status line naming it
  (tests/integration/test_compile.py). Target <= 10 s (issue 33). The first run of each scenario
  fills a private inductor cache (gcc's kernels) and is printed apart as ``cold``.
- ``hang``: a DataLoader worker stuck in ``__getitem__`` (tests/scenarios/hang/stuck_worker.py):
  from the last step to the hang recorded with its stack dumps (tests/integration/test_hang.py).
  Target <= --hang-after + 5 s.
- ``straggler``: two gloo ranks, rank 1 with slow data (tests/scenarios/distributed/
  straggler_data.py): from the first step to the status line naming rank 1 the straggler
  (tests/integration/test_rank_verdicts.py). Target <= 10 s.
- ``stop``: ``torchwatch run`` on demo/cpu_bound.py stopped by SIGTERM, and a training that ignores
  SIGINT stopped by Ctrl-C: from the signal to torchwatch's exit with the report written
  (tests/integration/test_lifecycle.py). Target < 5 s (the tests only check it is below the 10 s
  SIGINT grace, which must not be waited).

Other latencies have their own benchmarks: the first verdict (``bench/first_verdict.py``), the
memory forecast's lead (``bench/memory_forecast.py``), the pause of an injection
(``bench/inject.py``), a key in the TUI (``bench/tui.py``).

    python bench/latencies.py [--runs 1] [--only compile,hang,straggler,stop] [--json PATH]

Bounded: every training it starts is ended by the tests' helpers (process groups killed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGETS = {"compile": 10.0, "hang": 10.0, "straggler": 10.0, "stop": 5.0}
"""Each case's target, s (``hang``: --hang-after 5 s + 5 s)."""


def compile_case(tmp: Path, runs: int) -> dict[str, Any]:
    """Seconds from each compile scenario's event to the status line naming it: cold (first run,
    an empty inductor cache) and warm (the following runs)."""
    from tests.integration import test_compile as tc

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / "inductor")
    cases = (
        ("compile_shapes", "compile-recompiles", ("--change-after", "2")),
        ("compile_item_break", "compile-graph-breaks", ()),
        ("compile_limit", "compile-cache-limit", ("--change-after", "2")),
    )
    out: dict[str, Any] = {}
    for scenario, rule, args in cases:
        figures = []
        for i in range(runs + 1):
            d = tmp / f"{scenario}-{i}"
            d.mkdir()
            w = tc.watch(d, scenario, rule, *args)
            figures.append(None if w.named_at is None or w.event_at is None else round(w.named_at - w.event_at, 1))
        out[scenario] = {"cold_s": figures[0], "warm_s": figures[1:]}
    return out


def hang_case(tmp: Path, runs: int) -> dict[str, Any]:
    """Seconds from the last step to the hang recorded (detection + dumps)."""
    from tests.integration import test_hang as th

    figures = []
    for i in range(runs):
        d = tmp / f"hang-{i}"
        d.mkdir()
        proc, _ = th._start(d, str(th.SCENARIOS / "stuck_worker.py"), "--seconds", "300")
        try:
            _code, h, _out = th._watch_hang(d, proc, 1)
            figures.append(round(h["detected_after_s"] + h["dump_s"], 2))
        finally:
            th._end(proc)
    return {"recorded_after_last_step_s": figures, "hang_after_s": th.HANG_AFTER_S}


def straggler_case(tmp: Path, runs: int) -> dict[str, Any]:
    """Seconds from the first step to the straggler named, per launcher."""
    from tests.integration import test_rank_verdicts as tr

    out: dict[str, Any] = {}
    for launcher in tr.LAUNCHERS:
        figures = []
        for i in range(runs):
            d = tmp / f"straggler-{launcher}-{i}"
            d.mkdir()
            result = tr.watch_job(d, "straggler_data", launcher)
            first = (result.report or {}).get("hook", {}).get("first_step_after_s")
            named = tr.named_at(result.stderr, 1)
            figures.append(None if first is None or named is None else round(named - first, 1))
        out[launcher] = figures
    return out


def stop_case(tmp: Path, runs: int) -> dict[str, Any]:
    """Seconds from the stop signal to torchwatch gone with its report (SIGTERM; Ctrl-C on a
    training that ignores SIGINT)."""
    from tests.integration import test_lifecycle as tl

    out: dict[str, list[float]] = {"SIGTERM": [], "ctrl-c, SIGINT ignored": []}
    for i in range(runs):
        w = tl.Watching(tmp / f"term-{i}.json", tl.CPU_BOUND)
        try:
            w.wait_for_label()
            took, _gone = w.stop_with([signal.SIGTERM])
            out["SIGTERM"].append(round(took, 2))
        finally:
            w.kill()
        w = tl.Watching(tmp / f"int-{i}.json", [sys.executable, "-c", tl.IGNORES_SIGINT])
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(w.tree()) < 2:
                time.sleep(0.2)
            time.sleep(3)
            took, _gone = w.stop_with([signal.SIGINT], group=True)
            out["ctrl-c, SIGINT ignored"].append(round(took, 2))
        finally:
            w.kill()
    return out


CASES: dict[str, Callable[[Path, int], dict[str, Any]]] = {
    "compile": compile_case,
    "hang": hang_case,
    "straggler": straggler_case,
    "stop": stop_case,
}


def _figures(value: Any) -> list[float]:
    """Every number in ``value`` (nested dicts and lists), for the worst-case line."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)]
    if isinstance(value, dict):
        return [x for k, v in value.items() if k != "hang_after_s" for x in _figures(v)]
    if isinstance(value, list):
        return [x for v in value for x in _figures(v)]
    return []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--only", default=",".join(CASES), help="comma-separated: " + ",".join(CASES))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    bad = [n for n in names if n not in CASES]
    if bad:
        print(f"latencies: unknown case {', '.join(bad)}: choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tw-latencies-") as tmp:
        for name in names:
            d = Path(tmp) / name
            d.mkdir()
            t0 = time.monotonic()
            res = CASES[name](d, args.runs)
            figs = _figures({k: v for k, v in res.items()} if name != "compile" else
                            {k: v["warm_s"] for k, v in res.items()})  # fmt: skip
            worst = max(figs) if figs else None
            verdict = "n/a" if worst is None else ("PASS" if worst <= TARGETS[name] else "OVER")
            median = round(statistics.median(figs), 2) if figs else None
            results[name] = {"figures": res, "target_s": TARGETS[name], "worst_s": worst, "median_s": median}
            print(
                f"{name}: {json.dumps(res)}; median {median} s, worst {worst} s, target {TARGETS[name]:g} s: {verdict}"
                f" ({time.monotonic() - t0:.0f} s)",
                flush=True,
            )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A reliability table of torchwatch's confidence: for each confidence bucket, how many runs gave
the right label.

A confidence is meant as a probability: of the runs labelled at 0.9 or more, 9 in 10 or more must
be right. This reads what the scenario matrices wrote (``--json``) and scores each run's label
against the truth by intervention (every scenario's ``--relieve`` proves its label)::

    python bench/scenarios.py --runs 1 --json S.json          # quiet, every scenario (labelled)
    python bench/noisy.py --watch --conditions hog,quota --json N.json
    python bench/reliability.py --scenarios S.json --noisy N.json [--markdown]

Right, per run:

- a scenario of ``bench/scenarios.py``: its label is the scenario's ``EXPECTED`` (and, for the
  distributed ones, the straggler and the rank count are right: what that bench scores). Where the
  run's first finding is one of :data:`ENV_RULES` (whose evidence is other processes' CPU, or the
  training's quota or threads: the "quiet" run was not alone), it is scored as a noisy.py cell
  under a condition, and counted apart (``busy`` in the wrong list; ``--strict`` scores it as
  quiet);
- a cell of ``bench/noisy.py`` under a condition (a busy process, a CPU quota): the scenario's own
  label, or ``cpu-bound`` led by the condition's own finding (``cpu-contention``,
  ``cpu-quota-throttled``, ``cpu-oversubscribed``): the condition is then a cause as real as the
  scenario's, and which of the two is the larger lever is what ``noisy.py --truth`` measures, not
  the label. Any other label is wrong. A quiet cell of noisy.py is scored as the quiet matrix.

Buckets (:data:`BUCKETS`): [0, 0.5) (the "undetermined" and the first seconds' caps), [0.5, 0.7),
[0.7, 0.9), [0.9, 1.0]. Printed: per bucket the runs, the right ones and their share, the mean
confidence (a calibrated bucket's share is near it), the expected calibration error over all runs,
and every wrong run at 0.9 or more. ``--markdown`` prints the table as docs/labels.md has it.

Standard library only; reads files, runs nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUCKETS = ((0.0, 0.5), (0.5, 0.7), (0.7, 0.9), (0.9, 1.0))
"""Confidence buckets, [low, high); the last one includes 1.0."""
ENV_RULES = ("cpu-contention", "cpu-quota-throttled", "cpu-oversubscribed")
"""The findings that name a busy machine's CPU scarcity (as bench/noisy.py's ``ENV_RULES``)."""


@dataclass(frozen=True)
class Run:
    """One scored torchwatch run: where it came from (``matrix``: "scenarios" or "noisy"), the
    scenario, the condition ("quiet", "hog", ...), the label and confidence given (0-1), the
    label expected, and whether it was right."""

    matrix: str
    scenario: str
    condition: str
    label: str
    confidence: float
    expected: str
    right: bool


def bucket_of(confidence: float) -> int:
    """Index into :data:`BUCKETS` of a confidence in [0, 1] (values outside are clamped)."""
    c = min(max(confidence, 0.0), 1.0)
    for i, (_low, high) in enumerate(BUCKETS):
        if c < high:
            return i
    return len(BUCKETS) - 1


def scenario_runs(data: dict[str, Any], strict: bool = False) -> list[Run]:
    """The runs of a ``bench/scenarios.py --json`` file: ``{"expected": {name: label}, "runs":
    {name: [{"label", "confidence", "findings", "straggler_ok"?...}]}}``. A run whose first finding
    is one of :data:`ENV_RULES` gets the condition ``busy`` and is scored as a noisy.py cell
    (:func:`noisy_right`), unless ``strict``.

    Raises KeyError / TypeError: a file of another shape."""
    out = []
    for name, runs in data["runs"].items():
        expected = data["expected"][name]
        for r in runs:
            findings = [f for f in (r.get("findings") or []) if isinstance(f, str)]
            busy = not strict and bool(findings) and findings[0] in ENV_RULES
            cond = "busy" if busy else "quiet"
            right = noisy_right(expected, cond, r["label"], findings) and r.get("straggler_ok", True) is True
            out.append(Run("scenarios", name, cond, r["label"], float(r["confidence"]), expected, right))
    return out


def noisy_right(expected: str, condition: str, label: str, findings: list[str]) -> bool:
    """A noisy.py cell's label scored (see the module's docstring): the scenario's own label, or,
    under a condition, ``cpu-bound`` whose first finding is one of :data:`ENV_RULES`."""
    if label == expected:
        return True
    return condition != "quiet" and label == "cpu-bound" and bool(findings) and findings[0] in ENV_RULES


def noisy_runs(data: dict[str, Any], expected: dict[str, str]) -> list[Run]:
    """The cells of a ``bench/noisy.py --json`` file (``{name: {condition: {"label", "confidence",
    "findings"}}}``), with each scenario's expected label from ``expected``; scenarios missing
    from it are left out.

    Raises KeyError / TypeError: a file of another shape."""
    out = []
    for name, conds in data.items():
        if name not in expected:
            continue
        for cond, r in conds.items():
            findings = [f for f in (r.get("findings") or []) if isinstance(f, str)]
            right = noisy_right(expected[name], cond, r["label"], findings)
            out.append(Run("noisy", name, cond, r["label"], float(r["confidence"]), expected[name], right))
    return out


@dataclass(frozen=True)
class Row:
    """One bucket of the table: [low, high), the runs in it, the right ones, their mean confidence
    (``None`` when empty)."""

    low: float
    high: float
    runs: int
    right: int
    mean_confidence: float | None

    @property
    def share(self) -> float | None:
        """Right / runs, 0-1 (``None`` when the bucket is empty)."""
        return self.right / self.runs if self.runs else None


def table(runs: list[Run]) -> list[Row]:
    """The reliability table over ``runs``: one :class:`Row` per bucket of :data:`BUCKETS`."""
    rows = []
    for i, (low, high) in enumerate(BUCKETS):
        inside = [r for r in runs if bucket_of(r.confidence) == i]
        mean = sum(r.confidence for r in inside) / len(inside) if inside else None
        rows.append(Row(low, high, len(inside), sum(r.right for r in inside), mean))
    return rows


def calibration_error(runs: list[Run]) -> float | None:
    """Expected calibration error over the buckets: sum over buckets of (runs in it / all runs) x
    |share right - mean confidence|, 0-1 (``None`` with no runs). Guo et al., "On Calibration of
    Modern Neural Networks" (ICML 2017), with :data:`BUCKETS` as the bins."""
    if not runs:
        return None
    total = 0.0
    for row in table(runs):
        if row.runs and row.share is not None and row.mean_confidence is not None:
            total += row.runs / len(runs) * abs(row.share - row.mean_confidence)
    return total


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def render(runs: list[Run], markdown: bool) -> str:
    """The table (and the wrong runs at 0.9 or more) as text, or as a markdown table."""
    rows = table(runs)
    lines = []
    if markdown:
        lines += ["| confidence | runs | right | share right | mean confidence |", "|---|---|---|---|---|"]
        for r in rows:
            mean = "-" if r.mean_confidence is None else f"{r.mean_confidence:.2f}"
            span = f"{r.low:.1f}–{r.high:.1f}" + ("" if r.high < 1.0 else " (incl. 1.0)")
            lines.append(f"| {span} | {r.runs} | {r.right} | {_pct(r.share)} | {mean} |")
    else:
        lines.append(f"{'confidence':<12} {'runs':>5} {'right':>6} {'share':>7} {'mean conf':>10}")
        for r in rows:
            mean = "-" if r.mean_confidence is None else f"{r.mean_confidence:.2f}"
            lines.append(f"[{r.low:.1f}, {r.high:.1f}){'':<3} {r.runs:>5} {r.right:>6} {_pct(r.share):>7} {mean:>10}")
    ece = calibration_error(runs)
    right = sum(r.right for r in runs)
    busy = [r for r in runs if r.matrix == "scenarios" and r.condition == "busy"]
    lines.append("")
    lines.append(f"all runs: {right}/{len(runs)} right; expected calibration error {_pct(ece)}")
    if busy:
        lines.append(
            f"scenarios.py runs that were not alone (first finding a CPU-scarcity one), scored as busy: {len(busy)}"
        )
    high = [r for r in runs if r.confidence >= 0.9 and not r.right]
    lines.append(f"wrong at >= 0.9: {len(high)}")
    for r in high:
        lines.append(f"  {r.matrix} {r.scenario} [{r.condition}]: {r.label} {r.confidence:.2f}, expected {r.expected}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", metavar="PATH", action="append", default=[], help="bench/scenarios.py --json")
    parser.add_argument("--noisy", metavar="PATH", action="append", default=[], help="bench/noisy.py --json")
    parser.add_argument("--markdown", action="store_true", help="print the table in markdown")
    parser.add_argument(
        "--strict", action="store_true", help="score every scenarios.py run as quiet (its EXPECTED label only)"
    )
    args = parser.parse_args(argv)
    if not args.scenarios and not args.noisy:
        parser.error("give --scenarios and/or --noisy (files written by those benches' --json)")
    runs: list[Run] = []
    expected: dict[str, str] = {}
    try:
        for path in args.scenarios:
            data = json.loads(Path(path).read_text())
            expected.update(data["expected"])
            runs += scenario_runs(data, args.strict)
        if args.noisy:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            import scenarios  # bench/scenarios.py: every labelled scenario's EXPECTED

            for name, (_script, label) in scenarios.discover(None, False, False).items():
                expected.setdefault(name, label)
            for path in args.noisy:
                runs += noisy_runs(json.loads(Path(path).read_text()), expected)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"reliability.py: error: {exc!r}: give the JSON files bench/scenarios.py and bench/noisy.py wrote")
        return 2
    print(render(runs, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ranks of a job side by side: per-rank readings, the straggler, the job's verdict.

Each rank is diagnosed on its own (its features, its rules); this module compares them. In
synchronous data parallelism every rank's step lasts as long as the slowest's, so the step time
names no straggler: the rank that reaches the gradient all-reduce last does, and the others
wait for it inside the collective. Per rank (medians over the window's steps, from the hook's
counters, :class:`~torchwatch.wire.RankStep`): the time to reach backward (data wait +
forward and other host work) and the time blocked on peers.

Straggler score, as TraceML defines it (github.com/traceopt-ai/traceml, its step-time
diagnosis thresholds ``straggler_score_warn = 0.10``, ``straggler_score_crit = 0.20``):
``(victim's collective wait - culprit's collective wait) / step time``, the share of the
others' step the culprit costs them. The culprit is the rank that arrives last, the victim the
rank that waits longest.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace

from torchwatch.analysis.diagnosis import Analysis
from torchwatch.analysis.features import rank_collective_wait
from torchwatch.analysis.store import Window
from torchwatch.model.findings import Verdict
from torchwatch.model.observation import RankReading, Straggler

__all__ = ["MIN_STEPS", "STRAGGLER_CRIT", "STRAGGLER_WARN", "job_analysis", "rank_readings", "straggler"]

STRAGGLER_WARN = 0.10  # TraceML: straggler_score_warn
STRAGGLER_CRIT = 0.20  # TraceML: straggler_score_crit
MIN_STEPS = 3  # steps per rank in the window before ranks are compared (medians of fewer swing)


def rank_readings(window: Window, analyses: Mapping[int, Analysis]) -> tuple[RankReading, ...]:
    """One :class:`RankReading` per training process of ``analyses`` (``{pid: its analysis}``)
    with steps in ``window``, ordered by rank.

    A rank's number comes from its hook (``RANK``, ``torch.distributed``, the spawn index);
    a process whose hook names none gets the next number after the known ones, by PID.
    """
    rows: list[tuple[int | None, RankReading]] = []
    for pid, analysis in analyses.items():
        reads = [h for h in window.hook if h.pid == pid]
        rec = next((h.record for h in reversed(reads) if h.record is not None), None)
        steps = [(h.record, s) for h in reads for s in h.rank_steps if window.start <= s.end <= window.end]
        if not steps:
            continue
        info = rec.rank if rec is not None else None
        first = analysis.findings[0].rule if analysis.findings else None
        f = analysis.features
        reading = RankReading(
            rank=-1,
            pid=pid,
            world_size=info.world_size if info is not None else None,
            steps=len(steps),
            step_ms=1000 * statistics.median(s.duration for _, s in steps),
            data_wait_ms=1000 * statistics.median(s.data_wait for _, s in steps),
            compute_ms=1000 * statistics.median(s.before_collective() for _, s in steps),
            collective_wait_ms=1000 * statistics.median(rank_collective_wait(r, s) for r, s in steps),
            cpu_pct=f.get("main_cpu_pct"),
            runqueue_share=f.get("main_runqueue_share"),
            label=analysis.verdict.label,
            summary=analysis.verdict.summary,
            top_finding=first,
        )
        rows.append((info.rank if info is not None else None, reading))
    known = {r for r, _ in rows if r is not None}
    spare = iter(n for n in range(len(rows) + len(known) + 1) if n not in known)
    out = []
    for r, reading in sorted(rows, key=lambda row: (row[0] is None, row[0] or 0, row[1].pid)):
        out.append(replace(reading, rank=r if r is not None else next(spare)))
    return tuple(sorted(out, key=lambda x: x.rank))


def straggler(readings: Sequence[RankReading]) -> Straggler | None:
    """The rank that paces the job, or ``None`` (fewer than two ranks with :data:`MIN_STEPS`
    steps, or a score below :data:`STRAGGLER_WARN`).

    The culprit is the rank with the longest time to reach backward (:attr:`RankReading.arrive_ms`),
    the victim the rank with the longest collective wait; the score is their collective waits'
    difference over the median step time (the ranks' steps are alike in synchronous training).
    """
    ready = [r for r in readings if r.steps >= MIN_STEPS and r.step_ms > 0]
    if len(ready) < 2:
        return None
    culprit = max(ready, key=lambda r: r.arrive_ms)
    victim = max(ready, key=lambda r: r.collective_wait_ms)
    step = statistics.median(r.step_ms for r in ready)
    score = (victim.collective_wait_ms - culprit.collective_wait_ms) / step
    if victim.pid == culprit.pid or score < STRAGGLER_WARN:
        return None
    d_data = culprit.data_wait_ms - victim.data_wait_ms
    d_compute = culprit.compute_ms - victim.compute_ms
    return Straggler(
        rank=culprit.rank,
        pid=culprit.pid,
        victim_rank=victim.rank,
        score=round(score, 3),
        severity="critical" if score >= STRAGGLER_CRIT else "warning",
        part="data" if d_data >= d_compute else "compute",
        extra_ms=round(culprit.arrive_ms - victim.arrive_ms, 1),
        label=culprit.label,
        summary=culprit.summary,
        top_finding=culprit.top_finding,
    )


COMM_RULE = "ranks-collective-wait"
COMM_SHARE = 0.2  # the rule's threshold (TraceML's overhead_share_crit): the ranks' median share
COMM_DOMINANT = 0.5  # collectives take the larger part of the step: no local label explains it


def job_analysis(focus: Analysis, analyses: Mapping[int, Analysis], found: Straggler | None) -> Analysis:
    """The job's analysis.

    - One rank paces the job: the straggler's own analysis (its label is the job's); its summary
      says it is the straggler and what it costs the others.
    - None does, but the ranks' median ``collective_wait_share`` is >= :data:`COMM_SHARE` and a
      rank carries the communication finding: ``focus`` (the rank shown) with that finding
      first; its label stays unless the ranks wait on each other for :data:`COMM_DOMINANT` of
      their step or more (medians of the hook's per-step times); then the verdict is the
      communication finding's (``undetermined``: time on peers is no local resource's).
    - Otherwise ``focus`` as it is.
    """
    if found is not None and found.pid in analyses:
        return _straggler_analysis(focus, analyses[found.pid], found)
    shares = [a.features.get("collective_wait_share") for a in analyses.values()]
    known = [v for v in shares if v is not None]
    comm = [f for a in analyses.values() for f in a.findings if f.rule == COMM_RULE]
    if not known or statistics.median(known) < COMM_SHARE or not comm:
        return replace(focus, straggler=None)
    median = statistics.median(known)
    finding = max(comm, key=lambda f: f.measure or 0.0)
    words = (
        f"Communication-bound: the ranks wait {median:.0%} of their step on each other in collectives "
        "(gradient all-reduce), and no rank paces the others."
    )
    findings = [replace(finding, summary=words), *(f for f in focus.findings if f.rule != COMM_RULE)]
    # The rank's own label stays while the ranks spend most of their step doing something else
    # than waiting on each other (the hook's per-step medians; a thread-state share would count a
    # thread waiting for a CPU as computing, and on a loaded machine that is a large part).
    steps = [r for r in focus.ranks if r.step_ms > 0]
    waits = statistics.median(r.collective_wait_ms / r.step_ms for r in steps) if steps else median
    keeps = focus.verdict.label != "undetermined" and waits < COMM_DOMINANT
    verdict = (
        Verdict(focus.verdict.label, focus.verdict.confidence, f"{focus.verdict.summary} {words}")
        if keeps
        else Verdict("undetermined", 0.5, words)
    )
    return replace(focus, findings=findings, verdict=verdict, straggler=None)


def _straggler_analysis(focus: Analysis, own: Analysis, found: Straggler) -> Analysis:
    where = "its DataLoader" if found.part == "data" else "its forward and other host work"
    lead = (
        f"Rank {found.rank} is the straggler (score {found.score:.2f}: rank {found.victim_rank} waits "
        f"{found.score:.0%} of its step for it; {found.extra_ms:.0f} ms more in {where} per step)."
    )
    verdict = Verdict(own.verdict.label, own.verdict.confidence, f"{lead} {own.verdict.summary}")
    return Analysis(
        t=own.t,
        features=own.features,
        findings=list(own.findings),
        not_applicable=list(own.not_applicable),
        verdict=verdict,
        per_rank=focus.per_rank,
        ranks=focus.ranks,
        straggler=found,
    )

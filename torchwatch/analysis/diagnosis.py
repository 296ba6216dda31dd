"""Rules over features → findings → one verdict.

The label follows the order of :data:`torchwatch.model.labels.LABELS`: the first of gpu-bound,
io-bound, dataloader-bound, cpu-bound that a warning or critical finding argues for; otherwise ``undetermined``.

Findings are ordered by :func:`finding_order`: a finding of scope ``machine`` (other processes hold
the CPUs) first, then the label's winner and the rest; within a label, scope ``demand`` last.

Confidence (0..1) says how much of the loop's wall time the winning evidence explains and
how sure the inputs are: ``min(0.95, 0.5 + measure) * coverage * dominance * (1 - blur)`` where
``measure`` is the winning finding's explained share, ``coverage`` grows with the number of
samples behind the stack and thread shares (full at 3 s of data), ``dominance`` is
``measure / max(measure of a deciding finding of another label)`` (lower when a later label
explains more), and ``blur`` is the loop's wait for a CPU while other processes hold the CPUs
(:func:`_blur`) unless the winner is that scarcity's own finding (scope ``machine``).

Stability: a rule's condition must hold for its ``for`` seconds (less :data:`HOLD_SLACK_S`, the
evaluations' jitter on their grid) before it fires, and be false for as long before it stops
firing (hold and release), so a steady run does not flap. While a rule of a higher-priority label
holds but has not fired yet, a lower label is not announced: the previous verdict stays (no
"dataloader-bound for one second, then io-bound" at start).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchwatch.analysis import expr
from torchwatch.analysis.features import COMPILE_TEXTS, MIN_STACK_SAMPLES, MIN_THREAD_SAMPLES, Features
from torchwatch.analysis.predict import predict_fix
from torchwatch.analysis.rules_engine import Rule, fill
from torchwatch.analysis.workers import io_bound_workers, suggested_workers
from torchwatch.model.findings import Finding, Fix, NotApplicable, Verdict
from torchwatch.model.labels import PRIORITY as _PRIORITY
from torchwatch.model.observation import RankReading, Straggler
from torchwatch.model.progress import fmt_loss
from torchwatch.model.units import human_bytes

__all__ = [
    "HOLD_SLACK_S",
    "Analysis",
    "Diagnoser",
    "Finding",
    "Fix",
    "NotApplicable",
    "Verdict",
    "finding_order",
    "template_values",
]

# A rule's hold (its ``for``) is met this much early. The rules run on a grid of whole intervals
# (1 s fast, 2 s steady: torchwatch.watch.cadence.until_tick), so the evaluation ``for`` seconds
# after the first true one comes 2.000 s later give or take the wake-ups' jitter (ms): without
# slack, about one evaluation in two found 1.99x s held and the finding waited a whole interval
# more (measured: the first cpu-bound verdict came 1 s later than before the grid). 0.25 s is a
# quarter of the shortest interval: far above the jitter, far below an interval, so a hold still
# spans as many evaluations as ``for`` says.
HOLD_SLACK_S = 0.25


@dataclass
class Analysis:
    """One evaluation of every rule at time ``t``."""

    t: float
    features: Features
    findings: list[Finding] = field(default_factory=list)
    not_applicable: list[NotApplicable] = field(default_factory=list)
    verdict: Verdict = field(default_factory=lambda: Verdict("undetermined", 0.0, "Collecting evidence."))
    # Ranks of a job of several processes (empty for one): {pid: its own analysis}, their
    # readings over the window, and the straggler (torchwatch.analysis.ranks).
    per_rank: dict[int, Analysis] = field(default_factory=dict)
    ranks: tuple[RankReading, ...] = ()
    straggler: Straggler | None = None


def template_values(features: Features, texts: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Features plus the derived values fix templates may use (:data:`rules_engine.TEMPLATE_VALUES`).

    Args:
        features: ``{name: value}`` of the window. texts: settings read verbatim by the hook
            (:func:`features.texts`); a text not given prints as ``unknown (not read by the hook)``.
    """
    values: dict[str, Any] = dict(features)
    for name in ("optimizer_state", "alloc_conf_state", "thread_env"):
        values[name] = (texts or {}).get(name, "unknown (not read by the hook)")
    for name, unread in COMPILE_TEXTS.items():
        values[name] = (texts or {}).get(name, unread)
    values["cpu_neighbours"] = (texts or {}).get(
        "cpu_neighbours", "no process torchwatch can see (another container's, or interrupts)"
    )
    values["mem_limit_source"] = (texts or {}).get("mem_limit_source", "not readable")
    values["mem_grower"] = (texts or {}).get("mem_grower", "no single process")
    values["producer_frame"] = (texts or {}).get("producer_frame", "code py-spy did not see")
    values["producer_processes"] = (texts or {}).get("producer_processes", "no busy process")
    values["suggested_threads"] = _suggested_threads(features)
    cpus = features.get("usable_cpus")
    values["suggested_workers"] = suggested_workers(cpus) if cpus else None
    alive, wcpu = features.get("worker_count"), features.get("workers_cpu_pct")
    values["io_workers"] = (
        io_bound_workers(cpus, alive, wcpu) if cpus and alive is not None and wcpu is not None else None
    )
    set_workers = features.get("dl_num_workers")
    values["num_workers"] = set_workers if set_workers is not None else features.get("worker_count")
    values["loader_settings"] = _loader_settings(features, texts)
    amp = features.get("amp_enabled")
    values["amp_state"] = "unknown (no hook)" if amp is None else ("autocast on" if amp else "no autocast seen")
    values["memory_pressure_state"] = _memory_pressure(features)
    values["stall_state"] = _stall_state(features)
    batch, workers = features.get("dl_batch_bytes"), features.get("dl_num_workers")
    prefetch = features.get("dl_prefetch_factor") or 2.0
    values["shm_needed_bytes"] = workers * prefetch * batch if batch is not None and workers else None
    return values


_STILL_WHY = {
    1.0: "none of its {n} parameter tensors has a gradient",
    2.0: "every learning rate is 0",
    3.0: "the optimizer wrote none of its {n} parameter tensors",
}


def _stall_state(f: Features) -> str:
    """Why ``loss-stalled`` holds, in words: the optimizer's steps changed no parameter for
    ``params_still_s`` (and why), else the loss's change over the stall window."""
    still, why = f.get("params_still_s"), f.get("params_still_why")
    loss = f.get("loss")
    at = f" (loss {fmt_loss(loss)})" if loss is not None else ""
    if still is not None and still >= 20 and why in _STILL_WHY:
        n = f.get("params_count")
        reason = _STILL_WHY[why].format(n=f"{n:.0f}" if n is not None else "")
        steps = f.get("params_still_steps") or 0
        return f"{steps:.0f} optimizer steps in {still:.0f} s changed no parameter: {reason}{at}"
    share, trend = f.get("loss_change_share"), f.get("loss_trend_per_min")
    if share is None or loss is None:
        return "the loss has not moved in 2 minutes"
    slope = f", {trend:+.3g}/min" if trend is not None else ""
    return (
        f"the loss has not moved in 2 minutes: {fmt_loss(loss)}, changing {share:.1%} of itself over the "
        f"window{slope}, not different from zero"
    )


def _suggested_threads(f: Features) -> float | None:
    """Intra-op threads per rank that fit the CPUs left to the training: the usable CPUs less what
    other processes use (``foreign_cpu_cores``, from half a core on) and what the DataLoader workers
    use, shared by the ranks, at least 1 (``None`` without usable_cpus). Within the quota, too: a quota of 1.5 CPUs
    fits 1 thread. The fix quotes it for ``torch.set_num_threads`` / ``OMP_NUM_THREADS``."""
    cpus = f.get("usable_cpus")
    if not cpus:
        return None
    foreign = f.get("foreign_cpu_cores") or 0.0
    # less than half a core of others is below cpu-contention's line: noise, not a CPU taken
    left = cpus - (foreign if foreign >= 0.5 else 0.0) - (f.get("workers_cpu_pct") or 0.0) / 100.0
    return float(max(1, math.floor(left / max(1.0, f.get("local_ranks") or 1.0) + 1e-9)))


def _memory_pressure(f: Features) -> str:
    """The device memory readings behind ``gpu-memory-pressure``, as one phrase."""
    nvml = f.get("gpu_mem_ratio")
    nvml_text = None if nvml is None else f"NVML: {nvml:.0%} of the device in use"
    ratio, cap = f.get("cuda_mem_peak_ratio"), f.get("cuda_mem_capacity_bytes")
    if ratio is None or cap is None:
        return nvml_text or "n/a"
    text = (
        f"the allocator's peak {human_bytes(f.get('cuda_mem_peak_bytes') or 0)} and reserved"
        f" {human_bytes(f.get('cuda_mem_reserved_bytes') or 0)} reach {ratio:.0%} of the device's {human_bytes(cap)}"
    )
    retries = f.get("cuda_alloc_retries")
    if retries:
        text += f", {retries:.0f} allocation retries in the window"
    return text + (f" ({nvml_text})" if nvml_text else "")


def _loader_settings(f: Features, texts: Mapping[str, str] | None) -> str:
    """The DataLoader's settings as the user set them, quoted from the hook's record
    (``texts["loader_settings"]``: :meth:`torchwatch.wire.LoaderInfo.settings_text`); without the
    hook, only the workers alive are known (psutil)."""
    quoted = (texts or {}).get("loader_settings")
    if quoted is not None:
        return quoted
    workers = f.get("worker_count")
    return "n/a (no hook)" if workers is None else f"num_workers={workers:.0f}"


class Diagnoser:
    """Evaluates rules over successive feature sets, with per-rule hold and release times.

    Args:
        rules: loaded rules.
        why_missing: returns why a feature is missing (e.g. the reason of its source), for
            the report's not-applicable list.
    """

    def __init__(self, rules: list[Rule], why_missing: Any = None) -> None:
        self.rules = rules
        self.why_missing = why_missing or (lambda name: "not measured")
        self._true_since: dict[str, float] = {}
        self._false_since: dict[str, float] = {}
        self._firing: set[str] = set()
        self._last: Verdict | None = None
        self._loop_seen = False

    def evaluate(
        self, features: Features, now: float, texts: Mapping[str, str] | None = None, waiting: str | None = None
    ) -> Analysis:
        """Evaluate every rule on ``features`` taken at ``now`` (monotonic seconds); ``texts``:
        settings fixes quote verbatim (see :func:`template_values`); ``waiting``: what the
        training does instead of its loop, while it has not reached its first step
        (:func:`torchwatch.analysis.startup.waiting_for`; ``None``: it has)."""
        if waiting is None and not self._loop_seen:
            self._loop_seen = True
            # Nothing said before the loop carries into it: a finding that fired on the start's
            # readings (imports read files, set-up computes) stops at once, and one still true
            # keeps its hold and fires when its readings of the loop say so.
            self._firing.clear()
            self._false_since.clear()
            self._last = None
        analysis = Analysis(t=now, features=features)
        values = template_values(features, texts)
        for rule in self.rules:
            try:
                holds = bool(rule.when.evaluate(values))
            except expr.Missing as missing:
                analysis.not_applicable.append(NotApplicable(rule.id, missing.name, self.why_missing(missing.name)))
                self._firing.discard(rule.id)
                self._true_since.pop(rule.id, None)
                continue
            if not self._update(rule, holds, now):
                continue
            analysis.findings.append(self._finding(rule, values))
        analysis.findings.sort(key=finding_order)
        verdict = self._verdict(analysis.findings, features)
        pending = [
            r
            for r in self.rules
            if r.id in self._true_since
            and r.id not in self._firing
            and r.severity != "info"
            and r.label != "undetermined"
            and r.scope != "health"
        ]
        if any(_PRIORITY[r.label] < _PRIORITY[verdict.label] for r in pending):
            verdict = self._last or Verdict("undetermined", 0.0, "Collecting evidence: a finding is settling.")
        if not self._loop_seen:
            verdict = before_loop(waiting or "the first step")
            # no label before the first step: the findings that argue for one wait for the loop
            analysis.findings = [f for f in analysis.findings if f.label == "undetermined" or f.severity == "info"]
        self._last = verdict
        analysis.verdict = verdict
        return analysis

    def _update(self, rule: Rule, holds: bool, now: float) -> bool:
        if holds:
            self._false_since.pop(rule.id, None)
            since = self._true_since.setdefault(rule.id, now)
            if now - since >= rule.hold_s - HOLD_SLACK_S:
                self._firing.add(rule.id)
        else:
            self._true_since.pop(rule.id, None)
            since = self._false_since.setdefault(rule.id, now)
            if now - since >= rule.hold_s - HOLD_SLACK_S:
                self._firing.discard(rule.id)
        return rule.id in self._firing

    @staticmethod
    def _finding(rule: Rule, values: Mapping[str, Any]) -> Finding:
        measure = None
        if rule.measure is not None:
            try:
                measure = float(rule.measure.evaluate(values))
            except (expr.Missing, TypeError, ValueError):
                measure = None
        fixes = []
        for fx in rule.fixes:
            if fx.when is not None:
                try:
                    if not fx.when.evaluate(values):
                        continue
                except expr.Missing:
                    continue
            trial = _trial(fx.trial, values) if fx.trial else None
            predicted = predict_fix(rule.id, fx.title, trial, values)
            fixes.append(Fix(fill(fx.title, values), fill(fx.detail, values), trial, predicted))
        evidence = {name: values.get(name) for name in rule.evidence}
        return Finding(
            rule.id,
            rule.label,
            rule.severity,
            fill(rule.summary, values),
            measure,
            evidence,
            tuple(fixes),
            rule.source,
            rule.scope,
        )

    @staticmethod
    def _verdict(findings: list[Finding], features: Features) -> Verdict:
        # health findings (the loss: scope "health") are beside the verdict, never part of it
        findings = [f for f in findings if f.scope != "health"]
        deciding = [f for f in findings if f.severity != "info" and f.label != "undetermined"]
        stack_n = features.get("stack_samples") or 0.0
        thread_n = features.get("thread_samples") or 0.0
        if not deciding:
            if stack_n < MIN_STACK_SAMPLES and thread_n < MIN_THREAD_SAMPLES:
                return Verdict("undetermined", 0.0, "Collecting evidence: not enough samples of the loop yet.")
            idle = [f for f in findings if f.label == "undetermined"]
            if idle:
                return Verdict("undetermined", 0.5, idle[0].summary)
            return Verdict(
                "undetermined", 0.3, "No resource is seen limiting the loop: no rule's threshold is crossed."
            )
        # The label: the first label a deciding finding argues for (a machine-scope finding's
        # cpu-bound only when no other label is argued for: a loop that waits on its DataLoader
        # stays so); within it, the first finding in finding_order.
        win = min(deciding, key=lambda f: (_PRIORITY[f.label], finding_order(f)))

        def explained(f: Finding) -> float:
            # A rule without a measure claims a modest share; finite and within 0..1 always.
            m = f.measure if f.measure is not None and math.isfinite(f.measure) else 0.3
            return min(1.0, max(0.0, m))

        measure = explained(win)
        best = max([measure] + [explained(f) for f in deciding if f.label != win.label])
        dominance = measure / best if best > 0 else 1.0
        # 60 stack samples = 3 s at 20 Hz; 30 thread samples = 3 s at 10 Hz.
        coverage = min(1.0, max(stack_n / 60.0, thread_n / 30.0))
        confidence = min(0.95, 0.5 + measure) * coverage * dominance * (1.0 - _blur(win, features))
        return Verdict(win.label, min(0.95, max(0.05, confidence)), win.summary)


def before_loop(waiting: str) -> Verdict:
    """The verdict before the training's first step: ``undetermined`` at confidence 0 (no reading
    of a loop yet), its summary and :attr:`Verdict.waiting_for` saying what the training does."""
    return Verdict("undetermined", 0.0, f"Waiting for the first step: {waiting}.", waiting_for=waiting)


BLUR_FLOOR = 0.1
"""Run-queue wait (share of wall time) below which the loop's readings are taken as sharp: on a
quiet 2-core machine here the busiest thread of a CPU-bound training waited 0.02-0.08 for a CPU
(torchwatch and py-spy beside it)."""


def _blur(win: Finding, f: Features) -> float:
    """How much waiting for a CPU that others hold blurs the winning finding's readings, 0..1: the
    run-queue share of the loop (its main thread, or the intra-op thread that waited most) when it
    is at least :data:`BLUR_FLOOR` and other processes use >= half a core (``foreign_cpu_cores``),
    else 0. A thread ready to run but without a CPU is neither computing nor waiting on what the
    finding names, so the finding explains that much less of the step. A wait the training makes
    itself (its threads beyond its CPUs, its quota spent) is part of its own work and blurs
    nothing; a finding of scope ``machine`` (the neighbours themselves) is not blurred by them."""
    if win.scope == "machine" or (f.get("foreign_cpu_cores") or 0.0) < 0.5:
        return 0.0
    waited = max(f.get("main_runqueue_share") or 0.0, f.get("threads_runqueue_share") or 0.0)
    return min(0.9, waited) if waited >= BLUR_FLOOR else 0.0


def finding_order(f: Finding) -> tuple[int, int, int, float, bool]:
    """Sort key of findings. First, deciding findings (warning or critical, not ``undetermined``)
    whose rule's scope is ``machine``: other processes hold the CPUs the training needs, and their
    load does not shrink when the training's does; every reading of the loop is taken under that
    scarcity and their fix changes them all (measured, ``bench/noisy.py``: beside one busy process,
    a DataLoader-bound training ran 5.0x faster with the neighbour gone, 2.4x with its own relief;
    a CPU-bound one 6.7x against 4.3x). Then findings that decide a label in label order
    (:data:`~torchwatch.model.labels.LABELS`), then ``undetermined`` ones, then ``info``, then scope
    ``health`` (the loss: beside the verdict, never part of it). Within a
    label, scope ``demand`` (the training's own demand beyond its CPUs: a quota it spends, more
    threads than CPUs) after the others: making the loop cheaper shrinks that wait too (measured:
    under a 1-CPU quota big_cpu_matmul ran 2.3x faster with the quota lifted, 8.8x with its own
    relief; every scenario's own relief beat lifting the quota or lowering the threads); then the
    larger measure, critical before warning. The verdict's label does not follow this order: see
    :meth:`Diagnoser._verdict`."""
    tier = 3 if f.scope == "health" else 2 if f.severity == "info" else (1 if f.label == "undetermined" else 0)
    if f.scope == "machine" and tier == 0:
        return (0, -1, 0, -(f.measure or 0.0), f.severity != "critical")
    return (tier, _PRIORITY[f.label], 1 if f.scope == "demand" else 0, -(f.measure or 0.0), f.severity != "critical")


def _trial(template: str, values: Mapping[str, Any]) -> str | None:
    """A fix's ``trial`` filled in, when it is a setting and value a live trial takes (a missing
    reading leaves the fix without one)."""
    from torchwatch.wire import parse_assignment

    text = fill(template, values)
    try:
        parse_assignment(text)
    except ValueError:
        return None
    return text

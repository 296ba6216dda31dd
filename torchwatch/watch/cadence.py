"""How fast the samplers run: fast until the verdict settles, then a steady cadence that costs a
fraction, and fast again the moment something changes.

:class:`CadencePolicy` is pure (readings in, cadence out, no clock, no threads): the session hands
it one :class:`CadenceReading` per analysis tick (:func:`cadence_reading` makes it of the tick's
analysis) and an event for what the readings cannot show (a key pressed in the TUI, a burst asked
for). :class:`Pacer` holds the policy for the session's threads: it applies each new
:class:`Cadence` to the sources (through the session's ``apply``), keeps the changes and the time
spent steady for the report, and wakes the napping samplers when the cadence changes.

Why these numbers (measured with ``bench/footprint.py`` on a 2-core machine, each sampler alone,
% of one core): py-spy 20 Hz in 3 s chunks ~1.0 (each start ~0.012 CPU-s, each sample per Hz
~0.03 % of a core), thread states 10 Hz ~0.45, psutil 1 Hz ~0.3, the hook's files 2 Hz ~0.2,
NVML 1 Hz ~0.02. The steady cadence cuts the costly ones and keeps enough samples in the
verdict's window for the same features: py-spy 5 Hz in 8 s chunks (at least one chunk, >= 40
loop samples, in a 10 s window, above the 20 the stack shares need), the loop's thread states at
5 Hz (50 in the window, above the 30 that give full coverage to the confidence).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from torchwatch.analysis.diagnosis import Analysis
from torchwatch.model.observation import SamplingChange, SamplingView
from torchwatch.model.readings import HookState, Role, Status
from torchwatch.sources import Pace
from torchwatch.sources.registry import SOURCES
from torchwatch.watch.options import SessionOptions

FAST = "fast"
STEADY = "steady"

# Evaluations in a row with the same label and top finding before the cadence drops: one window's
# worth at the default 1 s analysis interval and 10 s window, so every reading the settled verdict
# is computed over was taken at the fast cadence and agreed, and a rule's hold time (``for``, 1-5 s
# in the shipped rules) has passed twice over.
SETTLE_EVALUATIONS = 10
# A step time this much longer or shorter (relative, median over the window) than when the verdict
# settled: compute unchanged, a new wait of x of the old step is a share x / (1 + x) of the new
# one, so 25 % is a new cause at 20 % of the step, the share most rules fire at (XProf's
# input-bound mark): the cadence is fast again by the time a rule can see it. Not less: with
# nothing changed, the window median of a dataloader-bound demo on a 2-core machine wandered by
# 11-17 % for tens of seconds (a worker losing its core), and each false wake costs ten seconds of
# the fast cadence (measured with ``bench/overhead.py --steady-window``).
STEP_SHIFT = 0.25
# The readings that move continuously (step time, data wait, confidence) must show the move in
# this many evaluations in a row (4 s at the steady 2 s interval): one window's median crossing
# the line once is noise; a change of cause outlasts it (the shipped rules hold 1-5 s before they
# fire). The discrete changes (label, top finding, straggler, processes, burst, a key) act at once.
SHIFT_HOLD = 2
# Fewer steps than this in the window and the step time is not compared: the median of 8 step
# times strays ~0.44 standard deviations of one step (1.25 / sqrt(8)), under the 25 % above for a
# loop whose steps vary by up to a third; the median of 2 or 3 steps (a 4 s step in a 10 s
# window) jumps with every step.
MIN_STEPS = 8
# The reference is the median of the last readings of the settling run, not of all of it: the
# first seconds of a verdict often still ramp (the data wait climbs as the prefetched batches
# run out).
REFERENCE_READINGS = 5
# The DataLoader wait (share of the step) moving this many points from where it settled: half the
# 20 % at which the input rules fire.
WAIT_SHIFT = 0.10
# The verdict's confidence falling this far below the lowest it had while it settled.
CONFIDENCE_DROP = 0.10
# The cadence changes the report keeps (the last ones): a flapping training must not grow it.
CHANGES_KEPT = 50
# A startup share above this (py-spy sees the loop's thread importing) means the training is still starting.
STARTING_SHARE = 0.5


def until_tick(now: float, interval: float) -> float:
    """Seconds from ``now`` to the next multiple of ``interval`` on the same clock.

    Every source and the rules are read on a multiple of their own interval, and the intervals of
    a cadence divide one another (0.1 / 0.5 / 1 s fast, 0.2 / 1 / 2 s steady), so the reads due
    at one instant are done in one wake-up of torchwatch, not one each at its own phase. On a
    machine whose cores the training fills, each wake-up takes a core from a training thread for
    a moment, however little CPU it then uses.

    A wake-up a little early (a timer's slack) or late still counts as the tick it was meant for:
    the next tick is the one after the nearest, at least half an interval away.

    Args:
        now: the current time, s (``time.monotonic()``).
        interval: s between two ticks; 0 or less: no wait.

    Returns:
        s to wait, in ``[interval / 2, 3 * interval / 2)``, or 0.0 when ``interval <= 0``.
    """
    if interval <= 0:
        return 0.0
    return (math.floor(now / interval + 0.5) + 1) * interval - now


@dataclass(frozen=True)
class Cadence:
    """What each sampler does in one mode.

    Attributes:
        mode: ``fast`` or ``steady``.
        paces: ``{source name: its pace}`` for every paced source of
            :data:`~torchwatch.sources.registry.SOURCES` (a :data:`~torchwatch.sources.Pace`: its
            own knobs, e.g. ``{"interval_s": 1.0}``: seconds between two reads).
        analysis_interval_s: seconds between two evaluations of the rules (and Observations).
    """

    mode: str
    paces: Mapping[str, Pace]
    analysis_interval_s: float = 1.0

    def pace(self, source: str) -> Pace:
        """The pace of the source named ``source`` (``KeyError``: not paced)."""
        return self.paces[source]


def fast_cadence(options: SessionOptions | None = None) -> Cadence:
    """The rates of the session's ``options`` (default :class:`SessionOptions`): every reading as
    often as the first verdict needs (each source's fast pace, :attr:`SourceSpec.fast`)."""
    opts = options or SessionOptions()
    paces = {spec.name: spec.fast(opts) for spec in SOURCES if spec.fast is not None}
    return Cadence(FAST, paces, opts.analysis_interval_s)


def steady_cadence(fast: Cadence, window_s: float = 10.0) -> Cadence:
    """The settled cadence: each source's steady pace of its fast one (:attr:`SourceSpec.steady`;
    py-spy at a quarter of the fast rate, at least 5 Hz, in chunks of 8 s, at most 0.8 of the
    verdict's ``window_s``; thread states at 5 Hz, every thread every 2 s; psutil every 2 s, the
    hook every second, NVML every 2 s) and the rules every 2 s; never faster than ``fast``."""
    paces = {
        spec.name: spec.steady(fast.paces[spec.name], window_s)
        for spec in SOURCES
        if spec.steady is not None and spec.name in fast.paces
    }
    return Cadence(STEADY, paces, max(fast.analysis_interval_s, 2.0))


@dataclass(frozen=True)
class CadenceReading:
    """What one analysis tick tells the policy.

    Attributes:
        label: the verdict's label. top_finding: the rule behind the verdict (``None``: none).
        confidence: the verdict's confidence, 0..1.
        step_time_s: the focus rank's median step time over the window, s (``None``: no hook).
        steps: optimizer steps in the window (the step time is compared from :data:`MIN_STEPS`).
        data_wait: its DataLoader wait, share of the step 0..1 (``None``: not measured).
        processes: how many training processes (ranks) and DataLoader workers the tree has (a
            count, not PIDs: workers that are not persistent start again every epoch with new
            PIDs and the same work).
        straggler: the straggler's PID (``None``: none, or one process).
        burst: the focus hook's burst state and count (``state:count``; ``None``: no hook).
        collecting: the verdict still waits for samples, or the training for its first steps
            (never settles).
        filling: the training steps, but the window still reaches back before its first step:
            the verdict may hold (its evaluations count towards settling) while its continuous
            readings still climb, so none of them becomes the settled reference and the cadence
            does not settle on it.
    """

    label: str
    top_finding: str | None = None
    confidence: float = 0.0
    step_time_s: float | None = None
    steps: float = 0.0
    data_wait: float | None = None
    processes: tuple[int, int] = (0, 0)
    straggler: int | None = None
    burst: str | None = None
    collecting: bool = False
    filling: bool = False


@dataclass
class _Settled:
    """What the verdict looked like while it settled, the reference the steady cadence watches."""

    key: tuple[str, str | None, int | None]
    streak: int = 0
    full: int = 0  # of the streak, the evaluations of a window that was all steps
    min_confidence: float = 1.0
    step_times: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)


def _median(values: Collection[float]) -> float | None:
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return None
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class CadencePolicy:
    """Decides, each analysis tick, whether the samplers run fast or steady.

    Fast until :data:`SETTLE_EVALUATIONS` evaluations in a row give the same label, top finding and
    straggler with no change below, the last :data:`REFERENCE_READINGS` of them (at least) of a
    window that is all steps (:attr:`CadenceReading.filling`); then steady. Back to fast at once
    (and the count starts again) when the label, the top finding or the straggler changes, a
    training process or worker appears or vanishes, the hook's burst state or count changes, or
    :meth:`wake` is called (a key in the TUI, a burst asked for); and when, for :data:`SHIFT_HOLD`
    evaluations in a row, the step time has moved :data:`STEP_SHIFT` or the data wait
    :data:`WAIT_SHIFT` from where they settled, or the confidence has fallen :data:`CONFIDENCE_DROP`
    below its settled low.

    Args:
        fast: the fast cadence (the session's options). steady: the steady one (default
            :func:`steady_cadence` of ``fast``).
        settle: evaluations in a row before steady.

    Attributes:
        reason: why the cadence is what it is (one line for the report).
        changes: how many times the cadence went back to fast after settling.
    """

    def __init__(
        self, fast: Cadence | None = None, steady: Cadence | None = None, settle: int = SETTLE_EVALUATIONS
    ) -> None:
        self.fast = fast or fast_cadence()
        self.steady = steady or steady_cadence(self.fast)
        self.settle = settle
        self.cadence = self.fast
        self.reason = "starting: fast until the verdict settles"
        self.changes = 0
        self._settled: _Settled | None = None
        self._processes: tuple[int, int] | None = None
        self._burst: str | None = None
        self._held = 0  # steady evaluations in a row with a continuous reading past its line

    @property
    def mode(self) -> str:
        """``fast`` or ``steady``."""
        return self.cadence.mode

    def wake(self, why: str) -> Cadence:
        """Something the readings cannot show happened (a key, a burst request): fast at once."""
        return self._to_fast(why)

    def update(self, r: CadenceReading) -> Cadence:
        """The cadence after one analysis tick's reading."""
        why = self._changed(r)
        self._processes = r.processes
        self._burst = r.burst
        if why is not None:
            self._to_fast(why)
            if r.collecting:
                return self.cadence
            self._settled = _Settled((r.label, r.top_finding, r.straggler))
        s = self._settled
        if s is None:
            return self.cadence
        if self.mode == FAST:
            s.streak += 1
            if not r.filling:  # the reference: readings of windows that are all steps
                s.full += 1
                s.min_confidence = min(s.min_confidence, r.confidence)
                if r.step_time_s is not None and r.steps >= MIN_STEPS:
                    s.step_times.append(r.step_time_s)
                if r.data_wait is not None:
                    s.waits.append(r.data_wait)
            if s.streak >= self.settle and s.full >= min(self.settle, REFERENCE_READINGS):
                self.cadence = self.steady
                self.reason = f"the verdict held for {s.streak} evaluations in a row"
        return self.cadence

    def _changed(self, r: CadenceReading) -> str | None:
        """Why this reading sends the cadence back to fast (and restarts the count), or ``None``."""
        s = self._settled
        if r.collecting:
            return "the verdict is still collecting evidence"
        if s is None:
            return "first verdict"
        if (r.label, r.top_finding, r.straggler) != s.key:
            what = "straggler" if r.label == s.key[0] and r.top_finding == s.key[1] else "verdict"
            return f"the {what} changed"
        if self._processes is not None and r.processes != self._processes:
            return "a training process or DataLoader worker appeared or exited"
        if self._burst is not None and r.burst is not None and r.burst != self._burst:
            return "a profiler burst was asked for"
        if self.mode != STEADY:
            return None
        why = self._shifted(r, s)
        self._held = self._held + 1 if why is not None else 0
        return why if self._held >= SHIFT_HOLD else None

    @staticmethod
    def _shifted(r: CadenceReading, s: _Settled) -> str | None:
        """How a continuous reading moved past its line from where the verdict settled, or ``None``."""
        ref_step = _median(s.step_times[-REFERENCE_READINGS:])
        ref_wait = _median(s.waits[-REFERENCE_READINGS:])
        step = r.step_time_s if r.steps >= MIN_STEPS else None
        if step is not None and ref_step and abs(step / ref_step - 1) >= STEP_SHIFT:
            return f"the step time moved {step / ref_step - 1:+.0%}"
        if r.data_wait is not None and ref_wait is not None and abs(r.data_wait - ref_wait) >= WAIT_SHIFT:
            return f"the data wait moved {100 * (r.data_wait - ref_wait):+.0f} points"
        if r.confidence < s.min_confidence - CONFIDENCE_DROP:
            return "the verdict's evidence weakened"
        return None

    def _to_fast(self, why: str) -> Cadence:
        if self.mode == STEADY:
            self.changes += 1
        if self._settled is not None:
            self._settled = _Settled(self._settled.key)
        self.cadence = self.fast
        self.reason = why
        self._held = 0
        return self.cadence


def cadence_reading(
    analysis: Analysis,
    *,
    window_s: float,
    roles: Iterable[Role],
    focus_hook: HookState | None,
    hook_status: Status,
    now: float,
) -> CadenceReading:
    """What the policy needs of one analysis tick.

    Args:
        analysis: the tick's analysis (of the job, with several ranks).
        window_s: the verdict's window, s (the step count is the window's).
        roles: the role of every process of the tree now (training processes and workers counted).
        focus_hook: the focus process's latest hook reading (``None``: none).
        hook_status: the hook source's status.
        now: the time of the tick, monotonic s (the clock of ``HookState.first_step_t``).
    """
    v, f = analysis.verdict, analysis.features
    top = next((x.rule for x in analysis.findings if x.label == v.label and x.summary == v.summary), None)
    step_ms = f.get("step_time_p50_ms")
    wait = f.get("data_wait_fraction")
    tree = list(roles)
    burst = focus_hook.record.burst if focus_hook is not None and focus_hook.record is not None else None
    return CadenceReading(
        label=v.label,
        top_finding=top,
        confidence=v.confidence,
        step_time_s=None if step_ms is None else step_ms / 1000.0,
        steps=(f.get("hook_steps_per_s") or 0.0) * window_s,
        data_wait=wait if wait is not None else f.get("data_wait_share"),
        processes=(tree.count(Role.MAIN), tree.count(Role.WORKER)),
        straggler=analysis.straggler.pid if analysis.straggler is not None else None,
        burst=None if burst is None else f"{burst.state}:{burst.count}",
        collecting=_collecting(analysis, focus_hook, hook_status),
        filling=_filling(focus_hook, window_s, now),
    )


def _collecting(analysis: Analysis, focus_hook: HookState | None, hook_status: Status) -> bool:
    """The verdict cannot hold yet: it still waits for samples, or the training is still starting
    (importing, or its hook has counted no step in the window), so the readings that matter have
    not begun."""
    v, f = analysis.verdict, analysis.features
    if v.label == "undetermined" and v.confidence == 0.0:
        return True
    if (f.get("startup_share") or 0.0) > STARTING_SHARE:
        return True
    return hook_status is Status.STARTING or (hook_status is Status.OK and not f.get("hook_steps_per_s"))


def _filling(focus_hook: HookState | None, window_s: float, now: float) -> bool:
    """The window still reaches back before the focus's first step (its hook's ``first_step_t``):
    its shares (the data wait above all) still climb as the loop fills it, and a reference taken
    now would wake the cadence later. The verdict's evaluations count towards settling meanwhile
    (:attr:`CadenceReading.filling`): the cadence settles :data:`REFERENCE_READINGS` evaluations
    after the window is all steps, not :data:`SETTLE_EVALUATIONS` after."""
    first = focus_hook.first_step_t if focus_hook is not None else 0.0
    return bool(first) and now - first < window_s


class Pacer:
    """The cadence in force for a session's samplers, for its threads (thread-safe).

    Args:
        policy: decides the cadence; its current one is applied at once.
        apply: sets every source's pace to a cadence's (the session's wiring); called outside any
            lock, before the napping samplers are woken, so they wake to the new rates.
        started: when watching started, monotonic s (the changes are stamped from it).
        adaptive: ``False``: the fast cadence throughout; readings and wakes change nothing.
    """

    def __init__(
        self, policy: CadencePolicy, apply: Callable[[Cadence], None], started: float, adaptive: bool = True
    ) -> None:
        self.policy = policy
        self.adaptive = adaptive
        self._apply = apply
        self._started = started
        self._lock = threading.Lock()
        self._nap = threading.Condition()
        self._generation = 0
        self._changes: list[SamplingChange] = []
        self._steady_since: float | None = None
        self._steady_s = 0.0
        self._switch(policy.cadence)

    @property
    def cadence(self) -> Cadence:
        """The cadence in force."""
        with self._lock:
            return self.policy.cadence

    @property
    def generation(self) -> int:
        """How many times a cadence was applied: a sampler that sees it change reads its sources now."""
        return self._generation

    def update(self, reading: CadenceReading, now: float | None = None) -> None:
        """Hand the policy one analysis tick's reading and apply the cadence it returns."""
        if self.adaptive:
            self._change(reading, now)

    def wake(self, why: str, now: float | None = None) -> None:
        """Back to the fast cadence now: something the readings cannot show happened (``why``: a
        key pressed in the TUI, a burst asked for)."""
        if self.adaptive:
            self._change(why, now)

    def _change(self, reading: CadenceReading | str, now: float | None) -> None:
        with self._lock:
            before = self.policy.cadence
            after = self.policy.wake(reading) if isinstance(reading, str) else self.policy.update(reading)
            if after == before:
                return
            now = time.monotonic() if now is None else now
            if after.mode == FAST and self._steady_since is not None:
                self._steady_s += now - self._steady_since
                self._steady_since = None
            elif after.mode != FAST:
                self._steady_since = now
            self._changes.append(SamplingChange(round(now - self._started, 1), after.mode, self.policy.reason))
            del self._changes[:-CHANGES_KEPT]
        self._switch(after)

    def _switch(self, cadence: Cadence) -> None:
        self._apply(cadence)
        with self._nap:
            self._generation += 1
            self._nap.notify_all()

    def view(self, now: float | None = None) -> SamplingView:
        """The cadence, why, the seconds spent steady so far (until ``now``, monotonic s) and the
        last :data:`CHANGES_KEPT` changes."""
        now = time.monotonic() if now is None else now
        with self._lock:
            steady = self._steady_s + (now - self._steady_since if self._steady_since is not None else 0.0)
            return SamplingView(
                mode=self.policy.mode,
                reason=self.policy.reason if self.adaptive else "adaptive cadence off",
                steady_s=round(steady, 1),
                returns_to_fast=self.policy.changes,
                changes=tuple(self._changes),
            )

    def nap(self, seconds: float, stop: threading.Event) -> None:
        """Wait ``seconds``, or less when ``stop`` is set (and :meth:`interrupt` called) or the
        cadence changes."""
        with self._nap:
            generation = self._generation
            self._nap.wait_for(lambda: stop.is_set() or self._generation != generation, seconds)

    def interrupt(self) -> None:
        """Wake every nap now, to look at its ``stop`` event (watching stops)."""
        with self._nap:
            self._nap.notify_all()

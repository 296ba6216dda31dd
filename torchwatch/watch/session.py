"""A watch session: sampler threads feed the store; an analysis thread turns windows into verdicts.

One direction only: sources → store → features → diagnosis → Observation → faces (TUI, report,
status line). Each analysis tick builds one :class:`~torchwatch.model.observation.Observation`
(:mod:`torchwatch.watch.observe`); no face calls a source or reads the store: they get
:meth:`Session.observe` and :meth:`Session.final_observation`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import resource
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from torchwatch.analysis import features as feats
from torchwatch.analysis import ranks
from torchwatch.analysis.diagnosis import Analysis, Diagnoser
from torchwatch.analysis.rules_engine import Rule
from torchwatch.analysis.store import KEEP_S, Store, Window
from torchwatch.hook.wire import RankInfo
from torchwatch.model import files
from torchwatch.model.errors import TorchwatchError
from torchwatch.model.observation import (
    ChildProcess,
    Observation,
    SamplingChange,
    SamplingView,
    SelfUsage,
    TargetView,
    VerdictChange,
)
from torchwatch.model.readings import GpuSample, HookState, Role, SourceStatus, Status
from torchwatch.model.trials import Outcome
from torchwatch.sources import Source
from torchwatch.sources.hook import OTHER_RANKS_EVERY, HookSource
from torchwatch.sources.nvml import NvmlSource
from torchwatch.sources.proc import ProcessTree, ProcSource, ThreadStateSource
from torchwatch.sources.pyspy import PySpySource
from torchwatch.watch.cadence import (
    FAST,
    Cadence,
    CadencePolicy,
    CadenceReading,
    fast_cadence,
    steady_cadence,
    until_tick,
)
from torchwatch.watch.hang import HangRecorder
from torchwatch.watch.observe import Tick, Trends, device_memory, observe, target_view

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionOptions:
    """Tunables of a session.

    Attributes:
        window_s: seconds of readings each verdict is computed over.
        analysis_interval_s: seconds between two evaluations of the rules.
        pyspy_rate: py-spy samples per second per thread.
        pyspy_chunk_s: seconds per py-spy recording.
        thread_interval_s: seconds between two rounds of thread-state sampling.
        nvml: whether to read GPUs through NVML at all.
        trace_path: append every analysis (features, findings, verdict) to this file as JSON lines.
        hook_expected: the training was started with the hook pre-loaded (``torchwatch run``).
        hang_after: seconds without a step that count as a hang (``--hang-after``); ``None``:
            ``max(30 s, 20 x p95 step)`` per process (:mod:`torchwatch.analysis.hang`).
        adaptive: drop to the steady cadence once the verdict settles
            (:mod:`torchwatch.watch.cadence`); ``False`` samples at the rates above throughout.
    """

    window_s: float = 10.0
    analysis_interval_s: float = 1.0
    pyspy_rate: int = 20
    pyspy_chunk_s: float = 3.0
    thread_interval_s: float = 0.1
    nvml: bool = True
    trace_path: Path | None = None
    hook_expected: bool = False
    hang_after: float | None = None
    adaptive: bool = True


# The bounds of --window. py-spy's stack samples arrive a chunk at a time, all stamped at the
# chunk's end: a window shorter than a chunk may hold none and flip between a label and
# "undetermined". A window longer than the store keeps would silently be cut to what it holds.
WINDOW_MIN_S = SessionOptions.pyspy_chunk_s
WINDOW_MAX_S = KEEP_S
# A tick's sources count as due this early: a timed wait may end a little before its deadline.
TICK_SLACK_S = 0.002
HANG_JOIN_S = 20.0  # the report waits this long for a thread dump in flight (py-spy's timeout is 10 s a process)


class Session:
    """Watches the process tree under ``root_pid`` until :meth:`stop`.

    Args:
        root_pid: the PID that was started (``run``) or named (``attach``).
        rules: loaded rules.
        options: see :class:`SessionOptions`.
        child: the launched command (``run``): its command line and exit status go into every
            Observation; ``None`` for ``attach``.

    Raises:
        psutil.NoSuchProcess: ``root_pid`` does not exist.
    """

    def __init__(
        self,
        root_pid: int,
        rules: list[Rule],
        options: SessionOptions | None = None,
        child: ChildProcess | None = None,
    ) -> None:
        self.options = options or SessionOptions()
        self.tree = ProcessTree(root_pid)
        self.store = Store()
        self.started = time.monotonic()
        self.child = child
        self.trends = Trends()
        self._observation: Observation | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.latest: Analysis | None = None
        self.last_alive: Analysis | None = None  # the last analysis made while the target ran
        self.history: list[tuple[float, str]] = []  # (seconds since start, label) at each change
        self.ended_at: float | None = None
        self._chosen: int | None = None
        self.chosen_rank: int | None = None  # the rank the user picked to show (TUI), else the straggler
        self._diagnosers: dict[int, Diagnoser] = {}
        self._straggler_pid: int | None = None
        self._rank_analyses: dict[int, Analysis] = {}  # {pid: its last analysis}
        self._tick = 0
        self.stopped_target = False  # torchwatch stopped the launched command (--duration, q)
        self._errors_seen: set[str] = set()
        self._trace_file: TextIO | None = None  # --trace, opened at the first analysis
        opts = self.options
        self.proc = ProcSource(self.tree)
        self.pyspy = PySpySource(
            self._main_pid, self._role_of, self.tree.root_alive, rate=opts.pyspy_rate, chunk=opts.pyspy_chunk_s
        )
        self.threads = ThreadStateSource(self.tree, interval=opts.thread_interval_s)
        self.sources: list[Source] = [self.proc, self.threads, self.pyspy]
        self.hook = HookSource(self._main_pid, expected=opts.hook_expected, rank_pids=self.tree.mains)
        self.sources.append(self.hook)
        self.nvml: NvmlSource | None = None
        if opts.nvml:
            self.nvml = NvmlSource(self.tree.pids)
            self.sources.append(self.nvml)
        self.diagnoser = Diagnoser(rules, self.why_missing)
        self.hang = HangRecorder(self.tree, self.started, opts.hang_after)
        # The sampler threads nap on this condition: a change of cadence wakes them at once.
        self._nap = threading.Condition()
        self._cadence_gen = 0
        fast = fast_cadence(opts.pyspy_rate, opts.pyspy_chunk_s, opts.thread_interval_s, opts.analysis_interval_s)
        self.cadence = CadencePolicy(fast, steady_cadence(fast, opts.window_s))
        self.sampling_changes: list[tuple[float, str, str]] = []  # (s since start, mode, why)
        self._steady_since: float | None = None
        self._steady_s = 0.0
        self._apply(self.cadence.cadence)

    # -- tree helpers handed to sources -------------------------------------------------------
    def _main_pid(self) -> int | None:
        """The training process to diagnose: the busiest main, kept until another is 2x busier.

        Under torchrun every rank is a main (ranks look alike, the first stays); when a Python
        wrapper starts the real training with subprocess, the training is the busy one.
        """
        mains = self.tree.mains()
        if not mains:
            return None
        # With several ranks: the rank chosen, else the straggler, else the lowest rank (a
        # torch.multiprocessing.spawn launcher is a main too, and an idle one).
        latest = self.latest
        lowest = latest.ranks[0].pid if latest is not None and latest.ranks else None
        picked = self._rank_pid(self.chosen_rank) if self.chosen_rank is not None else self._straggler_pid
        for pid in (picked, lowest):
            if pid in mains:
                return pid
        cpu = self.proc.cpu_pct
        current = self._chosen if self._chosen in mains else mains[0]
        busiest = max(mains, key=lambda pid: cpu.get(pid, 0.0))
        if cpu.get(busiest, 0.0) > 2.0 * cpu.get(current, 0.0) + 5.0:
            current = busiest
        self._chosen = current
        return current

    def _rank_pid(self, rank: int) -> int | None:
        """The PID of ``rank`` in the last analysis, ``None`` when it has none."""
        latest = self.latest
        found = [r.pid for r in latest.ranks if r.rank == rank] if latest is not None else []
        return found[0] if found else None

    def choose_rank(self, rank: int | None) -> None:
        """Show ``rank`` in the panels (and diagnose it with py-spy's stacks); ``None``: the
        straggler when there is one, else the busiest rank."""
        self.chosen_rank = rank

    def _diagnoser(self, pid: int | None) -> Diagnoser:
        """Each rank's rules hold and release on their own; the first process keeps the session's."""
        if pid is None:
            return self.diagnoser
        if pid not in self._diagnosers:
            first = not self._diagnosers
            self._diagnosers[pid] = self.diagnoser if first else Diagnoser(self.diagnoser.rules, self.why_missing)
        return self._diagnosers[pid]

    def _evaluate(self, window: Window, now: float) -> Analysis:
        """The analysis of the focus process; with several ranks, every rank's own, their
        readings, the straggler and the job's verdict (:mod:`torchwatch.analysis.ranks`)."""
        focus = self.main_pid
        # The ranks: processes whose hook says they are one (a wrapper script or a
        # torch.multiprocessing.spawn launcher is a main too); those that exited during the
        # window (a job ending, stopped by --duration) keep their readings in it, so the last
        # verdict still compares every rank.
        pids = list(dict.fromkeys(h.pid for h in window.hook if h.record is not None and _is_rank(h.record.rank)))
        if len(pids) < 2:
            self._straggler_pid = None
            return self._diagnoser(focus).evaluate(feats.compute(window, focus), now, feats.texts(window, focus))
        # The ranks not shown are diagnosed every other tick (each costs a pass over the window);
        # in between their last analysis stands.
        self._tick += 1
        per_rank = {}
        for pid in pids:
            last = self._rank_analyses.get(pid)
            if pid == focus or last is None or self._tick % OTHER_RANKS_EVERY == 0:
                last = self._rank_analyses[pid] = self._diagnoser(pid).evaluate(
                    feats.compute(window, pid), now, feats.texts(window, pid)
                )
            per_rank[pid] = last
        for gone in [p for p in self._rank_analyses if p not in pids]:
            del self._rank_analyses[gone]
        for gone in [p for p in self._diagnosers if p not in pids and self._diagnosers[p] is not self.diagnoser]:
            del self._diagnosers[gone]
        readings = ranks.rank_readings(window, per_rank)
        found = ranks.straggler(readings)
        self._straggler_pid = found.pid if found is not None else None
        shown = focus if focus in per_rank else (readings[0].pid if readings else pids[0])
        analysis = per_rank[shown]
        analysis.per_rank, analysis.ranks = per_rank, readings
        return ranks.job_analysis(analysis, per_rank, found)

    def _role_of(self, pid: int) -> Role:
        node = self.tree.nodes().get(pid)
        return node.role if node else Role.OTHER

    @property
    def main_pid(self) -> int | None:
        """PID of the training process (first rank), once found."""
        return self._main_pid()

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the sampling threads: one that ticks (the quick readers, then the rules), and one
        for each source that blocks (py-spy for a chunk, NVML in the driver)."""
        ticked = [src for src in self.sources if src in (self.proc, self.threads, self.hook)]
        for src in self.sources:
            if src in ticked:
                continue
            t = threading.Thread(target=self._sample_loop, args=(src,), name=f"torchwatch-{src.name}", daemon=True)
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._tick_loop, args=(ticked,), name="torchwatch-ticks", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop sampling, close the sources and join the threads. Idempotent."""
        self._stop.set()
        with self._nap:
            self._nap.notify_all()
        for src in self.sources:
            try:
                src.close()
            except Exception:  # a source failing to close must not block the exit
                log.warning("closing the %s source failed", src.name, exc_info=True)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._close_trace()

    @property
    def target_gone(self) -> bool:
        """Whether the watched root process has exited."""
        return self.proc.status.status is Status.GONE

    def statuses(self) -> dict[str, SourceStatus]:
        """``{source name: status}`` for the report and the TUI; ``gpm`` (GPU Performance Monitoring,
        read by the NVML source) beside ``nvml``, so that "why is SM activity n/a" is said once."""
        out = {src.name: src.status for src in self.sources}
        if self.nvml is not None:
            out["gpm"] = self.nvml.gpm_status
        return out

    def own_usage(self) -> SelfUsage:
        """What watching cost so far: torchwatch's CPU s (all its threads), py-spy's CPU s, wall s,
        both together as % of one core, and torchwatch's peak RSS (bytes)."""
        me = resource.getrusage(resource.RUSAGE_SELF)
        own = me.ru_utime + me.ru_stime
        wall = max(1e-9, (self.ended_at or time.monotonic()) - self.started)
        return SelfUsage(
            torchwatch_cpu_s=round(own, 3),
            pyspy_cpu_s=round(self.pyspy.cpu_s, 3),
            wall_s=round(wall, 2),
            cpu_pct_of_core=round(100 * (own + self.pyspy.cpu_s) / wall, 2),
            max_rss_bytes=me.ru_maxrss * 1024,
        )

    def why_missing(self, feature: str) -> str:
        """Why ``feature`` has no value: the status of its source, or too few samples."""
        spec = feats.CATALOGUE.get(feature)
        if spec is None:
            return "unknown feature"
        by_source = {
            "py-spy": "py-spy",
            "proc": "threads",
            "psutil": "psutil",
            "psi": "psutil",
            "diskstats": "psutil",
            "vmstat": "psutil",
            "nvml": "nvml",
            "gpm": "gpm",
            "hook": "hook",
            "burst": "hook",
            "cgroup": "psutil",
        }
        names = [by_source.get(part, part) for part in spec.source.split("+")]
        statuses = self.statuses()
        for name in names:
            st = statuses.get(name)
            if st is not None and st.status is Status.UNAVAILABLE:
                return f"{name} unavailable: {st.reason}"
        if feature == "gpu_proc_sm_pct":
            last = self.store.latest(GpuSample)
            if isinstance(last, GpuSample) and last.proc_util_reason:
                return last.proc_util_reason
        if spec.source == "gpm":
            last = self.store.latest(GpuSample)
            if isinstance(last, GpuSample) and last.gpm_reason:
                return last.gpm_reason
        if self.main_pid is None:
            return "no Python training process found in the tree yet"
        if "diskstats" in spec.source:
            return (
                "no block device served enough reads in the window "
                "(data in the page cache or RAM, or on a network file system)"
            )
        if spec.source == "burst":
            return "no profiler burst has completed yet (press b, or torchwatch burst PID)"
        if spec.source == "cgroup":
            return "no cgroup CPU quota binds the training (cpu.max / cpu.cfs_quota_us unset): nothing throttles it"
        if feature in ("intra_op_threads", "interop_threads", "cpu_threads_wanted"):
            return "the training's hook has not read its threads yet (it reads them at its steps)"
        if spec.source == "hook" and feature.startswith("dl_"):
            return "no DataLoader iterated in the training yet"
        if spec.source == "hook" and feature.startswith("cuda_"):
            reading = self.store.latest(HookState, lambda h: h.pid == self.main_pid)
            why = device_memory(reading.record if reading is not None else None).why
            return why or "the hook's device memory readings do not cover the window yet"
        return "not enough samples in the window yet, or the loop never entered that state"

    def _sample_loop(self, src: Source) -> None:
        """A source on a thread of its own: sample, then sleep to its next tick."""
        while not self._stop.is_set():
            if not self._sample(src) or self.ended_at is not None:
                return
            if src is self.nvml and src.status.status is Status.UNAVAILABLE:
                return  # NVML never comes back once unavailable (sample() gives [] for ever)
            self._sleep(until_tick(time.monotonic(), src.interval))

    def _tick_loop(self, sources: Sequence[Source]) -> None:
        """The quick readers (psutil, thread states, the hook's files) and the rules on one
        thread: each tick of the grid (:func:`until_tick`) reads the sources due, then evaluates
        the rules when they are due, then sleeps to the next tick of any of them.

        One thread, not one per source: the process wakes once a tick (5 times a second when
        steady), not once per source at its own phase, and its threads never queue for the GIL
        at the same instant (a thread per source on one grid doubled the context switches)."""
        due = {src: 0.0 for src in sources}  # the first round at once
        analysis_due = time.monotonic() + self.until_analysis(time.monotonic())
        gen = self._cadence_gen
        while not self._stop.is_set():
            now = time.monotonic()
            if gen != self._cadence_gen:  # a new cadence: read the sources now, then on its grid
                gen = self._cadence_gen
                due = dict.fromkeys(due, now)
                # the rules at their next tick: the change most often comes from the rules
                # themselves, and evaluating them again at once would only repeat the verdict
                analysis_due = now + self.until_analysis(now)
            for src in [s for s, t in due.items() if now >= t - TICK_SLACK_S]:
                if not self._sample(src):
                    del due[src]
                    continue
                t = time.monotonic()
                due[src] = t + until_tick(t, src.interval)
            if self.ended_at is not None:
                return
            if now >= analysis_due - TICK_SLACK_S:
                self._analysis_round()
                t = time.monotonic()
                analysis_due = t + self.until_analysis(t)
            self._sleep(max(0.0, min([analysis_due, *due.values()]) - time.monotonic()))

    def _sample(self, src: Source) -> bool:
        """One reading of ``src`` into the store; ``False`` when the source failed and stops
        (the others keep running)."""
        t0 = time.monotonic()
        try:
            readings = src.sample(t0)
        except Exception as exc:
            log.exception("the %s sampler failed; it stops, the other sources keep running", src.name)
            src.status = SourceStatus.unavailable(
                f"internal error in {src.name}: {exc!r}", "please report it; other sources keep running"
            )
            return False
        self.store.add(readings)
        if src is self.hook:
            self._mark_spawned(readings)
            self.hang.feed(readings)
        if src is self.proc and src.status.status is Status.GONE and self.ended_at is None:
            self.ended_at = time.monotonic()
        return True

    def _sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less when watching stops or the cadence changes."""
        with self._nap:
            gen = self._cadence_gen
            self._nap.wait_for(lambda: self._stop.is_set() or self._cadence_gen != gen, seconds)

    def _ranks_ended(self, analysis: Analysis) -> bool:
        """The job's ranks have exited while its launcher lingers: ``analysis`` (of the launcher
        alone) is not the job's, and the report keeps the last verdict made while they ran."""
        last = self.last_alive
        if analysis.ranks or last is None or not last.ranks:
            return False
        mains = set(self.tree.mains())
        return not any(r.pid in mains for r in last.ranks)

    def _mark_spawned(self, readings: Sequence[object]) -> None:
        """Ranks a training started with ``torch.multiprocessing.spawn`` (its hook lists them) are
        training processes of the tree, not its DataLoader workers."""
        for r in readings:
            if isinstance(r, HookState) and r.record is not None and r.record.spawned_ranks:
                self.tree.mark_spawned_ranks(r.pid, r.record.spawned_ranks)

    def analyze(self, now: float | None = None) -> Analysis:
        """Compute features and evaluate the rules over the last ``window_s`` seconds."""
        now = time.monotonic() if now is None else now
        end = self.ended_at if self.ended_at is not None else now
        window = self.store.window(end - self.options.window_s, end)
        analysis = self._evaluate(window, now)
        with self._lock:
            self.latest = analysis
            if self.ended_at is None and not self._ranks_ended(analysis):
                self.last_alive = analysis
            label = analysis.verdict.label
            if not self.history or self.history[-1][1] != label:
                self.history.append((round(now - self.started, 1), label))
        if self.ended_at is None and self.options.adaptive:
            self._adapt(self._cadence_reading(analysis), now)
        observation = self._observe(analysis, now)
        with self._lock:
            self._observation = observation
        if self.options.trace_path is not None:
            self._trace(analysis, now)
        return analysis

    # -- cadence ----------------------------------------------------------------------------------
    def _cadence_reading(self, analysis: Analysis) -> CadenceReading:
        """What the cadence policy needs of one analysis (see :class:`CadenceReading`)."""
        v, f = analysis.verdict, analysis.features
        top = next((x.rule for x in analysis.findings if x.label == v.label and x.summary == v.summary), None)
        step_ms = f.get("step_time_p50_ms")
        wait = f.get("data_wait_fraction")
        roles = [n.role for n in self.tree.nodes().values()]
        focus = self.main_pid
        reading = self.store.latest(HookState, lambda h: h.pid == focus) if focus is not None else None
        burst = reading.record.burst if reading is not None and reading.record is not None else None
        return CadenceReading(
            label=v.label,
            top_finding=top,
            confidence=v.confidence,
            step_time_s=None if step_ms is None else step_ms / 1000.0,
            steps=(f.get("hook_steps_per_s") or 0.0) * self.options.window_s,
            data_wait=wait if wait is not None else f.get("data_wait_share"),
            processes=(roles.count(Role.MAIN), roles.count(Role.WORKER)),
            straggler=analysis.straggler.pid if analysis.straggler is not None else None,
            burst=None if burst is None else f"{burst.state}:{burst.count}",
            collecting=self._collecting(analysis, reading),
        )

    def _collecting(self, analysis: Analysis, focus_hook: HookState | None) -> bool:
        """The verdict cannot settle yet: it still waits for samples, the training is still
        starting (importing, or its hook has counted no step in the window, or its first step is
        less than a window ago: ``focus_hook``, the focus process's latest hook reading), so the
        readings that matter have not begun or not filled the window."""
        v, f = analysis.verdict, analysis.features
        if v.label == "undetermined" and v.confidence == 0.0:
            return True
        if (f.get("startup_share") or 0.0) > 0.5:  # py-spy sees the loop's thread importing
            return True
        hook = self.hook.status.status
        if hook is Status.STARTING or (hook is Status.OK and not f.get("hook_steps_per_s")):
            return True
        # The window still reaches back before the first step: its shares (data wait above all)
        # still climb as the loop fills it, and a reference taken now would wake the cadence later.
        first = focus_hook.first_step_t if focus_hook is not None else 0.0
        return bool(first) and time.monotonic() - first < self.options.window_s

    def _adapt(self, reading: CadenceReading | str, now: float | None = None) -> None:
        """Hand the policy a reading (or, as a string, why to go fast: a key, a burst request)
        and apply the cadence it returns."""
        with self._lock:
            before = self.cadence.cadence
            after = self.cadence.wake(reading) if isinstance(reading, str) else self.cadence.update(reading)
            if after == before:
                return
            now = time.monotonic() if now is None else now
            if after.mode == FAST and self._steady_since is not None:
                self._steady_s += now - self._steady_since
                self._steady_since = None
            elif after.mode != FAST:
                self._steady_since = now
            self.sampling_changes.append((round(now - self.started, 1), after.mode, self.cadence.reason))
            del self.sampling_changes[:-50]  # bounded: a flapping training must not grow the report
        self._apply(after)

    def _apply(self, c: Cadence) -> None:
        """Set every source's rates to ``c``; going fast, cut a slow py-spy chunk short and wake
        the samplers, so the fast readings start now, not after the nap."""
        slower = c.pyspy_rate > self.pyspy.rate
        self.pyspy.rate, self.pyspy.chunk = c.pyspy_rate, c.pyspy_chunk_s
        self.threads.interval, self.threads.all_interval = c.thread_interval_s, c.all_threads_interval_s
        self.proc.interval = c.proc_interval_s
        self.hook.interval = c.hook_interval_s
        if self.nvml is not None:
            self.nvml.interval = c.nvml_interval_s
        if slower:
            self.pyspy.cut_short()
        with self._nap:
            self._cadence_gen += 1
            self._nap.notify_all()

    def wake(self, why: str) -> None:
        """Back to the fast cadence now: something the readings cannot show happened (a key
        pressed in the TUI, a burst asked for)."""
        if self.options.adaptive and self.ended_at is None:
            self._adapt(why)

    def sampling(self, now: float | None = None) -> SamplingView:
        """The current cadence, why, and the seconds spent steady so far."""
        now = time.monotonic() if now is None else now
        with self._lock:
            steady = self._steady_s + (now - self._steady_since if self._steady_since is not None else 0.0)
            return SamplingView(
                mode=self.cadence.mode,
                reason=self.cadence.reason if self.options.adaptive else "adaptive cadence off",
                steady_s=round(steady, 1),
                returns_to_fast=self.cadence.changes,
                changes=tuple(SamplingChange(t, mode, why) for t, mode, why in self.sampling_changes),
            )

    def _trace(self, analysis: Analysis, now: float) -> None:
        record = {
            "t": round(now - self.started, 2),
            "main_pid": self.main_pid,
            "verdict": analysis.verdict.to_json(),
            "findings": [f.rule for f in analysis.findings],
            "features": {k: (None if v is None else round(v, 4)) for k, v in analysis.features.items()},
        }
        try:
            if self._trace_file is None:
                # opened once, never through a link nor in a directory another user can change
                path = Path(self.options.trace_path).expanduser()  # type: ignore[arg-type]
                self._trace_file = os.fdopen(files.open_append(path), "a", encoding="utf-8")
            self._trace_file.write(json.dumps(record) + "\n")
            self._trace_file.flush()
        except OSError as exc:
            log.warning("--trace: cannot append to %s (%s): tracing stops", self.options.trace_path, exc)
            self.options = dataclasses.replace(self.options, trace_path=None)
            self._close_trace()

    def _close_trace(self) -> None:
        """Close the ``--trace`` file, if open."""
        f, self._trace_file = self._trace_file, None
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()

    def _analysis_round(self) -> None:
        """Trim the store, look for a hang, evaluate the rules; an error is logged, never raised."""
        self.store.trim(time.monotonic())
        try:
            self.hang.check(time.monotonic())
        except Exception as exc:
            self._log_analysis_error(exc)
        try:
            self.analyze()
        except Exception as exc:
            self._log_analysis_error(exc)

    def until_analysis(self, now: float) -> float:
        """Seconds from ``now`` to the next evaluation of the rules: the next tick of the
        analysis interval (1 s fast, 2 s steady), right after the samplers due at that tick."""
        return until_tick(now, self.cadence.cadence.analysis_interval_s)

    def _log_analysis_error(self, exc: Exception) -> None:
        """Log a failed analysis: the first of each kind as a warning, every one with its traceback
        at debug level (the loop retries every second, so a persistent error would flood the log)."""
        key = f"{type(exc).__name__}: {exc}"
        if key not in self._errors_seen:
            self._errors_seen.add(key)
            log.warning("analysis failed (retried every %g s): %s", self.options.analysis_interval_s, key)
        log.debug("analysis failed", exc_info=exc)

    # -- the Observation ---------------------------------------------------------------
    @property
    def latest_observation(self) -> Observation | None:
        """The last analysis tick's Observation, ``None`` before the first (costs nothing)."""
        with self._lock:
            return self._observation

    def observe(self) -> Observation:
        """The Observation to show now: the last tick's, or, once the analysis has stopped (the
        target exited) or before its first tick, one built now (exit line, statuses)."""
        with self._lock:
            current = self._observation
            analysis = self.last_alive or self.latest
        if current is not None and self.ended_at is None and not self._child_exited():
            return current
        return self._observe(analysis, time.monotonic())

    def final_observation(self) -> Observation:
        """The Observation the report is made of: the last verdict made while the target ran
        (see :meth:`final`) over the readings up to its exit; a thread dump in flight is waited for."""
        self.hang.join(HANG_JOIN_S)
        return self._observe(self.final(), time.monotonic())

    def _child_exited(self) -> bool:
        return self.child is not None and self.child.poll() is not None

    def _target(self) -> TargetView:
        root = self.tree.root
        nodes = self.tree.nodes()
        node = nodes.get(self.main_pid or root) or nodes.get(root)
        return target_view(root, node.cmdline if node else (), self.child, self.target_gone)

    def _observe(self, analysis: Analysis | None, now: float) -> Observation:
        """Build the Observation of ``analysis`` at ``now`` (see :func:`torchwatch.watch.observe.observe`)."""
        target = self._target()
        with self._lock:
            history = tuple(VerdictChange(t, label) for t, label in self.history)
        try:
            possible = (False, "the training has exited") if target.exited else self.burst_possible()
        except Exception as exc:  # a failing check must not cost the tick its Observation
            possible = (False, f"burst check failed: {exc!r}")
        tick = Tick(
            now=now,
            end=self.ended_at if self.ended_at is not None else now,
            started=self.started,
            window_s=self.options.window_s,
            analysis=analysis,
            statuses=tuple(self.statuses().items()),
            focus_pid=self.main_pid,
            target=target,
            hook_status=self.hook.status,
            burst_possible=possible,
            history=history,
            own_usage=self.own_usage(),
            hang=self.hang.view(self.ended_at if self.ended_at is not None else now),  # a stall ends with the training
            sampling=self.sampling(now),
        )
        return observe(self.store, tick, self.trends)

    def burst_possible(self) -> tuple[bool, str]:
        """Whether a profiler burst can be asked for now; if not, why (one line)."""
        reader = self.hook.reader()
        if reader is None:
            return False, "no training process found yet"
        if self.target_gone:
            return False, "the training has exited"
        return reader.burst_possible()

    def request_burst(self, params: dict[str, object] | None = None) -> tuple[bool, str]:
        """Ask the hook for a profiler burst (non-blocking; see :meth:`HookReader.request_burst`);
        the samplers go back to the fast cadence to watch it."""
        self.wake("a profiler burst was asked for")
        reader = self.hook.reader()
        if reader is None:
            return False, "no training process found yet"
        return reader.request_burst(params)

    def try_setting(self, assignment: str, stopped: Callable[[], int | None] = lambda: None) -> Outcome:
        """Run a live trial of ``assignment`` (``SETTING=VALUE``) on the watched training (every
        rank of its job), blocking until it ends (:func:`torchwatch.watch.trials.run_trial`); the
        samplers go back to the fast cadence to watch it.

        Raises:
            UsageError: a setting or value the trial does not take.
            TorchwatchError: no hook, or nothing could be sent.
        """
        from torchwatch.watch.trials import plan_trial, readers_for, run_trial

        self.wake(f"a live trial of {assignment} was asked for")
        reader = self.hook.reader()
        if reader is None:
            raise TorchwatchError("no training process found yet", "wait for the training's first steps")
        readers = readers_for(reader.pid)
        return run_trial(readers, plan_trial(readers, assignment), stopped=stopped)

    def final(self) -> Analysis:
        """The verdict to report: the last one made while the target ran (or a fresh one)."""
        with self._lock:
            if self.last_alive is not None:
                return self.last_alive
        return self.analyze()


def _is_rank(info: RankInfo | None) -> bool:
    """The hook names a rank (a launcher's record may carry the job's key but no rank)."""
    return info is not None and info.rank is not None

"""A watch session: sampler threads feed the store; an analysis thread turns windows into verdicts.

One direction only: sources → store → features → diagnosis → Observation → faces (TUI, report,
status line). Each analysis tick builds one :class:`~torchwatch.model.observation.Observation`
(:mod:`torchwatch.watch.observe`); no face calls a source or reads the store: they get
:meth:`Session.observe` and :meth:`Session.final_observation`.

The session is the wiring: its threads, its sources and the store. The decisions live apart, each
without threads of its own: which process is diagnosed (:mod:`torchwatch.watch.focus`; its PID is
handed to py-spy and the hook with each read), the verdict of a process or of a job
(:mod:`torchwatch.watch.diagnose`), how often each source is read (:mod:`torchwatch.watch.cadence`).
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
from pathlib import Path
from typing import TextIO

from torchwatch.analysis import progress
from torchwatch.analysis.diagnosis import Analysis
from torchwatch.analysis.rules_engine import Rule
from torchwatch.analysis.store import Store
from torchwatch.model import files
from torchwatch.model.errors import TorchwatchError
from torchwatch.model.observation import ChildProcess, Observation, SelfUsage, TargetView, VerdictChange
from torchwatch.model.readings import HookState, SourceStatus, Status
from torchwatch.model.trials import Outcome
from torchwatch.sources import AnySource, FocusedSource, SourceContext
from torchwatch.sources.proc import ProcessTree
from torchwatch.sources.registry import SourceSet
from torchwatch.watch.cadence import (
    Cadence,
    CadencePolicy,
    CadenceReading,
    Pacer,
    cadence_reading,
    fast_cadence,
    steady_cadence,
    until_tick,
)
from torchwatch.watch.diagnose import JobDiagnoser, why_missing
from torchwatch.watch.focus import FocusPolicy
from torchwatch.watch.hang import HangRecorder
from torchwatch.watch.memwatch import MemoryWatch
from torchwatch.watch.observe import Tick, Trends, observe, target_view
from torchwatch.watch.options import WINDOW_MAX_S, WINDOW_MIN_S, SessionOptions
from torchwatch.watch.roles import RoleProbe
from torchwatch.wire import BurstRequest

__all__ = ["HANG_JOIN_S", "TICK_SLACK_S", "WINDOW_MAX_S", "WINDOW_MIN_S", "Session", "SessionOptions"]

log = logging.getLogger(__name__)


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
        self._cpu_before = time.process_time()  # CPU s torchwatch spent before watching (SelfUsage.by_part)
        self._cpu_parts: dict[str, float] = {}  # thread CPU s of each source's reads, the analysis
        self._cpu_lock = threading.Lock()
        self.options = opts = options or SessionOptions()
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
        self.stopped_target = False  # torchwatch stopped the launched command (--duration, q)
        self._consumers: list[Callable[[Observation], None]] = []  # see subscribe()
        self._errors_seen: set[str] = set()
        self._trace_file: TextIO | None = None  # --trace, opened at the first analysis
        self._focus = FocusPolicy()
        # every source of SOURCES (torchwatch.sources.registry) these options turn on
        self.sources = SourceSet(SourceContext(self.tree, opts, lambda: self.focus_pid))
        self.memwatch = MemoryWatch(kernel_log=self.sources.reads_kernel_log())
        self.judge = JobDiagnoser(rules, self.why_missing)
        self.hang = HangRecorder(self.tree, self.started, opts.hang_after)
        self.roles = RoleProbe(self.tree)
        fast = fast_cadence(opts)
        policy = CadencePolicy(fast, steady_cadence(fast, opts.window_s))
        self.pacer = Pacer(policy, self._apply, self.started, adaptive=opts.adaptive)

    # -- the focus ------------------------------------------------------------------------------
    @property
    def focus_pid(self) -> int | None:
        """PID of the training process diagnosed and shown now (:class:`FocusPolicy`), ``None``
        while the tree has none."""
        return self._focus.focus(self.tree.mains(), self.sources.tree_source.cpu_pct)

    def choose_rank(self, rank: int | None) -> None:
        """Show ``rank`` in the panels (and diagnose it with py-spy's stacks) from the next
        analysis; ``None``: the straggler when there is one, else the lowest rank."""
        self._focus.choose_rank(rank)

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start the sampling threads: one that ticks (the quick readers, then the rules), and one
        for each source that blocks (py-spy for a chunk, NVML in the driver)."""
        ticked = self.sources.ticked()
        for src in self.sources.threaded():
            t = threading.Thread(target=self._sample_loop, args=(src,), name=f"torchwatch-{src.name}", daemon=True)
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._tick_loop, args=(ticked,), name="torchwatch-ticks", daemon=True)
        t.start()
        self._threads.append(t)
        self.roles.start(self._stop)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop sampling, close the sources and join the threads. Idempotent."""
        self._stop.set()
        self.pacer.interrupt()
        self._memory_last_round()  # before the kernel log is closed with its source
        for src in self.sources.all:
            try:
                src.close()
            except Exception:  # a source failing to close must not block the exit
                log.warning("closing the %s source failed", src.name, exc_info=True)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.roles.join(max(0.0, deadline - time.monotonic()))
        self._close_trace()

    @property
    def target_gone(self) -> bool:
        """Whether the watched root process has exited."""
        return self.sources.tree_source.status.status is Status.GONE

    def statuses(self) -> dict[str, SourceStatus]:
        """``{source name: status}`` for the report and the TUI, in :data:`SOURCES`'s order, each
        source's own followed by those it reports beside it (``gpm``, GPU Performance Monitoring,
        beside NVML's status, so that "why is SM activity n/a" is said once)."""
        return self.sources.statuses()

    def own_usage(self) -> SelfUsage:
        """What watching cost so far: torchwatch's CPU s (all its threads), py-spy's CPU s, wall s,
        both together as % of one core, torchwatch's peak RSS (bytes), and its CPU s by part
        (:attr:`SelfUsage.by_part`: each part's thread CPU, ``time.thread_time``)."""
        me = resource.getrusage(resource.RUSAGE_SELF)
        own = me.ru_utime + me.ru_stime
        wall = max(1e-9, (self.ended_at or time.monotonic()) - self.started)
        helpers = self.sources.helper_cpu_s()  # the sources' helper processes (py-spy's runs)
        cpu_pct = round(100 * (own + helpers) / wall, 2)
        with self._cpu_lock:
            parts = {"start": self._cpu_before, **self._cpu_parts, "roles": self.roles.cpu_s}
        parts["other"] = max(0.0, own - sum(parts.values()))
        by_part = {name: round(cpu, 3) for name, cpu in parts.items()}
        return SelfUsage(round(own, 3), round(helpers, 3), round(wall, 2), cpu_pct, me.ru_maxrss * 1024, by_part)

    def _charge(self, part: str, since: float) -> None:
        """Add this thread's CPU since ``since`` (``time.thread_time()``) to ``part``."""
        spent = time.thread_time() - since
        with self._cpu_lock:
            self._cpu_parts[part] = self._cpu_parts.get(part, 0.0) + spent

    def why_missing(self, feature: str) -> str:
        """Why ``feature`` has no value (one line; :func:`torchwatch.watch.diagnose.why_missing`)."""
        return why_missing(feature, self.statuses(), self.store, self.focus_pid)

    # -- the sampler threads --------------------------------------------------------------------
    def _sample_loop(self, src: AnySource) -> None:
        """A source on a thread of its own: sample, then sleep to its next tick."""
        while not self._stop.is_set():
            if not self._sample(src) or self.ended_at is not None:
                return
            if self.sources.spec(src).final_unavailable and src.status.status is Status.UNAVAILABLE:
                return  # it never comes back once unavailable (NVML: sample() gives [] for ever)
            self._sleep(until_tick(time.monotonic(), src.interval))

    def _tick_loop(self, sources: Sequence[AnySource]) -> None:
        """The quick readers (psutil, thread states, the hook's files) and the rules on one
        thread: each tick of the grid (:func:`until_tick`) reads the sources due, then evaluates
        the rules when they are due, then sleeps to the next tick of any of them.

        One thread, not one per source: the process wakes once a tick (5 times a second when
        steady), not once per source at its own phase, and its threads never queue for the GIL
        at the same instant (a thread per source on one grid doubled the context switches)."""
        due = {src: 0.0 for src in sources}  # the first round at once
        analysis_due = time.monotonic() + self.until_analysis(time.monotonic())
        gen = self.pacer.generation
        while not self._stop.is_set():
            now = time.monotonic()
            if gen != self.pacer.generation:  # a new cadence: read the sources now, then on its grid
                gen = self.pacer.generation
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

    def read(self, src: AnySource, now: float) -> Sequence[object]:
        """One reading of ``src`` stamped ``now`` (monotonic s); py-spy and the hook read the
        focus process of this moment (:attr:`focus_pid`). Raises what the source raises."""
        if isinstance(src, FocusedSource):
            return src.sample(now, self.focus_pid)
        return src.sample(now)

    def _sample(self, src: AnySource) -> bool:
        """One reading of ``src`` into the store; ``False`` when the source failed and stops
        (the others keep running). Its thread's CPU is charged to the source's name."""
        since = time.thread_time()
        try:
            return self._sample_into_store(src)
        finally:
            self._charge(src.name, since)

    def _sample_into_store(self, src: AnySource) -> bool:
        try:
            readings = self.read(src, time.monotonic())
        except Exception as exc:
            log.exception("the %s sampler failed; it stops, the other sources keep running", src.name)
            src.status = SourceStatus.unavailable(
                f"internal error in {src.name}: {exc!r}", "please report it; other sources keep running"
            )
            return False
        self.store.add(readings)
        self._mark_spawned(readings)  # both read the hook's readings (HookState) only
        self.hang.feed(readings)
        if src is self.sources.tree_source and src.status.status is Status.GONE and self.ended_at is None:
            self.ended_at = time.monotonic()
        return True

    def _sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less when watching stops or the cadence changes."""
        self.pacer.nap(seconds, self._stop)

    def _mark_spawned(self, readings: Sequence[object]) -> None:
        """Ranks a training started with ``torch.multiprocessing.spawn`` (its hook lists them) are
        training processes of the tree, not its DataLoader workers."""
        for r in readings:
            if isinstance(r, HookState) and r.record is not None and r.record.spawned_ranks:
                self.tree.mark_spawned_ranks(r.pid, r.record.spawned_ranks)

    # -- the analysis tick ----------------------------------------------------------------------
    def _analysis_round(self) -> None:
        """Trim the store, look for a hang, evaluate the rules; an error is logged, never raised."""
        since = time.thread_time()
        try:
            self._analyse_now()
        finally:
            self._charge("analysis", since)

    def _analyse_now(self) -> None:
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
        return until_tick(now, self.pacer.cadence.analysis_interval_s)

    def _log_analysis_error(self, exc: Exception) -> None:
        """Log a failed analysis: the first of each kind as a warning, every one with its traceback
        at debug level (the loop retries every second, so a persistent error would flood the log)."""
        key = f"{type(exc).__name__}: {exc}"
        if key not in self._errors_seen:
            self._errors_seen.add(key)
            log.warning("analysis failed (retried every %g s): %s", self.options.analysis_interval_s, key)
        log.debug("analysis failed", exc_info=exc)

    def analyze(self, now: float | None = None) -> Analysis:
        """Compute features and evaluate the rules over the last ``window_s`` seconds, for the
        focus process (:mod:`torchwatch.watch.diagnose`); then feed the cadence, build and
        publish the tick's Observation, hand it to the consumers (:meth:`subscribe`) and trace the analysis."""
        now = time.monotonic() if now is None else now
        end = self.ended_at if self.ended_at is not None else now
        focus_now = self.focus_pid
        try:
            self.memwatch.update(self.store, now, focus_now)
        except Exception as exc:  # the memory forecast must not cost the tick its verdict
            self._log_analysis_error(exc)
        extra = self.memwatch.features()
        try:
            hook_readings = self.store.window(end - progress.KEEP_S, end, kinds=("hook",)).hook
            extra.update(progress.features(hook_readings, focus_now, end))
        except Exception as exc:  # the loss's health must not cost the tick its verdict
            self._log_analysis_error(exc)
        pending = self.sources.pending()  # what the sources still wait for (SourceSpec.pending)
        analysis = self.judge.evaluate(
            self.store.window(end - self.options.window_s, end),
            focus_now,
            now,
            extra=extra,
            extra_texts=self.memwatch.texts(),
            hook_pending="hook" in pending,
            stacks_pending="stacks" in pending,
        )
        self._focus.judged(analysis.ranks, analysis.straggler.pid if analysis.straggler is not None else None)
        with self._lock:
            self.latest = analysis
            # Once torchwatch stops the training (--duration, q), what follows is its shutdown: a
            # Hogwild main whose trainers it already ended read "sleeps on a timer" (issue 47).
            if self.ended_at is None and not self.stopped_target and not self._ranks_ended(analysis):
                self.last_alive = analysis
            label = analysis.verdict.label
            if not self.history or self.history[-1][1] != label:
                self.history.append((round(now - self.started, 1), label))
        focus = self.focus_pid  # after the verdict: it names the straggler and the ranks
        if self.ended_at is None and self.pacer.adaptive:
            self.pacer.update(self._cadence_reading(analysis, focus, now), now)
        observation = self._observe(analysis, now, focus)
        with self._lock:
            self._observation = observation
        # The per-tick consumers of the Observation (subscribe()): after it is published.
        for consumer in list(self._consumers):
            try:
                consumer(observation)
            except Exception as exc:
                self._log_analysis_error(exc)
        if self.options.trace_path is not None:
            self._trace(analysis, now, focus)
        return analysis

    def subscribe(self, consumer: Callable[[Observation], None]) -> None:
        """Call ``consumer`` with each analysis tick's Observation, on the analysis thread, after
        it is published (:attr:`latest_observation`), in the order subscribed. It must be quick (a
        write, a queue put): the next tick waits for it. One that raises is logged (once per kind
        of error, as a failed analysis) and the others still run. Subscribe before :meth:`start`."""
        self._consumers.append(consumer)

    def _ranks_ended(self, analysis: Analysis) -> bool:
        """The job's ranks have exited while its launcher lingers: ``analysis`` (of the launcher
        alone) is not the job's, and the report keeps the last verdict made while they ran."""
        last = self.last_alive
        if analysis.ranks or last is None or not last.ranks:
            return False
        mains = set(self.tree.mains())
        return not any(r.pid in mains for r in last.ranks)

    # -- the cadence's wiring ---------------------------------------------------------------------
    def _cadence_reading(self, analysis: Analysis, focus: int | None, now: float) -> CadenceReading:
        """What the cadence policy needs of ``analysis`` (:func:`cadence_reading`): the tree's
        roles, the focus process's latest hook reading and the hook's status."""
        reading = self.store.latest(HookState, lambda h: h.pid == focus) if focus is not None else None
        return cadence_reading(
            analysis,
            window_s=self.options.window_s,
            roles=[n.role for n in self.tree.nodes().values()],
            focus_hook=reading,
            hook_status=self.sources.channel.status.status,
            now=now,
        )

    def _apply(self, c: Cadence) -> None:
        """Set every paced source's pace to ``c``'s (each by its :attr:`SourceSpec.apply`; going
        fast, py-spy cuts a slow chunk short, so the fast readings start now, not after the chunk);
        the :class:`Pacer` then wakes the samplers."""
        self.sources.apply(c.paces)

    def wake(self, why: str) -> None:
        """Back to the fast cadence now: something the readings cannot show happened (a key
        pressed in the TUI, a burst asked for); nothing once the target has exited."""
        if self.ended_at is None:
            self.pacer.wake(why)

    # -- --trace ----------------------------------------------------------------------------------
    def _trace(self, analysis: Analysis, now: float, focus: int | None) -> None:
        record = {
            "t": round(now - self.started, 2),
            "main_pid": focus,
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
        return self._observe(analysis, time.monotonic(), self.focus_pid)

    def final_observation(self) -> Observation:
        """The Observation the report is made of: the last verdict made while the target ran
        (see :meth:`final`) over the readings up to its exit; a thread dump in flight is waited for."""
        self.hang.join(HANG_JOIN_S)
        self._memory_last_round()
        return self._observe(self.final(), time.monotonic(), self.focus_pid)

    def _memory_last_round(self) -> None:
        """After the target exited: the kernel log once more (a worker's OOM kill is often the
        last thing before its training exits) and the hooks' last words (a CUDA out-of-memory
        record); never raises."""
        now = time.monotonic()
        try:
            for src in self.sources.last_round():
                self.store.add(self.read(src, now))
            self.memwatch.update(self.store, now, self.focus_pid)
            self.memwatch.finish(self.store, now)
        except Exception as exc:
            self._log_analysis_error(exc)

    def _child_exited(self) -> bool:
        return self.child is not None and self.child.poll() is not None

    def _target(self, focus: int | None) -> TargetView:
        root = self.tree.root
        nodes = self.tree.nodes()
        node = nodes.get(focus or root) or nodes.get(root)
        return target_view(root, node.cmdline if node else (), self.child, self.target_gone)

    def _observe(self, analysis: Analysis | None, now: float, focus: int | None) -> Observation:
        """Build the Observation of ``analysis`` at ``now`` with ``focus`` the process shown (see
        :func:`torchwatch.watch.observe.observe`)."""
        target = self._target(focus)
        with self._lock:
            history = tuple(VerdictChange(t, label) for t, label in self.history)
        try:
            possible = (False, "the training has exited") if target.exited else self._burst_possible(focus)
        except Exception as exc:  # a failing check must not cost the tick its Observation
            possible = (False, f"burst check failed: {exc!r}")
        tick = Tick(
            now=now,
            end=self.ended_at if self.ended_at is not None else now,
            started=self.started,
            window_s=self.options.window_s,
            analysis=analysis,
            statuses=tuple(self.statuses().items()),
            focus_pid=focus,
            target=target,
            hook_status=self.sources.channel.status,
            burst_possible=possible,
            history=history,
            own_usage=self.own_usage(),
            hang=self.hang.view(self.ended_at if self.ended_at is not None else now),  # a stall ends with the training
            sampling=self.pacer.view(now),
            memory=self.memwatch.view(),
        )
        return observe(self.store, tick, self.trends)

    # -- bursts and trials --------------------------------------------------------------------------
    def _burst_possible(self, focus: int | None) -> tuple[bool, str]:
        """Whether a profiler burst of ``focus`` can be asked for now; if not, why (one line)."""
        reader = self.sources.channel.reader(focus)
        if reader is None:
            return False, "no training process found yet"
        if self.target_gone:
            return False, "the training has exited"
        return reader.burst_possible()

    def request_burst(self, params: BurstRequest | None = None) -> tuple[bool, str]:
        """Ask the focus process's hook for a profiler burst (non-blocking; see
        :meth:`HookReader.request_burst`); the samplers go back to the fast cadence to watch it."""
        self.wake("a profiler burst was asked for")
        reader = self.sources.channel.reader(self.focus_pid)
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
        reader = self.sources.channel.reader(self.focus_pid)
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

"""Builds the :class:`~torchwatch.model.observation.Observation` of one analysis tick.

:func:`observe` is the one place that turns the store's readings, the analysis and what the
session knows (sources, target, hook status) into what the faces show. It is pure apart from
:class:`Trends`, the history of live values it appends to (one point per tick): tests run it over
a store filled with recorded readings, exactly as the session does.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from torchwatch.analysis import progress, views
from torchwatch.analysis.diagnosis import Analysis
from torchwatch.analysis.features import CATALOGUE, thread_states
from torchwatch.analysis.store import Store
from torchwatch.model.errors import shell_status
from torchwatch.model.hang import HangView
from torchwatch.model.memory import MemoryView
from torchwatch.model.observation import (
    BurstView,
    ChildProcess,
    DeviceMemory,
    Observation,
    RankView,
    SamplingView,
    SelfUsage,
    StepsView,
    TargetView,
    VerdictChange,
)
from torchwatch.model.peaks import FlopRate, flop_rate
from torchwatch.model.readings import HookState, SourceStatus, Status, ThreadSample
from torchwatch.model.text import escape_all
from torchwatch.model.units import amp_words
from torchwatch.sources import container
from torchwatch.wire import HookRecord, TrialState

HISTORY_S = 180.0  # seconds of readings behind the trends ("the last minutes")
NO_HOOK = "no hook in the process: start the training with torchwatch run"
NO_CUDA = "the training has not initialised CUDA"  # and the hook never creates a context (hook/gpu.py)
NO_HOOK_MEMORY = "no hook in the process: device memory comes from the in-process hook"
NOT_PUBLISHED = "the hook has not published device memory"


MAX_TRIALS = 16  # live trials kept for the report (a trial takes up to minutes: 16 is a long session)


class Trends:
    """Bounded series of live values the store does not keep (steps/s, data wait, ...).

    Thread-safe: the analysis thread adds, faces read copies (through the Observation).

    Args:
        keep: most points kept per series (one point per tick: 300 = 5 min at 1 s).
    """

    def __init__(self, keep: int = 300) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._series: dict[str, deque[tuple[float, float]]] = {}
        self._trials: dict[int, TrialState] = {}

    def note_trial(self, state: object) -> tuple[TrialState, ...]:
        """Keep the latest state of each live trial seen (by id, the last :data:`MAX_TRIALS`);
        returns them, oldest first."""
        with self._lock:
            if isinstance(state, TrialState):
                self._trials.pop(state.id, None)
                self._trials[state.id] = state
                while len(self._trials) > MAX_TRIALS:
                    del self._trials[next(iter(self._trials))]
            return tuple(self._trials.values())

    def add(self, t: float, values: Mapping[str, float | None]) -> None:
        """Append ``values`` measured at ``t`` (monotonic s); ``None`` is skipped, and a point
        at the same ``t`` as the last one replaces it."""
        with self._lock:
            for name, value in values.items():
                if value is None:
                    continue
                buf = self._series.setdefault(name, deque(maxlen=self.keep))
                if buf and buf[-1][0] == t:
                    buf.pop()
                buf.append((t, float(value)))

    def extend(self, name: str, points: Iterable[tuple[float, float]]) -> None:
        """Append recorded ``(t, value)`` points to one series (replays, tests)."""
        for t, v in points:
            self.add(t, {name: v})

    def series(self, name: str) -> tuple[float, ...]:
        """The values of one series, oldest first (empty when never measured)."""
        with self._lock:
            return tuple(v for _, v in self._series.get(name, ()))


@dataclass(frozen=True)
class Tick:
    """What the session knows at one tick, besides the readings in its store.

    Attributes:
        now: the tick's clock reading, monotonic s. end: where the readings' windows end (``now``
            while the target runs, its exit after). started: when watching started.
        window_s: seconds each verdict covers. analysis: the analysis to show (``None``: none yet).
        statuses: ``(source, status)`` of every source. focus_pid: the training process the
            verdict is about (``None``: not found yet). target: the process torchwatch was given.
        hook_status: the hook source's status (``None``: the session reads no hook).
        burst_possible: whether a burst may be asked for, and why not.
        history: the verdict's changes. own_usage: what watching cost so far.
        hang: the last hang the recorder made (``None``: none).
        sampling: the samplers' cadence (fast or steady) and why.
        memory: the limit, the forecasts and the out-of-memory records (:mod:`torchwatch.watch.memwatch`).
    """

    now: float
    end: float
    started: float
    window_s: float
    analysis: Analysis | None
    statuses: tuple[tuple[str, SourceStatus], ...]
    focus_pid: int | None
    target: TargetView
    hook_status: SourceStatus | None = None
    burst_possible: tuple[bool, str] = (False, NO_HOOK)
    history: tuple[VerdictChange, ...] = ()
    own_usage: SelfUsage = field(default_factory=SelfUsage)
    hang: HangView | None = None
    sampling: SamplingView = field(default_factory=SamplingView)
    memory: MemoryView = field(default_factory=MemoryView)


def exit_line(code: int | None, launched: bool, gone: bool) -> str | None:
    """One line saying the target exited (with its shell-style exit status when torchwatch started
    it), ``None`` while it runs."""
    if launched and code is not None:
        return f"The training exited with status {code} · last readings kept · q quits"
    if not launched and gone:
        return "The process exited (status unknown: not started here) · last readings kept · q quits"
    return None


def target_view(root: int, cmdline: Sequence[str], child: ChildProcess | None, gone: bool) -> TargetView:
    """The process torchwatch was given: the launched command (its PID, arguments and shell-style
    exit status once it ended) or, for ``attach``, the PID named and the training's command line.

    The arguments are the target's text: each has its characters that are not printable escaped
    (:func:`~torchwatch.model.text.escape`), so no face shows a newline or an escape sequence of it."""
    if child is not None:
        code = child.poll()
        status = None if code is None else shell_status(code)
        args = escape_all(str(a) for a in child.args)
        return TargetView(child.pid, args, exit_line(status, True, gone), status, gone, _ns_pid(child.pid))
    return TargetView(root, escape_all(cmdline), exit_line(None, False, gone), None, gone, _ns_pid(root))


def _ns_pid(pid: int) -> int | None:
    """``pid``'s PID in its own PID namespace when that is not torchwatch's (``NSpid``), else ``None``."""
    ids = container.ns_ids(pid)
    return ids[-1] if len(ids) > 1 else None


def gpu_note(status: SourceStatus | None) -> str:
    """Why the GPU panel has no card: NVML off, unavailable (with the fix), or no reading yet."""
    if status is None:
        return "n/a: NVML is not read in this session"
    if status.status is Status.UNAVAILABLE:
        hint = f" ({status.hint})" if status.hint else ""
        return f"n/a: {status.reason}{hint}"
    if status.status is Status.GONE:
        return "n/a: the target exited before a GPU reading"
    return "no GPU reading yet"


def steps_view(
    reading: HookState | None,
    status: SourceStatus | None,
    features: Mapping[str, float | None],
    started: float,
) -> StepsView:
    """The loop of one rank as its hook measured it (the hook's last reading) and the analysis
    computed it over the window (``features``); without a hook reading, the status and why.

    The data wait is the hook's measurement when there is one, else py-spy's stack estimate.
    """
    wait = features.get("data_wait_fraction")
    source = "hook" if wait is not None else None
    if wait is None and features.get("data_wait_share") is not None:
        wait, source = features.get("data_wait_share"), "py-spy"
    common = {
        "steps_per_s": features.get("hook_steps_per_s"),
        "p50_ms": features.get("step_time_p50_ms"),
        "p95_ms": features.get("step_time_p95_ms"),
        "data_wait": wait,
        "data_wait_source": source,
    }
    if reading is None:
        if status is None:
            return StepsView(**common)  # type: ignore[arg-type]
        amp_on = features.get("amp_enabled")
        return StepsView(
            status=status.status.value,
            reason=status.reason,
            amp_text=None if amp_on is None else amp_words(bool(amp_on)),
            **common,  # type: ignore[arg-type]
        )
    rec: HookRecord | None = reading.record
    return StepsView(
        status=status.status.value if status is not None else Status.OK.value,
        reason=status.reason if status is not None else None,
        pid=reading.pid,
        torch=rec.torch if rec else None,
        steps=reading.steps,
        first_step_after_s=round(reading.first_step_t - started, 2) if reading.first_step_t else None,
        loader=rec.dataloaders[0] if rec and rec.dataloaders else None,
        loaders=rec.dataloaders if rec else (),
        usable_cpus=rec.usable_cpus if rec else None,
        shm_bytes=rec.shm_bytes if rec else None,
        amp=rec.amp if rec else None,
        amp_text=amp_words(rec.amp.autocast, rec.amp.dtype, rec.amp.device_type, rec.amp.grad_scaler) if rec else None,
        cuda_initialized=rec.cuda_initialized if rec else None,
        signal=rec.signal if rec else None,
        signal_owned=rec.signal_owned if rec else None,
        errors=rec.errors if rec else (),
        **common,  # type: ignore[arg-type]
    )


def burst_view(rec: HookRecord | None, possible: tuple[bool, str]) -> BurstView:
    """Profiler bursts of one rank: the hook's burst state and last result, and whether ``b`` may
    ask for one now (not while one is in flight)."""
    ok, why = possible
    burst = rec.burst if rec is not None else None
    if burst is None:
        return BurstView(possible=ok, reason=why)
    state = burst.state or None
    if ok and state not in (None, "idle"):
        ok, why = False, f"a burst is {state}"
    last = burst.last
    return BurstView(
        possible=ok,
        reason=why,
        state=state,
        mode=burst.mode,
        count=burst.count,
        last_refusal=burst.last_refusal,
        error=last.error if last is not None else None,
        last=last,
    )


def device_memory(rec: HookRecord | None) -> DeviceMemory:
    """A rank's device memory as its hook publishes it, or why it is not known."""
    if rec is None:
        return DeviceMemory(why=NO_HOOK_MEMORY)
    mem = rec.device_memory
    if mem is not None:
        return DeviceMemory(
            mem.allocated_bytes,
            mem.reserved_bytes,
            mem.peak_bytes,
            device=mem.device,
            capacity_bytes=mem.capacity_bytes,
            alloc_retries=mem.alloc_retries,
            devices=max(1, len(rec.devices)),
        )
    return DeviceMemory(why=NOT_PUBLISHED if rec.cuda_initialized else NO_CUDA)


def observe(store: Store, tick: Tick, trends: Trends) -> Observation:
    """The Observation of one tick: the analysis, the readings of the window and of the last
    minutes, and what the session knows (see :class:`Tick`).

    Appends this tick's steps/s and data wait to ``trends`` (at the analysis's time, so building
    twice for one analysis adds one point).
    """
    analysis = tick.analysis
    features: Mapping[str, float | None] = analysis.features if analysis is not None else {}
    end, pid = tick.end, tick.focus_pid
    # Minutes of history for the trends; the 10 Hz thread states and the stacks for the window.
    long = store.window(end - HISTORY_S, end, kinds=("processes", "gpus"))
    short = store.window(end - tick.window_s, end, kinds=("threads", "stacks"))
    reading = store.latest(HookState, lambda h: pid is None or h.pid == pid)
    rec = reading.record if reading is not None else None
    steps = steps_view(reading, tick.hook_status, features, tick.started)
    if analysis is not None:
        wait = steps.data_wait
        trends.add(
            analysis.t, {"steps_per_s": steps.steps_per_s, "data_wait_pct": None if wait is None else 100 * wait}
        )
    memory = device_memory(rec)
    if analysis is not None:
        trends.add(analysis.t, {"device_allocated": memory.allocated_bytes, "device_reserved": memory.reserved_bytes})
    if memory.allocated_bytes is not None:
        memory = replace(
            memory,
            allocated_series=trends.series("device_allocated"),
            reserved_series=trends.series("device_reserved"),
        )
    steps = _with_series(steps, trends)
    main_states, worker_states = thread_states(short.threads, pid)
    rank = RankView(
        rank=0,
        pid=pid,
        steps=steps,
        burst=burst_view(rec, tick.burst_possible),
        device_memory=memory,
        gpu_settings=rec.gpu_settings if rec is not None else None,
        stacks=tuple(views.stack_rows(short.stacks, pid)),
        main_states=main_states,
        worker_states=worker_states,
        rank_info=rec.rank if rec is not None else None,
        compile=rec.compile if rec is not None else None,
        flop_rate=rank_flop_rate(rec, steps.p50_ms),
        progress=progress.progress(store.window(end - progress.KEEP_S, end, kinds=("hook",)).hook, pid, end),
    )
    ranks, focus_rank = _rank_views(store, tick, short.threads, rank)
    gpus = tuple(views.gpu_rows(long.gpus))
    statuses = dict(tick.statuses)
    return Observation(
        t=tick.now,
        elapsed_s=tick.now - tick.started,
        window_s=tick.window_s,
        target=tick.target,
        verdict=analysis.verdict if analysis is not None else None,
        findings=tuple(analysis.findings) if analysis is not None else (),
        not_applicable=tuple(analysis.not_applicable) if analysis is not None else (),
        features=dict(features),
        catalogue=CATALOGUE,
        statuses=tick.statuses,
        ranks=ranks,
        focus_rank=focus_rank,
        straggler=analysis.straggler if analysis is not None else None,
        processes=tuple(views.process_rows(long.processes, short.threads)),
        gpus=gpus,
        gpu_note=None if gpus else gpu_note(statuses.get("nvml")),
        memory=replace(views.memory_trend(long.processes, long.gpus), view=tick.memory),
        history=tick.history,
        own_usage=tick.own_usage,
        hang=tick.hang,
        sampling=tick.sampling,
        trials=trends.note_trial(rec.trial if rec is not None else None),
    )


OTHER_RANK_BURST = "bursts go to the rank shown: choose it in the ranks table"


def _rank_views(
    store: Store, tick: Tick, threads: Sequence[ThreadSample], focus: RankView
) -> tuple[dict[int, RankView], int]:
    """``{rank: RankView}`` of every rank the analysis compared, and the focus's rank; one
    process: ``{0: focus}``. Each rank carries its reading and its own diagnosis; py-spy's
    stacks and the trends are the focus's only (py-spy samples the rank shown)."""
    analysis = tick.analysis
    if analysis is None or not analysis.ranks:
        return {0: focus}, 0
    out: dict[int, RankView] = {}
    focus_rank = analysis.ranks[0].rank
    for reading in analysis.ranks:
        own = analysis.per_rank.get(reading.pid)
        verdict, findings = (own.verdict, tuple(own.findings)) if own is not None else (None, ())
        if reading.pid == focus.pid:
            focus_rank = reading.rank
            out[reading.rank] = replace(focus, rank=reading.rank, reading=reading, verdict=verdict, findings=findings)
            continue
        last = store.latest(HookState, lambda h, p=reading.pid: h.pid == p)  # type: ignore[misc]
        rec = last.record if last is not None else None
        main_states, worker_states = thread_states(threads, reading.pid)
        out[reading.rank] = RankView(
            rank=reading.rank,
            pid=reading.pid,
            steps=steps_view(last, tick.hook_status, own.features if own is not None else {}, tick.started),
            burst=burst_view(rec, (False, OTHER_RANK_BURST)),
            device_memory=device_memory(rec),
            main_states=main_states,
            worker_states=worker_states,
            reading=reading,
            verdict=verdict,
            findings=findings,
            rank_info=rec.rank if rec is not None else None,
            compile=rec.compile if rec is not None else None,
            flop_rate=rank_flop_rate(rec, reading.step_ms),
        )
    return out, focus_rank


def rank_flop_rate(rec: HookRecord | None, step_ms: float | None) -> FlopRate | None:
    """A rank's achieved FLOP/s and MFU: its last burst's FLOP count over ``step_ms`` (its median
    step, ms), against the peak of the math its settings allow (TF32 or not)."""
    if rec is None or rec.burst is None:
        return None
    s = rec.gpu_settings
    tf32 = None
    if s is not None and (s.float32_matmul_precision is not None or s.matmul_allow_tf32 is not None):
        tf32 = s.float32_matmul_precision in ("high", "medium") or bool(s.matmul_allow_tf32)
    return flop_rate(rec.burst.last, step_ms, tf32)


def _with_series(steps: StepsView, trends: Trends) -> StepsView:
    return replace(steps, steps_series=trends.series("steps_per_s"), wait_series=trends.series("data_wait_pct"))

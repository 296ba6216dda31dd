"""What one refresh of the screen shows, read from the session off the UI thread.

:func:`read_snapshot` is the only place the TUI reads the session. It copies what it needs
(the latest analysis, source statuses, readings of the last minutes, the hook's summary)
into a frozen :class:`Snapshot`; the widgets draw that and nothing else. Every session
method it uses beyond ``latest``, ``statuses()`` and ``store`` is optional (``getattr``), so
the app works against a session without the in-process hook.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from torchwatch.analysis.diagnosis import Analysis
from torchwatch.analysis.rules_engine import human_bytes
from torchwatch.analysis.store import Store
from torchwatch.faces.tui import views
from torchwatch.model.readings import Role, SourceStatus, Status

if TYPE_CHECKING:
    from torchwatch.watch.lifecycle import ChildProcess

HISTORY_S = 180.0  # seconds of readings behind the sparklines ("the last minutes")
NO_HOOK = "no hook in the process: start the training with torchwatch run"


class WatchedSession(Protocol):
    """What the TUI needs of a :class:`~torchwatch.watch.session.Session`; the rest it reads with ``getattr``.

    Optional: ``last_alive``, ``target_gone``, ``ended_at``, ``main_pid``, ``options.window_s``,
    ``tree.root``, ``history``, ``own_usage()``, ``hook_summary()``, ``burst_possible()``,
    ``request_burst()``.
    """

    latest: Analysis | None
    store: Store

    def statuses(self) -> Mapping[str, SourceStatus]:
        """``{source name: status}``."""
        ...


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _maybe(call: Callable[[], Any], default: Any) -> Any:
    """``call()``, or ``default`` when it raises: the session's optional parts must never stop a refresh."""
    try:
        return call()
    except Exception:
        return default


@dataclass(frozen=True)
class StepsView:
    """The training loop as the in-process hook measures it.

    Attributes:
        status: the hook's status (``ok``, ``starting``, ``unavailable``, ``gone``) or ``None``
            when the session has no hook; reason: why it is not ``ok``.
        steps: optimizer steps so far; steps_per_s: steps/s; p50_ms / p95_ms: step time, ms.
        data_wait: share of the loop's time blocked in ``next()`` on a DataLoader, 0..1, and
            data_wait_source: ``hook`` (measured in-process) or ``py-spy`` (stack estimate).
        dataloader: the DataLoader's real settings as ``(name, text)`` pairs.
        usable_cpus: CPUs the training may use; amp: autocast / GradScaler in words.
        storage: the busiest block device's reads and the machine's swap-ins in one line
            (:func:`storage_line`), ``None`` when neither is seen.
        steps_series: steps/s history; wait_series: data wait history, %.
    """

    status: str | None = None
    reason: str | None = None
    steps: int | None = None
    steps_per_s: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    data_wait: float | None = None
    data_wait_source: str | None = None
    dataloader: tuple[tuple[str, str], ...] = ()
    usable_cpus: float | None = None
    amp: str | None = None
    errors: tuple[str, ...] = ()
    storage: str | None = None
    steps_series: tuple[float, ...] = ()
    wait_series: tuple[float, ...] = ()


@dataclass(frozen=True)
class BurstSummary:
    """The last profiler burst's summary (see ``hook_summary()["last_burst"]``).

    Attributes:
        step_time_ms: mean step time during the burst, ms.
        breakdown: ``(kind, share)`` of the step time: kernel, memcpy, memset, communication,
            runtime, dataloader, cpu_exec, other; phases: ``(phase, share)`` (data, forward, ...).
        gpu_idle_share: GPU idle time over the burst, 0..1 (``None`` on a CPU-only training);
            host_wait_share: the part of it waiting for the host to launch work (HTA host wait).
        top_ops: ``(name, self ms, calls)``; top_kernels: ``(name, total ms, calls)``.
        rss_before_bytes / rss_after_bytes: the training's resident memory around the burst.
    """

    id: int | None
    steps: int | None
    step_time_ms: float | None
    breakdown: tuple[tuple[str, float], ...]
    phases: tuple[tuple[str, float], ...]
    gpu_idle_share: float | None
    top_ops: tuple[tuple[str, float | None, int | None], ...]
    top_kernels: tuple[tuple[str, float | None, int | None], ...]
    trace_path: str | None
    events: int | None
    rss_before_bytes: int | None
    rss_after_bytes: int | None
    host_wait_share: float | None = None


@dataclass(frozen=True)
class BurstView:
    """Whether a burst can be asked for, its state, and the last result.

    Attributes:
        possible: ``b`` may send the request now; reason: why not (or what it does).
        state: ``idle``, ``armed``, ``running``, ``summarizing`` or ``None`` without a hook.
        error: the last burst failed with this message.
        last: the last burst's summary.
    """

    possible: bool = False
    reason: str = NO_HOOK
    state: str | None = None
    error: str | None = None
    last: BurstSummary | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything one refresh draws. Times are monotonic seconds.

    Attributes:
        t: when it was read; window_s: seconds each verdict covers.
        analysis: the latest analysis (the last one made while the target ran, once it exited).
        exited: one line saying the target exited, with its exit status, or ``None``.
        statuses: ``(source name, status)`` pairs.
        main_pid: the diagnosed training process.
        gpu_note: why there is no GPU card (``n/a: reason``), or ``None``.
        main_states / worker_states: ``(state, share)`` of the loop's and the workers' main
            threads over the verdict window.
        allocator: the CUDA caching allocator's ``allocated_bytes`` / ``reserved_bytes`` when the
            hook reports them (``hook_summary()["cuda_memory"]``), else empty.
    """

    t: float
    window_s: float
    analysis: Analysis | None
    exited: str | None
    exit_code: int | None
    statuses: tuple[tuple[str, SourceStatus], ...]
    main_pid: int | None
    processes: tuple[views.ProcessRow, ...]
    stacks: tuple[views.StackRow, ...]
    main_states: tuple[tuple[str, float], ...]
    worker_states: tuple[tuple[str, float], ...]
    gpus: tuple[views.GpuCard, ...]
    gpu_note: str | None
    memory: views.MemoryTrend
    steps: StepsView = field(default_factory=StepsView)
    burst: BurstView = field(default_factory=BurstView)
    allocator: tuple[tuple[str, float | None], ...] = ()


def _settings(loader: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    if not isinstance(loader, Mapping):
        return ()
    out = []
    for key in ("num_workers", "batch_size", "pin_memory", "prefetch_factor", "persistent_workers"):
        if key in loader:
            out.append((key, str(loader[key])))
    batch_bytes = _num(loader.get("batch_bytes"))
    if batch_bytes is not None:
        out.append(("batch", views.fmt_bytes(batch_bytes)))
    return tuple(out)


def _settings_from_features(f: Mapping[str, float | None]) -> tuple[tuple[str, str], ...]:
    out = []
    for key in ("num_workers", "batch_size", "pin_memory", "prefetch_factor", "persistent_workers"):
        v = f.get(f"dl_{key}")
        if v is None:
            continue
        out.append((key, str(bool(v)) if key in ("pin_memory", "persistent_workers") else f"{v:g}"))
    return tuple(out)


def _amp(amp: Any) -> str | None:
    if not isinstance(amp, Mapping):
        return None
    if not amp.get("autocast"):
        return "off" + (" (GradScaler on)" if amp.get("grad_scaler") else "")
    dtype = amp.get("dtype")
    return f"autocast {dtype or 'on'}" + (" + GradScaler" if amp.get("grad_scaler") else "")


def storage_line(features: Mapping[str, float | None]) -> str | None:
    """The storage readings in words, iostat's way: ``disk reads 78 MiB/s · 4.0 KiB per request ·
    0.06 ms each · 1.8 in flight · busy 72%``, then ``swap-in 30 MiB/s · memory stalls 40%`` when
    the machine swaps; ``None`` when no device served enough reads and nothing is swapped in."""
    parts = []
    request = features.get("disk_read_request_bytes")
    rate, wait_ms = features.get("disk_read_bytes_per_s"), features.get("disk_read_await_ms")
    queue, busy = features.get("disk_read_queue"), features.get("disk_busy_share")
    if request is not None and rate is not None:
        parts.append(f"disk reads {human_bytes(rate)}/s · {human_bytes(request)} per request")
        if wait_ms is not None:
            parts.append(f"{wait_ms:.2f} ms each")
        if queue is not None:
            parts.append(f"{queue:.1f} in flight")
        if busy is not None:
            parts.append(f"busy {views.fmt_share(busy)}")
    swap = features.get("swap_in_bytes_per_s")
    if swap:
        parts.append(f"swap-in {human_bytes(swap)}/s")
        stalls = features.get("memory_pressure_pct")
        if stalls is not None:
            parts.append(f"memory stalls {views.fmt_pct(stalls)}")
    return " · ".join(parts) or None


def steps_view(
    hook: Mapping[str, Any] | None, features: Mapping[str, float | None], trends: views.Trends, now: float
) -> StepsView:
    """Build the steps panel from the hook's summary (or the hook features of the analysis).

    Adds this refresh's steps/s and data wait to ``trends`` (at ``now``) and returns the series.
    """
    status = reason = None
    steps = p50 = p95 = sps = wait = cpus = None
    settings: tuple[tuple[str, str], ...] = ()
    amp: str | None = None
    errors: tuple[str, ...] = ()
    if isinstance(hook, Mapping):
        status = str(hook.get("status") or "ok")
        reason = hook.get("reason")
        steps = _int(hook.get("steps"))
        sps = _num(hook.get("steps_per_s"))
        raw_times = hook.get("step_time_ms")
        times: Mapping[str, Any] = raw_times if isinstance(raw_times, Mapping) else {}
        p50, p95 = _num(times.get("p50")), _num(times.get("p95"))
        wait = _num(hook.get("data_wait_fraction"))
        settings = _settings(hook.get("dataloader"))
        cpus = _num(hook.get("usable_cpus"))
        amp = _amp(hook.get("amp"))
        errors = tuple(str(e) for e in hook.get("errors") or ())
    else:
        sps = features.get("hook_steps_per_s")
        p50, p95 = features.get("step_time_p50_ms"), features.get("step_time_p95_ms")
        wait = features.get("data_wait_fraction")
        settings = _settings_from_features(features)
        if any(v is not None for v in (sps, p50, wait)) or settings:
            status = "ok"
        amp_on = features.get("amp_enabled")
        amp = None if amp_on is None else ("autocast on" if amp_on else "off")
    if cpus is None:
        cpus = features.get("usable_cpus")
    source = "hook" if wait is not None else None
    if wait is None and features.get("data_wait_share") is not None:
        wait, source = features.get("data_wait_share"), "py-spy"
    trends.add(now, {"steps_per_s": sps, "data_wait_pct": None if wait is None else 100.0 * wait})
    return StepsView(
        status=status,
        reason=None if reason is None else str(reason),
        steps=steps,
        steps_per_s=sps,
        p50_ms=p50,
        p95_ms=p95,
        data_wait=wait,
        data_wait_source=source,
        dataloader=settings,
        usable_cpus=cpus,
        amp=amp,
        errors=errors,
        storage=storage_line(features),
        steps_series=trends.series("steps_per_s"),
        wait_series=trends.series("data_wait_pct"),
    )


def _named(rows: Any, value_key: str) -> tuple[tuple[str, float | None, int | None], ...]:
    out = []
    for r in rows or ():
        if isinstance(r, Mapping):
            out.append((str(r.get("name", "?")), _num(r.get(value_key)), _int(r.get("calls"))))
    return tuple(out)


def _shares(shares: Any, order: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    if not isinstance(shares, Mapping):
        return ()
    names = [n for n in order if n in shares] + [n for n in shares if n not in order]
    return tuple((str(n), v) for n in names if (v := _num(shares[n])) is not None)


def burst_summary(last: Mapping[str, Any]) -> BurstSummary:
    """A :class:`BurstSummary` from the hook's ``last_burst`` dict (missing keys are ``None``)."""
    return BurstSummary(
        id=_int(last.get("id")),
        steps=_int(last.get("steps")),
        step_time_ms=_num(last.get("step_time_ms")),
        breakdown=_shares(last.get("breakdown_share"), views.BREAKDOWN_ORDER),
        phases=_shares(last.get("phases_share"), ("data", "forward", "backward", "optimizer", "other")),
        gpu_idle_share=_num(last.get("gpu_idle_share")),
        top_ops=_named(last.get("top_cpu_ops"), "self_ms"),
        top_kernels=_named(last.get("top_kernels"), "total_ms"),
        trace_path=None if last.get("trace_path") is None else str(last.get("trace_path")),
        events=_int(last.get("events")),
        rss_before_bytes=_int(last.get("rss_before_bytes")),
        rss_after_bytes=_int(last.get("rss_after_bytes")),
        host_wait_share=_num((last.get("gpu_idle_split_share") or {}).get("host_wait")),
    )


def burst_view(hook: Mapping[str, Any] | None, possible: tuple[bool, str]) -> BurstView:
    """Build the burst panel from the hook's summary and ``session.burst_possible()``."""
    ok, why = possible
    state = error = None
    last = None
    if isinstance(hook, Mapping):
        burst = hook.get("burst")
        state = str(burst.get("state")) if isinstance(burst, Mapping) and burst.get("state") else None
        raw = hook.get("last_burst")
        if isinstance(raw, Mapping):
            if "error" in raw:
                error = str(raw["error"])
            else:
                last = burst_summary(raw)
    if ok and state not in (None, "idle"):
        ok, why = False, f"a burst is {state}"
    return BurstView(possible=ok, reason=why, state=state, error=error, last=last)


def exit_line(child: ChildProcess | None, target_gone: bool) -> tuple[str | None, int | None]:
    """One line saying the target exited (with its exit status), and the status; ``None`` while it runs."""
    if child is not None:
        code = child.poll()
        if code is None:
            return None, None
        status = 128 - code if code < 0 else code  # shell style: killed by signal N is 128+N
        return f"The training exited with status {status} · last readings kept · q quits", status
    if target_gone:
        return "The process exited (status unknown: not started here) · last readings kept · q quits", None
    return None, None


def read_snapshot(session: WatchedSession, child: ChildProcess | None, now: float, trends: views.Trends) -> Snapshot:
    """Read everything one refresh shows from ``session`` (any object shaped like :class:`Session`).

    Args:
        session: the watch session (see :class:`WatchedSession`).
        child: the launched command (``run``), polled for its exit status.
        now: the clock reading (monotonic s) the readings windows end at while the target runs.
        trends: series of live values kept across refreshes; this read appends to it.
    """
    exited, code = exit_line(child, bool(getattr(session, "target_gone", False)))
    latest: Analysis | None = getattr(session, "latest", None)
    analysis = (getattr(session, "last_alive", None) or latest) if exited else latest
    ended = getattr(session, "ended_at", None)
    end = ended if isinstance(ended, (int, float)) else now
    options = getattr(session, "options", None)
    window_s = float(getattr(options, "window_s", 10.0))
    # Minutes of history only for the trends; the 10 Hz thread states and the stacks for the window.
    long = session.store.window(end - HISTORY_S, end, kinds=("processes", "gpus"))
    short = session.store.window(end - window_s, end, kinds=("threads", "stacks"))
    threads, stack_samples = short.threads, short.stacks
    main_pid = _maybe(lambda: getattr(session, "main_pid", None), None)
    statuses: dict[str, SourceStatus] = dict(_maybe(session.statuses, {}))
    hook_fn = getattr(session, "hook_summary", None)
    hook = _maybe(hook_fn, None) if callable(hook_fn) else None
    possible_fn = getattr(session, "burst_possible", None)
    possible = _maybe(possible_fn, (False, "burst check failed")) if callable(possible_fn) else (False, NO_HOOK)
    if exited:
        possible = (False, "the training exited")
    features = analysis.features if analysis is not None else {}
    stack_rows = views.stack_rows(stack_samples, main_pid)
    cards = views.gpu_cards(long.gpus)
    return Snapshot(
        t=now,
        window_s=window_s,
        analysis=analysis,
        exited=exited,
        exit_code=code,
        statuses=tuple(statuses.items()),
        main_pid=main_pid,
        processes=tuple(views.process_rows(long.processes, threads)),
        stacks=tuple(stack_rows),
        main_states=tuple(views.state_shares(threads, Role.MAIN, main_pid).items()),
        worker_states=tuple(views.state_shares(threads, Role.WORKER).items()),
        gpus=tuple(cards),
        gpu_note=None if cards else gpu_note(statuses.get("nvml")),
        memory=views.memory_trend(long.processes, long.gpus),
        steps=steps_view(hook, features, trends, now),
        burst=burst_view(hook, possible),
        allocator=allocator(hook, features),
    )


def allocator(
    hook: Mapping[str, Any] | None, features: Mapping[str, float | None]
) -> tuple[tuple[str, float | None], ...]:
    """The CUDA allocator's allocated / reserved bytes from the hook, when it reports them."""
    mem = hook.get("cuda_memory") if isinstance(hook, Mapping) else None
    if isinstance(mem, Mapping):
        values = {k: _num(mem.get(k)) for k in ("allocated_bytes", "reserved_bytes")}
    else:
        values = {k: features.get(f"cuda_{k}") for k in ("allocated_bytes", "reserved_bytes")}
    return tuple(values.items()) if any(v is not None for v in values.values()) else ()


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

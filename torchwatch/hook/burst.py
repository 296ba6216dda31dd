"""Profiler bursts: a short, bounded ``torch.profiler`` run started and stopped on step boundaries.

Life of a burst (every transition happens in the training's main thread: the signal handler
and the optimizer step hook both run there, and ``torch.profiler`` must start and stop on the
thread it profiles)::

    idle --request--> armed --step boundary--> running --N active steps / max_s--> summarizing --> idle
                        \\--no step within the arm wait: time-window mode (start now, stop at window_s)

The arm wait is ``arm_timeout_s``, or 1.5 times the median of the hook's last measured steps when
those are slower (at most ``max_s``): a training that steps every 5 s gets a burst on its step
boundaries, not a time window that cuts steps in two.

Exporting the trace and summarising it run in a background thread, so the training pays only
for the profiled steps themselves. Bounds (traces of 1+ GB and memory growth across many short
profiles are known failure modes of always-on profiling): active steps, seconds, trace bytes
(checked on the exported file before it is read); a cooldown between bursts.

Where traces go, and how they are written: :mod:`torchwatch.hook.traces`.

A burst may start at a named step (``start_step``), so that every rank profiles the same steps:
the profiler's ``ProfilerStep#N`` annotations then carry the hook's own step count (the same on
every rank of a synchronous job), which is how HTA lines the ranks' iterations up.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import wire
from . import flops, traces
from .traces import _host, run_name, trace_dir

BurstParams = wire.BurstRequest  # the bounds of one burst, as torchwatch's request.json gives them
ARM_MAX_S = 300.0  # a burst waiting for its start_step gives up after this long


def rss_bytes() -> int:
    """Resident set size of this process, bytes (``/proc/self/statm``); 0 when unreadable."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _cooldown_s(default: float) -> float:
    """``$TORCHWATCH_BURST_COOLDOWN_S`` (0 to 1 h), else ``default`` (also for nan, inf, junk)."""
    try:
        value = float(os.environ.get("TORCHWATCH_BURST_COOLDOWN_S", default))
    except ValueError:
        return default
    return min(3600.0, max(0.0, value)) if math.isfinite(value) else default


def new_profiler(torch: Any, schedule: Any) -> Any:
    """A ``torch.profiler.profile`` as a burst runs it: the CPU, and CUDA only when the training
    already initialised it (the hook never creates a context); no shapes, stacks or memory."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with contextlib.suppress(Exception):
        if torch.cuda.is_initialized():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities,
        schedule=schedule,
        record_shapes=False,
        with_stack=False,  # measured: with_stack breaks top-level categories and triples the cost
        profile_memory=False,
    )


class Burster:
    """Runs bursts for the hook. Not thread-safe by design: call it from the main thread only.

    Args:
        torch: the imported ``torch`` module.
        instance: this process.
        interrupt: calls the hook's signal handler in the main thread (``_thread.interrupt_main``);
            used for time-window deadlines and the arm timeout. Returns False when it cannot.
        changed: called after every state change (the hook republishes ``hook.json``).
        step_durations: the hook's measured durations of the last steps, s, newest last.
        rank: this process's global rank, when known (``None`` otherwise).
    """

    COOLDOWN_S = 5.0  # default; $TORCHWATCH_BURST_COOLDOWN_S overrides (tests run bursts back to back)

    def __init__(
        self,
        torch: Any,
        instance: wire.Instance,
        interrupt: Callable[[], bool],
        changed: Callable[[], None],
        step_durations: Callable[[int], list[float]],
        rank: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.torch = torch
        self._rank = rank
        self.instance = instance
        self.pid = instance.pid
        self.run = run_name(instance, time.time())
        self.trace_root = trace_dir().absolute()  # fixed now: the training may chdir later
        self._interrupt = interrupt
        self._changed = changed
        self._step_durations = step_durations
        self.cooldown_s = _cooldown_s(self.COOLDOWN_S)
        self.state = "idle"
        self.mode = ""
        self.count = 0
        self.params = BurstParams()
        self.last: wire.BurstResult | None = None
        self.last_refusal: wire.Refusal | None = None
        self.first_rss: int | None = None
        self._prof: Any = None
        self._window_rec: Any = None
        self._armed_at = 0.0
        self._arm_deadline = 0.0  # monotonic s: an armed burst falls back to a time window then
        self._started_at = 0.0
        self._first_step: int | None = None
        self._prev_step_at = 0.0  # the last step boundary seen while armed, monotonic s
        self._active_steps = 0
        self._recorded = 0
        self._rss_before = 0
        self._ended_at: float | None = None
        self._timer: threading.Timer | None = None
        self._worker: threading.Thread | None = None
        self._flop: flops.FlopStep | None = None  # the warmup step's FLOP count, while it runs
        self._flop_out: dict[str, Any] = {}  # its wire.FLOP_FIELDS

    # -- public, main thread --------------------------------------------------------------
    def public_state(self) -> wire.BurstState:
        """The state as published in ``hook.json``: state, mode, count, last result and refusal."""
        return wire.BurstState(self.state, self.mode, self.count, self.last, self.last_refusal)

    def refusal(self, now: float) -> str | None:
        """Why a burst cannot start now, or ``None`` when it can."""
        if self.state != "idle":
            return f"a burst is already {self.state}"
        if self._ended_at is not None and now - self._ended_at < self.cooldown_s:
            ago = now - self._ended_at
            return f"too soon: the last burst ended {ago:.1f} s ago (bursts are at least {self.cooldown_s:g} s apart)"
        if self._other_profiler():
            return "another profiler is already active in the training (torch.profiler): not starting a second one"
        if self._flop is not None:
            return (
                "the last burst's FLOP-counting mode is still beneath a dispatch mode of the training's: it "
                "leaves at the first step boundary where it is innermost"
            )
        return None

    @property
    def wants_steps(self) -> bool:
        """Whether :meth:`on_step` has work at a step boundary: a burst is armed or running, or
        the counting mode of the last one still waits to leave (:meth:`flops.FlopStep.stop`)."""
        return self.state != "idle" or self._flop is not None

    def request(self, params: BurstParams, now: float, stepping: bool, source: str) -> bool:
        """Arm a burst; False (with :attr:`last_refusal` set) when refused.

        Args:
            stepping: the process makes optimizer steps (start at the next boundary); otherwise
                profile a time window from now.
            source: ``"signal"`` or ``"scheduled"`` (reported).
        """
        why = self.refusal(now)
        if why is not None:
            self.last_refusal = wire.Refusal(now, wire.clean_text(why, wire.TEXT), source)
            self._changed()
            return False
        self.params = params
        self._rss_before = rss_bytes()
        if self.first_rss is None:
            self.first_rss = self._rss_before
        self._armed_at = now
        self._prev_step_at = 0.0
        self.count += 1
        if stepping:
            self.state, self.mode = "armed", "steps"
            wait = self.arm_wait_s()
            self._arm_deadline = now + wait
            self._schedule(wait)
            self._changed()
        else:
            self._start_window(now)
        return True

    def arm_wait_s(self) -> float:
        """How long an armed step-mode burst waits for a step boundary before it profiles a time
        window instead, s: ``arm_timeout_s`` (default 3 s), or 1.5 times the median of the last 5
        steps the hook measured when that is longer, at most ``max_s``."""
        params = self.params
        try:
            recent = sorted(self._step_durations(5))
        except Exception:
            recent = []
        if not recent:
            return params.arm_timeout_s
        typical = recent[len(recent) // 2]
        return max(params.arm_timeout_s, min(1.5 * typical, params.max_s))

    def on_step(self, now: float, step: int | None = None) -> None:
        """Step boundary: start, advance or finish a step-mode burst.

        Args:
            now: monotonic s.
            step: the number (0-based) of the step that begins now, as the hook counts them;
                ``None`` when not counted (then ``start_step`` is not waited for).
        """
        if self._flop is not None and not (self.state == "running" and self.mode == "steps"):
            self._end_flop_count(now)  # a burst that ended with its mode beneath the training's
        if self.state == "armed" and self.mode == "steps":
            start = self.params.start_step
            if start is not None and step is not None and step < start:
                if now - self._armed_at > ARM_MAX_S:
                    self._abort(now, f"step {start} not reached in {ARM_MAX_S:g} s (at step {step})")
                else:
                    # still stepping: wait on, as long as three of these steps if they are slow
                    last = now - self._prev_step_at if self._prev_step_at else 0.0
                    wait = max(self.params.arm_timeout_s, 3 * last)
                    self._arm_deadline = now + wait
                    self._schedule(wait)
                self._prev_step_at = now
                return
            self._cancel_timer()
            self._start_steps(now, step)
        elif self.state == "running" and self.mode == "steps":
            self._active_steps += 1
            self._end_flop_count(now)  # the warmup step ends: count off before the profiler records
            self._prof.step()
            total = self.params.warmup + self.params.steps
            if self._active_steps >= total or now - self._started_at >= self.params.max_s:
                self._finish(now)

    def on_interrupt(self, now: float) -> None:
        """The timer fired (through the signal handler): an arm timeout or a window deadline."""
        if self.state == "armed" and now >= self._arm_deadline - 0.05:
            self._start_window(now)
        elif (self.state == "running" and self.mode == "window") or (
            self.state == "running" and now - self._started_at >= self.params.max_s and self._flop is None
        ):
            # (while the warmup step's FLOPs are counted, its end, a step boundary, ends the burst:
            # a signal handler may run inside the counting mode, which cannot be left from there)
            self._finish(now)

    def close(self) -> None:
        """Stop a running profiler and the timer (at exit); waits briefly for the summary."""
        self._cancel_timer()
        if self.state == "running":
            with contextlib.suppress(Exception):
                self._finish(time.monotonic())
        if self._worker is not None:
            self._worker.join(10.0)

    # -- internals ------------------------------------------------------------------------
    def _other_profiler(self) -> bool:
        try:
            return bool(self.torch.autograd._profiler_enabled())
        except Exception:
            return False

    def _start_profiler(self, now: float, schedule: Any, renumber: Callable[[Any], None] | None = None) -> bool:
        """Start ``torch.profiler`` now; on a clash or failure end the burst with the reason.

        Args:
            renumber: called with the profiler after it is made and before it starts.
        """
        if self._other_profiler():
            self._abort(now, "another profiler became active before the burst started")
            return False
        try:
            self._prof = new_profiler(self.torch, schedule)
            if renumber is not None:
                renumber(self._prof)
            self._prof.start()
        except Exception as exc:
            self._prof = None
            self._abort(now, f"torch.profiler failed to start: {exc!r}")
            return False
        return True

    def _start_steps(self, now: float, step: int | None) -> None:
        p = self.params
        inner = self.torch.profiler.schedule(wait=0, warmup=p.warmup, active=p.steps, repeat=1)
        base = [0]

        def sched(n: int) -> Any:
            return inner(max(0, n - base[0]))

        def renumber(prof: Any) -> None:
            # Number the profiler's steps as the hook counts them (ProfilerStep#<step>): traces of
            # several ranks then line up step for step. The schedule is offset alike, so what the
            # profiler computed at construction (for its step 0) still holds.
            if step is not None and isinstance(getattr(prof, "step_num", None), int):
                base[0] = step
                prof.step_num = step

        if not self._start_profiler(now, sched, renumber):
            return
        self._first_step = step
        self.state, self._started_at, self._active_steps = "running", now, 0
        self._start_flop_count()
        self._schedule(p.max_s)  # a step longer than max_s still ends the burst
        self._changed()

    def _start_flop_count(self) -> None:
        """Count the FLOPs of the warmup step (:mod:`torchwatch.hook.flops`): the step the
        profiler discards, so no profiled step pays for the count."""
        self._flop, self._flop_out = None, {}
        if not flops.enabled():
            self._flop_out = {"flops_note": f"FLOPs not counted: {flops.ENV}=0"}
        elif self.params.warmup < 1:
            self._flop_out = {"flops_note": "FLOPs not counted: the burst has no warmup step to count them in"}
        else:
            self._flop, note = flops.FlopStep.start(self.torch, self._started_at)
            if note:
                self._flop_out = {"flops_note": note}

    def _end_flop_count(self, now: float) -> None:
        """The counted step ended at ``now``: leave the counting mode; on a CPU, measure the
        matmul peak once (same step, after the count)."""
        step, self._flop = self._flop, None
        if step is None:
            return
        out = step.stop(now)
        if step.on:  # could not leave it (a mode of the training's on top): try again later
            self._flop = step
        if out.get("flops_device") == "cpu" and out.get("flops_per_step"):
            peak = flops.cpu_peak(self.torch, out.get("flops_dtype"))
            if peak is not None:
                out["cpu_peak_flops"], out["cpu_peak_ms"] = round(peak[0], 1), peak[1]
        self._flop_out = out

    def _start_window(self, now: float) -> None:
        self._cancel_timer()
        if not self._start_profiler(now, None):
            return
        # A time window has no step boundaries: mark it as one step, so the trace reads alike.
        with contextlib.suppress(Exception):
            self._window_rec = self.torch.profiler.record_function("ProfilerStep#0")
            self._window_rec.__enter__()
        self.state, self.mode, self._started_at = "running", "window", now
        self._first_step = None
        self._schedule(min(self.params.window_s, self.params.max_s))
        self._changed()

    def _finish(self, now: float) -> None:
        self._cancel_timer()
        if self._flop is not None:  # the burst ends inside its warmup step (at exit, detach, max_s)
            self._end_flop_count(now)
            if self._flop is None:
                self._flop_out = {"flops_note": "FLOPs not counted: the burst ended inside its warmup step"}
            else:
                self._flop_out = {
                    "flops_note": "FLOPs not counted: the burst ended with its counting mode beneath a dispatch "
                    "mode of the training's; it leaves at the first step boundary where it is innermost"
                }
        prof, self._prof = self._prof, None
        measured = self._step_durations(self._active_steps) if self.mode == "steps" else []
        rec, self._window_rec = self._window_rec, None
        try:
            if rec is not None:
                rec.__exit__(None, None, None)
            prof.stop()
        except Exception as exc:
            self._abort(now, f"torch.profiler failed to stop: {exc!r}")
            return
        self.state = "summarizing"
        self._changed()
        info = {
            "id": self.count,
            "mode": self.mode,
            "started_at": self._started_at,
            "duration_s": round(now - self._started_at, 4),
            "measured_step_ms": [round(d * 1000, 4) for d in measured[-self.params.steps :]],
            "start_step": self.params.start_step,
            "first_step": self._first_step,
            "group": self.params.group,
            "rank": self._rank_or_none(),
            **(self._flop_out if self.mode == "steps" else {}),
        }
        self._worker = threading.Thread(
            target=self._summarize, args=(prof, info), name="torchwatch-burst-summary", daemon=True
        )
        self._worker.start()

    def _summarize(self, prof: Any, info: dict[str, Any]) -> None:
        """Background thread: export the trace, check its size, summarise it, gzip it, publish."""
        t0 = time.monotonic()
        result: dict[str, Any] = dict(info)
        n = int(info["id"])
        try:
            result.update(self._export(prof, n))
        except Exception as exc:
            result["error"] = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        del prof
        gc.collect()
        result["summary_s"] = round(time.monotonic() - t0, 4)
        result["rss_before_bytes"] = self._rss_before
        result["rss_after_bytes"] = rss_bytes()
        result["rss_growth_since_first_bytes"] = result["rss_after_bytes"] - (self.first_rss or self._rss_before)
        if isinstance(result.get("error"), str):
            result["error"] = wire.clean_text(result["error"], wire.TEXT)
        try:
            last = wire.BurstResult.decode(result, "burst")
        except wire.WireError as exc:  # a bug of ours: keep the burst's outcome visible
            last = wire.BurstResult(n, error=f"summary did not validate: {exc}"[: wire.TEXT])
        if last.trace_path is not None:
            with contextlib.suppress(OSError):
                traces.write_summary(self.trace_root, self.run, self.params.group, self._stem(), n, last)
        self.last = last
        self._ended_at = time.monotonic()
        self.state, self.mode = "idle", ""
        self._changed()

    def _rank_or_none(self) -> int | None:
        try:
            rank = self._rank()
        except Exception:
            return None
        return rank if isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank <= wire.MAX_RANKS else None

    def _stem(self) -> str:
        """``<host>_<pid>`` (TensorBoard's worker name), with ``.rank<r>`` when the rank is known."""
        rank = self._rank_or_none()
        return f"{_host()}_{self.instance.pid}" + ("" if rank is None else f".rank{rank}")

    def _export(self, prof: Any, n: int) -> dict[str, Any]:
        """Export burst ``n``'s trace into its folder (:func:`traces.burst_folder`), summarise it
        if it is within the size bound, gzip it (:func:`traces.export_trace`).

        Raises:
            OSError, ValueError: the trace folder cannot be used, or the trace cannot be read.
        """
        burst_fd, folder = traces.burst_folder(self.trace_root, self.run, self.params.group, n)
        try:
            return traces.export_trace(
                prof, burst_fd, folder, self.instance.pid, n, self.params.max_bytes, self._rank_or_none, self._stem
            )
        finally:
            os.close(burst_fd)

    def _abort(self, now: float, reason: str) -> None:
        self._cancel_timer()
        self._end_flop_count(now)
        self.last = wire.BurstResult(self.count, error=wire.clean_text(reason, wire.TEXT), started_at=now)
        self._ended_at = now
        self.state, self.mode = "idle", ""
        self._changed()

    def _schedule(self, seconds: float) -> None:
        self._cancel_timer()
        t = threading.Timer(seconds, self._interrupt)
        t.daemon = True
        t.name = "torchwatch-burst-timer"
        self._timer = t
        t.start()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

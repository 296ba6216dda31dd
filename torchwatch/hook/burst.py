"""Profiler bursts: a short, bounded ``torch.profiler`` run started and stopped on step boundaries.

Life of a burst (every transition happens in the training's main thread: the signal handler
and the optimizer step hook both run there, and ``torch.profiler`` must start and stop on the
thread it profiles)::

    idle --request--> armed --step boundary--> running --N active steps / max_s--> summarizing --> idle
                        \\--no step within arm_timeout_s: time-window mode (start now, stop at window_s)

Exporting the trace and summarising it run in a background thread, so the training pays only
for the profiled steps themselves. Bounds (FIELD.md: 1+ GB traces, OOM at stop, RSS growth
across many short profiles): active steps, seconds, trace bytes; a cooldown between bursts.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torchwatch.hook import publish


@dataclass(frozen=True)
class BurstParams:
    """Bounds of one burst.

    Attributes:
        warmup: steps profiled but discarded first (the profiler's own start-up cost lands there).
        steps: active steps recorded (at most 20).
        max_s: seconds after which the burst stops at the next step boundary (or in time-window
            mode, at the deadline).
        window_s: length of a time-window burst, for processes that make no optimizer steps.
        max_bytes: a trace larger than this is deleted (the summary is kept).
        arm_timeout_s: seconds to wait for a step boundary before falling back to a time window.
    """

    warmup: int = 1
    steps: int = 3
    max_s: float = 10.0
    window_s: float = 2.0
    max_bytes: int = 200 * 1024 * 1024
    arm_timeout_s: float = 3.0

    @classmethod
    def from_request(cls, req: dict[str, Any] | None) -> BurstParams:
        """Params from a ``request.json`` dict, each value clamped to a safe range."""
        d = cls()
        if not req:
            return d

        def num(key: str, lo: float, hi: float, default: float) -> float:
            v = req.get(key, default)
            return min(hi, max(lo, float(v))) if isinstance(v, (int, float)) else default

        return cls(
            warmup=int(num("warmup", 0, 5, d.warmup)),
            steps=int(num("steps", 1, 20, d.steps)),
            max_s=num("max_s", 0.5, 60.0, d.max_s),
            window_s=num("window_s", 0.2, 30.0, d.window_s),
            max_bytes=int(num("max_bytes", 1e6, 2e9, d.max_bytes)),
            arm_timeout_s=num("arm_timeout_s", 0.5, 60.0, d.arm_timeout_s),
        )


def rss_bytes() -> int:
    """Resident set size of this process, bytes (``/proc/self/statm``); 0 when unreadable."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def trace_dir() -> Path:
    """Where traces and their summaries are kept after the process exits:
    ``$TORCHWATCH_TRACE_DIR``, else ``$XDG_CACHE_HOME/torchwatch/traces`` (``~/.cache`` by default)."""
    if os.environ.get("TORCHWATCH_TRACE_DIR"):
        return Path(os.environ["TORCHWATCH_TRACE_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "torchwatch" / "traces"


class Burster:
    """Runs bursts for the hook. Not thread-safe by design: call it from the main thread only.

    Args:
        torch: the imported ``torch`` module.
        pid: this process.
        interrupt: calls the hook's signal handler in the main thread (``_thread.interrupt_main``);
            used for time-window deadlines and the arm timeout. Returns False when it cannot.
        changed: called after every state change (the hook republishes ``hook.json``).
        step_durations: the hook's measured durations of the last steps, s, newest last.
    """

    COOLDOWN_S = 5.0  # default; $TORCHWATCH_BURST_COOLDOWN_S overrides (tests run bursts back to back)

    def __init__(
        self,
        torch: Any,
        pid: int,
        interrupt: Callable[[], bool],
        changed: Callable[[], None],
        step_durations: Callable[[int], list[float]],
    ) -> None:
        self.torch = torch
        self.pid = pid
        self._interrupt = interrupt
        self._changed = changed
        self._step_durations = step_durations
        try:
            self.cooldown_s = max(0.0, float(os.environ.get("TORCHWATCH_BURST_COOLDOWN_S", self.COOLDOWN_S)))
        except ValueError:
            self.cooldown_s = self.COOLDOWN_S
        self.state = "idle"
        self.mode = ""
        self.count = 0
        self.params = BurstParams()
        self.last: dict[str, Any] | None = None
        self.last_refusal: dict[str, Any] | None = None
        self.first_rss: int | None = None
        self._prof: Any = None
        self._window_rec: Any = None
        self._armed_at = 0.0
        self._started_at = 0.0
        self._active_steps = 0
        self._recorded = 0
        self._rss_before = 0
        self._ended_at: float | None = None
        self._timer: threading.Timer | None = None
        self._worker: threading.Thread | None = None

    # -- public, main thread --------------------------------------------------------------
    def public_state(self) -> dict[str, Any]:
        """JSON-ready state: ``{"state", "mode", "count", "last", "last_refusal"}``."""
        return {
            "state": self.state,
            "mode": self.mode,
            "count": self.count,
            "last": self.last,
            "last_refusal": self.last_refusal,
        }

    def refusal(self, now: float) -> str | None:
        """Why a burst cannot start now, or ``None`` when it can."""
        if self.state != "idle":
            return f"a burst is already {self.state}"
        if self._ended_at is not None and now - self._ended_at < self.cooldown_s:
            ago = now - self._ended_at
            return f"too soon: the last burst ended {ago:.1f} s ago (bursts are at least {self.cooldown_s:g} s apart)"
        if self._other_profiler():
            return "another profiler is already active in the training (torch.profiler): not starting a second one"
        return None

    def request(self, params: BurstParams, now: float, stepping: bool, source: str) -> bool:
        """Arm a burst; False (with :attr:`last_refusal` set) when refused.

        Args:
            stepping: the process makes optimizer steps (start at the next boundary); otherwise
                profile a time window from now.
            source: ``"signal"`` or ``"scheduled"`` (reported).
        """
        why = self.refusal(now)
        if why is not None:
            self.last_refusal = {"t": now, "reason": why, "source": source}
            self._changed()
            return False
        self.params = params
        self._rss_before = rss_bytes()
        if self.first_rss is None:
            self.first_rss = self._rss_before
        self._armed_at = now
        self.count += 1
        if stepping:
            self.state, self.mode = "armed", "steps"
            self._schedule(params.arm_timeout_s)
            self._changed()
        else:
            self._start_window(now)
        return True

    def on_step(self, now: float) -> None:
        """Step boundary (the optimizer step hook): start, advance or finish a step-mode burst."""
        if self.state == "armed" and self.mode == "steps":
            self._cancel_timer()
            self._start_steps(now)
        elif self.state == "running" and self.mode == "steps":
            self._active_steps += 1
            self._prof.step()
            total = self.params.warmup + self.params.steps
            if self._active_steps >= total or now - self._started_at >= self.params.max_s:
                self._finish(now)

    def on_interrupt(self, now: float) -> None:
        """The timer fired (through the signal handler): an arm timeout or a window deadline."""
        if self.state == "armed" and now - self._armed_at >= self.params.arm_timeout_s - 0.05:
            self._start_window(now)
        elif (self.state == "running" and self.mode == "window") or (
            self.state == "running" and now - self._started_at >= self.params.max_s
        ):
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

    def _activities(self) -> list[Any]:
        acts = [self.torch.profiler.ProfilerActivity.CPU]
        # Only when the training already initialised CUDA: the hook never creates a context.
        with contextlib.suppress(Exception):
            if self.torch.cuda.is_initialized():
                acts.append(self.torch.profiler.ProfilerActivity.CUDA)
        return acts

    def _new_profiler(self, schedule: Any) -> Any:
        return self.torch.profiler.profile(
            activities=self._activities(),
            schedule=schedule,
            record_shapes=False,
            with_stack=False,  # measured: with_stack breaks top-level categories and triples the cost
            profile_memory=False,
        )

    def _start_profiler(self, now: float, schedule: Any) -> bool:
        """Start ``torch.profiler`` now; on a clash or failure end the burst with the reason."""
        if self._other_profiler():
            self._abort(now, "another profiler became active before the burst started")
            return False
        try:
            self._prof = self._new_profiler(schedule)
            self._prof.start()
        except Exception as exc:
            self._prof = None
            self._abort(now, f"torch.profiler failed to start: {exc!r}")
            return False
        return True

    def _start_steps(self, now: float) -> None:
        p = self.params
        sched = self.torch.profiler.schedule(wait=0, warmup=p.warmup, active=p.steps, repeat=1)
        if not self._start_profiler(now, sched):
            return
        self.state, self._started_at, self._active_steps = "running", now, 0
        self._schedule(p.max_s)  # a step longer than max_s still ends the burst
        self._changed()

    def _start_window(self, now: float) -> None:
        self._cancel_timer()
        if not self._start_profiler(now, None):
            return
        # A time window has no step boundaries: mark it as one step, so the trace reads alike.
        with contextlib.suppress(Exception):
            self._window_rec = self.torch.profiler.record_function("ProfilerStep#0")
            self._window_rec.__enter__()
        self.state, self.mode, self._started_at = "running", "window", now
        self._schedule(min(self.params.window_s, self.params.max_s))
        self._changed()

    def _finish(self, now: float) -> None:
        self._cancel_timer()
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
        }
        self._worker = threading.Thread(
            target=self._summarize, args=(prof, info), name="torchwatch-burst-summary", daemon=True
        )
        self._worker.start()

    def _summarize(self, prof: Any, info: dict[str, Any]) -> None:
        """Background thread: export the trace, summarise it, gzip it, publish the result."""
        t0 = time.monotonic()
        result: dict[str, Any] = dict(info)
        raw: Path | None = None
        try:
            out = publish.ensure_private_dir(trace_dir())
            stem = f"trace-{self.pid}-{info['id']}-{time.strftime('%Y%m%d-%H%M%S')}"
            raw = out / f".{stem}.json"
            prof.export_chrome_trace(str(raw))
            del prof
            from torchwatch.hook.summary import load_trace, summarize_trace

            trace = load_trace(raw)
            try:
                summary = summarize_trace(trace)
            finally:
                del trace
            result.update(summary)
            size = raw.stat().st_size
            result["trace_bytes"] = size
            if size > self.params.max_bytes:
                result["trace_path"] = None
                result["trace_note"] = (
                    f"trace of {size / 1e6:.0f} MB exceeds the {self.params.max_bytes / 1e6:.0f} MB bound: deleted"
                )
            else:
                final = out / f"{stem}.json.gz"
                with open(raw, "rb") as src, gzip.open(final, "wb", compresslevel=3) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                os.chmod(final, 0o600)
                result["trace_path"] = str(final)
                result["trace_gz_bytes"] = final.stat().st_size
        except Exception as exc:
            result["error"] = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        finally:
            if raw is not None:
                with contextlib.suppress(OSError):
                    raw.unlink()
        gc.collect()
        result["summary_s"] = round(time.monotonic() - t0, 4)
        result["rss_before_bytes"] = self._rss_before
        result["rss_after_bytes"] = rss_bytes()
        result["rss_growth_since_first_bytes"] = result["rss_after_bytes"] - (self.first_rss or self._rss_before)
        if result.get("trace_path"):
            with contextlib.suppress(OSError):
                publish.write_json_atomic(Path(result["trace_path"][: -len(".json.gz")] + ".summary.json"), result)
        self.last = result
        self._ended_at = time.monotonic()
        self.state, self.mode = "idle", ""
        self._changed()

    def _abort(self, now: float, reason: str) -> None:
        self._cancel_timer()
        self.last = {"id": self.count, "error": reason, "started_at": now}
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


def params_dict(params: BurstParams) -> dict[str, Any]:
    """``params`` as a JSON-ready dict."""
    return asdict(params)

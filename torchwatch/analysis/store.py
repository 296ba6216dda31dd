"""Bounded, time-windowed storage of readings, shared by sampler threads and the analysis."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from torchwatch.model.memory import MemorySample
from torchwatch.model.readings import (
    GpuSample,
    HookState,
    ProcessSample,
    StackSample,
    SystemSample,
    ThreadSample,
)

_R = TypeVar("_R")
KEEP_S = 300.0  # seconds of readings a Store keeps by default: the longest window a verdict can use


@dataclass
class Window:
    """Readings from ``start`` to ``end`` (monotonic seconds), each list oldest first."""

    start: float
    end: float
    processes: list[ProcessSample] = field(default_factory=list)
    threads: list[ThreadSample] = field(default_factory=list)
    system: list[SystemSample] = field(default_factory=list)
    gpus: list[GpuSample] = field(default_factory=list)
    stacks: list[StackSample] = field(default_factory=list)
    hook: list[HookState] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        """Length of the window, s."""
        return max(0.0, self.end - self.start)


_KINDS: dict[type, str] = {
    ProcessSample: "processes",
    ThreadSample: "threads",
    SystemSample: "system",
    GpuSample: "gpus",
    StackSample: "stacks",
    HookState: "hook",
    MemorySample: "memory",
}


class Store:
    """Ring buffers of readings, trimmed to the last ``keep`` seconds.

    Args:
        keep: seconds of history kept (the TUI's sparklines and the report window read it).
        max_items: hard cap per kind, so a runaway source cannot grow memory without bound.
    """

    def __init__(self, keep: float = KEEP_S, max_items: int = 200_000) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._buffers: dict[str, deque[object]] = {k: deque(maxlen=max_items) for k in _KINDS.values()}

    def add(self, readings: Iterable[object]) -> None:
        """Append readings of any known type; unknown objects are ignored."""
        with self._lock:
            for r in readings:
                kind = _KINDS.get(type(r))
                if kind is not None:
                    self._buffers[kind].append(r)

    def trim(self, now: float) -> None:
        """Drop readings older than ``now - keep``."""
        cutoff = now - self.keep
        with self._lock:
            for buf in self._buffers.values():
                while buf and buf[0].t < cutoff:  # type: ignore[attr-defined]
                    buf.popleft()

    def window(self, start: float, end: float, kinds: Iterable[str] | None = None) -> Window:
        """A copy of the readings with ``start <= t <= end``.

        Args:
            kinds: copy only these lists of :class:`Window` (e.g. ``("processes", "gpus")``); the
                others stay empty. ``None`` copies all.
        """
        w = Window(start=start, end=end)
        wanted = set(self._buffers) if kinds is None else set(kinds)
        with self._lock:
            for kind, buf in self._buffers.items():
                if kind in wanted:
                    setattr(w, kind, [r for r in buf if start <= r.t <= end])  # type: ignore[attr-defined]
        return w

    def latest(self, kind: type[_R], where: Callable[[_R], bool] | None = None) -> _R | None:
        """The newest reading of type ``kind`` (e.g. :class:`HookState`) for which ``where`` holds
        (any when ``None``), or ``None``."""
        with self._lock:
            buf = self._buffers.get(_KINDS.get(kind, ""))
            if not buf:
                return None
            if where is None:
                return buf[-1]  # type: ignore[return-value]
            return next((r for r in reversed(buf) if where(r)), None)  # type: ignore[arg-type, return-value]

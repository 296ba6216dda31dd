"""Bounded, time-windowed storage of readings, shared by sampler threads and the analysis.

The store names no reading type: a reading declares its list, ``STORE_KIND`` (a class attribute of
its type in :mod:`torchwatch.model`, e.g. ``"processes"``), and the store keeps every reading
that declares one, each kind in a ring buffer of its own. A :class:`Window` holds the seven kinds
the features read as typed lists, and any other kind (a new source's readings) in :attr:`Window.more`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import TypeVar

from torchwatch.model.memory import MemorySample
from torchwatch.model.readings import GpuSample, HookState, ProcessSample, StackSample, SystemSample, ThreadSample

_R = TypeVar("_R")
KEEP_S = 300.0  # seconds of readings a Store keeps by default: the longest window a verdict can use


@dataclass
class Window:
    """Readings from ``start`` to ``end`` (monotonic seconds), each list oldest first.

    Attributes:
        processes, threads, system, gpus, stacks, hook, memory: the readings whose ``STORE_KIND``
            names the list.
        more: ``{STORE_KIND: readings}`` of every other kind (a source's readings no list above holds).
    """

    start: float
    end: float
    processes: list[ProcessSample] = field(default_factory=list)
    threads: list[ThreadSample] = field(default_factory=list)
    system: list[SystemSample] = field(default_factory=list)
    gpus: list[GpuSample] = field(default_factory=list)
    stacks: list[StackSample] = field(default_factory=list)
    hook: list[HookState] = field(default_factory=list)
    memory: list[MemorySample] = field(default_factory=list)
    more: dict[str, list[object]] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """Length of the window, s."""
        return max(0.0, self.end - self.start)

    def of(self, kind: str) -> list[object]:
        """The readings of ``kind`` (a ``STORE_KIND``), whether a typed list holds them or :attr:`more`."""
        if kind in _TYPED:
            return list(getattr(self, kind))
        return self.more.get(kind, [])


# The kinds a Window holds as typed lists (its fields but the bounds and more); every other kind goes to Window.more.
_TYPED = frozenset(f.name for f in fields(Window)) - {"start", "end", "more"}


def kind_of(reading_type: type) -> str | None:
    """The store's list for readings of ``reading_type`` (its ``STORE_KIND``); ``None``: not kept."""
    kind = getattr(reading_type, "STORE_KIND", None)
    return kind if isinstance(kind, str) else None


class Store:
    """Ring buffers of readings, trimmed to the last ``keep`` seconds.

    Args:
        keep: seconds of history kept (the TUI's sparklines and the report window read it).
        max_items: hard cap per kind, so a runaway source cannot grow memory without bound.
    """

    def __init__(self, keep: float = KEEP_S, max_items: int = 200_000) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._max_items = max_items
        self._buffers: dict[str, deque[object]] = {}  # {STORE_KIND: readings}, made at the first of each kind

    def add(self, readings: Iterable[object]) -> None:
        """Append readings of any type that declares a ``STORE_KIND``; other objects are ignored."""
        with self._lock:
            for r in readings:
                kind = kind_of(type(r))
                if kind is None:
                    continue
                buf = self._buffers.get(kind)
                if buf is None:
                    buf = self._buffers[kind] = deque(maxlen=self._max_items)
                buf.append(r)

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
            kinds: copy only these kinds (``STORE_KIND``: a list of :class:`Window`, e.g.
                ``("processes", "gpus")``, or a key of :attr:`Window.more`); the others stay empty.
                ``None`` copies all.
        """
        w = Window(start=start, end=end)
        wanted = set(self._buffers) if kinds is None else set(kinds)
        with self._lock:
            for kind, buf in self._buffers.items():
                if kind not in wanted:
                    continue
                kept = [r for r in buf if start <= r.t <= end]  # type: ignore[attr-defined]
                if kind in _TYPED:
                    setattr(w, kind, kept)
                else:
                    w.more[kind] = kept
        return w

    def latest(self, kind: type[_R], where: Callable[[_R], bool] | None = None) -> _R | None:
        """The newest reading of type ``kind`` (e.g. :class:`HookState`) for which ``where`` holds
        (any when ``None``), or ``None``."""
        with self._lock:
            buf = self._buffers.get(kind_of(kind) or "")
            if not buf:
                return None
            if where is None:
                return buf[-1]  # type: ignore[return-value]
            return next((r for r in reversed(buf) if where(r)), None)  # type: ignore[arg-type, return-value]

"""The hook's record of a CUDA out-of-memory error: the allocator's state at the moment it failed.

Standard library only; ``torch`` is the training's module, duck-typed (tests pass a fake).

PyTorch's CUDA caching allocator calls its out-of-memory observers
(``torch._C._cuda_attach_out_of_memory_observer``, the hook of ``torch.cuda.memory``'s own OOM
snapshots) after ``cudaMalloc`` failed and the allocator freed its cache and retried, with its
lock released and the GIL held, just before it raises ``torch.cuda.OutOfMemoryError``. The
observer here records and returns: it never raises (an exception from an observer would replace
the training's error), never catches the error, and costs nothing before it: no allocation
history is recorded while the training runs (``torch.cuda.memory._record_memory_history`` adds
a stack capture to every allocation). At the error it reads ``memory_stats`` and takes
``torch.cuda.memory._snapshot()`` (the segments and blocks the allocator holds, without
per-block stacks) and summarises it; the time both took is in the record (``snapshot_ms``), and
``bench/oom_snapshot.py`` / the GPU run in ``docs/memory.md`` give its size on a real device.

Observers cannot be detached: after :meth:`OomWatch.close` (``torchwatch detach``, exit) the
observer returns at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from types import FrameType
from typing import Any

from .. import wire
from .gpu import _count

SNAPSHOT_MAX_SEGMENTS = 100_000
"""Segments summarised at most (a long training with changing shapes holds thousands; the
summary is one pass over them)."""


def _stat(stats: Any, key: str) -> int | None:
    try:
        return _count(stats.get(key))
    except Exception:
        return None


def summarise_snapshot(snapshot: Any, device: int) -> tuple[int, int | None, tuple[int, ...]]:
    """Segments, the largest free block and the largest blocks in use on ``device``.

    Args:
        snapshot: what ``torch.cuda.memory._snapshot()`` returns: ``{"segments": [{"device": int,
            "total_size": int, "blocks": [{"size": int, "state": "active_allocated" |
            "active_pending_free" | "inactive"}, ...]}, ...]}``.
    Returns:
        ``(segments, largest free block bytes or None, the largest active blocks' sizes in bytes,
        at most wire.MAX_OOM_BLOCKS, largest first)``.
    """
    segments = 0
    largest_free: int | None = None
    active: list[int] = []
    for seg in list(snapshot.get("segments") or ())[:SNAPSHOT_MAX_SEGMENTS]:
        if not isinstance(seg, dict) or seg.get("device", device) != device:
            continue
        segments += 1
        for block in seg.get("blocks") or ():
            size = _count(block.get("size")) if isinstance(block, dict) else None
            if size is None:
                continue
            if block.get("state") == "inactive":
                largest_free = size if largest_free is None else max(largest_free, size)
            else:
                active.append(size)
    active.sort(reverse=True)
    return segments, largest_free, tuple(active[: wire.MAX_OOM_BLOCKS])


def python_stack(skip: int = 1) -> tuple[str, ...]:
    """The calling thread's Python stack as ``file:line function``, innermost last, at most
    :data:`wire.MAX_OOM_FRAMES` (the innermost kept), without this module's frames. A thread with
    no Python frame of its own (the autograd engine's device thread runs ``backward()``'s
    allocations: an H100 run's error came from there) gives the main thread's stack instead,
    which is where ``loss.backward()`` waits."""
    here = os.path.abspath(__file__)

    def frames_of(frame: FrameType | None) -> list[str]:
        if frame is None:
            return []
        return [
            wire.clean_text(f"{f.filename}:{f.lineno} {f.name}", wire.TEXT)
            for f in traceback.extract_stack(frame)
            if os.path.abspath(f.filename) != here
        ]

    out = frames_of(sys._getframe(skip))
    if not out and threading.current_thread() is not threading.main_thread():
        main = threading.main_thread().ident
        out = frames_of(sys._current_frames().get(main) if main is not None else None)
    return tuple(out[-wire.MAX_OOM_FRAMES :])


_TRIED = re.compile(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)")
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def is_cuda_oom(exc: object) -> bool:
    """Whether ``exc`` is ``torch.cuda.OutOfMemoryError`` (by class name: the hook never imports
    torch for a check), or a subclass of it."""
    return isinstance(exc, BaseException) and any(
        c.__name__ == "OutOfMemoryError" and c.__module__.startswith("torch") for c in type(exc).__mro__
    )


def requested_from_message(message: str) -> int:
    """The bytes of the failed allocation from the error's message ("Tried to allocate 2.00 GiB"),
    0 when absent."""
    m = _TRIED.search(message)
    if m is None:
        return 0
    with contextlib.suppress(ValueError):
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    return 0


class OomWatch:
    """Attaches the out-of-memory observer once per process and keeps the last record.

    Args:
        on_record: called with each new :class:`wire.OomRecord` (the hook publishes ``hook.json``
            there); its errors are swallowed.
        steps: returns ``(optimizer steps so far, the last step durations in s)``.
        snapshot: take ``torch.cuda.memory._snapshot()`` at the error (default on).

    Attributes:
        record: the last record (``None``: no error yet). attached: the observer is in place.
        error: why attaching failed (a torch without the observer), once.
    """

    def __init__(
        self,
        on_record: Callable[[wire.OomRecord], None],
        steps: Callable[[], tuple[int | None, list[float]]],
        snapshot: bool = True,
    ) -> None:
        self.record: wire.OomRecord | None = None
        self.attached = False
        self.error: str | None = None
        self._on_record = on_record
        self._steps = steps
        self._snapshot = snapshot
        self._torch: Any = None
        self._closed = False
        self._pid = os.getpid()
        self._count = 0

    def attach(self, torch: Any) -> bool:
        """Attach the observer (once; only after the training initialised CUDA: the caller
        checks). Never raises. Returns whether it is attached."""
        self._torch = torch
        if self.attached or self._closed:
            return self.attached
        if self._closed:
            return False
        try:
            attach = torch._C._cuda_attach_out_of_memory_observer
        except Exception:
            self.error = "CUDA out-of-memory errors are not recorded: this torch has no out-of-memory observer"
            self.attached = True  # do not try again every step
            return False
        try:
            attach(self._observe)
        except Exception as exc:
            self.error = f"CUDA out-of-memory observer: {exc!r}"
            self.attached = True
            return False
        self.attached = True
        return True

    def close(self) -> None:
        """Make the observer return at once from now on (it cannot be detached)."""
        self._closed = True

    def at_exit(self, exc: object, torch: Any) -> wire.OomRecord | None:
        """At exit, when the training ended by an uncaught ``torch.cuda.OutOfMemoryError`` the
        observer did not see (it was raised before the first step attached it, or by a torch
        without observers): a record from the error's message and traceback and the allocator as
        it is now (after the stack unwound: ``snapshot_ms`` absent). Never raises.

        Args:
            exc: ``sys.last_value`` (set by the interpreter for an uncaught exception before
                ``atexit`` handlers run). torch: the training's module.
        Returns:
            the new record, or ``None`` (not an out-of-memory error, or one already recorded).
        """
        if self.record is not None or not is_cuda_oom(exc) or os.getpid() != self._pid:
            return None
        try:
            assert isinstance(exc, BaseException)
            self._torch = self._torch if self._torch is not None else torch
            snapshot, self._snapshot = self._snapshot, False
            try:
                rec = self.take(None, requested_from_message(str(exc)), None, None)
            finally:
                self._snapshot = snapshot
            frames = traceback.extract_tb(exc.__traceback__)
            stack = tuple(wire.clean_text(f"{f.filename}:{f.lineno} {f.name}", wire.TEXT) for f in frames)
            self.record = rec = replace(rec, stack=stack[-wire.MAX_OOM_FRAMES :])
        except Exception:
            return None
        return rec

    def _observe(self, device: object, requested: object, total: object, free: object) -> None:
        """The allocator's callback: ``(device, bytes asked for, device total or the fraction's
        limit, bytes free)``. Never raises."""
        if self._closed or os.getpid() != self._pid:
            return
        try:
            rec = self.take(device, requested, total, free)
        except Exception:
            return
        self.record = rec
        with contextlib.suppress(Exception):
            self._on_record(rec)

    def take(self, device: object, requested: object, total: object, free: object) -> wire.OomRecord:
        """Read the allocator and build the record (the observer's body; tests call it with a
        fake ``torch``).

        Raises:
            Exception: whatever the allocator's readers raise (the observer swallows it).
        """
        t = time.monotonic()
        dev = _count(device) or 0
        self._count += 1
        cuda = self._torch.cuda
        if device is None:
            with contextlib.suppress(Exception):
                dev = int(cuda.current_device())
        stats: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            stats = dict(cuda.memory_stats(dev))
        segments = largest_free = None
        largest: tuple[int, ...] = ()
        snapshot_ms = None
        if self._snapshot:
            with contextlib.suppress(Exception):
                t0 = time.perf_counter()
                segments, largest_free, largest = summarise_snapshot(cuda.memory._snapshot(dev), dev)
                snapshot_ms = round((time.perf_counter() - t0) * 1000.0, 3)
        step: int | None = None
        durations: list[float] = []
        with contextlib.suppress(Exception):
            step, durations = self._steps()
        return wire.OomRecord(
            t=round(t, 3),
            count=self._count,
            device=dev,
            requested_bytes=_count(requested) or 0,
            device_total_bytes=_count(total),
            device_free_bytes=_count(free),
            allocated_bytes=_stat(stats, "allocated_bytes.all.current"),
            reserved_bytes=_stat(stats, "reserved_bytes.all.current"),
            peak_bytes=_stat(stats, "allocated_bytes.all.peak"),
            active_bytes=_stat(stats, "active_bytes.all.current"),
            inactive_split_bytes=_stat(stats, "inactive_split_bytes.all.current"),
            alloc_retries=_stat(stats, "num_alloc_retries"),
            ooms=_stat(stats, "num_ooms"),
            segments=segments,
            largest_free_bytes=largest_free,
            largest_active=largest,
            snapshot_ms=snapshot_ms,
            step=_count(step),
            step_ms=tuple(round(d * 1000.0, 3) for d in durations[-16:] if d >= 0),
            stack=python_stack(2),
            thread=wire.clean_text(threading.current_thread().name, wire.NAME),
        )

"""The ``counters`` file itself: the hook's writer (:class:`Counters`, a sequence-locked header
and a step ring in a shared ``mmap``) and torchwatch's consistent read (:func:`read_counters`).
The layout and its decoder are :mod:`~torchwatch.wire.counters`; the file is opened and checked
as every file of the channel (:mod:`~torchwatch.wire.files`)."""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
from collections.abc import Collection

from .base import WireError
from .counters import (
    COUNTERS_MAGIC,
    COUNTERS_SIZE,
    COUNTERS_VERSION,
    DYNAMIC,
    DYNAMIC_OFFSET,
    ENTRY,
    HEADER,
    IDENTITY,
    RING,
    SEQ,
    SEQ_OFFSET,
    STEP_SOURCES,
    Busy,
    CounterSnapshot,
    decode_counters,
)
from .files import COUNTERS_FILE, TEMP_PREFIX, open_checked
from .identity import Instance

__all__ = ["Counters", "read_counters"]


# bound once: the hot path (every step and batch) pays no lookups for them
_pack_seq = SEQ.pack_into
_pack_dynamic = DYNAMIC.pack_into
_pack_entry = ENTRY.pack_into
_DYNAMIC_OFFSET = DYNAMIC_OFFSET
_ENTRIES_AT = HEADER.size
_ENTRY_SIZE = ENTRY.size


class Counters:
    """The writer's side of the ``counters`` file: a seqlock-protected header and a step ring.

    Not thread-safe: one thread writes at a time (the hook's step, backward and collective
    wrappers count the main thread's calls only).

    The file is made under a temp name, sized, mapped and only then renamed to ``counters``:
    no file anyone has mapped is ever truncated (a truncated mapping kills its reader or
    writer with SIGBUS). Writes go straight to the shared ``mmap``; the sequence number is odd
    while a write is in progress, so a reader retries instead of using a torn copy.

    Args:
        dir_fd: the hook's own directory. instance: this process.

    Raises:
        OSError: the file cannot be created or mapped.
    """

    SIZE = COUNTERS_SIZE

    def __init__(self, dir_fd: int, instance: Instance) -> None:
        tmp = f"{TEMP_PREFIX}{COUNTERS_FILE}.{secrets.token_hex(6)}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, self.SIZE)  # a new, empty file of ours: nobody else maps it
            self._mm = mmap.mmap(fd, self.SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        finally:
            os.close(fd)
        self.instance = instance
        IDENTITY.pack_into(self._mm, 0, COUNTERS_MAGIC, COUNTERS_VERSION, instance.pid, instance.start, instance.pidns)
        self.seq = 0
        self.steps = 0
        self.batches = 0
        self.written = 0
        self.last_step_t = 0.0
        self.first_step_t = 0.0
        self.data_wait_s = 0.0
        self.step_time_s = 0.0
        self.in_next_since = 0.0
        self.last_batch_t = 0.0
        self.step_source = 0  # index in STEP_SOURCES
        self.backward_calls = 0
        self.collective_calls = 0
        self.backward_s = 0.0
        self.backward_blocked_s = 0.0
        self.collective_s = 0.0
        self.in_backward_since = 0.0
        self.in_collective_since = 0.0
        self._flush()
        try:
            os.rename(tmp, COUNTERS_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            self.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise

    def _flush(self) -> None:
        # seqlock: odd while the fields change, even again only after they are all written
        mm = self._mm
        seq = self.seq + 1
        _pack_seq(mm, SEQ_OFFSET, seq)
        _pack_dynamic(
            mm,
            _DYNAMIC_OFFSET,
            self.steps,
            self.batches,
            RING,
            self.written,
            self.last_step_t,
            self.data_wait_s,
            self.step_time_s,
            self.in_next_since,
            self.last_batch_t,
            self.first_step_t,
            self.step_source,
            self.backward_calls,
            self.collective_calls,
            self.backward_s,
            self.backward_blocked_s,
            self.collective_s,
            self.in_backward_since,
            self.in_collective_since,
        )
        self.seq = seq = seq + 1
        _pack_seq(mm, SEQ_OFFSET, seq)

    def step(
        self,
        end: float,
        duration: float | None,
        wait: float,
        backward: float = 0.0,
        blocked: float = 0.0,
        collective: float = 0.0,
    ) -> None:
        """Record a step that ended at ``end`` (monotonic s), lasted ``duration`` s (``None`` for
        the first step, whose start is unknown) and spent ``wait`` s in DataLoader ``__next__``,
        ``backward`` s in backward passes (``blocked`` of it without CPU) and ``collective`` s in
        explicit collectives (see :class:`RankStep`)."""
        self.steps += 1
        if duration is not None:
            self.step_time_s += duration
            _pack_entry(
                self._mm,
                _ENTRIES_AT + (self.written % RING) * _ENTRY_SIZE,
                end,
                duration,
                wait,
                backward,
                blocked,
                collective,
            )
            self.written += 1
        else:
            self.first_step_t = end
        self.last_step_t = end
        self._flush()

    def set_step_source(self, source: str) -> None:
        """Where step boundaries come from from now on (one of :data:`STEP_SOURCES`)."""
        self.step_source = STEP_SOURCES.index(source)
        self._flush()

    def next_started(self, t: float) -> None:
        """A DataLoader ``__next__`` began at ``t`` (so a reader sees a long stall while it lasts)."""
        self.in_next_since = t
        self._flush()

    def next_ended(self, t: float, waited: float) -> None:
        """A DataLoader ``__next__`` ended at ``t`` after ``waited`` s."""
        self.batches += 1
        self.data_wait_s += waited
        self.in_next_since = 0.0
        self.last_batch_t = t
        self._flush()

    def next_aborted(self) -> None:
        """A DataLoader ``__next__`` raised (``StopIteration`` at the end of an epoch, or an
        error): no batch, and no longer "in ``__next__``" (a pause after the epoch is not a wait)."""
        self.in_next_since = 0.0
        self._flush()

    def backward_started(self, t: float) -> None:
        """A backward pass began at ``t`` (monotonic s)."""
        self.in_backward_since = t
        self._flush()

    def backward_ended(self, wall: float, blocked: float, flush: bool = True) -> None:
        """A backward pass ended after ``wall`` s, ``blocked`` s of it without CPU; ``flush``
        False when :meth:`step` follows at once (one write instead of two)."""
        self.backward_calls += 1
        self.backward_s += wall
        self.backward_blocked_s += blocked
        self.in_backward_since = 0.0
        if flush:
            self._flush()

    def collective_started(self, t: float) -> None:
        """A collective (or ``Work.wait()``) began at ``t`` (monotonic s)."""
        self.in_collective_since = t
        self._flush()

    def collective_ended(self, waited: float) -> None:
        """The collective ended after ``waited`` s."""
        self.collective_calls += 1
        self.collective_s += waited
        self.in_collective_since = 0.0
        self._flush()

    def snapshot(self) -> CounterSnapshot | None:
        """What a reader would see now (from the mapping, in this process)."""
        with contextlib.suppress(WireError, ValueError):
            data = bytes(self._mm)
            return decode_counters(data, data[: HEADER.size], self.instance)
        return None

    def close(self) -> None:
        """Unmap the file (in a forked child: drop the parent's mapping without writing to it)."""
        with contextlib.suppress(Exception):
            self._mm.close()


def read_counters(
    dir_fd: int, owners: Collection[int], expect: Instance | None = None, retries: int = 5, since: int = 0
) -> CounterSnapshot:
    """Read ``counters`` in ``dir_fd`` consistently (checked as :func:`open_checked`); ``since``:
    decode only the step entries after that ``written`` count (see :func:`decode_counters`).

    Raises:
        Unsafe / OSError: as :func:`open_checked`. WireError: not a counters file of
            ``expect``, or still being written after ``retries`` reads.
    """
    with open_checked(dir_fd, COUNTERS_FILE, owners, COUNTERS_SIZE, exact=COUNTERS_SIZE) as fd:
        for _ in range(retries):
            data = os.pread(fd, COUNTERS_SIZE, 0)
            again = os.pread(fd, HEADER.size, 0)
            try:
                return decode_counters(data, again, expect, since)
            except Busy:
                continue
    raise Busy("counters: still being written")

"""Where the hook publishes, and the two formats it publishes in. Standard library only.

Both sides use this module: the hook (inside the training process) writes, torchwatch reads.
Per training process there is one directory ``<base>/<pid>/`` (mode 0700) holding:

- ``hook.json``: the announcement and every slow-changing fact (signal, DataLoader settings,
  AMP, burst state and results, errors); rewritten atomically (temp file + rename, 0600)
  only when something in it changes.
- ``counters``: a fixed-layout binary file the hook updates in place through ``mmap`` at every
  step and batch (a few microseconds, no system call); see :class:`Counters`.
- ``request.json``: written by torchwatch just before it signals a burst (its parameters).

No network port is opened in the training process. ``<base>`` is ``$TORCHWATCH_DIR`` or
``$TMPDIR/torchwatch-<uid>`` (``/tmp`` when ``TMPDIR`` is unset): torchwatch reads both
variables from the target's ``/proc/PID/environ``, so ``attach`` finds a hook the user
installed themselves.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "hook.json"
COUNTERS_FILE = "counters"
REQUEST_FILE = "request.json"
SCHEMA = "torchwatch.hook/1"

_MAGIC = b"TWH1"
# magic, version, seq, pid, steps, batches, ring capacity, ring written,
# last step end (s), data wait total (s), step time total (s), in-next since (s, 0 = not in next),
# last batch end (s), first step end (s)
_HEADER = struct.Struct("<4sIQQQQQQdddddd")
_SEQ = struct.Struct("<Q")  # the header's seq field, at offset 8
_ENTRY = struct.Struct("<ddd")  # step end (monotonic s), step duration (s), data wait in the step (s)
RING = 512


def base_dir(environ: Mapping[str, str] | None = None, uid: int | None = None) -> Path:
    """The per-user directory under which each hooked process has its own directory.

    Args:
        environ: the environment to read (the target's, for torchwatch); default ``os.environ``.
        uid: the user id; default the current one.
    """
    env = os.environ if environ is None else environ
    if env.get("TORCHWATCH_DIR"):
        return Path(env["TORCHWATCH_DIR"])
    tmp = env.get("TMPDIR") or "/tmp"
    return Path(tmp) / f"torchwatch-{os.getuid() if uid is None else uid}"


def ensure_private_dir(path: Path, levels: int = 1) -> Path:
    """Create ``path`` (and parents) and make it and its ``levels - 1`` parents mode 0700.

    Raises:
        PermissionError: one of them belongs to another user or is a symbolic link.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for d in [path, *path.parents][:levels]:
        st = d.lstat()
        if st.st_uid != os.getuid() or not os.path.isdir(d) or os.path.islink(d):
            raise PermissionError(f"{d} is not a directory of this user (uid {st.st_uid})")
        if st.st_mode & 0o077:
            os.chmod(d, 0o700)
    return path


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temp file in the same directory, 0600, rename).

    Raises:
        OSError: the directory is not writable.
    """
    fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or ``None`` when it is missing, half-written or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class CounterSnapshot:
    """One consistent read of the hook's counters. Times are ``time.monotonic()`` seconds (the
    same clock in every process of the machine), durations in s.

    Attributes:
        pid: the training process that writes them.
        steps: optimizer steps since the hook started.
        batches: batches taken from DataLoader iterators.
        last_step_t: when the last step ended (0.0: none yet).
        first_step_t: when the first step ended (0.0: none yet).
        data_wait_s: total time blocked in DataLoader ``__next__``.
        step_time_s: total duration of the steps (from the first step end on).
        in_next_since: when the ``__next__`` now running began (0.0: not in one).
        last_batch_t: when the last batch arrived (0.0: none yet).
        entries: the last up-to-:data:`RING` steps as ``(end, duration, data wait)``, oldest first.
    """

    pid: int
    steps: int
    batches: int
    last_step_t: float
    first_step_t: float
    data_wait_s: float
    step_time_s: float
    in_next_since: float
    last_batch_t: float
    entries: tuple[tuple[float, float, float], ...]


class Counters:
    """The writer's side of the ``counters`` file: a seqlock-protected header and a step ring.

    Writes go straight to a shared ``mmap``; the sequence number is odd while a write is in
    progress, so a reader retries instead of using a torn copy.

    Raises:
        OSError: the file cannot be created or mapped.
    """

    SIZE = _HEADER.size + RING * _ENTRY.size

    def __init__(self, path: Path, pid: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, self.SIZE)
            self._mm = mmap.mmap(fd, self.SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.pid = pid
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
        self._flush()

    def _flush(self) -> None:
        self.seq += 1  # odd: write in progress
        _SEQ.pack_into(self._mm, 8, self.seq)
        self.seq += 1
        _HEADER.pack_into(
            self._mm,
            0,
            _MAGIC,
            1,
            self.seq,
            self.pid,
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
        )

    def step(self, end: float, duration: float | None, wait: float) -> None:
        """Record a step that ended at ``end`` (monotonic s), lasted ``duration`` s (``None`` for
        the first step, whose start is unknown) and spent ``wait`` s in DataLoader ``__next__``."""
        self.steps += 1
        if duration is not None:
            self.step_time_s += duration
            _ENTRY.pack_into(self._mm, _HEADER.size + (self.written % RING) * _ENTRY.size, end, duration, wait)
            self.written += 1
        else:
            self.first_step_t = end
        self.last_step_t = end
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

    def close(self) -> None:
        """Unmap the file (in a forked child: drop the parent's mapping without writing to it)."""
        with contextlib.suppress(Exception):
            self._mm.close()


def read_counters(path: Path, retries: int = 5) -> CounterSnapshot | None:
    """Read the ``counters`` file consistently; ``None`` when it is missing, foreign or busy."""
    for _ in range(retries):
        try:
            with open(path, "rb") as f:
                data = f.read(Counters.SIZE)
                f.seek(0)
                again = f.read(_HEADER.size)
        except OSError:
            return None
        if len(data) < Counters.SIZE or len(again) < _HEADER.size:
            return None
        head = _HEADER.unpack_from(data, 0)
        if head[0] != _MAGIC:
            return None
        seq, seq2 = head[2], _HEADER.unpack_from(again, 0)[2]
        if seq % 2 or seq != seq2:
            continue
        (_, _, _, pid, steps, batches, ring, written, last_step, wait, step_time, in_next, last_batch, first) = head
        n = min(written, ring)
        start = written - n
        entries = tuple(_ENTRY.unpack_from(data, _HEADER.size + ((start + i) % ring) * _ENTRY.size) for i in range(n))
        return CounterSnapshot(pid, steps, batches, last_step, first, wait, step_time, in_next, last_batch, entries)
    return None

"""Where the hook publishes, and how its files are made, read and removed safely. Standard library only.

Both sides use this module: the hook (inside the training process) writes, torchwatch reads,
often as root and always in a directory the training's user controls. Layout::

    <base>/                      $TORCHWATCH_DIR, else $TMPDIR/torchwatch-<uid> (/tmp without TMPDIR)
        <pid>-<start>-<pidns>/   one per hooked process instance (wire.Instance), mode 0700
            hook.json            the announcement and slow-changing facts (wire.HookRecord), 0600
            counters             fixed binary layout updated in place through mmap (wire.HEADER), 0600
            request.json         a burst request, written by torchwatch before its signal, 0644

No network port is opened in the training process. torchwatch reads ``TORCHWATCH_DIR`` and
``TMPDIR`` from the target's ``/proc/PID/environ``, so ``attach`` finds a hook the user
installed themselves.

Rules both sides keep (the files sit where another user, or the training's own user, may
have planted anything):

- every directory is opened ``O_DIRECTORY | O_NOFOLLOW`` and checked on its descriptor
  (owner, not writable by group or others unless sticky); every file is reached relative to
  that descriptor, never through a path that could be swapped in between;
- files are opened without following symbolic links and without opening FIFOs or devices at
  all (``O_PATH`` first, then checked: a regular file, of the expected owner, no larger than a
  cap), and read up to the cap;
- files are written under a fresh temp name (``O_CREAT | O_EXCL | O_NOFOLLOW``), their mode set
  on the descriptor, then renamed into place: nothing is truncated in place (another process
  may have it mapped) and nothing is ever chown'ed or chmod'ed by path;
- the hook creates its base directory only when missing (0700), never changes an existing one,
  and removes only hook directories it can prove are its own and dead (:func:`remove_stale`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import secrets
import stat
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from torchwatch.hook import wire
from torchwatch.hook.wire import (
    COUNTERS_FILE,
    COUNTERS_SIZE,
    ENTRY,
    HEADER,
    REQUEST_FILE,
    RING,
    SCHEMA,
    SEQ,
    SEQ_OFFSET,
    STATE_FILE,
    CounterSnapshot,
    Instance,
)

__all__ = [
    "COUNTERS_FILE",
    "REQUEST_FILE",
    "RING",
    "SCHEMA",
    "STATE_FILE",
    "CounterSnapshot",
    "Counters",
    "Unsafe",
    "base_dir",
    "open_checked",
    "open_dir",
    "prepare_dir",
    "read_counters",
    "read_json",
    "remove_hook_dir",
    "remove_stale",
    "write_atomic",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_PATH = getattr(os, "O_PATH", 0)


class Unsafe(OSError):
    """A directory or file fails a safety check (owner, kind, mode, size); one-line message."""


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


def _check_dir(fd: int, shown: str, owners: Collection[int], private: bool) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise Unsafe(f"{shown} is not a directory")
    if st.st_uid not in owners:
        raise Unsafe(f"{shown} belongs to uid {st.st_uid}, not to uid {'/'.join(map(str, owners))}")
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and (private or not st.st_mode & stat.S_ISVTX):
        raise Unsafe(f"{shown} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})")
    return st


def open_dir(path: str | os.PathLike[str], owners: Collection[int], private: bool, dir_fd: int | None = None) -> int:
    """Open a directory for ``*at`` calls, without following a symbolic link, and check it.

    Args:
        path: the directory (relative to ``dir_fd`` when given).
        owners: the uids it may belong to.
        private: it must not be writable by group or others at all; otherwise it may be when
            its sticky bit is set (as ``/tmp``: others cannot rename or remove what is ours).

    Returns:
        The descriptor (close it).

    Raises:
        Unsafe: a symbolic link, not a directory, another owner, writable by others.
        OSError: missing or unreadable (passed through).
    """
    shown = os.fsdecode(path)
    try:
        fd = os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # with O_DIRECTORY, a link gives either
            try:
                link = stat.S_ISLNK(os.lstat(path, dir_fd=dir_fd).st_mode)
            except OSError:
                link = exc.errno == errno.ELOOP
            raise Unsafe(f"{shown} is {'a symbolic link' if link else 'not a directory'}") from None
        raise
    try:
        _check_dir(fd, shown, owners, private)
    except BaseException:
        os.close(fd)
        raise
    return fd


def prepare_dir(path: Path, parents: bool = False) -> int:
    """The hook's side: open ``path`` as a directory of this user, creating it (0700) when missing.

    An existing directory is never changed: not chmod'ed, not chown'ed. It is refused when it
    is a symbolic link, belongs to another user, or is writable by group or others without the
    sticky bit.

    Args:
        parents: create missing parents too (with the default mode), as ``mkdir -p``.

    Returns:
        A descriptor of the directory (close it).

    Raises:
        Unsafe: refused (one line: which check). OSError: cannot be created or opened.
    """
    created = False
    try:
        os.mkdir(path, 0o700)
        created = True
    except FileExistsError:
        pass
    except FileNotFoundError:
        if not parents:
            raise
        os.makedirs(path.parent, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
            created = True
    fd = open_dir(path, (os.geteuid(),), private=False)
    if created:
        os.fchmod(fd, 0o700)  # ours, on the descriptor: the umask may have taken bits we need
    return fd


def private_subdir(base_fd: int, name: str) -> int:
    """Create (0700) or reuse this user's private directory ``name`` under ``base_fd``.

    Raises:
        Unsafe: it exists and is a link, another user's, or open to others. OSError: as mkdir.
    """
    try:
        os.mkdir(name, 0o700, dir_fd=base_fd)
        created = True
    except FileExistsError:
        created = False
    fd = open_dir(name, (os.geteuid(),), private=True, dir_fd=base_fd)
    if created:
        os.fchmod(fd, 0o700)
    return fd


@contextlib.contextmanager
def open_checked(dir_fd: int, name: str, owners: Collection[int], cap: int, exact: int | None = None) -> Iterator[int]:
    """Open file ``name`` in ``dir_fd`` for reading, only if it is safe to read.

    The name is first opened ``O_PATH | O_NOFOLLOW`` (which opens nothing: a FIFO does not
    block, a device is not touched) and checked on that descriptor; only then is it opened
    for reading, through ``/proc/self/fd`` (the same inode, checked again).

    Args:
        owners: the uids it may belong to.
        cap: the largest size accepted, bytes. exact: the only size accepted.

    Yields:
        A descriptor open for reading (closed on exit).

    Raises:
        Unsafe: a symbolic link, not a regular file, another owner, too large or the wrong size.
        FileNotFoundError: missing. OSError: unreadable.
    """
    fd = _open_regular(dir_fd, name, owners, cap, exact)
    try:
        yield fd
    finally:
        os.close(fd)


def _check_file(st: os.stat_result, name: str, owners: Collection[int], cap: int, exact: int | None) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise Unsafe(f"{name} is a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise Unsafe(f"{name} is not a regular file")
    if st.st_uid not in owners:
        raise Unsafe(f"{name} belongs to uid {st.st_uid}")
    if exact is not None and st.st_size != exact:
        raise Unsafe(f"{name} is {st.st_size} bytes, expected {exact}")
    if st.st_size > cap:
        raise Unsafe(f"{name} is {st.st_size} bytes, more than {cap}")


def _open_regular(dir_fd: int, name: str, owners: Collection[int], cap: int, exact: int | None) -> int:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    if _O_PATH:
        pfd = os.open(name, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            st = os.fstat(pfd)
            _check_file(st, name, owners, cap, exact)
            try:
                fd = os.open(f"/proc/self/fd/{pfd}", flags & ~os.O_NOFOLLOW)
            except FileNotFoundError:  # no /proc: open by name, then check it is the same inode
                fd = os.open(name, flags, dir_fd=dir_fd)
        finally:
            os.close(pfd)
    else:
        fd = os.open(name, flags, dir_fd=dir_fd)
        st = os.fstat(fd)
    try:
        st2 = os.fstat(fd)
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
            raise Unsafe(f"{name} was replaced while opened")
        _check_file(st2, name, owners, cap, exact)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_capped(fd: int, cap: int) -> bytes:
    """Read at most ``cap`` bytes from ``fd`` from its start.

    Raises:
        Unsafe: the file holds more than ``cap`` bytes (it grew after the size check).
    """
    chunks, total = [], 0
    while total <= cap:
        chunk = os.pread(fd, min(1 << 16, cap + 1 - total), total)
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > cap:
        raise Unsafe(f"more than {cap} bytes")
    return b"".join(chunks)


def read_json(dir_fd: int, name: str, owners: Collection[int], cap: int) -> Any:
    """The JSON value in file ``name`` (checked as :func:`open_checked`; at most ``cap`` bytes).

    Raises:
        Unsafe / OSError: as :func:`open_checked`. wire.WireError: not UTF-8 JSON, or nested
            deeper than the parser allows.
    """
    with open_checked(dir_fd, name, owners, cap) as fd:
        raw = read_capped(fd, cap)
    try:
        return json.loads(raw)
    except RecursionError:
        raise wire.WireError(f"{name}: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise wire.WireError(f"{name}: not JSON ({wire.clean_text(str(exc), 80)})") from None


def write_atomic(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``name`` in ``dir_fd``: a fresh temp file (``O_EXCL | O_NOFOLLOW``),
    its mode set on the descriptor, then renamed over ``name`` (never truncated in place).

    Raises:
        OSError: the directory is not writable.
    """
    tmp = f"{wire.TEMP_PREFIX}{name}.{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, mode)  # the umask may have taken bits the reader needs
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def encode_json(data: Any) -> bytes:
    """Compact JSON, ASCII only (``\\u`` escapes), as the hook writes it."""
    return json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


# -- counters ---------------------------------------------------------------------------------
# bound once: the hot path (every step and batch) pays no lookups for them
_pack_seq = SEQ.pack_into
_pack_dynamic = wire.DYNAMIC.pack_into
_pack_entry = ENTRY.pack_into
_DYNAMIC_OFFSET = wire.DYNAMIC_OFFSET
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
        tmp = f"{wire.TEMP_PREFIX}{COUNTERS_FILE}.{secrets.token_hex(6)}"
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
        wire.IDENTITY.pack_into(
            self._mm, 0, wire.COUNTERS_MAGIC, wire.COUNTERS_VERSION, instance.pid, instance.start, instance.pidns
        )
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
        self.step_source = 0  # index in wire.STEP_SOURCES
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
        explicit collectives (see :class:`wire.RankStep`)."""
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
        """Where step boundaries come from from now on (one of :data:`wire.STEP_SOURCES`)."""
        self.step_source = wire.STEP_SOURCES.index(source)
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
        with contextlib.suppress(wire.WireError, ValueError):
            data = bytes(self._mm)
            return wire.decode_counters(data, data[: HEADER.size], self.instance)
        return None

    def close(self) -> None:
        """Unmap the file (in a forked child: drop the parent's mapping without writing to it)."""
        with contextlib.suppress(Exception):
            self._mm.close()


def read_counters(
    dir_fd: int, owners: Collection[int], expect: Instance | None = None, retries: int = 5, since: int = 0
) -> CounterSnapshot:
    """Read ``counters`` in ``dir_fd`` consistently (checked as :func:`open_checked`); ``since``:
    decode only the step entries after that ``written`` count (see :func:`wire.decode_counters`).

    Raises:
        Unsafe / OSError: as :func:`open_checked`. wire.WireError: not a counters file of
            ``expect``, or still being written after ``retries`` reads.
    """
    with open_checked(dir_fd, COUNTERS_FILE, owners, COUNTERS_SIZE, exact=COUNTERS_SIZE) as fd:
        for _ in range(retries):
            data = os.pread(fd, COUNTERS_SIZE, 0)
            again = os.pread(fd, HEADER.size, 0)
            try:
                return wire.decode_counters(data, again, expect, since)
            except wire.Busy:
                continue
    raise wire.Busy("counters: still being written")


# -- removal ----------------------------------------------------------------------------------
def _is_ours(name: str) -> bool:
    return name in wire.KNOWN_FILES or name.startswith(wire.TEMP_PREFIX)


def remove_hook_dir(base_fd: int, name: str) -> bool:
    """Remove hook directory ``name`` of this user: unlink the files the hook and torchwatch
    make (by their names), then ``rmdir``; a directory holding anything else is left as is.

    Returns:
        Whether it is gone.
    """
    try:
        fd = open_dir(name, (os.geteuid(),), private=True, dir_fd=base_fd)
    except OSError:
        return False
    try:
        for entry in os.listdir(fd):
            if _is_ours(entry):
                with contextlib.suppress(OSError):
                    if not stat.S_ISDIR(os.lstat(entry, dir_fd=fd).st_mode):
                        os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=base_fd)
    except OSError:
        return False
    return True


def remove_stale(base_fd: int, me: Instance) -> list[str]:
    """Remove the hook directories of this user's processes that died without cleaning up (SIGKILL).

    Only entries named as a hook directory (``<pid>-<start>-<pidns>``) of this PID namespace
    and this user, whose process is provably gone (its PID absent, or now with another start
    time) are removed; nothing at all when ``/proc`` is another namespace's.

    Returns:
        The names removed.
    """
    if not wire.proc_is_own_namespace():
        return []
    removed = []
    try:
        names = os.listdir(base_fd)
    except OSError:
        return []
    for name in names:
        inst = Instance.from_dir_name(name)
        if inst is None or inst.pidns != me.pidns or inst == me or wire.alive_here(inst):
            continue
        if remove_hook_dir(base_fd, name):
            removed.append(name)
    return removed

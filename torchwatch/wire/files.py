"""Where the hook publishes, and how the channel's files are made, read and removed safely.

The hook (inside the training process) writes, torchwatch reads, often as root and always in a
directory the training's user controls. No network port is opened in the training process.
torchwatch reads ``TORCHWATCH_DIR`` and ``TMPDIR`` from the target's ``/proc/PID/environ``, so
``attach`` finds a hook the user installed themselves.

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
  and removes only hook directories it can prove are its own and dead (:func:`remove_stale`);
- a training in another mount namespace (a container) names paths in its own view: torchwatch
  reaches them through ``/proc/PID/root`` (:mod:`torchwatch.wire.roots`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from .base import WireError, clean_text
from .identity import Instance, alive_here, proc_is_own_namespace

__all__ = [
    "COUNTERS_FILE",
    "KNOWN_FILES",
    "REQUEST_FILE",
    "REQUEST_MAX_BYTES",
    "STATE_FILE",
    "STATE_MAX_BYTES",
    "TEMP_PREFIX",
    "Unsafe",
    "base_dir",
    "encode_json",
    "open_checked",
    "open_dir",
    "prepare_dir",
    "private_subdir",
    "read_capped",
    "read_json",
    "remove_hook_dir",
    "remove_stale",
    "write_atomic",
]


STATE_FILE = "hook.json"
COUNTERS_FILE = "counters"
REQUEST_FILE = "request.json"
KNOWN_FILES = (STATE_FILE, COUNTERS_FILE, REQUEST_FILE)
TEMP_PREFIX = ".tw-"  # temp files the hook or torchwatch create before a rename (see write_atomic)

STATE_MAX_BYTES = 1 << 20  # a real hook.json is 2-20 KB (a burst summary lists at most 10 ops and kernels)
REQUEST_MAX_BYTES = 4096  # a request is eight numbers and a short name

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


def _link_on_path(path: str | os.PathLike[str], dir_fd: int | None) -> str | None:
    """The first component of ``path`` (relative to ``dir_fd`` when given) that is a symbolic
    link, or ``None``: what a "Permission denied" came from when the kernel refuses to follow
    a link another user planted in a sticky directory (``fs.protected_symlinks``)."""
    parts = os.fsdecode(path).split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        if not prefix or prefix == parts[0] == "":
            continue
        try:
            if stat.S_ISLNK(os.lstat(prefix, dir_fd=dir_fd).st_mode):
                return prefix
        except OSError:
            return None
    return None


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
        Unsafe: a symbolic link (also one on the way that the kernel refused to follow:
            ``fs.protected_symlinks``), not a directory, another owner, writable by others.
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
        if exc.errno in (errno.EACCES, errno.EPERM):
            planted = _link_on_path(path, dir_fd)
            if planted is not None:  # fs.protected_symlinks refused to follow another user's link
                raise Unsafe(f"{planted} is a symbolic link (planted?): {shown} was not opened through it") from None
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
        Unsafe / OSError: as :func:`open_checked`. WireError: not UTF-8 JSON, or nested
            deeper than the parser allows.
    """
    with open_checked(dir_fd, name, owners, cap) as fd:
        raw = read_capped(fd, cap)
    try:
        return json.loads(raw)
    except RecursionError:
        raise WireError(f"{name}: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise WireError(f"{name}: not JSON ({clean_text(str(exc), 80)})") from None


def write_atomic(dir_fd: int, name: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``name`` in ``dir_fd``: a fresh temp file (``O_EXCL | O_NOFOLLOW``),
    its mode set on the descriptor, then renamed over ``name`` (never truncated in place).

    Raises:
        OSError: the directory is not writable.
    """
    tmp = f"{TEMP_PREFIX}{name}.{secrets.token_hex(6)}"
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


def _is_ours(name: str) -> bool:
    return name in KNOWN_FILES or name.startswith(TEMP_PREFIX)


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
    if not proc_is_own_namespace():
        return []
    removed = []
    try:
        names = os.listdir(base_fd)
    except OSError:
        return []
    for name in names:
        inst = Instance.from_dir_name(name)
        if inst is None or inst.pidns != me.pidns or inst == me or alive_here(inst):
            continue
        if remove_hook_dir(base_fd, name):
            removed.append(name)
    return removed

"""The files torchwatch writes (its log, ``--trace``, the JSON report, the hang record), opened so
that no other user can point them elsewhere.

torchwatch runs as root on other users' trainings. A path given to it may pass through a
directory a watched user can write: there the user can plant a symbolic link (root would
append to whatever it names), pre-create the file, or swap a directory for a link between
two calls. So, as the hook channel does (:mod:`torchwatch.wire.files`):

- the directory is reached by a walk from ``/`` that opens each component without following
  a link (``O_DIRECTORY | O_NOFOLLOW``) and checks it on its descriptor: owned by root or by
  the caller, and not writable by others (nor by a group other than the caller's own) unless
  its sticky bit is set (``/tmp``: others cannot rename or remove what is not theirs). A
  symbolic link on the way is followed only when it sits in such a directory and belongs to
  root or the caller (``/var/run`` -> ``/run``); any other is refused;
- the file itself is never reached through a link (``O_NOFOLLOW``); an existing file is
  appended to only when it is a regular file of the caller with a single name (a hard link to
  another file is refused); a FIFO or device is never written (``O_NONBLOCK``, then checked);
- a whole file (a report) is written to a new file beside it (``O_CREAT | O_EXCL``), flushed,
  then renamed over the name (rename(2) replaces a link, never follows it).

Anything refused raises :class:`UnsafePath` (an ``OSError`` whose ``strerror`` is one line).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

__all__ = ["MAX_LINKS", "UNSAFE_HINT", "UnsafePath", "check_dir", "open_append", "open_dir", "write_atomic"]

MAX_LINKS = 40  # symbolic links followed in one path at most: Linux's own limit (path_resolution(7), ELOOP)
# the hint of a refusal (format with option=the option that named the path)
UNSAFE_HINT = "give {option} a path whose directories only root or you can write (no other user's, no shared one)"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OSError):
    """A path torchwatch will not write through: its ``strerror`` says why, in one line."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EPERM, message)


def _who(uid: int) -> str:
    return "root" if uid == 0 else f"uid {uid}"


def check_dir(st: os.stat_result, shown: str) -> None:
    """Refuse a directory another user could change: owned by someone other than root or the
    caller, or writable by others (or by a group not the caller's own) without the sticky bit.

    Raises:
        UnsafePath: the directory is not safe to write in (one line: who could change it).
    """
    me = os.geteuid()
    if st.st_uid not in (0, me):
        raise UnsafePath(f"{shown} belongs to {_who(st.st_uid)}, who could redirect what is written there")
    if st.st_mode & stat.S_ISVTX:
        return
    if st.st_mode & stat.S_IWOTH:
        raise UnsafePath(f"{shown} is writable by every user (mode {stat.S_IMODE(st.st_mode):o}, no sticky bit)")
    if st.st_mode & stat.S_IWGRP and st.st_gid != os.getegid():
        raise UnsafePath(f"{shown} is writable by group {st.st_gid} (mode {stat.S_IMODE(st.st_mode):o})")


def open_dir(path: str | os.PathLike[str]) -> int:
    """Open directory ``path`` to create files in, after the walk of the module docstring.

    A relative path is taken from the current directory (as the shell gave it).

    Returns:
        A descriptor of the directory (close it).

    Raises:
        UnsafePath: a directory on the way (or a link) another user could change.
        OSError: a component is missing (``FileNotFoundError``), not a directory, unreadable.
    """
    parts = [p for p in os.path.abspath(os.fspath(path)).split("/") if p and p != "."]
    fd = os.open("/", _DIR_FLAGS)
    shown = "/"
    links = 0
    try:
        check_dir(os.fstat(fd), shown)
        while parts:
            name = parts.pop(0)
            st: os.stat_result | None
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                st = None  # missing or unreadable: the open below says which
            if st is not None and stat.S_ISLNK(st.st_mode):
                # the directory holding the link passed the check: only root or the caller can change it
                if st.st_uid not in (0, os.geteuid()):
                    raise UnsafePath(f"{os.path.join(shown, name)} is a symbolic link of {_who(st.st_uid)}")
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, f"more than {MAX_LINKS} symbolic links in {path}")
                target = os.readlink(name, dir_fd=fd)
                parts[:0] = [p for p in target.split("/") if p and p != "."]
                if target.startswith("/"):
                    top = os.open("/", _DIR_FLAGS)
                    os.close(fd)
                    fd, shown = top, "/"
                continue
            nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
            shown = os.path.normpath(os.path.join(shown, name))
            check_dir(os.fstat(fd), shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _split(path: str | os.PathLike[str]) -> tuple[Path, str]:
    p = Path(os.path.abspath(os.fspath(path)))
    if p.name in ("", ".", ".."):
        raise IsADirectoryError(errno.EISDIR, f"{path} is a directory")
    return p.parent, p.name


def open_append(path: str | os.PathLike[str], mode: int = 0o600) -> int:
    """Open file ``path`` for appending, creating it (``mode``, 0600 by default: what torchwatch
    logs names other users' processes and their stacks) when missing; see the module docstring.

    Returns:
        A descriptor open for writing in append mode (close it).

    Raises:
        UnsafePath: a directory on the way another user could change, the file is a symbolic
            link, not a regular file, another user's, or has several names (hard links).
        OSError: the directory is missing or not writable.
    """
    folder, name = _split(path)
    dfd = open_dir(folder)
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, mode, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePath(f"{path} is a symbolic link") from None
            if exc.errno == errno.ENXIO:  # a FIFO nobody reads
                raise UnsafePath(f"{path} is not a regular file") from None
            raise
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise UnsafePath(f"{path} belongs to {_who(st.st_uid)}, not to {_who(os.geteuid())}")
        if st.st_nlink != 1:
            raise UnsafePath(f"{path} has {st.st_nlink} names (hard links)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomic(path: str | os.PathLike[str], text: str, mode: int | None = None) -> None:
    """Write ``text`` (UTF-8) to ``path`` so that a reader sees the old file or the whole new one.

    The text goes to a new file in the checked directory (``O_CREAT | O_EXCL | O_NOFOLLOW``), is
    flushed to disk, then renamed over the name (rename(2) replaces a symbolic link, never
    follows it; in a sticky directory it cannot replace another user's file).

    Args:
        mode: the file's mode, set on its descriptor (``None``: 0666 less the umask, as ``open`` gives).

    Raises:
        UnsafePath: a directory on the way another user could change.
        OSError: the directory is missing or not writable, the disk is full, ... (the temporary
            file is removed).
    """
    folder, name = _split(path)
    dfd = open_dir(folder)
    try:
        tmp = f".{name}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dfd)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                if mode is not None:
                    os.fchmod(f.fileno(), mode)
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)

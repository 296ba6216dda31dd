"""Paths of a training in another mount namespace (a container, a chroot), reached from outside.

The training names its hook directory in its own view of the filesystem. torchwatch reaches it
through ``/proc/PID/root`` (:func:`root_of`), one component at a time with ``O_NOFOLLOW`` from a
descriptor of that root, a symbolic link on the way resolved inside it (:func:`open_dir_in`, as
``openat2``'s ``RESOLVE_IN_ROOT``, which Python does not expose): a link the container's user
planted cannot lead out to the host's files, whose absolute targets a plain
``/proc/PID/root/...`` path would resolve against torchwatch's own root.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection

from .files import _DIR_FLAGS, Unsafe, open_dir

__all__ = ["MAX_LINKS", "open_dir_in", "root_of", "sees_same", "stat_in", "walk_in"]

MAX_LINKS = 40  # symbolic links followed in one path, as the kernel's own limit (path_resolution(7))


def root_of(pid: int) -> str | None:
    """``/proc/PID/root`` when process ``pid`` sees another filesystem than this process (another
    mount namespace, or another root directory: a container, a chroot), else ``None`` (its paths
    are ours). Unreadable (gone, not allowed): ``None`` too, and reading its files fails later
    with the reason."""
    try:
        if os.stat(f"/proc/{pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino:
            return f"/proc/{pid}/root"
        theirs, ours = os.stat(f"/proc/{pid}/root"), os.stat("/")
    except OSError:
        return None
    return None if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino) else f"/proc/{pid}/root"


def walk_in(root_fd: int, parts: list[str], shown: str) -> int:
    """A descriptor of the directory ``parts`` (path components) lead to from ``root_fd``, each
    component opened ``O_NOFOLLOW``; a symbolic link is read and its target walked instead, an
    absolute one from ``root_fd`` again; ``..`` goes back one component and never above
    ``root_fd``. ``shown``: the path, for messages.

    Raises:
        Unsafe: a component that is neither a directory nor a link; too many links.
        OSError: a missing or unreadable component (passed through).
    """
    stack = [os.dup(root_fd)]
    todo = list(parts)
    links = 0
    try:
        while todo:
            name = todo.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            try:
                stack.append(os.open(name, _DIR_FLAGS, dir_fd=stack[-1]))
                continue
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                if not stat.S_ISLNK(os.lstat(name, dir_fd=stack[-1]).st_mode):
                    raise Unsafe(f"{shown}: {name} is not a directory") from None
            links += 1
            if links > MAX_LINKS:
                raise Unsafe(f"{shown}: more than {MAX_LINKS} symbolic links")
            target = os.readlink(name, dir_fd=stack[-1])
            if target.startswith("/"):
                while len(stack) > 1:
                    os.close(stack.pop())
            todo[:0] = target.split("/")
        return stack.pop()
    finally:
        for fd in stack:
            os.close(fd)


def open_dir_in(root: str | None, path: str | os.PathLike[str], owners: Collection[int], private: bool) -> int:
    """Open directory ``path`` as a process whose root is ``root`` (``/proc/PID/root``) sees it,
    and check it as :func:`open_dir` does.

    Every component on the way is opened relative to the one before with ``O_NOFOLLOW``; a
    symbolic link on the way is resolved inside ``root`` (an absolute one from ``root``, ``..``
    never above it), as ``openat2``'s ``RESOLVE_IN_ROOT``; the last component must not be a link.

    Args:
        root: the process's root directory; ``None``: ours (plain :func:`open_dir`).
        path: an absolute path as the process names it.

    Returns:
        The descriptor (close it).

    Raises:
        Unsafe: as :func:`open_dir`; a relative path; a component that is neither a directory
            nor a link; more than :data:`MAX_LINKS` links.
        OSError: missing or unreadable (passed through).
    """
    if root is None:
        return open_dir(path, owners, private)
    shown = os.fsdecode(path)
    if not shown.startswith("/"):
        raise Unsafe(f"{shown} is relative: in another mount namespace only an absolute path is followed")
    parts = shown.split("/")
    while len(parts) > 1 and parts[-1] in ("", "."):
        parts.pop()
    last = parts.pop()
    if last in ("", ".", ".."):
        raise Unsafe(f"{shown} does not name a directory")
    base = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)  # /proc/PID/root is a link by design
    try:
        parent = walk_in(base, parts, shown)
    finally:
        os.close(base)
    try:
        return open_dir(last, owners, private, dir_fd=parent)
    finally:
        os.close(parent)


def stat_in(root: str | None, path: str) -> os.stat_result:
    """``os.stat`` of directory ``path`` as the process whose root is ``root`` sees it (links
    resolved inside that root, as :func:`walk_in`); ``root`` ``None``: plain ``os.stat``.

    Raises:
        Unsafe: a component that is neither a directory nor a link. OSError: missing or unreadable.
    """
    if root is None:
        return os.stat(path)
    base = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        fd = walk_in(base, path.split("/"), path)
    finally:
        os.close(base)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def sees_same(pid: int, path: str) -> bool | None:
    """Whether process ``pid`` sees at directory ``path`` the very directory this process sees
    there (same device and inode): ``True`` at once when it shares our root
    (:func:`root_of`); ``None`` when it cannot be told (missing on our side, unreadable)."""
    root = root_of(pid)
    if root is None:
        return True
    try:
        ours = os.stat(path)
    except OSError:
        return None
    try:
        theirs = stat_in(root, path)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)

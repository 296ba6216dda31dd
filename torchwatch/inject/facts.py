"""What ``/proc`` says about torchwatch itself (:class:`Host`) and a target process (:class:`Target`).

Standard library only. Every reader takes the ``/proc`` root as an argument so the checks can
be tested on a fake tree, and never raises for a file it cannot read: the field is ``None``
(unknown), which the checks report as such. Reading ``exe``, ``maps`` and ``environ`` of
another user's process needs ptrace-read permission, so those fields are ``None`` exactly when
injection would be refused for lack of permission anyway.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
CAP_SYS_PTRACE = 19  # bit in CapEff, capabilities(7)

# Environment variables of the target that the checks read; nothing else is kept.
ENV_KEYS = ("PYTHON_DISABLE_REMOTE_DEBUG", "TORCHWATCH_HOOK", "TORCHWATCH_DIR", "TMPDIR")
_MAX_PROC_FILE = 1 << 20  # environ and cmdline are capped by the kernel at a few MiB; 1 MiB is plenty

_EXE_RE = re.compile(r"python(\d)\.(\d+)(t?)$")
_MAPS_RES = (
    re.compile(r"libpython(\d)\.(\d+)(t?)\.so"),
    re.compile(r"\.cpython-(\d)(\d+)(t?)-"),  # extension modules: _json.cpython-311-x86_64-linux-gnu.so
    re.compile(r"/python(\d)\.(\d+)(t?)/lib-dynload/"),
)


@dataclass(frozen=True)
class PythonVersion:
    """A target's interpreter, as far as its executable name and mapped files tell.

    Attributes:
        major, minor: e.g. ``3``, ``12``.
        free_threaded: a ``3.13t``-style build without the GIL.
        evidence: where it was read, e.g. ``"exe python3.12"``, ``"maps libpython3.12.so"``.
    """

    major: int
    minor: int
    free_threaded: bool
    evidence: str

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{'t' if self.free_threaded else ''}"


@dataclass(frozen=True)
class Host:
    """torchwatch's own process: who it is and where it stands.

    Attributes:
        pid: its PID.
        uids, gids: real, effective, saved.
        cap_eff: effective capability mask (``/proc/self/status`` ``CapEff``).
        ptrace_scope: ``/proc/sys/kernel/yama/ptrace_scope`` (0-3), ``None`` without Yama.
        namespaces: ``{"pid"|"mnt"|"user": link text}``, e.g. ``"pid:[4026531836]"``.
        python: ``(major, minor)`` of the interpreter torchwatch runs on.
        free_threaded: torchwatch's interpreter has no GIL.
        remote_debug_enabled: torchwatch's own interpreter allows ``sys.remote_exec`` (3.14+).
        package_root: the directory holding the ``torchwatch`` package (what the target imports from).
    """

    pid: int
    uids: tuple[int, int, int]
    gids: tuple[int, int, int]
    cap_eff: int
    ptrace_scope: int | None
    namespaces: Mapping[str, str]
    python: tuple[int, int]
    free_threaded: bool
    remote_debug_enabled: bool
    package_root: str

    @property
    def has_cap_ptrace(self) -> bool:
        """CAP_SYS_PTRACE is in the effective set."""
        return bool(self.cap_eff >> CAP_SYS_PTRACE & 1)


@dataclass(frozen=True)
class Target:
    """A process torchwatch may inject into.

    Attributes:
        pid: its PID as torchwatch sees it.
        name: ``comm``.
        state: ``State`` letter of ``/proc/PID/status``: R, S, D, T (stopped), t (traced), Z, X.
        uids, gids: real, effective, saved; ``None`` if unreadable.
        groups: supplementary groups.
        tracer_pid: ``TracerPid`` (0: nobody ptraces it); tracer_name: its ``comm``.
        ns_pids: ``NSpid``: its PID in each PID namespace, outermost first.
        start_ticks: field 22 of ``/proc/PID/stat`` (clock ticks since boot): with the PID it
            names one process instance.
        proc_owner: owner of ``/proc/PID``: root for a non-dumpable process (setuid, or
            ``PR_SET_DUMPABLE`` 0), which only CAP_SYS_PTRACE may trace.
        exe: resolved ``/proc/PID/exe``; ``None`` if unreadable.
        python: the interpreter version; ``None`` when nothing says this is Python.
        environ: the :data:`ENV_KEYS` present in its environment; ``None`` if unreadable.
        cmdline: its argv; empty if unreadable.
        namespaces: as :attr:`Host.namespaces`; a missing key means unreadable.
    """

    pid: int
    name: str
    state: str
    uids: tuple[int, int, int] | None
    gids: tuple[int, int, int] | None
    groups: tuple[int, ...]
    tracer_pid: int
    tracer_name: str
    ns_pids: tuple[int, ...]
    start_ticks: int | None
    proc_owner: int | None
    exe: str | None
    python: PythonVersion | None
    environ: Mapping[str, str] | None
    cmdline: tuple[str, ...]
    namespaces: Mapping[str, str] = field(default_factory=dict)


class NoSuchTarget(Exception):
    """The PID does not exist (``/proc/PID/status`` is absent)."""


def _read_bytes(path: Path, limit: int = _MAX_PROC_FILE) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def _status(path: Path) -> dict[str, str]:
    raw = _read_bytes(path)
    if raw is None:
        return {}
    out: dict[str, str] = {}
    for line in raw.decode(errors="replace").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def _ints(text: str | None, n: int | None = None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(x) for x in text.split())
    except ValueError:
        return None
    if n is not None and len(values) < n:
        return None
    return values if n is None else values[:n]


def _triple(text: str | None) -> tuple[int, int, int] | None:
    v = _ints(text, 3)
    return None if v is None else (v[0], v[1], v[2])


def _namespaces(proc_pid: Path) -> dict[str, str]:
    out = {}
    for kind in ("pid", "mnt", "user"):
        with contextlib.suppress(OSError):
            out[kind] = os.readlink(proc_pid / "ns" / kind)
    return out


def ptrace_scope(proc: Path = PROC) -> int | None:
    """Yama's ``ptrace_scope`` (0 classic, 1 restricted to ancestors, 2 admin only, 3 none), ``None`` without Yama."""
    raw = _read_bytes(proc / "sys/kernel/yama/ptrace_scope", 64)
    try:
        return None if raw is None else int(raw.strip())
    except ValueError:
        return None


def read_host(proc: Path = PROC) -> Host:
    """Facts about the calling process. Never raises."""
    st = _status(proc / "self/status")
    try:
        cap = int(st.get("CapEff", "0"), 16)
    except ValueError:
        cap = 0
    uid, gid = os.getuid(), os.getgid()
    return Host(
        pid=os.getpid(),
        uids=_triple(st.get("Uid")) or (uid, os.geteuid(), os.geteuid()),
        gids=_triple(st.get("Gid")) or (gid, os.getegid(), os.getegid()),
        cap_eff=cap,
        ptrace_scope=ptrace_scope(proc),
        namespaces=_namespaces(proc / "self"),
        python=(sys.version_info[0], sys.version_info[1]),
        free_threaded=bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
        remote_debug_enabled=_host_remote_debug(),
        package_root=str(Path(__file__).resolve().parents[2]),
    )


def _host_remote_debug() -> bool:
    check = getattr(sys, "is_remote_debug_enabled", None)
    if check is None:
        return False  # before 3.14 there is no sys.remote_exec
    return bool(check())


def python_version(exe: str | None, maps: Iterable[str], argv0: str = "", comm: str = "") -> PythonVersion | None:
    """The interpreter version of a process, from its executable's name or the files it maps.

    Args:
        exe: resolved ``/proc/PID/exe`` (``/usr/bin/python3.12``), or ``None``.
        maps: the lines (or just the path names) of ``/proc/PID/maps``.
        argv0, comm: ``argv[0]`` and ``comm``, used only when the above say nothing.

    Returns:
        The version and where it was read, or ``None`` when nothing says this is Python.
    """
    if exe:
        m = _EXE_RE.search(os.path.basename(exe))
        if m:
            return PythonVersion(int(m[1]), int(m[2]), bool(m[3]), f"exe {os.path.basename(exe)}")
    for line in maps:
        for rx in _MAPS_RES:
            m = rx.search(line)
            if m:
                name = line.rsplit("/", 1)[-1].strip()
                return PythonVersion(int(m[1]), int(m[2]), bool(m[3]), f"maps {name}")
    for label, text in (("argv[0]", argv0), ("comm", comm)):
        m = _EXE_RE.search(os.path.basename(text))
        if m:
            return PythonVersion(int(m[1]), int(m[2]), bool(m[3]), f"{label} {os.path.basename(text)}")
    return None


def _environ(raw: bytes | None) -> dict[str, str] | None:
    if raw is None:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        name = key.decode(errors="replace")
        if sep and name in ENV_KEYS:
            env[name] = value.decode(errors="replace")
    return env


def read_target(pid: int, proc: Path = PROC) -> Target:
    """Facts about process ``pid``.

    Raises:
        NoSuchTarget: no such process (or ``/proc`` is not mounted).
    """
    base = proc / str(pid)
    st = _status(base / "status")
    if not st:
        raise NoSuchTarget(pid)
    stat = _read_bytes(base / "stat", 4096) or b""
    after = stat.rpartition(b")")[2].split()  # comm may contain spaces and parentheses
    start = int(after[19]) if len(after) > 19 and after[19].isdigit() else None
    try:
        exe: str | None = os.readlink(base / "exe")
    except OSError:
        exe = None
    maps_raw = _read_bytes(base / "maps", 8 << 20)
    maps = maps_raw.decode(errors="replace").splitlines() if maps_raw else []
    argv = tuple(a.decode(errors="replace") for a in (_read_bytes(base / "cmdline") or b"").split(b"\0") if a)
    try:
        owner: int | None = os.stat(base).st_uid
    except OSError:
        owner = None
    name = st.get("Name", "")
    tracer = int(st["TracerPid"]) if st.get("TracerPid", "").isdigit() else 0
    tracer_name = (
        (_read_bytes(proc / str(tracer) / "comm", 64) or b"").decode(errors="replace").strip() if tracer else ""
    )
    return Target(
        pid=pid,
        name=name,
        state=(st.get("State", "?") + " ")[0],
        uids=_triple(st.get("Uid")),
        gids=_triple(st.get("Gid")),
        groups=_ints(st.get("Groups", "")) or (),
        tracer_pid=tracer,
        tracer_name=tracer_name,
        ns_pids=_ints(st.get("NSpid", "")) or (pid,),
        start_ticks=start,
        proc_owner=owner,
        exe=exe,
        python=python_version(exe, maps, argv[0] if argv else "", name),
        environ=_environ(_read_bytes(base / "environ")),
        cmdline=argv,
        namespaces=_namespaces(base),
    )


def same_instance(pid: int, start_ticks: int | None, proc: Path = PROC) -> bool:
    """Whether ``pid`` is still the process that started at ``start_ticks`` (not a reused PID)."""
    stat = _read_bytes(proc / str(pid) / "stat", 4096)
    if stat is None or start_ticks is None:
        return False
    after = stat.rpartition(b")")[2].split()
    return len(after) > 19 and after[19] == str(start_ticks).encode()


TEMP_CANDIDATES = ("/tmp", "/dev/shm")  # where the injection's files may go, after this process's own TMPDIR


@dataclass(frozen=True)
class View:
    """What a target in another mount namespace (a container) sees of torchwatch's files.

    Attributes:
        root: ``/proc/PID/root`` when it sees another filesystem (:func:`torchwatch.wire.root_of`),
            else ``None`` (and every other field is moot: its paths are ours).
        package: it sees torchwatch's package directory (:attr:`Host.package_root`) as the very
            directory torchwatch runs from (same device and inode); ``None``: cannot be told.
        shared_tmp: a temporary directory it sees as the same one torchwatch sees at that path
            (the injection's files go there as for any process), or ``None``.
        own_tmp: else, a temporary directory in its own view (``/tmp``) that torchwatch can open
            through ``root`` (owned by root or the target's user, sticky or private): the
            injection's files are placed there, or ``None``.
        why: when neither, why not (one line).
    """

    root: str | None
    package: bool | None = True
    shared_tmp: str | None = None
    own_tmp: str | None = None
    why: str = ""


def read_view(pid: int, package_root: str, uid: int | None, tmpdir: str | None = None) -> View:
    """The :class:`View` of process ``pid`` (user ``uid``) from this process. Never raises.

    Args:
        package_root: the directory holding torchwatch's package (:attr:`Host.package_root`).
        tmpdir: this process's temporary directory tried first (default ``tempfile.gettempdir()``).
    """
    import tempfile

    from torchwatch import wire

    root = wire.root_of(pid)
    if root is None:
        return View(None)
    package = wire.sees_same(pid, package_root)
    first = tmpdir or tempfile.gettempdir()
    for candidate in dict.fromkeys((first, *TEMP_CANDIDATES)):
        if os.path.isdir(candidate) and wire.sees_same(pid, candidate):
            return View(root, package, shared_tmp=candidate)
    owners = (0,) if uid is None else (0, uid)
    reasons = []
    for candidate in TEMP_CANDIDATES:
        try:
            fd = wire.open_dir_in(root, candidate, owners, private=False)
        except OSError as exc:
            reasons.append(f"{candidate}: {exc.strerror or exc}")
            continue
        os.close(fd)
        return View(root, package, own_tmp=candidate)
    return View(root, package, why="no temporary directory of its own is usable (" + "; ".join(reasons) + ")")

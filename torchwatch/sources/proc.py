"""The watched process tree, from psutil and ``/proc``: processes, thread states, system load.

Three pieces share one :class:`ProcessTree`:

- :class:`ProcessTree` finds the training process(es) under the root PID and gives each
  process a :class:`Role` (main, DataLoader worker, launcher, helper).
- :class:`ProcSource` (1 Hz): CPU %, RSS and storage bytes/s of every process; system CPU,
  IO and memory pressure (PSI), swap-ins, and the reads of the busiest block device
  (:class:`DiskRates`: request size, requests in flight, busy time, as iostat derives them).
  ``cpu_times().iowait`` is 0 without kernel delay accounting, so IO waits come from thread
  states and PSI instead.
- :class:`ThreadStateSource` (10 Hz): for every thread of the main and worker processes, its
  state letter and, for a blocked thread, the syscall it waits in (``/proc/PID/task/TID/syscall``),
  so a wait is told apart: disk (state D), timer sleep, waiting on another thread or process,
  socket or file read.
"""

from __future__ import annotations

import math
import os
import platform
import pwd
import threading
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from torchwatch import wire
from torchwatch.model.readings import (
    CpuConsumer,
    ProcessSample,
    Role,
    SourceStatus,
    SystemSample,
    ThreadSample,
    Wait,
)
from torchwatch.sources import Pace, SourceOptions, SourceSpec, container, set_interval
from torchwatch.wire import (
    LAUNCHER_MODULES,
    LAUNCHER_SCRIPTS,
    MP_HELPER_MARKERS,
    SPAWN_MARKERS,
    cpu_quota,
    read_throttling,
    usable_cpus,
)

# Launchers start ranks; they are watched for exit but never diagnosed as the training.
_LAUNCHER_MARKERS = LAUNCHER_SCRIPTS + LAUNCHER_MODULES
_HELPER_MARKERS = MP_HELPER_MARKERS
_SPAWN_MARKERS = SPAWN_MARKERS


def catches(pid: int, signum: int) -> bool:
    """Whether ``pid`` has a handler for ``signum`` (``/proc/PID/status`` ``SigCgt``, bit signum-1).

    A signal such as SIGUSR2 kills a process that does not catch it (kineto#406), so this is
    checked before any signal torchwatch sends to ask something of a process.
    """
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


@dataclass(frozen=True)
class TreeNode:
    """One process of the tree as last seen: ``pid``, parent, role, name and command line;
    ``trainer``: a child of a training process that runs training steps itself (its stacks said
    so, :mod:`torchwatch.analysis.roles`); its role is then ``main``."""

    pid: int
    ppid: int
    role: Role
    name: str
    cmdline: tuple[str, ...]
    create_time: float
    trainer: bool = False


def _is_python(name: str, cmdline: Sequence[str], exe: str) -> bool:
    names = [name, os.path.basename(exe)]
    if cmdline:
        names.append(os.path.basename(cmdline[0]))
    return any(n.startswith(("python", "pypy")) for n in names if n)


def assign_roles(
    nodes: dict[int, tuple[int, str, tuple[str, ...], str]],
    root: int,
    spawned: Mapping[int, frozenset[int]] | None = None,
    trainers: Collection[int] = (),
) -> dict[int, Role]:
    """Give each process of a tree its role.

    Args:
        nodes: ``{pid: (ppid, name, cmdline, exe)}`` for the root and all its descendants.
        root: the PID the user named (``attach``) or started (``run``).
        spawned: ``{main PID: PIDs of the ranks it started with torch.multiprocessing.spawn}``,
            as its hook published them: those children are ranks (``main``), not workers,
            though they start as a spawned DataLoader worker does.
        trainers: children whose stacks showed training steps and no DataLoader worker loop
            (:mod:`torchwatch.analysis.roles`, read by :class:`torchwatch.watch.roles.RoleProbe`):
            ``main``, wherever the command line alone would make them a worker.

    Returns:
        ``{pid: Role}``. The topmost Python process that is not a launcher is ``main``
        (under torchrun every rank is ``main``); a Python child of a main with the same
        command line (fork), multiprocessing's spawn command line, or a child of the
        forkserver is a ``worker``. Any other Python process below a main is ``main`` too
        (a wrapper script may start the real training with ``subprocess``): the session
        diagnoses the busiest main.
    """
    roles: dict[int, Role] = {}

    def visit(pid: int, main_above: int | None) -> None:
        ppid, name, cmdline, exe = nodes[pid]
        joined = " ".join(cmdline)
        parent_forkserver = roles.get(ppid) is Role.HELPER and "forkserver" in " ".join(nodes[ppid][2])
        role = Role.OTHER
        if not _is_python(name, cmdline, exe):
            role = Role.LAUNCHER if main_above is None else Role.OTHER
        elif pid in trainers and main_above is not None:
            role = Role.MAIN
        elif parent_forkserver and main_above is not None:
            role = Role.WORKER
        elif any(m in joined for m in _HELPER_MARKERS):
            role = Role.HELPER
        elif main_above is None:
            role = Role.LAUNCHER if any(m in joined for m in _LAUNCHER_MARKERS) else Role.MAIN
        elif pid in (spawned or {}).get(ppid, ()):
            role = Role.MAIN
        elif any(m in joined for m in _SPAWN_MARKERS) or cmdline == nodes[main_above][2]:
            role = Role.WORKER
        else:
            role = Role.MAIN
        roles[pid] = role
        below = pid if role is Role.MAIN else main_above
        for child, (cppid, *_rest) in nodes.items():
            if cppid == pid and child != pid and child not in roles:
                visit(child, below)

    if root in nodes:
        visit(root, None)
    return roles


class ProcessTree:
    """The root PID and its descendants with roles; refreshed by :class:`ProcSource`.

    Thread-safe: samplers read snapshots while ProcSource refreshes.

    torchwatch itself and what it starts (py-spy) are never part of the tree: when the root is an
    ancestor of torchwatch (``attach`` to the shell it runs in, or to a training that started
    torchwatch on itself), torchwatch's own branch is left out.

    Raises:
        psutil.NoSuchProcess: from the constructor when ``root`` does not exist.
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self._root_proc = psutil.Process(root)
        self._holds_me = root in ancestors()
        self._lock = threading.Lock()
        self._nodes: dict[int, TreeNode] = {}
        self._procs: dict[int, psutil.Process] = {root: self._root_proc}
        self._spawned: dict[int, frozenset[int]] = {}
        self._decided: dict[int, tuple[float, str]] = {}  # pid -> (create time, role its stacks showed)
        self.refresh()

    def mark_spawned_ranks(self, parent: int, pids: Iterable[int]) -> None:
        """Take ``pids`` as the ranks ``parent`` started with ``torch.multiprocessing.spawn`` (from
        its hook), from the next :meth:`refresh` on. Only ``parent``'s own children in the tree
        become ranks. The hook names PIDs in its own PID namespace: in a container's, each is
        translated to torchwatch's through the children's ``NSpid``
        (:func:`~torchwatch.sources.container.host_pids`); one that is not a child now is dropped."""
        wanted = frozenset(pids)
        same_ns = container.same_namespace(parent)
        if same_ns is None:
            return
        if not same_ns:
            wanted = frozenset(container.host_pids(parent, wanted).values())
        with self._lock:
            self._spawned[parent] = wanted

    def decide(self, pid: int, create_time: float, role: str) -> None:
        """Take ``role`` (:data:`torchwatch.analysis.roles.TRAINER` or ``WORKER``) as what the
        process ``pid`` created at ``create_time`` does, from the next :meth:`refresh` on (a PID
        reused by another process is not that process: the create time must match)."""
        with self._lock:
            self._decided[pid] = (create_time, role)

    def undecided(self) -> list[TreeNode]:
        """The tree's workers (by command line) whose stacks have not yet said what they do."""
        with self._lock:
            return [
                n
                for n in self._nodes.values()
                if n.role is Role.WORKER and self._decided.get(n.pid, (None, ""))[0] != n.create_time
            ]

    def refresh(self) -> None:
        """Walk the tree again (new workers appear, finished ones vanish)."""
        try:
            children = self._root_proc.children(recursive=True)
        except psutil.Error:
            children = []
        raw: dict[int, tuple[int, str, tuple[str, ...], str]] = {}
        procs: dict[int, psutil.Process] = {}
        created: dict[int, float] = {}
        for proc in [self._root_proc, *children]:
            known = self._procs.get(proc.pid)
            if known is not None and known.is_running():
                proc = known
            try:
                with proc.oneshot():
                    ppid, name, cmdline, exe = proc.ppid(), proc.name(), tuple(proc.cmdline()), _exe(proc)
                    created[proc.pid] = proc.create_time()
            except psutil.Error:
                continue
            before = self._nodes.get(proc.pid)
            if not cmdline and before is not None and before.create_time == created[proc.pid]:
                # A process on its way out (the OOM kill of a large worker takes seconds) has released
                # its memory: its cmdline reads empty. It is still the process it was (same create
                # time): a dying worker must not become a main (its OOM record would name the wrong role).
                cmdline = before.cmdline
            raw[proc.pid] = (ppid, name, cmdline, exe)
            procs[proc.pid] = proc
        if self._holds_me:
            for pid in _branch(raw, os.getpid()):
                raw.pop(pid, None)
                procs.pop(pid, None)
        with self._lock:
            spawned = {p: ranks for p, ranks in self._spawned.items() if p in raw}
            decided = {p: d for p, d in self._decided.items() if p in created and created[p] == d[0]}
        trainers = {p for p, (_, role) in decided.items() if role == "trainer"}
        roles = assign_roles(raw, self.root, spawned, trainers)
        with self._lock:
            self._spawned = spawned
            self._decided = decided
            self._procs = procs
            self._nodes = {
                pid: TreeNode(
                    pid,
                    raw[pid][0],
                    roles.get(pid, Role.OTHER),
                    raw[pid][1],
                    raw[pid][2],
                    created[pid],
                    pid in trainers and roles.get(pid) is Role.MAIN,
                )
                for pid in raw
            }

    def nodes(self) -> dict[int, TreeNode]:
        """A snapshot ``{pid: TreeNode}`` of the tree."""
        with self._lock:
            return dict(self._nodes)

    def process(self, pid: int) -> psutil.Process | None:
        """The cached psutil handle of ``pid`` (keeps psutil's CPU-time baseline)."""
        with self._lock:
            return self._procs.get(pid)

    def pids(self) -> list[int]:
        """Every PID of the tree."""
        with self._lock:
            return list(self._nodes)

    def mains(self) -> list[int]:
        """PIDs of the training processes (ranks), oldest first."""
        with self._lock:
            mains = [n for n in self._nodes.values() if n.role is Role.MAIN]
        return [n.pid for n in sorted(mains, key=lambda n: (n.create_time, n.pid))]

    def root_alive(self) -> bool:
        """Whether the root process still runs (a zombie counts as exited)."""
        try:
            return self._root_proc.is_running() and self._root_proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False


def ancestors(pid: int | None = None) -> set[int]:
    """PIDs of the ancestors of ``pid`` (default: this process), up to PID 1 of its namespace."""
    try:
        return {p.pid for p in psutil.Process(pid).parents()}
    except psutil.Error:
        return set()


def _branch(nodes: dict[int, tuple[int, str, tuple[str, ...], str]], top: int) -> set[int]:
    """``top`` and every PID below it in ``nodes`` (``{pid: (ppid, ...)}``)."""
    below: dict[int, list[int]] = {}
    for pid, (ppid, *_rest) in nodes.items():
        below.setdefault(ppid, []).append(pid)
    found, todo = {top}, [top]
    while todo:
        for child in below.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _exe(proc: psutil.Process) -> str:
    try:
        return proc.exe()
    except psutil.Error:
        return ""


class _PsiRate:
    """``some`` stall share, %, of one ``/proc/pressure/*`` file between two reads.

    The ``total=`` field of the ``some`` line is cumulative stall time in microseconds (kernel
    Documentation/accounting/psi.rst); the share is its growth over the wall time between reads.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._prev: tuple[float, float] | None = None

    def sample(self, now: float) -> float | None:
        """The share since the previous call, %; ``None`` on the first call or without PSI."""
        try:
            total_us = float(self.path.read_text().split("total=")[1].split()[0])
        except (OSError, IndexError, ValueError):
            return None
        prev, self._prev = self._prev, (now, total_us)
        if prev is None or now <= prev[0]:
            return None
        return max(0.0, 100.0 * (total_us - prev[1]) / 1e6 / (now - prev[0]))


NEIGHBOUR_SCAN_S = 2.0
"""Seconds between two scans of every process's CPU (:class:`CpuNeighbours`): one ``stat`` read per
process, ~0.8 ms for 65 processes here, so ~25 ms for 2,000 (about 1 % of a core at this period)."""
MAX_SCANNED = 16384  # processes read per scan at most (a bound on a scan's cost)


TOP_NEIGHBOURS = 3  # the busiest processes outside the training a finding names


class CpuNeighbours:
    """Who else uses the CPUs: every process's CPU between two scans, split into the training's
    tree, torchwatch (itself and its children: py-spy) and the rest (the neighbours).

    One scan reads ``/proc/stat`` (the machine's busy time) and each ``/proc/PID/stat`` (utime +
    stime of the process, its parent, start time): a process's CPU is the growth of its ticks
    since the previous scan (all its ticks when it started after that scan). A process seen
    before and gone now is counted at its previous rate. What no visible process explains (the
    host's processes seen from a container's PID namespace, interrupts) counts as foreign: it is
    CPU the training did not get. Process names are the processes' own text: control characters
    are removed.

    Args:
        proc: the proc file system (tests point it elsewhere).
    """

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._prev: dict[int, tuple[int, int, float]] = {}  # pid -> (start, ticks, cores)
        self._prev_scan: tuple[float, int, float] | None = None  # (t, machine busy ticks, boot ticks)
        self._users: dict[int, str] = {}
        self.latest: tuple[float | None, float | None, tuple[CpuConsumer, ...]] = (None, None, ())
        self._last_t = -math.inf

    def sample(self, now: float, tree: Iterable[int]) -> tuple[float | None, float | None, tuple[CpuConsumer, ...]]:
        """``(foreign cores, own cores, top 3 neighbours)`` over the last scan; a new scan when
        :data:`NEIGHBOUR_SCAN_S` passed since the previous (``None`` before two scans).

        Args:
            now: monotonic s. tree: the training's PIDs (never foreign, never torchwatch's).
        """
        if now - self._last_t < NEIGHBOUR_SCAN_S - 0.25:
            return self.latest
        self._last_t = now
        try:
            busy = self._machine_busy()
            boot = time.clock_gettime(time.CLOCK_BOOTTIME) * _CLK_TCK
            entries = os.listdir(self.proc)
        except OSError:
            return self.latest
        procs: dict[int, tuple[int, int, int, str]] = {}  # pid -> (ppid, start, ticks, name)
        for entry in entries[:MAX_SCANNED] if len(entries) > MAX_SCANNED else entries:
            if entry.isdigit():
                read = self._read(int(entry))
                if read is not None:
                    procs[int(entry)] = read
        prev_scan, self._prev_scan = self._prev_scan, (now, busy, boot)
        prev = self._prev
        if prev_scan is None or now - prev_scan[0] <= 0:
            self._prev = {pid: (p[1], p[2], 0.0) for pid, p in procs.items()}
            return self.latest
        dt = now - prev_scan[0]
        cores: dict[int, float] = {}
        for pid, (_, start, ticks, _) in procs.items():
            before = prev.get(pid)
            if before is not None and before[0] == start:
                cores[pid] = max(0.0, (ticks - before[1]) / _CLK_TCK / dt)
            elif start >= prev_scan[2]:  # started since the previous scan: all of its CPU is new
                cores[pid] = ticks / _CLK_TCK / dt
        self._prev = {pid: (procs[pid][1], procs[pid][2], c) for pid, c in cores.items()}
        gone = {pid: c for pid, (_, _, c) in prev.items() if pid not in procs}
        tree_pids = set(tree)
        own = self._own(procs, tree_pids)
        foreign_pids = [pid for pid in cores if pid not in tree_pids and pid not in own]
        visible = sum(cores.values()) + sum(gone.values())
        machine = max(0.0, (busy - prev_scan[1]) / _CLK_TCK / dt)
        unseen = max(0.0, machine - visible)
        foreign = sum(cores[p] for p in foreign_pids) + sum(
            c for p, c in gone.items() if p not in tree_pids and p not in own
        )
        top = sorted(foreign_pids, key=lambda p: -cores[p])[:TOP_NEIGHBOURS]
        neighbours = tuple(
            CpuConsumer(p, procs[p][3], self._user(p), round(cores[p], 3)) for p in top if cores[p] >= 0.01
        )
        own_cores = sum(cores.get(p, 0.0) for p in own)
        self.latest = (foreign + unseen, own_cores, neighbours)
        return self.latest

    def _machine_busy(self) -> int:
        """Busy ticks of all CPUs since boot: ``/proc/stat``'s ``cpu`` line less idle and iowait
        (guest time is already inside user and nice)."""
        with open(self.proc / "stat", "rb") as f:
            fields = f.readline().split()[1:9]
        values = [int(v) for v in fields]
        return sum(values) - values[3] - values[4]

    def _read(self, pid: int) -> tuple[int, int, int, str] | None:
        try:
            with open(self.proc / str(pid) / "stat", "rb") as f:
                stat = f.read(1024)
        except OSError:
            return None
        close = stat.rfind(b")")
        fields = stat[close + 2 :].split()
        try:
            ppid, ticks, start = int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19])
        except (IndexError, ValueError):
            return None
        name = stat[stat.find(b"(") + 1 : close].decode("utf-8", "replace")
        return ppid, start, ticks, wire.clean_text(name, 16)

    @staticmethod
    def _own(procs: Mapping[int, tuple[int, int, int, str]], tree: set[int]) -> set[int]:
        """torchwatch and its descendants, less the training's tree (``run`` starts the training)."""
        children: dict[int, list[int]] = {}
        for pid, p in procs.items():
            children.setdefault(p[0], []).append(pid)
        own, todo = set(), [os.getpid()]
        while todo:
            pid = todo.pop()
            if pid in own or pid in tree:
                continue
            own.add(pid)
            todo.extend(children.get(pid, ()))
        return own

    def _user(self, pid: int) -> str:
        try:
            uid = os.stat(self.proc / str(pid)).st_uid
        except OSError:
            return "?"
        if uid not in self._users:
            try:
                self._users[uid] = wire.clean_text(pwd.getpwuid(uid).pw_name, 32)
            except KeyError:
                self._users[uid] = str(uid)
        return self._users[uid]


@dataclass(frozen=True)
class DiskRate:
    """Reads of one block device between two samples (see :class:`SystemSample`'s ``disk_*``)."""

    name: str | None = None
    read_bytes_per_s: float | None = None
    reads_per_s: float | None = None
    read_inflight: float | None = None
    busy: float | None = None


class DiskRates:
    """Per-device read counters (``psutil.disk_io_counters(perdisk=True)``, i.e. ``/proc/diskstats``),
    turned into the rates of the device that read the most bytes since the previous sample.

    Only whole devices count (a name present in ``/sys/block``, as iostat(1) decides), so a
    partition's reads are not counted twice. The counters are machine-wide: a device shared with
    other programs shows their reads too (the report then shows the tree's own read rate beside it).
    """

    def __init__(self) -> None:
        self._prev: tuple[float, dict[str, tuple[int, int, int, int]]] | None = None
        self._whole: dict[str, bool] = {}
        self.available = True

    def _is_whole(self, name: str) -> bool:
        known = self._whole.get(name)
        if known is None:
            known = self._whole[name] = os.access(f"/sys/block/{name.replace('/', '!')}", os.F_OK)
        return known

    def sample(self, now: float) -> DiskRate:
        """Rates since the previous call; an empty :class:`DiskRate` on the first call or when
        ``/proc/diskstats`` is unreadable (then :attr:`available` is False)."""
        if not self.available:
            return DiskRate()
        try:
            raw = psutil.disk_io_counters(perdisk=True, nowrap=True) or {}
        except (OSError, RuntimeError, NotImplementedError):
            self.available = False
            return DiskRate()
        counters = {
            name: (c.read_bytes, c.read_count, c.read_time, getattr(c, "busy_time", 0))
            for name, c in raw.items()
            if self._is_whole(name)
        }
        prev, self._prev = self._prev, (now, counters)
        if prev is None or now <= prev[0]:
            return DiskRate()
        dt = now - prev[0]
        best: tuple[int, str] | None = None
        for name, (rbytes, *_rest) in counters.items():
            before = prev[1].get(name)
            if before is not None and rbytes - before[0] > 0 and (best is None or rbytes - before[0] > best[0]):
                best = (rbytes - before[0], name)
        if best is None:
            return DiskRate(read_bytes_per_s=0.0)
        name = best[1]
        (rbytes, rcount, rtime_ms, busy_ms), before = counters[name], prev[1][name]
        return DiskRate(
            name=name,
            read_bytes_per_s=(rbytes - before[0]) / dt,
            reads_per_s=max(0, rcount - before[1]) / dt,
            read_inflight=max(0, rtime_ms - before[2]) / 1000.0 / dt,
            busy=min(1.0, max(0, busy_ms - before[3]) / 1000.0 / dt),
        )


class ProcSource:
    """CPU, memory and storage IO of each process of the tree, and system load (psutil, PSI).

    Args:
        tree: the tree to watch; ``sample`` refreshes it.
        interval: seconds between samples (1.0: psutil's CPU-time counters tick at 100 Hz,
            so shorter windows are noisy).
    """

    name = "psutil"

    def __init__(self, tree: ProcessTree, interval: float = 1.0) -> None:
        self.tree = tree
        self.interval = interval
        self.status = SourceStatus.ok()
        # pid -> (t, cpu seconds, read_bytes, write_bytes, create_time)
        self._prev: dict[int, tuple[float, float, int | None, int | None, float]] = {}
        self._io_psi = _PsiRate(Path("/proc/pressure/io"))
        self._mem_psi = _PsiRate(Path("/proc/pressure/memory"))
        self._disks = DiskRates()
        self._prev_swap: tuple[float, int] | None = None
        self._cpu_psi: _PsiRate | None = None
        self._prev_throttle: tuple[Path, float, int, int, float] | None = None
        self.neighbours = CpuNeighbours()
        self.cpu_pct: dict[int, float] = {}  # pid -> CPU % of one core in the latest sample
        psutil.cpu_percent(interval=None)  # baseline for the first system sample

    def sample(self, now: float) -> list[object]:
        """One sample of every process and of the system; sets status ``gone`` when the root exited."""
        self.tree.refresh()
        if not self.tree.root_alive():
            self.status = SourceStatus.gone()
            return []
        out: list[object] = []
        seen: set[int] = set()
        for pid, node in self.tree.nodes().items():
            proc = self.tree.process(pid)
            if proc is None:
                continue
            sample = self._sample_process(now, proc, node)
            if sample is not None:
                out.append(sample)
                seen.add(pid)
        self._prev = {pid: v for pid, v in self._prev.items() if pid in seen}
        self.cpu_pct = {s.pid: s.cpu_pct for s in out if isinstance(s, ProcessSample) and s.cpu_pct is not None}
        out.append(self._sample_system(now))
        return out

    def _sample_process(self, now: float, proc: psutil.Process, node: TreeNode) -> ProcessSample | None:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                cpu_s = times.user + times.system
                rss = proc.memory_info().rss
                nthreads = proc.num_threads()
                rbytes: int | None = None
                wbytes: int | None = None
                try:
                    io = proc.io_counters()
                    rbytes, wbytes = io.read_bytes, io.write_bytes
                except (psutil.AccessDenied, AttributeError):
                    pass
        except psutil.Error:
            return None
        cpu_pct = read_rate = write_rate = None
        prev = self._prev.get(node.pid)
        if prev is not None and prev[4] == node.create_time and now > prev[0]:
            dt = now - prev[0]
            cpu_pct = 100.0 * (cpu_s - prev[1]) / dt
            if rbytes is not None and prev[2] is not None:
                read_rate = (rbytes - prev[2]) / dt
            if wbytes is not None and prev[3] is not None:
                write_rate = (wbytes - prev[3]) / dt
        self._prev[node.pid] = (now, cpu_s, rbytes, wbytes, node.create_time)
        return ProcessSample(
            t=now,
            pid=node.pid,
            ppid=node.ppid,
            role=node.role,
            name=node.name,
            cmdline=node.cmdline,
            cpu_pct=cpu_pct,
            rss_bytes=rss,
            read_bytes_per_s=read_rate,
            write_bytes_per_s=write_rate,
            num_threads=nthreads,
            trainer=node.trainer,
        )

    def _cpu_pressure(self, pid: int, now: float) -> float | None:
        """PSI CPU ``some``, %: of ``pid``'s cgroup v2 group where it has ``cpu.pressure``, else
        of the machine (``/proc/pressure/cpu``)."""
        path = Path("/proc/pressure/cpu")
        try:
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
                if line.startswith("0::"):
                    group = Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "cpu.pressure"
                    if line[3:].strip("/") and group.is_file():
                        path = group
        except OSError:
            pass
        if self._cpu_psi is None or self._cpu_psi.path != path:
            self._cpu_psi = _PsiRate(path)
        return self._cpu_psi.sample(now)

    def _throttling(self, pid: int, now: float) -> tuple[float | None, float | None, float | None]:
        """``(quota CPUs, throttled periods share, throttled share of wall time)`` of the cgroup
        quota binding ``pid`` since the previous sample (see :class:`SystemSample`)."""
        quota = cpu_quota(pid)
        if quota is None:
            self._prev_throttle = None
            return None, None, None
        read = read_throttling(quota)
        if read is None:
            return quota.cpus, None, None
        prev, self._prev_throttle = self._prev_throttle, (quota.stat, now, *read)
        if prev is None or prev[0] != quota.stat or now <= prev[1]:
            return quota.cpus, None, None
        periods, throttled, seconds = read[0] - prev[2], read[1] - prev[3], read[2] - prev[4]
        if periods < 0 or throttled < 0 or seconds < 0:  # a new group behind the same path
            return quota.cpus, None, None
        share = None if periods == 0 else min(1.0, throttled / periods)
        # The kernel adds up the throttled time of the group's run queue on every CPU it ran on
        # (sched-bwc.rst; measured here: 2 threads under a 1-CPU quota on 2 CPUs read 0.93 s/s),
        # so the share of wall time is that sum over the CPUs the group may run on.
        try:
            cpus = max(1, len(os.sched_getaffinity(pid)))
        except OSError:
            cpus = os.cpu_count() or 1
        return quota.cpus, share, min(1.0, seconds / (now - prev[1]) / cpus)

    def _sample_system(self, now: float) -> SystemSample:
        mains = self.tree.mains()
        main = mains[0] if mains else self.tree.root
        disk = self._disks.sample(now)
        foreign, own, neighbours = self.neighbours.sample(now, self.tree.pids())
        quota, throttled_periods, throttled = self._throttling(main, now)
        swap_in: float | None = None
        available: int | None = None
        try:
            sin = psutil.swap_memory().sin
            if self._prev_swap is not None and now > self._prev_swap[0]:
                swap_in = max(0.0, (sin - self._prev_swap[1]) / (now - self._prev_swap[0]))
            self._prev_swap = (now, sin)
            available = psutil.virtual_memory().available
        except (OSError, RuntimeError, AttributeError):
            pass
        return SystemSample(
            t=now,
            cpu_pct=psutil.cpu_percent(interval=None),
            io_some_pct=self._io_psi.sample(now),
            usable_cpus=usable_cpus(main),
            disk=disk.name,
            disk_read_bytes_per_s=disk.read_bytes_per_s,
            disk_reads_per_s=disk.reads_per_s,
            disk_read_inflight=disk.read_inflight,
            disk_busy=disk.busy,
            swap_in_bytes_per_s=swap_in,
            mem_some_pct=self._mem_psi.sample(now),
            mem_available_bytes=available,
            cpu_some_pct=self._cpu_pressure(main, now),
            foreign_cpu_cores=foreign,
            own_cpu_cores=own,
            neighbours=neighbours,
            cpu_quota_cpus=quota,
            throttled_periods_share=throttled_periods,
            throttled_share=throttled,
        )

    def close(self) -> None:
        """Nothing to release."""


_CLK_TCK = float(os.sysconf("SC_CLK_TCK"))
AUTOGRAD_THREAD_PREFIX = b"pt_autograd_"
"""How PyTorch names the autograd engine's thread for a device (``pt_autograd_0`` for cuda:0)."""
COLLECTIVE_THREAD_PREFIXES = (b"pt_gloo_", b"gloo_")
"""How torch and gloo name the threads that run CPU collectives: ProcessGroupGloo's workers
(``pt_gloo_runloop``, 2 per process group) and gloo's transport loop (``gloo_tcp_loop``); read
from ``/proc/PID/task/TID/comm`` of a gloo rank with torch 2.13."""

# Syscall numbers per architecture: (read family, socket receive, timer sleep, wait on others).
_SYSCALLS: dict[str, tuple[frozenset[int], frozenset[int], frozenset[int], frozenset[int]]] = {
    "x86_64": (
        frozenset({0, 17, 19, 295, 327}),
        frozenset({45, 47, 299}),
        frozenset({35, 230}),
        frozenset({202, 7, 271, 23, 270, 232, 281, 441, 61, 247, 34, 130, 128}),
    ),
    "aarch64": (
        frozenset({63, 67, 65, 69, 286}),
        frozenset({207, 212, 243}),
        frozenset({101, 115}),
        frozenset({98, 73, 72, 22, 441, 260, 95, 133, 137}),
    ),
}


def classify_wait(
    state: str, syscall_line: str | None, fd_target: str | None = None, arch: str = platform.machine()
) -> Wait:
    """Why a thread is (not) running, from its state letter and ``/proc/.../syscall`` line.

    Args:
        state: third field of ``/proc/PID/task/TID/stat`` (``R``, ``S``, ``D``, ...).
        syscall_line: content of ``/proc/PID/task/TID/syscall`` (``"running"``, ``"-1 ..."`` or
            ``"NR arg1 ..."`` with hex args), or ``None`` when unreadable.
        fd_target: ``readlink`` of the fd a read-family syscall reads (``pipe:[..]``,
            ``socket:[..]``, a path), when known.
        arch: ``platform.machine()``; syscall numbers differ per architecture.
    """
    if state == "R":
        return Wait.RUNNING
    if state == "D":
        return Wait.DISK
    if not syscall_line or syscall_line.startswith(("running", "-1")):
        return Wait.OTHER
    tables = _SYSCALLS.get(arch)
    if tables is None:
        return Wait.OTHER
    reads, recvs, sleeps, syncs = tables
    try:
        nr = int(syscall_line.split()[0])
    except ValueError:
        return Wait.OTHER
    if nr in sleeps:
        return Wait.SLEEP
    if nr in syncs:
        return Wait.SYNC
    if nr in recvs:
        return Wait.NET
    if nr in reads:
        if fd_target is None:
            return Wait.OTHER
        if fd_target.startswith("pipe:"):
            return Wait.SYNC
        if fd_target.startswith("socket:"):
            return Wait.NET
        return Wait.FILE
    return Wait.OTHER


class ThreadStateSource:
    """State and wait reason of every thread of the main and worker processes.

    Sampling thread states at random instants estimates the share of time each thread
    spends running, on disk, sleeping or waiting on others, whatever the length of each wait.

    The features read only the main thread of each process (the loop, and the thread of each
    DataLoader worker that runs the dataset); the other threads (intra-op pools, pin-memory,
    CUDA and NCCL helpers: most of a training's threads) only give the Processes panel its state
    letters, so they are read once every ``all_interval`` seconds, not every round: a round of a
    process is then 1 thread's files instead of all of its threads'.

    Args:
        tree: the watched tree (roles decide which processes are sampled).
        interval: seconds between rounds of the main threads (0.1: ~10 file reads a round on a
            small tree).
        all_interval: seconds between rounds that read every thread (the display's 1 s refresh).
    """

    name = "threads"

    def __init__(self, tree: ProcessTree, interval: float = 0.1, all_interval: float = 1.0) -> None:
        self.tree = tree
        self.interval = interval
        self.all_interval = all_interval
        self.status = SourceStatus.ok()
        self._syscall_denied = False
        self._last_all = -math.inf
        self._autograd: dict[int, set[int]] = {}  # pid -> TIDs of its autograd device threads

    def sample(self, now: float) -> list[object]:
        """One round over the main threads of main and worker processes and their autograd
        engine threads (see :attr:`ThreadSample.autograd`); every thread of theirs once every
        :attr:`all_interval` s, which is also when the autograd threads are looked for anew."""
        out: list[object] = []
        # Half a round of slack: a round due a few ms from now is taken now, not one interval late.
        every = now - self._last_all >= self.all_interval - self.interval / 2
        found: dict[int, set[int]] = {}
        if every:
            self._last_all = now
        for pid, node in self.tree.nodes().items():
            if node.role not in (Role.MAIN, Role.WORKER):
                continue
            if every:
                try:
                    tids = [int(name) for name in os.listdir(f"/proc/{pid}/task")]
                except OSError:
                    continue
            else:
                tids = [pid, *sorted(self._autograd.get(pid, ()))]
            for tid in tids:
                sample = self._sample_thread(now, pid, tid, node.role, every)
                if sample is None:
                    continue
                out.append(sample)
                if sample.autograd:
                    found.setdefault(pid, set()).add(tid)
        if every:
            self._autograd = found
        return out

    def _sample_thread(self, now: float, pid: int, tid: int, role: Role, every: bool = False) -> ThreadSample | None:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return None
        # comm may hold spaces and parens: the fields after the last ')' start with the state
        # (field 3); utime and stime are fields 14 and 15, in clock ticks.
        fields = stat[stat.rfind(b")") + 2 :].split()
        state = fields[0].decode() if fields else "?"
        # PyTorch names the autograd engine's thread for device N "pt_autograd_N"
        # (c10::setThreadName in torch/csrc/autograd/engine.cpp); the main thread's backward() waits for it.
        comm = stat[stat.find(b"(") + 1 : stat.rfind(b")")]
        autograd = tid != pid and comm.startswith(AUTOGRAD_THREAD_PREFIX)
        collective = tid != pid and comm.startswith(COLLECTIVE_THREAD_PREFIXES)
        try:
            utime, stime = int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK
            cpu_s: float | None = utime + stime
            sys_s: float | None = stime
        except (IndexError, ValueError):
            cpu_s = sys_s = None
        syscall = fd_target = None
        if state not in ("R", "D") and not self._syscall_denied:
            try:
                with open(f"{base}/syscall") as f:
                    syscall = f.read()
            except PermissionError:
                self._syscall_denied = True
                self.status = SourceStatus.unavailable(
                    "cannot read /proc/PID/task/TID/syscall (ptrace permission): waits are not split by cause",
                    "run torchwatch as the target's user with ptrace allowed, or with CAP_SYS_PTRACE",
                )
            except OSError:
                syscall = None
            if syscall and not syscall.startswith(("running", "-1")):
                parts = syscall.split()
                if len(parts) > 1:
                    try:
                        fd_target = os.readlink(f"/proc/{pid}/fd/{int(parts[1], 16)}")
                    except (OSError, ValueError):
                        fd_target = None
        run_s = runq_s = None
        # The threads the features read each round: the loop (and its autograd engine) and workers;
        # every thread in the rounds that read them all, for the intra-op threads' run-queue wait.
        if pid == tid or autograd or every:
            try:
                with open(f"{base}/schedstat", "rb") as f:
                    on_cpu, queued = f.read().split()[:2]
                run_s, runq_s = int(on_cpu) / 1e9, int(queued) / 1e9
            except (OSError, ValueError):
                run_s = runq_s = None
        return ThreadSample(
            t=now,
            pid=pid,
            tid=tid,
            role=role,
            is_main_thread=(pid == tid),
            state=state,
            wait=classify_wait(state, syscall, fd_target),
            cpu_s=cpu_s,
            sys_s=sys_s,
            runq_s=runq_s,
            run_s=run_s,
            autograd=autograd,
            collective=collective,
        )

    def close(self) -> None:
        """Nothing to release."""


def _proc_steady(fast: Pace, window_s: float) -> Pace:
    return {"interval_s": max(fast["interval_s"], 2.0)}


def _threads_fast(options: SourceOptions) -> Pace:
    return {"interval_s": options.thread_interval_s, "all_interval_s": 1.0}


def _threads_steady(fast: Pace, window_s: float) -> Pace:
    return {"interval_s": max(fast["interval_s"], 0.2), "all_interval_s": max(fast["all_interval_s"], 2.0)}


def _threads_apply(src: ThreadStateSource, pace: Pace) -> None:
    src.interval, src.all_interval = pace["interval_s"], pace["all_interval_s"]


# psutil: each second fast (its CPU-time counters tick at 100 Hz), every 2 s steady; it reads the
# tree: its "gone" is the target's exit, its CPU shares pick the focus process.
SPEC = SourceSpec(
    name="psutil",
    readings=(ProcessSample, SystemSample),
    make=lambda ctx: ProcSource(ctx.tree),
    ticked=True,
    words=("psutil", "psi", "diskstats", "vmstat", "cgroup"),
    fast=lambda options: {"interval_s": 1.0},
    steady=_proc_steady,
    apply=set_interval,
    role="tree",
)
# Thread states: the loop's and workers' main threads at the session's rate (10 Hz), 5 Hz steady;
# every thread each second fast, every 2 s steady.
THREADS_SPEC = SourceSpec(
    name="threads",
    readings=(ThreadSample,),
    make=lambda ctx: ThreadStateSource(ctx.tree, interval=ctx.options.thread_interval_s),
    ticked=True,
    words=("proc",),
    fast=_threads_fast,
    steady=_threads_steady,
    apply=_threads_apply,
)

"""Memory of the watched tree against the limit that applies to it, and the kernel's OOM kills.

:class:`MemorySource` (1 Hz) reads, for the training's main process:

- the limit and what counts against it (:func:`read_limit`): the tightest cgroup limit of the
  process's group and its ancestors (v2 ``memory.max``, v1 ``hierarchical_memory_limit`` from
  ``memory.stat``), the working set charged to it (usage minus inactive file cache: the pages
  the kernel reclaims before it kills anything, counted as cAdvisor and the kubelet count them),
  the group's ``oom_kill`` count and PSI memory; with no cgroup limit, the machine
  (``MemTotal + SwapTotal`` against ``MemTotal - MemAvailable`` plus swap in use, and
  ``/proc/vmstat`` ``oom_kill``);
- every :data:`SMAPS_EVERY` rounds (more when that would cost over :data:`SMAPS_BUDGET`), each
  process of the tree's ``/proc/PID/smaps_rollup``: RSS, PSS,
  USS (private) and shared bytes, with the first values read (a DataLoader worker starts sharing
  its parent's pages; copy-on-write makes them private as it writes to them, reference counts
  of Python objects included: pytorch/pytorch#13246);
- new "Killed process PID (name)" lines of the kernel log (``/dev/kmsg``, readable by root; read
  from the end, non-blocking, at most :data:`KMSG_MAX_RECORDS` records a round).

Costs (``bench/memory_cost.py``): the limit is 4-6 small file reads; ``smaps_rollup`` walks the
process's page tables (about 1.6 ms of CPU per 100 MB resident), hence every few rounds only
(:data:`SMAPS_BUDGET`).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from torchwatch.model.memory import KillEvent, LimitReading, MemorySample, ProcMemory
from torchwatch.model.readings import SourceStatus
from torchwatch.sources import SourceContext, SourceSpec

__all__ = ["MemorySource", "read_kmsg", "read_limit", "read_smaps_rollup"]

SMAPS_EVERY = 5
"""Rounds between two ``smaps_rollup`` reads of each process (5 s at 1 Hz): the forecast buckets
are 5 s (:data:`torchwatch.model.forecast.BUCKET_S`)."""
SMAPS_BUDGET = 0.001
"""Most of one core the ``smaps_rollup`` reads may take (0.1 %): a tree of large processes is read
less often (the walk of the page tables costs ~1.6 ms of CPU per 100 MB resident: 22 ms for a
process of 1.4 GiB, measured here; a tree of three such processes is read about every 45 s), so the
readings stay within 0.2 % of a core whatever the training's size."""
KMSG_MAX_RECORDS = 2000
UNLIMITED = 1 << 60
"""A cgroup v1 limit above this is "no limit" (the kernel prints 9223372036854771712)."""
_FILE_MAX = 1 << 16
_KILLED = re.compile(r"Killed process (\d+) \(([^)]{0,64})\)(?:.*?anon-rss:(\d+)kB)?")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    """A small kernel file's text (at most 64 KiB), ``None`` when unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, _FILE_MAX).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _keyed(text: str | None, sep: str | None = None) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        parts = line.split(sep) if sep else line.split()
        if len(parts) >= 2:
            with contextlib.suppress(ValueError):
                out[parts[0].rstrip(":")] = int(parts[1])
    return out


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _psi_avg10(text: str | None) -> float | None:
    for line in (text or "").splitlines():
        if line.startswith("some "):
            for part in line.split():
                if part.startswith("avg10="):
                    with contextlib.suppress(ValueError):
                        return float(part[6:])
    return None


def _groups(pid: int) -> list[tuple[str, str]]:
    """``(controllers, path)`` of ``/proc/PID/cgroup``."""
    text = _read(Path(f"/proc/{pid}/cgroup"))
    out = []
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[1], parts[2].lstrip("/")))
    return out


PF_EXITING = 0x4
"""``task_struct.flags`` bit set by the kernel's ``do_exit`` (``exit_signals``) before anything else
of the exit, ``cgroup_exit`` included (include/linux/sched.h)."""


def _exited(pid: int) -> bool:
    """Whether ``pid`` is exiting (``PF_EXITING`` in ``/proc/PID/stat``'s flags), a zombie or dead
    (state ``Z``/``X``), or gone. Exiting counts: the kernel moves a task to the root cgroup in
    ``do_exit`` before it is a zombie, and a read in that window named the machine's limit for a
    container's main process killed at 400 MiB (CI, 2026-11-28)."""
    text = _read(Path(f"/proc/{pid}/stat"))
    if not text:
        return True
    fields = text[text.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X", "x"):
        return True
    try:
        return bool(int(fields[6]) & PF_EXITING)
    except (IndexError, ValueError):
        return True


def _v2_root(root: Path) -> Path | None:
    for cand in (root, root / "unified"):
        if (cand / "cgroup.controllers").exists():
            return cand
    return None


def _machine() -> LimitReading | None:
    info = _keyed(_read(Path("/proc/meminfo")))
    try:
        total, avail = info["MemTotal"] * 1024, info["MemAvailable"] * 1024
    except KeyError:
        return None
    swap_total, swap_free = info.get("SwapTotal", 0) * 1024, info.get("SwapFree", 0) * 1024
    kills = _keyed(_read(Path("/proc/vmstat"))).get("oom_kill")
    return LimitReading(
        limit=total + swap_total,
        used=total - avail + (swap_total - swap_free),
        source="the machine: MemTotal + SwapTotal (no cgroup memory limit)",
        oom_kills=kills,
        psi_some_pct=_psi_avg10(_read(Path("/proc/pressure/memory"))),
    )


def read_limit(pid: int, root: Path = CGROUP_ROOT) -> LimitReading | None:
    """The memory limit that applies to ``pid`` and its working set against it (module docstring).

    Args:
        pid: a process of torchwatch's PID namespace. root: where cgroups are mounted.
    Returns:
        the tightest cgroup limit (v2, then v1 ``memory``), else the machine; ``None`` when
        neither is readable (the process is gone) or the process has exited: a zombie's
        ``/proc/PID/cgroup`` names the root group (``cgroup_exit`` moves an exiting task there),
        which would read as "no limit" right after a container's main process was killed at its
        limit (its out-of-memory record then named the machine's 23.5 GiB, not the 400 MiB).
    """
    groups = _groups(pid)
    if not groups or _exited(pid):  # the state after the groups: groups read while it lived hold
        return None
    best: LimitReading | None = None
    v2 = _v2_root(root)
    for controllers, rel in groups:
        if controllers == "" and v2 is not None:
            group = v2 / rel
            chain = [group, *[p for p in group.parents if v2 in p.parents or p == v2]]
            for g in chain:
                limit = _int(_read(g / "memory.max"))
                if limit is None or limit >= UNLIMITED:
                    continue
                if best is not None and best.limit <= limit:
                    continue
                stat = _keyed(_read(g / "memory.stat"))
                current = _int(_read(g / "memory.current")) or 0
                high = _int(_read(g / "memory.high"))
                events = _keyed(_read(g / "memory.events"))
                best = LimitReading(
                    limit=limit,
                    used=max(0, current - stat.get("inactive_file", 0)),
                    source=f"cgroup v2 memory.max of {g}",
                    high=high if high is not None and high < limit else None,
                    oom_kills=events.get("oom_kill"),
                    psi_some_pct=_psi_avg10(_read(g / "memory.pressure")),
                )
        elif "memory" in controllers.split(","):
            g = root / "memory" / rel
            stat = _keyed(_read(g / "memory.stat"))
            limit = stat.get("hierarchical_memory_limit") or _int(_read(g / "memory.limit_in_bytes"))
            if limit is None or limit >= UNLIMITED or (best is not None and best.limit <= limit):
                continue
            usage = _int(_read(g / "memory.usage_in_bytes")) or 0
            inactive = stat.get("total_inactive_file", stat.get("inactive_file", 0))
            best = LimitReading(
                limit=limit,
                used=max(0, usage - inactive),
                source=f"cgroup v1 memory limit of {g}",
                oom_kills=_keyed(_read(g / "memory.oom_control")).get("oom_kill"),
            )
    machine = _machine()
    if best is None or (machine is not None and machine.limit < best.limit):
        return machine
    return best


def read_smaps_rollup(pid: int) -> tuple[int, int, int, int, int] | None:
    """``(rss, pss, uss, shared, swap)`` bytes of ``pid`` from ``/proc/PID/smaps_rollup``;
    ``None`` when unreadable (gone, no permission, a kernel before 4.14)."""
    text = _read(Path(f"/proc/{pid}/smaps_rollup"))
    if not text:
        return None
    v = _keyed(text)
    try:
        rss, pss = v["Rss"] * 1024, v["Pss"] * 1024
    except KeyError:
        return None
    uss = (v.get("Private_Clean", 0) + v.get("Private_Dirty", 0)) * 1024
    shared = (v.get("Shared_Clean", 0) + v.get("Shared_Dirty", 0)) * 1024
    return rss, pss, uss, shared, v.get("Swap", 0) * 1024


def read_kmsg(fd: int, now: float) -> list[KillEvent]:
    """New OOM-kill lines from an open, non-blocking ``/dev/kmsg``. Never raises."""
    out: list[KillEvent] = []
    for _ in range(KMSG_MAX_RECORDS):
        try:
            rec = os.read(fd, 8192)
        except BlockingIOError:
            break
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # records overwritten before we read them: go on
                continue
            break
        if not rec:
            break
        text = rec.decode("utf-8", "replace")
        m = _KILLED.search(text)
        if m is not None:
            anon = int(m.group(3)) * 1024 if m.group(3) else None
            out.append(KillEvent(now, int(m.group(1)), m.group(2), anon))
    return out


class MemorySource:
    """The limit, the tree's memory and the kernel's OOM kills (module docstring).

    Args:
        pids: returns the tree's PIDs, the main process first (torchwatch's namespace).
        interval: seconds between rounds.
        kmsg: read ``/dev/kmsg`` (root only; ``False`` in tests that must not read the host's).
    """

    name = "memory"

    def __init__(self, pids: Callable[[], Sequence[int]], interval: float = 1.0, kmsg: bool = True) -> None:
        self.interval = interval
        self.status = SourceStatus.ok()
        self._pids = pids
        self._round = 0
        self._next_smaps = 0
        self.smaps_every = SMAPS_EVERY
        self._first: dict[int, tuple[float, int, int]] = {}  # pid -> (t, uss, shared) at the first read
        self._kmsg: int | None = None
        if kmsg:
            try:
                self._kmsg = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                os.lseek(self._kmsg, 0, os.SEEK_END)
            except OSError:
                self._kmsg = None

    @property
    def reads_kernel_log(self) -> bool:
        """Whether OOM kills are read from the kernel log (else the cgroup's count only)."""
        return self._kmsg is not None

    def sample(self, now: float) -> list[object]:
        """One round (see :class:`MemorySample`); never raises for a vanished process."""
        pids = list(self._pids())
        kills = read_kmsg(self._kmsg, now) if self._kmsg is not None else []
        if not pids:
            return [MemorySample(now, None, (), tuple(kills))] if kills else []
        limit = read_limit(pids[0])
        procs: list[ProcMemory] = []
        if self._round >= self._next_smaps:
            cost = time.process_time()
            for pid in pids:
                got = read_smaps_rollup(pid)
                if got is None:
                    continue
                rss, pss, uss, shared, swap = got
                first = self._first.setdefault(pid, (now, uss, shared))
                procs.append(ProcMemory(pid, rss, pss, uss, shared, swap, first[1], first[2], now - first[0]))
            live = set(pids)
            for gone in [p for p in self._first if p not in live]:
                del self._first[gone]  # its PID may be reused
            cost = time.process_time() - cost
            self.smaps_every = max(SMAPS_EVERY, math.ceil(cost / (SMAPS_BUDGET * self.interval)))
            self._next_smaps = self._round + self.smaps_every
        self._round += 1
        return [MemorySample(now, limit, tuple(procs), tuple(kills))]

    def close(self) -> None:
        """Close the kernel log. Idempotent."""
        if self._kmsg is not None:
            with contextlib.suppress(OSError):
                os.close(self._kmsg)
            self._kmsg = None


def _make(ctx: SourceContext) -> MemorySource:
    def pids() -> list[int]:
        """The tree's PIDs, the focus process first (its cgroup's limit is the one read)."""
        all_pids = ctx.tree.pids()
        focus = ctx.focus()
        first = focus if focus is not None else ctx.tree.root
        return [first, *[p for p in all_pids if p != first]]

    return MemorySource(pids, kmsg=ctx.options.kernel_log)


# Each second, not paced; read once more after the target exited (a worker's OOM kill is often the
# last thing before its training exits).
SPEC = SourceSpec(
    name="memory",
    readings=(MemorySample,),
    make=_make,
    ticked=True,
    last_round=True,
    kernel_log=lambda src: src.reads_kernel_log,
)

"""The machine to itself for the tests that need it, while the rest of the suite runs in parallel.

The suite runs in several pytest-xdist workers (``-n`` in ``pyproject.toml``). Most tests do not
care what else runs: a hang, a signal, a file's mode or an injection reads the same beside a busy
process. A few assert what torchwatch concludes from CPU time: a demo's label, a straggler, a
trial's speed-up, a burst that agrees with the step times. Beside another test's training those
would, rightly, read ``cpu-contention`` instead. They are marked ``quiet``
(``@pytest.mark.quiet``) and run while no other test of the session runs: a readers-writer lock
across the workers, where a quiet test is the writer.

The lock is two ``flock(2)`` files in a directory of the session (:func:`make_dir`): ``gate``
and ``rw``. A quiet test takes ``gate``, then ``rw`` exclusively, and keeps both until it ends; any
other test takes ``gate`` for a moment, then ``rw`` shared. So a quiet test that waits holds
``gate`` and lets no new test start: it never starves behind a stream of short tests (flock alone
would keep granting the shared lock). Each worker opens the files itself (flock locks belong to
the open file), and a lock goes with its holder if the worker dies.

The tests that are not quiet run up to four at a time on this project's 2-core machine, and most
of them start a training that would spin every CPU with torch's intra-op threads (one per CPU by
default) for as long as it is watched: they start theirs with one OpenMP thread
(:data:`THREAD_VARIABLES` set to 1 in the worker, unless the suite was started with them set), so
two of them share two CPUs instead of each asking for both. What they assert (signals, hangs,
injection, files, the hook's numbers) does not depend on the thread count; the quiet tests, which
run alone, start their trainings with the environment the suite was started with
(:func:`environment`).

Without xdist (``-n 0``, or one test run by itself) there is nothing to wait for: no lock is taken
and no variable is set.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""The variables torch's CPU build reads, at its import, for its intra-op thread count."""

ENV = "TESTS_QUIET_DIR"
"""The environment variable that gives the workers the session's lock directory (set by the
controller process before it starts them)."""


def make_dir() -> Path:
    """A new private directory for the session's two lock files (0700, made by this process in
    the temporary directory: nothing another user made is opened)."""
    path = Path(tempfile.mkdtemp(prefix="torchwatch-tests-quiet-"))
    for name in ("gate", "rw"):
        fd = os.open(path / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        os.close(fd)
    return path


def remove_dir(path: Path) -> None:
    """Remove what :func:`make_dir` made."""
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def environment(values: dict[str, str | None]) -> Iterator[None]:
    """Within the block, each variable of ``values`` set to its value (``None``: unset); put
    back after."""
    saved = {name: os.environ.get(name) for name in values}

    def put(pairs: dict[str, str | None]) -> None:
        for name, value in pairs.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    put(values)
    try:
        yield
    finally:
        put(saved)


class Lock:
    """One worker's side of the lock: its own open files of ``gate`` and ``rw`` in ``path``."""

    def __init__(self, path: Path) -> None:
        self._gate = os.open(path / "gate", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        self._rw = os.open(path / "rw", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)

        self.held: bool | None = None
        """What this worker holds now: None, the shared lock (False) or the whole machine (True)."""

    def acquire(self, quiet: bool) -> None:
        """Take the machine (``quiet``) or a place beside the other tests that are not quiet.
        Blocks (without a time limit: a quiet test waits for the tests running now to end, each
        bounded by its own timeouts) until it may run. Nothing is done when this worker already
        holds what is asked (consecutive quiet tests keep the machine between them)."""
        if self.held is quiet:
            return
        self.release()
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._rw, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
        except BaseException:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
            raise
        if not quiet:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self.held = quiet

    def release(self) -> None:
        """Give back what this worker holds (nothing when it holds nothing)."""
        if self.held is None:
            return
        fcntl.flock(self._rw, fcntl.LOCK_UN)
        if self.held:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self.held = None

    @contextlib.contextmanager
    def hold(self, quiet: bool, keep: bool = False) -> Iterator[None]:
        """The block run alone (``quiet``) or beside the others; what was taken is kept after
        it when ``keep`` (the next test is quiet too: the quiet tests then run as one block, and
        the machine is waited for once, not once per test behind whatever long test another
        worker started in between)."""
        self.acquire(quiet)
        try:
            yield
        finally:
            if not keep:
                self.release()

    def close(self) -> None:
        """Close both files (releasing anything still held)."""
        os.close(self._gate)
        os.close(self._rw)


FOREIGN_LIMIT_CORES = 0.5
"""Above this much CPU (cores, averaged over the test) outside the test's own processes, a quiet
test's premise (a machine to itself) did not hold: the same half core from which torchwatch's
``cpu-contention`` names the neighbours (rules/cpu-contention.toml), so a failure then may be the
neighbours' doing, not torchwatch's."""

THROWAWAY_PREFIXES = ("twt", "twi")
"""Names of the throw-away users the tests make (``tests/users.py``; ``test_inject.py``'s)."""

SUITE_MARKS = (b"TESTS_SESSION=", b"TESTS_CI_RUN=")
"""Environment variables every process the suite (or ``.ci/run``) starts carries
(``tests/leftovers.py``)."""

_HZ = os.sysconf("SC_CLK_TCK")


def _machine_busy_ticks() -> int:
    """Clock ticks all CPUs spent busy since boot (``/proc/stat``: user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq + steal


def _stat(pid: int) -> tuple[str, float, int, int] | None:
    """``(comm, start time, own ticks, reaped children's ticks)`` of ``pid``, or ``None`` when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    try:
        comm = raw[raw.index(b"(") + 1 : raw.rindex(b")")].decode(errors="replace")
        rest = raw[raw.rindex(b")") + 2 :].split()
        return comm, float(rest[19]), int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14])
    except (ValueError, IndexError):
        return None


def _own_ticks(root: int, tree: Iterable[int]) -> int:
    """CPU ticks of ``root`` and the processes below it (``tree``), the ones they reaped included:
    a process that ran and ended during the test is in its reaper's children's time."""
    total = 0
    for pid in (root, *tree):
        st = _stat(pid)
        if st is not None:
            total += st[2] + st[3]
    return total


def _every_process() -> dict[tuple[int, float], tuple[str, int]]:
    """Every process now: ``(pid, start time) -> (comm, own ticks)``."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                found[(int(name), st[1])] = (st[0], st[2])
    return found


def _whose(pid: int) -> str:
    """Whose a process is, for the reason: the suite's own, a throw-away test user's, or a user's."""
    import pwd

    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        user = pwd.getpwuid(uid).pw_name
    except (OSError, KeyError):
        return "?"
    if user.startswith(THROWAWAY_PREFIXES):
        return f"{user}, a throw-away test user"
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
        if any(item.startswith(SUITE_MARKS) for item in env):
            return f"{user}, a test session's"
    except OSError:
        pass
    return user


class ForeignCpu:
    """The machine's CPU outside the test's own processes, from a reading before the test to one
    after (:meth:`end`): all CPUs' busy time (``/proc/stat``) less what this process and every
    process below it used (it is their subreaper: ``tests/leftovers.py``), averaged over the test.
    Independent of torchwatch, which a quiet test is checking."""

    def __init__(self) -> None:
        from tests import leftovers

        self._tree = leftovers._tree
        self.t0 = time.monotonic()
        self.busy0 = _machine_busy_ticks()
        self.own0 = _own_ticks(os.getpid(), self._tree(os.getpid()))
        self.procs0 = _every_process()

    def end(self) -> str:
        """``""`` when the premise held (at most :data:`FOREIGN_LIMIT_CORES` cores outside the
        test's processes on average), else why not: the cores and the busiest processes outside
        them (PID, name, whose)."""
        wall = max(time.monotonic() - self.t0, 1e-3)
        tree = self._tree(os.getpid())
        busy = _machine_busy_ticks() - self.busy0
        own = _own_ticks(os.getpid(), tree) - self.own0
        foreign = max(0.0, (busy - own) / _HZ / wall)
        if foreign <= FOREIGN_LIMIT_CORES:
            return ""
        mine = {os.getpid(), *tree}
        rates = []
        for key, (comm, ticks) in _every_process().items():
            before = self.procs0.get(key)
            used = ticks - (before[1] if before is not None else 0)  # one started since: all its time
            if key[0] not in mine and used > 0:
                rates.append((used / _HZ / wall, key[0], comm))
        rates.sort(reverse=True)
        top = [f"PID {pid} {comm} ({_whose(pid)}) {cores:.1f}" for cores, pid, comm in rates[:3] if cores >= 0.05]
        who = ", ".join(top)
        return f"foreign CPU {foreign:.1f} core over {wall:.0f} s" + (f": {who}" if who else "")

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
from collections.abc import Iterator
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

"""Fixtures and hooks shared by unit and integration tests: throw-away users, the signal
dispositions and mask every child starts with, and no process left running after the test that
started it (``tests/leftovers.py``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import leftovers, quiet, users

ESCAPED = pytest.StashKey[list[str]]()
"""What was still alive at the end of the session (the session then fails)."""
QUIET = pytest.StashKey[quiet.Lock]()
"""This xdist worker's side of the lock that runs ``quiet`` tests alone (``tests/quiet.py``)."""
THREADS = pytest.StashKey[dict[str, "str | None"]]()
"""The thread-count variables as this xdist worker was started with them (see :mod:`tests.quiet`)."""
QUIET_FIXTURES = frozenset({"dataloader_demo_runs", "cpu_bound_demo_run"})
"""Session-scoped watched runs whose labels tests assert (tests/integration/conftest.py)."""
QUIET_DIR = pytest.StashKey[Path]()
"""The lock's directory, made by the xdist controller (removed at its end)."""


def _controller(config: pytest.Config) -> bool:
    """This process only hands tests to xdist workers (``-n N``, N > 0) and runs none itself."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


@pytest.fixture
def make_user() -> Iterator[Callable[[], users.User]]:
    """A factory of real, throw-away unprivileged users (see ``tests/users.py``), removed after
    the test. Skips the test when not root or without ``useradd``."""
    why = users.available()
    if why:
        pytest.skip(why)
    made: list[users.User] = []

    def factory() -> users.User:
        user = users.create()
        made.append(user)
        return user

    yield factory
    for user in made:
        users.remove(user)


def _ignored(signum: int, frame: object) -> None:
    """A signal the test run was started with ignored: still ignored here (a handler, not
    SIG_IGN: see below)."""


IGNORED_AT_START = (signal.SIGHUP, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
"""Signals the tests send to what they start (or a training's hook listens for), reset to their
default in every child when the suite was started with them ignored (SIGINT too, below)."""


@pytest.fixture(scope="session", autouse=True)
def default_signals_for_children() -> Iterator[None]:
    """The suite may be started with SIGINT, SIGQUIT or SIGHUP ignored (a background job ``cmd &``
    from a script, ``nohup``, some CI runners) or with signals blocked, and an ignored or blocked
    signal stays so in every child across exec: a training the tests start would then never see
    the Ctrl-C they send it (Python installs its KeyboardInterrupt handler only where SIGINT is not
    ignored at start), and a torchwatch they start would leave SIGINT ignored as a background job
    asks. A signal with a handler is reset to its default at exec, so this process handles them
    instead: SIGINT as Python does by default, the others by ignoring them here only; and no
    signal is blocked in this thread, whose mask every child (and thread) it starts inherits. Put
    back at the end."""
    saved = {}
    for signum in (signal.SIGINT, *IGNORED_AT_START):
        if signal.getsignal(signum) == signal.SIG_IGN:
            saved[signum] = signal.SIG_IGN
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else _ignored)
    mask = signal.pthread_sigmask(signal.SIG_SETMASK, set())
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for signum, old in saved.items():
        signal.signal(signum, old)


BYTECODE_DIRS = ("torchwatch", "tests/scenarios", "demo")
"""What the processes the tests start import (or run) from this tree."""


def compile_bytecode() -> None:
    """Write the bytecode of :data:`BYTECODE_DIRS` once, before the tests start their processes.

    Hundreds of them (torchwatch, hooked trainings) import this tree; where ``PYTHONDONTWRITEBYTECODE``
    is set (this project's development machines set it) none writes ``__pycache__`` and each compiles
    the modules it imports again: 0.1 s of CPU for a ``torchwatch run`` here, in a suite whose second
    half is bound by its two CPUs (docs/development.md). Python reads bytecode that exists whatever
    that variable says. A directory that cannot be written is left as it is."""
    import compileall

    root = Path(__file__).resolve().parents[1]
    for name in BYTECODE_DIRS:
        compileall.compile_dir(root / name, quiet=2, workers=1)


def pytest_configure(config: pytest.Config) -> None:
    """Every process a test starts stays below this one (it becomes their subreaper) and carries
    this session's mark in its environment (:data:`tests.leftovers.MARK`). Under xdist each
    worker does so for itself and opens its side of the quiet lock; the controller, which runs
    no test, only makes the lock's directory for them (``tests/quiet.py``)."""
    config.stash[ESCAPED] = []
    config.pluginmanager.register(QuietPremise(), "tests-quiet-premise")
    if not hasattr(config, "workerinput"):
        compile_bytecode()
    if _controller(config):
        # The workers run the tests, each marking what it starts with its own value and checking
        # it at its end; the controller's mark would be in the workers' own environment.
        config.stash[QUIET_DIR] = quiet.make_dir()
        os.environ[quiet.ENV] = str(config.stash[QUIET_DIR])
        return
    leftovers.subreaper()
    os.environ[leftovers.MARK] = leftovers.mark_value()
    if hasattr(config, "workerinput") and os.environ.get(quiet.ENV):
        config.stash[QUIET] = quiet.Lock(Path(os.environ[quiet.ENV]))
        config.stash[THREADS] = {name: os.environ.get(name) for name in quiet.THREAD_VARIABLES}
        for name in quiet.THREAD_VARIABLES:
            os.environ.setdefault(name, "1")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Close this worker's lock files; the controller removes their directory."""
    lock = config.stash.get(QUIET, None)
    if lock is not None:
        lock.close()
    path = config.stash.get(QUIET_DIR, None)
    if path is not None:
        quiet.remove_dir(path)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses one of :data:`QUIET_FIXTURES` is ``quiet`` too (the shared run is made in
    the first test that asks for it). Every ``quiet`` test goes to the same xdist worker
    (``--dist loadgroup``): they run one at a time anyway, and the session-scoped watched runs
    they share are then made once; they come first (the sort is stable: each part keeps its
    order), then the rest (:func:`_order`)."""
    for item in items:
        if QUIET_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.quiet)
        if item.get_closest_marker("quiet") is not None:
            item.add_marker(pytest.mark.xdist_group("quiet"))
    items.sort(key=_order)


LEAD_IN = "tests/unit/test_diagnosis.py"
"""Tests of milliseconds each (132 of them, 0.3 s in all), sent right after the quiet block: each
other worker's first tests. A quiet test waits until no other test runs; before this order the
other workers began with xdist's groups (a 60 s compile test among them) and the quiet block, which
then runs alone at 1.3-1.8 cores of 2, began 60 s into the suite."""


def _order(item: pytest.Item) -> int:
    """The quiet tests first, as one block; then :data:`LEAD_IN`; then the others in collection
    order (the long integration tests before the unit tests, so the run does not end on a long
    test). The sort is stable and xdist keeps it (``--no-loadscope-reorder``, pyproject.toml): it
    sends each worker its units in this order."""
    if item.get_closest_marker("quiet") is not None:
        return 0
    return 1 if item.nodeid.startswith(LEAD_IN + "::") else 2


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Set-up, call and tear-down of a ``quiet`` test run while no other test runs, with the
    thread counts the suite was started with; any other test runs beside the others, what it
    starts with one OpenMP thread unless the suite was started with a count (``tests/quiet.py``).
    Without xdist: as is."""
    lock = item.config.stash.get(QUIET, None)
    if lock is None:
        yield
        return
    is_quiet = item.get_closest_marker("quiet") is not None
    keep = is_quiet and nextitem is not None and nextitem.get_closest_marker("quiet") is not None
    with lock.hold(is_quiet, keep), quiet.environment(item.config.stash[THREADS] if is_quiet else {}):
        yield


PREMISE_PROPERTY = "premise"
"""The name under which a quiet test's report carries why its premise (the machine to itself) did
not hold (:func:`pytest_runtest_protocol` below)."""


def _failure(reports: list[pytest.TestReport]) -> str:
    """The first line of the first failure in ``reports`` (its exception's message), at most 300 characters."""
    for r in reports:
        if r.failed:
            crash = getattr(r.longrepr, "reprcrash", None)
            text = str(getattr(crash, "message", "") or r.longrepr or "")
            return (text.strip().splitlines() or [""])[0][:300]
    return ""


class QuietPremise:
    """The plugin (registered by :func:`pytest_configure`) that runs each ``quiet`` test with its
    premise checked: a second ``pytest_runtest_protocol`` beside the lock's wrapper above, which
    holds the machine around both attempts."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        """A ``quiet`` test proves it had the machine: the CPU outside its own processes is read
        before and after it (:class:`tests.quiet.ForeignCpu`, not torchwatch's reading). A test that
        failed while it did not have the machine is run again once (setup, call, teardown); failed
        again without it, it is reported skipped with the reason (the foreign CPU and the busiest
        processes, each with whose it is), never a failure blamed on torchwatch. A quiet test that
        passes on a busy machine passes (those that check what a busy machine gives do so), and one
        that fails on a quiet machine fails. Other tests: pytest's own protocol."""
        if item.get_closest_marker("quiet") is None:
            return None
        from _pytest.runner import runtestprotocol

        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        why, notes = "", []
        for attempt in (1, 2):
            reading = quiet.ForeignCpu()
            reports = runtestprotocol(item, nextitem=nextitem, log=False)
            why = reading.end()
            if not (why and any(r.failed for r in reports)):
                break
            # what failed, too: the premise once hid a product bug (a report that broke its schema
            # under load) as a skip, and only this line said what the test had found
            notes.append(
                (PREMISE_PROPERTY, f"failed on attempt {attempt} ({_failure(reports)}), premise not held: {why}")
            )
        else:
            failure = _failure(reports)
            for r in reports:
                if r.failed:
                    r.outcome = "skipped"
                    r.longrepr = (
                        str(item.path),
                        item.location[1] or 0,
                        f"Skipped: premise not held (failed twice: {failure}): {why}",
                    )
        for r in reports:
            if r.when == "teardown":
                r.user_properties.extend(notes)
            item.ihook.pytest_runtest_logreport(report=r)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True


LEFT_PROPERTY = "left running by the test"
"""The name under which a test's report carries each process it left running (its
``user_properties``, which xdist sends from the worker to the controller that prints them)."""


@pytest.fixture(autouse=True)
def end_what_the_test_started(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, passed or failed, SIGKILL every process it started that is still running:
    those below this process that were not there before the test (orphans come here: see
    :func:`pytest_configure`), and every process of their process groups and sessions (a training
    started with ``start_new_session``, torchrun's ranks). A process started by a longer-lived
    fixture, and what it starts, is that fixture's. What was killed is listed at the end of the
    run (a test that leaves processes behind slows every test after it)."""
    before = leftovers.snapshot()
    yield
    started = leftovers.started_since(before)
    if not started:
        return
    procs = [*started, *leftovers.same_group_or_session(started)]
    for item in leftovers.end(procs, LEFT_PROPERTY):
        request.node.user_properties.append((LEFT_PROPERTY, item.line()))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Gather what the tests left running, and the quiet tests' premises that did not hold, from
    their tear-down reports (in xdist's controller, from every worker's)."""
    if report.when == "teardown":
        _LEFT.extend((report.nodeid, str(value)) for name, value in report.user_properties if name == LEFT_PROPERTY)
        for name, value in report.user_properties:
            if name == PREMISE_PROPERTY and (report.nodeid, str(value)) not in _PREMISE:
                _PREMISE.append((report.nodeid, str(value)))


_LEFT: list[tuple[str, str]] = []
_PREMISE: list[tuple[str, str]] = []


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """At the end: a process this session started (its mark in the environment) that is still
    alive escaped the per-test clean-up; it is killed and the session fails, since a leak that
    only prints is lost in a long CI log and slows everything that runs after it. Under xdist
    each worker checks its own and writes what it found beside the quiet lock, where the
    controller reads it (the workers have ended their sessions by then) and fails the run."""
    config = session.config
    if _controller(config):
        escaped = [
            line for path in sorted(config.stash[QUIET_DIR].glob("escaped-*")) for line in path.read_text().splitlines()
        ]
    else:
        found = leftovers.end(
            leftovers.marked(leftovers.MARK, os.environ[leftovers.MARK]), "alive at the end of the test session"
        )
        escaped = [item.line() for item in found]
        if QUIET in config.stash and escaped:
            worker = getattr(config, "workerinput", {}).get("workerid", "worker")
            (Path(os.environ[quiet.ENV]) / f"escaped-{worker}").write_text("".join(f"{line}\n" for line in escaped))
    config.stash[ESCAPED] = escaped
    if escaped and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The quiet tests run again because the machine was not theirs, the processes tests left
    running (each killed after its test), and any the session left."""
    if _PREMISE:
        terminalreporter.section("quiet tests that did not have the machine to themselves", yellow=True)
        for nodeid, line in _PREMISE:
            terminalreporter.line(f"{nodeid}: {line}")
    if _LEFT:
        terminalreporter.section("processes left running by tests (killed after each)", yellow=True)
        for nodeid, line in _LEFT:
            terminalreporter.line(f"{nodeid}: {line}")
    escaped = config.stash.get(ESCAPED, [])
    if escaped:
        terminalreporter.section("processes the test session left running (killed; the session fails)", red=True)
        for line in escaped:
            terminalreporter.line(line, red=True)

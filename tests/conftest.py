"""Fixtures and hooks shared by unit and integration tests: throw-away users, the signal
dispositions and mask every child starts with, and no process left running after the test that
started it (``tests/leftovers.py``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator

import pytest

from tests import leftovers, users

LEFT = pytest.StashKey[list[tuple[str, leftovers.Left]]]()
"""What each test left running (its node id and the process), for the terminal summary."""
ESCAPED = pytest.StashKey[list[leftovers.Left]]()
"""What was still alive at the end of the session (the session then fails)."""


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


def pytest_configure(config: pytest.Config) -> None:
    """Every process a test starts stays below this one (it becomes their subreaper) and carries
    this session's mark in its environment (:data:`tests.leftovers.MARK`)."""
    config.stash[LEFT] = []
    config.stash[ESCAPED] = []
    leftovers.subreaper()
    os.environ[leftovers.MARK] = leftovers.mark_value()


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
    for item in leftovers.end(procs, "left running by the test"):
        request.config.stash[LEFT].append((request.node.nodeid, item))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """At the end: a process this session started (its mark in the environment) that is still
    alive escaped the per-test clean-up; it is killed and the session fails, since a leak that
    only prints is lost in a long CI log and slows everything that runs after it."""
    escaped = leftovers.end(
        leftovers.marked(leftovers.MARK, os.environ.get(leftovers.MARK, "")), "alive at the end of the test session"
    )
    session.config.stash[ESCAPED] = escaped
    if escaped and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The processes tests left running (each killed after its test), and any the session left."""
    left = config.stash.get(LEFT, [])
    if left:
        terminalreporter.section("processes left running by tests (killed after each)", yellow=True)
        for nodeid, item in left:
            terminalreporter.line(f"{nodeid}: {item.line()}")
    escaped = config.stash.get(ESCAPED, [])
    if escaped:
        terminalreporter.section("processes the test session left running (killed; the session fails)", red=True)
        for item in escaped:
            terminalreporter.line(item.line(), red=True)

"""Fixtures shared by unit and integration tests."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator

import pytest

from tests import users


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


def _hangup(signum: int, frame: object) -> None:
    """SIGHUP to the test run: ignored, as nohup asked (a handler, not SIG_IGN: see below)."""


@pytest.fixture(scope="session", autouse=True)
def default_signals_for_children() -> Iterator[None]:
    """The suite may be started with SIGINT or SIGHUP ignored (a background job ``cmd &`` from a
    script, ``nohup``, some CI runners), and an ignored signal stays ignored in every child across
    exec: a training the tests start would then never see the Ctrl-C they send it (Python installs
    its KeyboardInterrupt handler only where SIGINT is not ignored at start), and a torchwatch
    they start would leave SIGINT ignored as a background job asks. A signal with a handler is
    reset to its default at exec, so this process handles them instead: SIGINT as Python does by
    default, SIGHUP by ignoring it here only. Put back at the end."""
    saved = {}
    for signum, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGHUP, _hangup)):
        if signal.getsignal(signum) == signal.SIG_IGN:
            saved[signum] = signal.SIG_IGN
            signal.signal(signum, handler)
    yield
    for signum, old in saved.items():
        signal.signal(signum, old)

"""Fixtures shared by unit and integration tests."""

from __future__ import annotations

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

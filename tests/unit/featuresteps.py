"""Feature steps held to their declarations: :func:`checked` wraps a step so that reading a feature
outside its ``needs`` or returning one outside its ``gives`` fails the test that computed it
(``tests/unit/conftest.py`` puts every step of ``torchwatch.analysis.features.ORDER`` so for the
whole unit suite)."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchwatch.analysis.features import Features, Step
from torchwatch.analysis.store import Window


class UndeclaredFeature(AssertionError):
    """A step read or made a feature its declaration does not name."""


class _Reads(dict):  # type: ignore[type-arg]
    def __init__(self, f: Features, step: Step) -> None:
        super().__init__(f)
        self.step = step

    def _check(self, key: str) -> None:
        if key not in self.step.needs:
            raise UndeclaredFeature(f"feature step {self.step.name!r} reads {key!r}, which its needs do not name")

    def get(self, key: str, default: Any = None) -> Any:
        self._check(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self._check(key)
        return super().__getitem__(key)


def checked(step: Step) -> Step:
    """``step`` with its reads and its result checked against its declaration.

    Raises (when run):
        UndeclaredFeature: it read a feature not in ``needs`` or returned one not in ``gives``.
    """

    def run(window: Window, main_pid: int | None, f: Features) -> Features:
        out = step.run(window, main_pid, _Reads(f, step))
        extra = set(out) - step.gives
        if extra:
            raise UndeclaredFeature(f"feature step {step.name!r} made {sorted(extra)}, which its gives do not name")
        return out

    return dataclasses.replace(step, run=run)

"""Unit-suite fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import torchwatch.analysis.features as feats
from tests.unit.featuresteps import checked


@pytest.fixture(scope="session", autouse=True)
def feature_steps_keep_to_their_declarations() -> Iterator[None]:
    """Every feature computation of the unit suite checks each step's reads and results against
    its declared ``needs`` and ``gives`` (the order of :data:`~torchwatch.analysis.features.ORDER`
    is computed from them: an undeclared read could run before its maker)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(feats, "ORDER", tuple(checked(s) for s in feats.ORDER))
        yield

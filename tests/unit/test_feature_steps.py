"""The feature families' steps: their computed order, and their declarations against the catalogue."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import torchwatch.analysis.features as feats
from tests.unit.featuresteps import UndeclaredFeature, checked
from tests.unit.recorded import MAIN, NOW, recorded_store
from torchwatch.analysis.features import CATALOGUE, PROGRESS_FEATURES, STEPS, WATCH_FEATURES, Features, Step, order
from torchwatch.analysis.features.steps import step
from torchwatch.analysis.store import Window

Run = Callable[[Window, int | None, Features], Features]


def _const(values: Features) -> Run:
    return lambda w, pid, f: dict(values)


def _reads(*names: str) -> Run:
    return lambda w, pid, f: {"sum": sum(f.get(n) or 0.0 for n in names)}


def test_a_reader_runs_after_its_makers_whatever_the_listing() -> None:
    a = step("a", _const({"x": 1.0}), ("x",))
    b = step("b", _reads("x", "y"), ("sum",), needs=("x", "y"))
    c = step("c", _const({"y": 2.0}), ("y",))
    assert [s.name for s in order([b, c, a])] == ["c", "a", "b"]
    assert [s.name for s in order([a, b, c])] == ["a", "c", "b"]


def test_a_corrector_runs_after_the_maker_it_corrects() -> None:
    make = step("make", _const({"x": 1.0}), ("x",))
    fix = step("fix", lambda w, pid, f: {"x": (f.get("x") or 0.0) * 2}, ("x",), needs=("x",))
    assert [s.name for s in order([fix, make])] == ["make", "fix"]


@pytest.mark.parametrize(
    ("steps", "words"),
    [
        ([step("a", _const({}), ("x",)), step("b", _const({}), ("x",))], "exactly one of them must read it"),
        ([step("a", _reads("z"), ("sum",), needs=("z",))], "which no other step makes"),
        (
            [step("a", _reads("y"), ("x",), needs=("y",)), step("b", _reads("x"), ("y",), needs=("x",))],
            "in a cycle",
        ),
        (
            [
                step("m", _const({}), ("x",)),
                step("f1", _reads("x"), ("x",), needs=("x",)),
                step("f2", _reads("x"), ("x",), needs=("x",)),
            ],
            "exactly one of them must read it",
        ),
    ],
)
def test_an_order_that_would_hang_on_the_listing_is_refused(steps: list[Step], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        order(steps)


def test_every_catalogue_feature_is_made_by_one_step_or_by_a_watch() -> None:
    made = {name for s in STEPS for name in s.gives}
    assert made <= set(CATALOGUE), sorted(made - set(CATALOGUE))
    assert set(CATALOGUE) - made == WATCH_FEATURES | PROGRESS_FEATURES - made, sorted(
        set(CATALOGUE) - made - WATCH_FEATURES - PROGRESS_FEATURES
    )
    assert len({s.name for s in STEPS}) == len(STEPS)


def test_a_step_that_reads_or_makes_an_undeclared_feature_fails_its_check() -> None:
    window = Window(start=0.0, end=1.0, processes=[], threads=[], system=[], gpus=[], stacks=[], hook=[])
    sneaky = checked(step("sneaky", _reads("x", "y"), ("sum",), needs=("x",)))
    with pytest.raises(UndeclaredFeature, match="reads 'y'"):
        sneaky.run(window, None, {"x": 1.0, "y": 2.0})
    loud = checked(step("loud", _const({"sum": 1.0, "other": 2.0}), ("sum",)))
    with pytest.raises(UndeclaredFeature, match="other"):
        loud.run(window, None, {})


def test_the_computed_order_gives_the_same_features_from_any_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    store = recorded_store(gpus=True)
    window = store.window(NOW - 10.0, NOW)
    listed = feats.compute(window, MAIN)
    monkeypatch.setattr(feats, "ORDER", tuple(checked(s) for s in order(list(reversed(STEPS)))))
    assert [s.name for s in feats.ORDER] != [s.name for s in order(STEPS)]
    assert feats.compute(window, MAIN) == listed
    assert sum(v is not None for v in listed.values()) > 40  # 52: stacks, threads, process, system, GPUs and the hook

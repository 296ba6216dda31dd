"""How the families' steps are put in order: each step says which features it makes and which it
reads, and :func:`order` runs every maker of a feature before every reader of it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from torchwatch.analysis.features.catalogue import Features
from torchwatch.analysis.store import Window


@dataclass(frozen=True)
class Step:
    """One computation of a feature family.

    Attributes:
        name: a short name for messages (``"stacks"``, ``"cpu_wait"``).
        run: ``(window, main_pid, features so far) -> features it makes``; it reads only the
            names in :attr:`needs` from the third argument, and returns only names in
            :attr:`gives` (``tests/unit/test_feature_steps.py`` holds every step to both).
        gives: the features it makes (a name it also reads is one it corrects: it runs after
            the other makers of that name, and its value wins).
        needs: the features it reads from those of the steps before it.
    """

    name: str
    run: Callable[[Window, int | None, Features], Features]
    gives: frozenset[str]
    needs: frozenset[str] = frozenset()


def step(
    name: str,
    run: Callable[[Window, int | None, Features], Features],
    gives: Iterable[str],
    needs: Iterable[str] = (),
) -> Step:
    """A :class:`Step` from any iterables of names."""
    return Step(name, run, frozenset(gives), frozenset(needs))


def order(steps: Sequence[Step]) -> tuple[Step, ...]:
    """``steps`` so that every step runs after each other step that makes a feature it reads;
    among steps free to run, the one listed first.

    The result does not depend on the listing: two steps that make the same feature must have
    one of them read it (the corrector, which then runs last), and every feature read is made.

    Raises:
        ValueError: a feature read that no step makes, two steps that make one feature without
            either reading it (which value wins would depend on the listing), two correctors of
            one feature, or a cycle.
    """
    makers: dict[str, list[Step]] = {}
    for s in steps:
        for name in s.gives:
            makers.setdefault(name, []).append(s)
    for s in steps:
        for name in sorted(s.needs):
            if not [m for m in makers.get(name, []) if m is not s]:
                raise ValueError(f"feature step {s.name!r} reads {name!r}, which no other step makes")
    for name, ms in makers.items():
        readers = [m for m in ms if name in m.needs]
        if len(ms) > 1 and len(readers) != 1:
            raise ValueError(
                f"feature {name!r} is made by steps {', '.join(m.name for m in ms)}: exactly one of them "
                "must read it (the one that corrects it)"
            )
    before: dict[str, set[str]] = {
        s.name: {m.name for name in s.needs for m in makers.get(name, []) if m is not s} for s in steps
    }
    done: list[Step] = []
    left = list(steps)
    while left:
        ready = next((s for s in left if before[s.name] <= {d.name for d in done}), None)
        if ready is None:
            raise ValueError(f"feature steps read each other's features in a cycle: {', '.join(s.name for s in left)}")
        done.append(ready)
        left.remove(ready)
    return tuple(done)

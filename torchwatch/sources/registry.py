"""The sources a session runs, in one list: :data:`SOURCES` (each source's :class:`SourceSpec`).

The session builds them (:class:`SourceSet`), the cadence paces them
(:func:`torchwatch.watch.cadence.fast_cadence`) and ``why_missing`` blames their statuses
(:func:`feature_sources`), all by iterating :data:`SOURCES`; none of them names a source. The
store needs no list: a reading's type declares its kind (``STORE_KIND``). A new source is a
module with its class and its ``SPEC``, and one line here (docs/architecture.md, "Adding to it").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from torchwatch.model.readings import SourceStatus
from torchwatch.sources import AnySource, Pace, SourceContext, SourceSpec, hook, memory, nvml, proc, pyspy

_T = TypeVar("_T")

# In this order: the report's ``sources`` object lists them so, and they are closed so.
SOURCES: list[SourceSpec[Any]] = [proc.SPEC, proc.THREADS_SPEC, pyspy.SPEC, hook.SPEC, memory.SPEC, nvml.SPEC]


def feature_sources() -> dict[str, str]:
    """``{feature-source word: source name}`` of :data:`SOURCES`: whose status a feature of
    :data:`torchwatch.analysis.features.CATALOGUE` with that word is blamed on. A word no spec
    claims names a status itself (NVML's ``gpm``)."""
    return {word: spec.name for spec in SOURCES for word in spec.words}


class SourceSet:
    """The sources of one session, built from :data:`SOURCES` (those whose factory returns one), in its order.

    Args:
        ctx: what the factories are given.

    Attributes:
        entries: ``(spec, source)`` of each source built.
        tree_source: the source that reads the watched tree (spec role ``"tree"``): its ``cpu_pct``
            (``{pid: % of one core}``) picks the focus, its ``gone`` status is the target's exit.
        channel: the source that reads the training's hook (spec role ``"channel"``): its
            ``reader(pid)`` asks for bursts and trials, its ``status`` and ``expected`` say whether
            it has published yet.
    """

    def __init__(self, ctx: SourceContext) -> None:
        self.entries: list[tuple[SourceSpec[Any], AnySource]] = []
        for spec in SOURCES:
            src = spec.make(ctx)
            if src is not None:
                self.entries.append((spec, src))
        self.tree_source: proc.ProcSource = self._role("tree", proc.ProcSource)
        self.channel: hook.HookSource = self._role("channel", hook.HookSource)

    def _role(self, role: str, kind: type[_T]) -> _T:
        src = next(s for spec, s in self.entries if spec.role == role)
        assert isinstance(src, kind), f"the {role} source is a {type(src).__name__}, not a {kind.__name__}"
        return src

    @property
    def all(self) -> list[AnySource]:
        """Every source, in :data:`SOURCES`'s order."""
        return [src for _, src in self.entries]

    def get(self, name: str) -> AnySource | None:
        """The source named ``name`` (``None``: none built of that name)."""
        return next((src for spec, src in self.entries if spec.name == name), None)

    def spec(self, src: AnySource) -> SourceSpec[Any]:
        """The spec ``src`` was built from."""
        return next(spec for spec, s in self.entries if s is src)

    def ticked(self) -> list[AnySource]:
        """The sources read on the session's tick thread."""
        return [src for spec, src in self.entries if spec.ticked]

    def threaded(self) -> list[AnySource]:
        """The sources each on a thread of its own (their ``sample()`` blocks)."""
        return [src for spec, src in self.entries if not spec.ticked]

    def last_round(self) -> list[AnySource]:
        """The sources read once more after the target exited."""
        return [src for spec, src in self.entries if spec.last_round]

    def statuses(self) -> dict[str, SourceStatus]:
        """``{name: status}`` of every source, each followed by the statuses it reports beside its own."""
        out: dict[str, SourceStatus] = {}
        for spec, src in self.entries:
            out[src.name] = src.status
            if spec.statuses is not None:
                out.update(spec.statuses(src))
        return out

    def helper_cpu_s(self) -> float:
        """CPU seconds the sources' helper processes used so far (py-spy's runs)."""
        return sum(spec.helper_cpu_s(src) for spec, src in self.entries if spec.helper_cpu_s is not None)

    def pending(self) -> set[str]:
        """What the verdict still waits for from the sources (``"stacks"``, ``"hook"``)."""
        out: set[str] = set()
        for spec, src in self.entries:
            what = spec.pending(src) if spec.pending is not None else None
            if what is not None:
                out.add(what)
        return out

    def reads_kernel_log(self) -> bool:
        """Whether a source reads the kernel's OOM kills."""
        return any(spec.kernel_log(src) for spec, src in self.entries if spec.kernel_log is not None)

    def apply(self, paces: Mapping[str, Pace]) -> None:
        """Set each paced source's pace (``{source name: pace}``, a cadence's)."""
        for spec, src in self.entries:
            if spec.apply is not None and spec.name in paces:
                spec.apply(src, paces[spec.name])

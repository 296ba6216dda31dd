"""What ``torch.compile`` did in the training (:class:`CompileInfo`) and its events in the user's
words (:class:`CompileEvent`: recompiles, graph breaks, the recompile limit), as ``hook.json``
carries them (written by :mod:`torchwatch.hook.compiled`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import _TIME_MAX, _U63, NAME, TEXT, WireError, _number, _Obj

__all__ = [
    "COMPILE_CAUSES",
    "COMPILE_KINDS",
    "MAX_COMPILE_EVENTS",
    "MAX_COMPILE_SPANS",
    "PATH",
    "CompileEvent",
    "CompileInfo",
]


COMPILE_KINDS = ("recompile", "graph_break", "cache_limit")
"""What a compile event is: a frame compiled again because a guard failed, a graph break (the
frame runs in pieces, the code between them eagerly), or a frame that hit the recompile limit
(torch runs it eagerly from then on)."""

COMPILE_CAUSES = (
    "shape",
    "dtype",
    "device",
    "stride",
    "requires_grad",
    "tensor",
    "value",
    "length",
    "type",
    "object",
    "training",
    "global_state",
    "freed",
    "item",
    "print",
    "data_dependent",
    "unsupported",
    "other",
)
"""Why, in one word: the guard that failed (``shape`` of a tensor, ``value`` of a Python scalar,
``training`` flag, ...) or what broke the graph (``item``, ``print``, ``data_dependent``, ...)."""

MAX_COMPILE_EVENTS = 8  # distinct events kept, the most recent
MAX_COMPILE_SPANS = 32  # compile intervals kept, the most recent
PATH = 1024  # file paths in compile events


@dataclass(frozen=True)
class CompileEvent:
    """One compile event, in the user's words (:func:`torchwatch.hook.compiled.guard_words`).

    Attributes:
        kind: one of :data:`COMPILE_KINDS`. cause: one of :data:`COMPILE_CAUSES`.
        words: what happened, e.g. ``shape of x changed 32→17 (dim 0)``.
        reason: torch's own reason (the failed guard, or the graph break's first line), clipped.
        hint: torch's hint for a graph break (``Hint:`` line), when it gives one.
        file / line: where in the user's code: the call of the compiled code that recompiled, or
            the line that broke the graph; ``None`` when not found.
        code: that line's source, stripped. function: the compiled function's name.
        count: times seen (events of one kind, cause, place and words are one).
        t: when last seen, monotonic s (the compile's start when known).
    """

    kind: str
    cause: str
    words: str
    reason: str = ""
    hint: str | None = None
    file: str | None = None
    line: int | None = None
    code: str | None = None
    function: str | None = None
    count: int = 1
    t: float = 0.0

    @property
    def where(self) -> str | None:
        """``train.py:88`` (the file's name and the line), ``None`` when not known."""
        if self.file is None:
            return None
        name = self.file.rsplit("/", 1)[-1]
        return name if self.line is None else f"{name}:{self.line}"

    @classmethod
    def decode(cls, value: object, where: str) -> CompileEvent:
        """Raises: WireError."""
        o = _Obj(value, where)
        return cls(
            kind=o.text("kind", 16, choices=COMPILE_KINDS),
            cause=o.text("cause", 16, choices=COMPILE_CAUSES),
            words=o.text("words", TEXT),
            reason=o.text("reason", TEXT, optional=True) or "",
            hint=o.text("hint", TEXT, optional=True),
            file=o.text("file", PATH, optional=True),
            line=o.integer("line", 0, 1 << 31, optional=True),
            code=o.text("code", NAME, optional=True),
            function=o.text("function", NAME, optional=True),
            count=o.integer("count", 1, _U63),
            t=o.number("t", 0.0, _TIME_MAX),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class CompileInfo:
    """What ``torch.compile`` did in the training, read from what torch keeps (no ``TORCH_LOGS``):
    ``torch._dynamo.utils.counters``, its compilation metrics and graph-break reasons.

    Attributes:
        frames: frames compiled (``counters["frames"]["ok"]``). graphs: graphs made
            (``counters["stats"]["unique_graphs"]``).
        recompiles: compiles of a frame already compiled (a guard failed), so far.
        graph_breaks: graph breaks met while compiling, so far (a break is met once per compile,
            then costs every step that runs that code).
        cache_limit_hits: frames that hit the recompile limit: torch runs them eagerly from then on.
        compile_s: seconds spent compiling so far (forward and backward graphs).
        spans: the last :data:`MAX_COMPILE_SPANS` compile intervals, ``(start, end)`` monotonic s:
            a step that overlaps one is a step that compiled.
        events: the last :data:`MAX_COMPILE_EVENTS` distinct events, oldest first.
        recompile_limit: ``torch._dynamo.config.recompile_limit`` (``cache_size_limit`` before
            torch 2.6), ``None`` when not read.
        t: when the hook read all this, monotonic s.
    """

    frames: int = 0
    graphs: int = 0
    recompiles: int = 0
    graph_breaks: int = 0
    cache_limit_hits: int = 0
    compile_s: float = 0.0
    spans: tuple[tuple[float, float], ...] = ()
    events: tuple[CompileEvent, ...] = ()
    recompile_limit: int | None = None
    t: float = 0.0

    @classmethod
    def decode(cls, value: object, where: str) -> CompileInfo:
        """Raises: WireError."""
        o = _Obj(value, where)
        spans = []
        for v, w in o.items("spans", MAX_COMPILE_SPANS):
            if not isinstance(v, list) or len(v) != 2:
                raise WireError(f"{w}: expected [start, end]")
            t0, t1 = (_number(x, 0.0, _TIME_MAX, w) for x in v)
            if t1 < t0:
                raise WireError(f"{w}: ends before it starts")
            spans.append((t0, t1))
        return cls(
            frames=o.integer("frames", 0, _U63),
            graphs=o.integer("graphs", 0, _U63),
            recompiles=o.integer("recompiles", 0, _U63),
            graph_breaks=o.integer("graph_breaks", 0, _U63),
            cache_limit_hits=o.integer("cache_limit_hits", 0, _U63),
            compile_s=o.number("compile_s", 0.0, _TIME_MAX),
            spans=tuple(spans),
            events=tuple(CompileEvent.decode(v, w) for v, w in o.items("events", MAX_COMPILE_EVENTS)),
            recompile_limit=o.integer("recompile_limit", 0, _U63, optional=True),
            t=o.number("t", 0.0, _TIME_MAX),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object (``spans`` as ``[[start, end], ...]``)."""
        out = dict(self.__dict__)
        out["spans"] = [list(s) for s in self.spans]
        out["events"] = [e.to_json() for e in self.events]
        return out

"""Sources: one module per external system, and the only place that system is imported.

A source is polled by its own sampler thread (see :mod:`torchwatch.watch.session`). ``sample()``
may block (py-spy blocks for one recording chunk); it returns readings and never raises
for a target that exited or a missing library: it sets ``status`` instead. A source that reads
one training process (py-spy, the hook) is a :class:`FocusedSource`: the session hands it the
focus process with each call, it never asks the session for it.

Each source declares what the session, the store, the cadence and ``why_missing`` need of it in
one :class:`SourceSpec` beside its class (``SPEC`` in its module); :data:`torchwatch.sources.registry.SOURCES`
lists them, and those parts iterate that list (docs/architecture.md, "Adding to it: a source").
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from torchwatch.model.readings import SourceStatus

if TYPE_CHECKING:
    from torchwatch.sources.proc import ProcessTree


class Source(Protocol):
    """What the session needs from a source.

    Attributes:
        name: key in the report's ``sources`` object (``psutil``, ``nvml``, ``py-spy``, ``hook``).
        interval: seconds between the starts of two ``sample()`` calls.
        status: the current :class:`SourceStatus`.
    """

    name: str
    interval: float
    status: SourceStatus

    def sample(self, now: float) -> Sequence[object]:
        """Take one round of readings stamped ``now`` (``time.monotonic()`` seconds)."""
        ...

    def close(self) -> None:
        """Release what the source holds (subprocesses, library handles). Idempotent."""
        ...


class FocusedSource(abc.ABC):
    """A source that reads the one training process the session diagnoses (py-spy, the hook).

    A class, not a protocol, so that the session tells the two kinds apart with ``isinstance``.

    Attributes:
        name, interval, status: as :class:`Source`.
    """

    name: str
    interval: float
    status: SourceStatus

    @abc.abstractmethod
    def sample(self, now: float, focus: int | None) -> Sequence[object]:
        """Take one round of readings stamped ``now`` (``time.monotonic()`` seconds) of ``focus``,
        the PID of the training process the session diagnoses at this moment (``None``: none
        found yet: no reading of it)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the source holds. Idempotent."""


AnySource = Source | FocusedSource
S = TypeVar("S", bound=AnySource)

# One source's rates in one cadence mode: {knob: value}, e.g. {"interval_s": 1.0}; its knobs are its
# own (py-spy's "rate" in Hz and "chunk_s" in s), read by its spec's ``apply``.
Pace = Mapping[str, float]


class SourceOptions(Protocol):
    """The session's options a source's factory reads (:class:`torchwatch.watch.options.SessionOptions`).

    Attributes:
        pyspy_rate: py-spy samples per second per thread. pyspy_chunk_s: seconds per py-spy run.
        thread_interval_s: seconds between two rounds of thread states.
        nvml: read GPUs through NVML at all. kernel_log: read OOM kills from ``/dev/kmsg``.
        hook_expected: the hook was pre-loaded. hook_boot_note: where its boot says why it failed.
    """

    @property
    def pyspy_rate(self) -> int: ...
    @property
    def pyspy_chunk_s(self) -> float: ...
    @property
    def thread_interval_s(self) -> float: ...
    @property
    def nvml(self) -> bool: ...
    @property
    def hook_expected(self) -> bool: ...
    @property
    def hook_boot_note(self) -> Path | None: ...
    @property
    def kernel_log(self) -> bool: ...


@dataclass(frozen=True)
class SourceContext:
    """What a source's factory is given by the session.

    Attributes:
        tree: the watched process tree.
        options: the session's options.
        focus: the PID of the training process diagnosed now (``None``: none yet); call it when reading.
    """

    tree: ProcessTree
    options: SourceOptions
    focus: Callable[[], int | None]


@dataclass(frozen=True)
class SourceSpec(Generic[S]):
    """What a source is to the session, the store, the cadence and ``why_missing``.

    Attributes:
        name: the source's ``name``: its key in the report's ``sources``, its thread's name and its
            key in a :class:`~torchwatch.watch.cadence.Cadence`.
        readings: the reading types it returns (each declares its store list, ``STORE_KIND``).
        make: builds it for a session; ``None``: off for these options (NVML with ``--no-nvml``).
        ticked: read on the session's tick thread (quick reads); ``False``: a thread of its own
            (``sample()`` blocks: a py-spy chunk, the GPU driver).
        words: the feature-source words of :data:`torchwatch.analysis.features.CATALOGUE` whose
            features it reads (``why_missing`` blames its status for them).
        fast: its :data:`Pace` in the fast cadence, of the session's options (``None``: not paced).
        steady: its steady pace, of its fast pace and the verdict's window (s); never faster.
        apply: sets a pace on it (the session's cadence changed).
        statuses: more ``{name: status}`` it reports beside its own (NVML's ``gpm``).
        helper_cpu_s: CPU seconds its helper processes used so far (py-spy's runs).
        pending: what the verdict still waits for from it (``"stacks"``, ``"hook"``), or ``None``.
        last_round: read once more after the target exited, before the report (the kernel log).
        final_unavailable: once unavailable it never comes back: its thread ends.
        kernel_log: whether it reads the kernel's OOM kills.
        role: ``"tree"``: it reads the watched tree (its ``gone`` status is the target's exit, its
            ``cpu_pct`` picks the focus); ``"channel"``: it reads the training's hook (bursts, trials);
            ``""``: neither.
    """

    name: str
    readings: tuple[type, ...]
    make: Callable[[SourceContext], S | None]
    ticked: bool
    words: tuple[str, ...] = ()
    fast: Callable[[SourceOptions], Pace] | None = None
    steady: Callable[[Pace, float], Pace] | None = None
    apply: Callable[[S, Pace], None] | None = None
    statuses: Callable[[S], Mapping[str, SourceStatus]] | None = None
    helper_cpu_s: Callable[[S], float] | None = None
    pending: Callable[[S], str | None] | None = None
    last_round: bool = False
    final_unavailable: bool = False
    kernel_log: Callable[[S], bool] | None = None
    role: str = ""


def set_interval(src: AnySource, pace: Pace) -> None:
    """The ``apply`` of a source paced by one knob, ``interval_s`` (s between two reads)."""
    src.interval = pace["interval_s"]

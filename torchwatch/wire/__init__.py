"""The hook channel: what the in-process hook writes and torchwatch reads. Standard library only.

The hook (:mod:`torchwatch.hook`) runs inside the user's training; torchwatch, the reader, runs
beside it, often as root. Both import this package, so writer and reader agree by construction;
it imports nothing but the standard library (no psutil, no torch), so it loads in any training.

Files, one directory per hooked process instance (:mod:`~torchwatch.wire.files`)::

    <base>/                      $TORCHWATCH_DIR, else $TMPDIR/torchwatch-<uid> (/tmp without TMPDIR)
        <pid>-<start>-<pidns>/   one per hooked process instance (Instance), 0700, made by the hook
            hook.json            the hook writes (HookRecord), torchwatch reads; 0600
            counters             the hook updates in place through mmap (Counters), torchwatch reads
                                 (read_counters); fixed binary layout (HEADER, a ring of RING steps); 0600
            request.json         torchwatch writes before its signal (BurstRequest, or a TrialRequest with
                                 "kind": "trial", or a TrialStop), the hook reads, decodes once into a
                                 typed Request (decode_request) and removes; 0644

A burst or a trial is asked with a signal (:mod:`~torchwatch.wire.signals`: SIGUSR1, SIGUSR2 or a
real-time signal, never one that stops a process) after ``request.json`` is in place. No network
port is opened in the training.

Sections (each a module of this package, none over 400 lines):

- ``base``: :class:`WireError`, :func:`clean_text`, the strict decoder and the limits;
- ``signals``: the burst signals; ``identity``: the process instance (:class:`Instance`) and its
  directory name;
- ``records``: ``hook.json`` (:class:`HookRecord`), made of ``loader`` (:class:`LoaderInfo`),
  ``burst`` (:class:`BurstState`, :class:`BurstResult`), ``gpu`` (:class:`DeviceMemory`,
  :class:`OomRecord`, :class:`GpuSettings`), ``ranks`` (:class:`RankInfo`), ``compile``
  (:class:`CompileInfo`), ``cpus`` (:class:`ThreadSettings`, and the usable CPUs both sides read)
  ``trial`` (:class:`TrialState`) and ``progress`` (:class:`ProgressInfo`: epoch, batch, loss);
- ``request``: ``request.json`` decoded into one typed :data:`Request` (the burst's bounds, a
  trial, its end); ``trial`` and ``settings``: the live trial's request, state, statistics and
  the settings it may change, each ``SETTING=VALUE`` checked by one :func:`check_trial`;
- ``counters``: the ``counters`` layout and its decoder; ``counterfile``: its writer and reader;
- ``files``: the directory, its files and how both sides open, write and remove them safely;
  ``roots``: reaching them from outside a training in another mount namespace (a container);
- ``roles``: the launchers and helper processes that are not the training.

Other parts import names from ``torchwatch.wire`` (this module re-exports each section's
``__all__``); the sections import each other, never this module.

Versioning: fields added to ``hook.json`` are optional (a reader of the same schema that does not
know them ignores them), so its schema stays :data:`SCHEMA` (``torchwatch.hook/2``); a field is
never renamed nor given another meaning without a new schema, which the reader refuses with a
one-line :class:`WireError`. The ``counters`` layout is versioned on its own
(:data:`COUNTERS_VERSION`, 3 since the per-rank fields): a reader of another version refuses the
file. ``request.json`` values are clamped to safe ranges when read (a burst's) or refused (a
trial's), and a request without ``"kind"`` is a burst's. The hook runs its own ``hook.json``
through the reader's decoder before writing it, so it never publishes what torchwatch would refuse.
"""

from __future__ import annotations

from . import (
    base,
    burst,
    compile,
    counterfile,
    counters,
    cpus,
    files,
    gpu,
    identity,
    loader,
    progress,
    ranks,
    records,
    request,
    roles,
    roots,
    settings,
    signals,
    trial,
)
from .base import *
from .burst import *
from .compile import *
from .counterfile import *
from .counters import *
from .cpus import *
from .files import *
from .gpu import *
from .identity import *
from .loader import *
from .progress import *
from .ranks import *
from .records import *
from .request import *
from .roles import *
from .roots import *
from .settings import *
from .signals import *
from .trial import *

__all__ = [
    *base.__all__,
    *burst.__all__,
    *compile.__all__,
    *counterfile.__all__,
    *counters.__all__,
    *cpus.__all__,
    *files.__all__,
    *gpu.__all__,
    *identity.__all__,
    *loader.__all__,
    *progress.__all__,
    *ranks.__all__,
    *records.__all__,
    *request.__all__,
    *roles.__all__,
    *roots.__all__,
    *settings.__all__,
    *signals.__all__,
    *trial.__all__,
]

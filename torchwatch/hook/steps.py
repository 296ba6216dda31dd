"""Step boundaries and DataLoader records: the hook's hot path (:class:`StepClock`,
:class:`LoaderWatch`, mixed into :class:`torchwatch.hook.runtime.Hook`).

The wrappers of :mod:`torchwatch.hook.patches` and the optimizer step post hook call these
methods in the training's main thread: each catches its own errors (recorded with
``error``), none raises into the user's code. At a step boundary, at most every 0.5 s, the GPU
settings, device memory, torch.compile's counters and the intra-op threads are read
(:meth:`StepClock._boundary`); ``hook.json`` is rewritten on rare events only.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import wire
from . import patches
from .burst import BurstParams
from .cpus import read_threads
from .progress import EpochWatch, UpdateWatch, progress_info

if TYPE_CHECKING:
    from .burst import Burster
    from .compiled import CompileWatch
    from .gpu import GpuWatch
    from .oom import OomWatch
    from .progress import LossWatch
    from .trial import Trials

__all__ = ["BACKWARD_DECIDE_CALLS", "BACKWARD_DECIDE_S", "MAX_LOADERS", "STEP_SOURCE_RULE", "LoaderWatch", "StepClock"]

MAX_LOADERS = 8  # DataLoaders whose settings are kept (train, val, ...)
PROGRESS_EVERY_S = 2.0  # hook.json is rewritten at most this often for the epoch and loss alone (0.9 ms each)

BACKWARD_DECIDE_CALLS = 64
BACKWARD_DECIDE_S = 10.0

STEP_SOURCE_RULE = f"""Where step boundaries come from. An optimizer step (any ``torch.optim.Optimizer``)
is a step boundary, always, and once one is seen nothing else is. Before that, the end of each
backward pass of the main thread is one when no optimizer was created in the process (a loop
that updates its parameters by hand, as ``pytorch/examples``' word_language_model does), or
when one was but has not stepped in the first {BACKWARD_DECIDE_CALLS} backward passes and
{BACKWARD_DECIDE_S:g} s (an optimizer that is never stepped). So gradient accumulation with
an optimizer keeps optimizer steps. A loop whose first optimizer step comes later than that
switches from backward passes to optimizer steps once, at that step (the step source says so)."""


def _batch_bytes(batch: Any, torch: Any, depth: int = 0, budget: list[int] | None = None) -> int:
    """Bytes of the tensors in a batch (tuples, lists, dicts nested up to 4 deep, 1000 items)."""
    budget = [1000] if budget is None else budget
    if budget[0] <= 0 or depth > 4:
        return 0
    budget[0] -= 1
    if isinstance(batch, torch.Tensor):
        return int(batch.element_size() * batch.nelement())
    if isinstance(batch, dict):
        return sum(_batch_bytes(v, torch, depth + 1, budget) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(_batch_bytes(v, torch, depth + 1, budget) for v in batch)
    return 0


def _count(value: object, hi: int = 1 << 62) -> int | None:
    """``value`` when it is an int in ``0..hi`` (not a bool), else ``None``."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= hi else None


def _name(value: object, limit: int = wire.NAME) -> str:
    """``value`` as one line of text, at most ``limit`` characters."""
    return wire.clean_text(value if isinstance(value, str) else str(value), limit)


def _loader_settings(loader: Any) -> dict[str, Any]:
    """The DataLoader's settings as the user passed them (the iterator's own ``_pin_memory`` is
    False on a CPU-only machine even when the user asked for pinning), in the types of
    :class:`wire.LoaderInfo`."""
    ctx = getattr(loader, "multiprocessing_context", None)
    ctx_name = getattr(ctx, "_name", None) if ctx is not None else None
    collate = getattr(loader, "collate_fn", None)
    return {
        "num_workers": _count(getattr(loader, "num_workers", 0), 1 << 16) or 0,
        "batch_size": _count(getattr(loader, "batch_size", None)),
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "prefetch_factor": _count(getattr(loader, "prefetch_factor", None), 1 << 20),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "drop_last": bool(getattr(loader, "drop_last", False)),
        "multiprocessing_context": None if ctx_name is None else _name(ctx_name, 32),
        "dataset": _name(type(getattr(loader, "dataset", None)).__name__),
        "collate_fn": _name(getattr(collate, "__name__", type(collate).__name__)),
    }


class _LoaderRecord:
    """One DataLoader: its settings as passed, batches, data wait (s), batch bytes, epochs."""

    __slots__ = ("batch_bytes", "batches", "epochs", "key", "ref", "settings", "standin_of", "wait_s")

    def __init__(self, key: int, settings: dict[str, Any], loader: Any = None) -> None:
        self.key = key
        self.ref: Callable[[], Any] = lambda: None  # the loader, weakly (a live trial changes its iterators)
        with contextlib.suppress(TypeError):
            self.ref = weakref.ref(loader)
        self.settings = settings
        self.batches = 0
        self.wait_s = 0.0
        self.batch_bytes: int | None = None
        self.epochs = EpochWatch()
        # A stand-in's (an iterator made before a live install, its DataLoader not found): the
        # id of the dataset it iterates, kept alive by the stand-in (hook/live.py); 0 otherwise.
        self.standin_of = 0

    def info(self) -> wire.LoaderInfo:
        """The record as ``hook.json`` holds it."""
        return wire.LoaderInfo(
            **self.settings, batches=self.batches, wait_s=round(self.wait_s, 4), batch_bytes=_count(self.batch_bytes)
        )


class StepClock:
    """Where steps end (:data:`STEP_SOURCE_RULE`) and what each step held: its data wait, backward
    time (and the part of it blocked), collective time; what runs at a boundary (a trial's block,
    a burst's step, the every-0.5-s reads). State set by :meth:`_init_steps`."""

    step_source: str
    _main_ident: int | None
    _step_opt: weakref.ref[Any] | None
    _last_step_t: float
    _last_check: float
    _wait_since_step: float
    _bw_since_step: float
    _bw_blocked_since_step: float
    _comm_since_step: float
    _in_backward: bool
    _in_comm: bool
    _optimizer_made: bool
    _first_backward_t: float
    _undecided_calls: int
    _identity_refreshed: bool
    if TYPE_CHECKING:  # the hook's, used here (runtime.Hook, LoaderWatch, requests.Requests)
        torch: Any
        counters: wire.Counters | None
        burster: Burster | None
        trials: Trials | None
        burst_at: tuple[int, ...]
        gpu: GpuWatch
        compile: CompileWatch
        oom: OomWatch
        threads: wire.ThreadSettings | None
        loss: LossWatch
        updates: UpdateWatch
        _progress_due: float

        def publish(self) -> None: ...
        def error(self, message: str) -> None: ...
        def _check_signal(self) -> bool: ...
        def _publish_progress(self, moved: bool = False) -> None: ...

    def _init_steps(self) -> None:
        self.step_source = ""
        self._main_ident = threading.main_thread().ident
        self._step_opt = None
        self._last_step_t = 0.0
        self._last_check = 0.0
        self._wait_since_step = 0.0
        self._bw_since_step = 0.0
        self._bw_blocked_since_step = 0.0
        self._comm_since_step = 0.0
        self._in_backward = False
        self._in_comm = False
        self._optimizer_made = False
        self._first_backward_t = 0.0
        self._undecided_calls = 0
        self._identity_refreshed = False

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not patches._active:
            return
        try:
            tracked = self._step_opt() if self._step_opt is not None else None
            if tracked is None:
                self._step_opt = weakref.ref(optimizer)
            elif tracked is not optimizer:
                return  # a second optimizer in the same iteration (GAN, ...): one step per iteration
            now = time.monotonic()
            if self.step_source != "optimizer":
                switched = self.step_source == "backward"
                self._set_step_source("optimizer")
                if switched:
                    # The last boundary was this iteration's backward pass: this step would be
                    # the optimizer's few ms. Start counting from here instead.
                    self._last_step_t = now
                    self._reset_step_times()
                    return
            self._boundary(now)
        except Exception as exc:
            self.error(f"step hook: {exc!r}")

    def _reset_step_times(self) -> None:
        self._wait_since_step = 0.0
        self._bw_since_step = 0.0
        self._bw_blocked_since_step = 0.0
        self._comm_since_step = 0.0

    def _boundary(self, now: float) -> None:
        """A step ended at ``now`` (an optimizer step, or a backward pass: :attr:`step_source`)."""
        counters = self.counters
        if counters is None:
            return
        duration = now - self._last_step_t if self._last_step_t else None
        bw, blocked, comm = self._bw_since_step, self._bw_blocked_since_step, self._comm_since_step
        counters.step(now, duration, self._wait_since_step, bw, blocked, comm)
        self._reset_step_times()
        self._last_step_t = now
        trials = self.trials
        trying = trials is not None and trials.active
        if trying:
            assert trials is not None
            trials.on_step(now, duration, counters.steps)
        burster = self.burster
        if burster is not None and not trying:
            if burster.wants_steps:
                burster.on_step(now, counters.steps)
                # Starting or stepping the profiler is our cost, not the next step's: the next
                # step starts when it is done (so it lines up with the trace's ProfilerStep span).
                self._last_step_t = time.monotonic()
            elif self.burst_at and counters.steps in self.burst_at:
                burster.request(BurstParams(), now, True, "scheduled")
        if now - self._last_check > 1.0:
            self._last_check = now
            self._check_signal()
        if now >= self._progress_due:
            self._progress_due = now + PROGRESS_EVERY_S
            moved = False
            if self.step_source == "optimizer" and self._step_opt is not None:
                try:
                    moved = self.updates.sample(self._step_opt(), counters.steps, now)
                except Exception as exc:
                    self.updates.off = True
                    self.error(f"optimizer update check: {exc!r}")
            self._publish_progress(moved)
        if not self._identity_refreshed:
            # a torch.multiprocessing.spawn rank knows its index only once its function runs
            self._identity_refreshed = True
            self.publish()
        if self.gpu.due(now):
            optimizer = self._step_opt() if self._step_opt is not None else None
            threads = read_threads(self.torch)
            moved, self.threads = threads != self.threads, threads
            compiled = self.compile.read(now)
            changed = self.gpu.sample(self.torch, optimizer, now) or moved or compiled
            if not self.oom.attached and self.gpu.memory is not None:
                # CUDA is initialised (the training did it). A torch without the observer is not
                # an error of the hook: an uncaught error is still recorded at exit (OomWatch.at_exit).
                self.oom.attach(self.torch)
            if changed:
                for err in (self.gpu.error, self.compile.error):
                    if err:
                        self.error(err)
                self.publish()

    def _set_step_source(self, source: str) -> None:
        self.step_source = source
        if self.counters is not None:
            self.counters.set_step_source(source)
        self.publish()

    def _write(self, what: str, write: Any, *args: float) -> None:
        """``write(counters, *args)`` (a :class:`wire.Counters` method); a failure (a closed
        mapping at exit) becomes an error of the ``what`` wrapper, never the training's."""
        counters = self.counters
        if counters is not None:
            try:
                write(counters, *args)
            except Exception as exc:
                self.error(f"{what} wrapper: {exc!r}")

    def backward_started(self, t0: float) -> None:
        """The main thread entered ``torch.autograd.backward`` at ``t0`` (monotonic s)."""
        self._in_backward = True
        self._write("backward", wire.Counters.backward_started, t0)

    def backward_aborted(self) -> None:
        """The backward pass raised: neither a step nor a backward pass to count."""
        self._in_backward = False
        with contextlib.suppress(Exception):
            if self.counters is not None:
                self.counters.backward_ended(0.0, 0.0)

    def backward_ended(self, t0: float, t1: float, cpu: float) -> None:
        """The backward pass begun at ``t0`` ended at ``t1`` (monotonic s) after ``cpu`` s of the
        main thread's CPU time."""
        self._in_backward = False
        try:
            wall = t1 - t0
            blocked = wall - cpu if wall > cpu else 0.0
            self._bw_since_step += wall
            self._bw_blocked_since_step += blocked
            boundary = self._backward_is_boundary(t1)
            counters = self.counters
            if counters is not None:
                counters.backward_ended(wall, blocked, flush=not boundary)
            if boundary:
                self._boundary(t1)
        except Exception as exc:
            self.error(f"backward wrapper: {exc!r}")

    def _backward_is_boundary(self, t: float) -> bool:
        """Whether the backward pass that ended at ``t`` ends a step (:data:`STEP_SOURCE_RULE`)."""
        if self.step_source:
            return self.step_source == "backward"
        self._undecided_calls += 1
        if not self._first_backward_t:
            self._first_backward_t = t
        if not self._optimizer_made or (
            self._undecided_calls >= BACKWARD_DECIDE_CALLS and t - self._first_backward_t >= BACKWARD_DECIDE_S
        ):
            self._set_step_source("backward")
            # the data wait and backward time before this first boundary belong to no step
            self._reset_step_times()
            return True
        return False

    def read_loss(self, args: tuple[Any, ...], kwargs: dict[str, Any], t0: float) -> None:
        """A reading of the loss ``backward(*args, **kwargs)`` is called on (:class:`LossWatch`);
        a first NaN/inf is published at once. Never raises: a failure turns loss reading off for
        a minute and is recorded."""
        try:
            counters = self.counters
            step = (counters.steps if counters is not None else 0) + 1
            if self.loss.read(self.torch, args, kwargs, step, t0):
                self.publish()
        except Exception as exc:
            self.loss.due = t0 + 60.0
            self.error(f"loss reading: {exc!r}")

    def collective_started(self, t0: float) -> None:
        """The main thread entered a collective at ``t0`` (monotonic s)."""
        self._in_comm = True
        self._write("collective", wire.Counters.collective_started, t0)

    def collective_ended(self, waited: float) -> None:
        """The collective returned (or raised) after ``waited`` s."""
        self._in_comm = False
        self._comm_since_step += waited
        self._write("collective", wire.Counters.collective_ended, waited)

    def step_durations(self, n: int) -> list[float]:
        """Durations of the last ``n`` steps, s (oldest first)."""
        snap = self.counters.snapshot() if self.counters is not None else None
        if snap is None or n <= 0:
            return []
        return [e[1] for e in snap.entries[-n:]]

    def _typical_step_s(self) -> float | None:
        """The median duration of the last 9 steps, s (``None`` before a step)."""
        recent = sorted(self.step_durations(9))
        return recent[len(recent) // 2] if recent else None

    def _oom_steps(self) -> tuple[int | None, list[float]]:
        counters = self.counters
        return (None if counters is None else counters.steps), self.step_durations(16)


class LoaderWatch:
    """The DataLoaders' records (at most :data:`MAX_LOADERS`): settings, batches, data wait,
    epochs; the progress (epoch, loss) published from them. State set by :meth:`_init_loaders`."""

    loaders: dict[int, _LoaderRecord]
    adopt_iterator: Callable[[Any], _LoaderRecord] | None
    _progress_due: float
    _progress_shown: tuple[int, int, int]
    if TYPE_CHECKING:  # the hook's, used here
        torch: Any
        counters: wire.Counters | None
        loss: LossWatch
        updates: UpdateWatch
        _wait_since_step: float

        def publish(self) -> None: ...
        def error(self, message: str) -> None: ...

    def _init_loaders(self) -> None:
        self.loaders = {}
        self._progress_due = 0.0
        self._progress_shown = (0, 0, 0)  # (loader key, epoch, batch) published
        # Set by an install into a running training (hook/live.py): finds the record of an
        # iterator made before the install (its first batch only).
        self.adopt_iterator = None

    def on_batch(self, it: Any, t0: float, t1: float, batch: Any) -> None:
        """A batch arrived: ``__next__`` ran from ``t0`` to ``t1`` (monotonic s)."""
        try:
            waited = t1 - t0
            self._wait_since_step += waited
            if self.counters is not None:
                self.counters.next_ended(t1, waited)
            rec = getattr(it, "_torchwatch_loader", None)
            if self.adopt_iterator is not None and (rec is None or self.loaders.get(rec.key) is not rec):
                rec = self.adopt_iterator(it)
            if rec is not None:
                rec.batches += 1
                rec.epochs.batch += 1
                rec.wait_s += waited
                if rec.batch_bytes is None:
                    rec.batch_bytes = _batch_bytes(batch, self.torch)
                    self.publish()
        except Exception as exc:
            self.error(f"DataLoader wrapper: {exc!r}")

    def loader_record(self, loader: Any) -> _LoaderRecord:
        """The record of ``loader`` (created on its first iterator; at most :data:`MAX_LOADERS`)."""
        key = id(loader)
        rec = self.loaders.get(key)
        if rec is None:
            rec = _LoaderRecord(key, _loader_settings(loader), loader)
            self._take_standin(rec, loader)
            if len(self.loaders) >= MAX_LOADERS:
                oldest = min(self.loaders.values(), key=lambda r: r.batches)
                del self.loaders[oldest.key]
            self.loaders[key] = rec
            self.publish()
        return rec

    def _take_standin(self, rec: _LoaderRecord, loader: Any) -> None:
        """The first iterator of ``loader`` since a live install: the stand-in record of its
        iterator made before the install (same dataset) is this loader's; its batches, wait and
        batch size move to ``rec`` and it is dropped, so the loader is one record (its epochs and
        its batches), not two that take turns at being the busiest."""
        try:
            dataset = loader.dataset
        except Exception:
            return
        for old in list(self.loaders.values()):
            if old.standin_of and old.standin_of == id(dataset):
                rec.batches += old.batches
                rec.wait_s += old.wait_s
                rec.batch_bytes = rec.batch_bytes if rec.batch_bytes is not None else old.batch_bytes
                del self.loaders[old.key]

    def epoch_started(self, loader: Any) -> None:
        """``iter(loader)`` was called: a new epoch of that DataLoader. Never raises."""
        try:
            self.loader_record(loader).epochs.started(loader)
        except Exception as exc:
            self.error(f"DataLoader epoch: {exc!r}")

    def epoch_ended(self) -> None:
        """A DataLoader iterator is exhausted: publish the epoch's end (once an epoch; the
        training may stop here, before the next every-2-s rewrite). Never raises."""
        with contextlib.suppress(Exception):
            self._publish_progress()

    def progress(self) -> wire.ProgressInfo | None:
        """The epoch of the busiest DataLoader and the loss readings (``hook.json``'s ``progress``)."""
        key = self._busiest_loader()
        rec = self.loaders.get(key) if key is not None else None
        return progress_info(rec.epochs if rec is not None else None, self.loss, self.updates)

    def _publish_progress(self, moved: bool = False) -> None:
        """Rewrite ``hook.json`` when the epoch, the batch, the loss or (``moved``) the optimizer's
        updates moved (at most every :data:`PROGRESS_EVERY_S`, from the step boundary)."""
        key = self._busiest_loader()
        rec = self.loaders.get(key) if key is not None else None
        shown = (key or 0, rec.epochs.epoch, rec.epochs.batch) if rec is not None else (0, 0, 0)
        if shown != self._progress_shown or self.loss.changed or moved:
            self._progress_shown = shown
            self.loss.changed = False
            self.publish()

    def _loader_object(self, key: int) -> Any:
        """The DataLoader recorded under ``key``, while it is alive (``None`` otherwise)."""
        rec = self.loaders.get(key)
        return rec.ref() if rec is not None else None

    def _busiest_loader(self) -> int | None:
        """The key of the DataLoader that gave the most batches (the training's), ``None`` before one."""
        if not self.loaders:
            return None
        return max(self.loaders.values(), key=lambda r: r.batches).key

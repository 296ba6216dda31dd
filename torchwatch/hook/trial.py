"""A live trial of one setting inside the training (``torchwatch trial PID SETTING=VALUE``).

Runs in the hook, in the main thread only: at step boundaries (:meth:`Trials.on_step`), when a
DataLoader iterator is made (:meth:`Trials.make_iterator`), and from the burst signal's handler
(:meth:`Trials.on_request`, :meth:`Trials.on_interrupt`). The contract (settings, request,
published state, statistics) is :mod:`torchwatch.wire.trial`.

What it guarantees:

- A setting is changed only between two steps (or, for a DataLoader setting, only for the
  iterators the trial makes: the DataLoader's own attributes are set for the call that makes the
  iterator and put back right after it), and only to the trial's value or the training's own.
- The training's value is put back when the trial ends for any reason: decided, ``max_s``
  passed (a timer ends it even if the training stops stepping, with or without torchwatch),
  torchwatch asked (``trial-stop``: it does so when it is stopped by a signal), or the process
  exits. The value is read back after and published (``restored``).
- What it cannot apply or put back safely it refuses, with the reason, before changing anything.
- Nothing raises into the training: every entry point catches its errors, ends the trial
  (``failed``) and puts the old value back where it can.
"""

from __future__ import annotations

import contextlib
import gc
import json
import signal
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from .. import wire
from ..wire import TEXT, WireError, clean_text

TIMER_GRACE_S = 2.0  # after max_s, the timer ends a trial that saw no step boundary


class _Knob:
    """Read and write one steps-mode setting. ``check`` says why a value cannot be tried."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def read(self) -> Any:
        raise NotImplementedError

    def write(self, value: Any) -> None:
        raise NotImplementedError

    def complete(self, value: Any, old: Any) -> Any:
        """The value to write for the request's ``value`` (a partial gc threshold is completed)."""
        return value

    def check(self, value: Any, old: Any) -> str | None:
        return None

    def show(self, value: Any) -> str:
        return wire.show_value(value)


class _Threads(_Knob):
    def read(self) -> Any:
        return int(self.torch.get_num_threads())

    def write(self, value: Any) -> None:
        self.torch.set_num_threads(int(value))


class _GcFreeze(_Knob):
    def read(self) -> Any:
        return gc.get_freeze_count() > 0

    def write(self, value: Any) -> None:
        if value:
            gc.freeze()
        else:
            gc.unfreeze()

    def check(self, value: Any, old: Any) -> str | None:
        if old:
            return (
                f"the training has frozen {gc.get_freeze_count()} objects itself (gc.freeze): the trial's "
                "gc.unfreeze() would thaw them too"
            )
        return None


class _GcThreshold(_Knob):
    def read(self) -> Any:
        return tuple(int(v) for v in gc.get_threshold())

    def write(self, value: Any) -> None:
        gc.set_threshold(*value)

    def complete(self, value: Any, old: Any) -> Any:
        return tuple(value) + tuple(old[len(value) :])


class _Flag(_Knob):
    def __init__(self, torch: Any, owner: Callable[[Any], Any], attr: str) -> None:
        super().__init__(torch)
        self.owner = owner(torch)
        self.attr = attr

    def read(self) -> Any:
        return bool(getattr(self.owner, self.attr))

    def write(self, value: Any) -> None:
        setattr(self.owner, self.attr, bool(value))


class _Tf32(_Knob):
    def read(self) -> Any:
        b = self.torch.backends
        return (bool(b.cuda.matmul.allow_tf32), bool(b.cudnn.allow_tf32))

    def write(self, value: Any) -> None:
        pair = value if isinstance(value, tuple) else (bool(value), bool(value))
        self.torch.backends.cuda.matmul.allow_tf32 = pair[0]
        self.torch.backends.cudnn.allow_tf32 = pair[1]

    def complete(self, value: Any, old: Any) -> Any:
        return (bool(value), bool(value))

    def show(self, value: Any) -> str:
        if isinstance(value, tuple):
            return (
                "true" if all(value) else "false" if not any(value) else f"matmul={value[0]},cudnn={value[1]}".lower()
            )
        return wire.show_value(value)


class _MatmulPrecision(_Knob):
    def read(self) -> Any:
        return str(self.torch.get_float32_matmul_precision())

    def write(self, value: Any) -> None:
        self.torch.set_float32_matmul_precision(str(value))


def _knob(name: str, torch: Any) -> _Knob:
    if name == "threads":
        return _Threads(torch)
    if name == "gc_freeze":
        return _GcFreeze(torch)
    if name == "gc_threshold":
        return _GcThreshold(torch)
    if name == "cudnn_benchmark":
        return _Flag(torch, lambda t: t.backends.cudnn, "benchmark")
    if name == "tf32":
        return _Tf32(torch)
    if name == "matmul_precision":
        return _MatmulPrecision(torch)
    raise ValueError(f"no steps-mode knob for {name}")


def _quiet(call: Callable[[], Any]) -> Any:
    """``call()`` with warnings silenced: a deprecation warning of a flag's setter is torch's
    remark on torchwatch's call, not something the training's output should show."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call()


class _Block:
    __slots__ = ("dropped", "durations", "first_step", "on")

    def __init__(self, on: bool, first_step: int) -> None:
        self.on = on
        self.first_step = first_step
        self.durations: list[float] = []
        self.dropped = 0

    def sealed(self) -> wire.TrialBlock:
        d = self.durations
        mean = sum(d) / len(d) if d else 0.0
        return wire.TrialBlock(self.on, self.first_step, len(d), self.dropped, round(mean, 7),
                             round(statistics.median(d), 7) if d else 0.0)  # fmt: skip


def _loader_refusal(
    torch: Any, loader: Any, name: str, value: Any, req: wire.TrialRequest, typical_step_s: Callable[[], float | None]
) -> tuple[str | None, Any]:
    """Why a trial of the DataLoader setting ``name=value`` on ``loader`` is refused (one line),
    else ``None``; and the loader's value now. Refused: the value it has already, an iterator
    kept across epochs, an ``IterableDataset`` (workers would change the samples), prefetching
    without workers, pinning without an accelerator, no length, or ``2 * min_pairs + 1`` epochs
    (at the median step, s) beyond the request's ``max_s``."""
    old = getattr(loader, name, None)
    if name == "pin_memory":
        old = bool(old)
    if old == value:
        return f"the DataLoader's {name} is already {wire.show_value(value)}: nothing to try", None
    if getattr(loader, "persistent_workers", False) and getattr(loader, "num_workers", 0) > 0:
        return ("the DataLoader keeps its iterator across epochs (persistent_workers=True): no new iterator "
                "would take the setting"), None  # fmt: skip
    workers = value if name == "num_workers" else getattr(loader, "num_workers", 0)
    if name == "num_workers":
        from torch.utils.data import IterableDataset

        if isinstance(getattr(loader, "dataset", None), IterableDataset):
            return ("its dataset is an IterableDataset: each worker iterates it, so the samples would change "
                    "with the number of workers unless it shards by worker"), None  # fmt: skip
        if getattr(loader, "persistent_workers", False):
            return "persistent_workers=True: an iterator with workers would be kept across epochs", None
    if name == "prefetch_factor" and not workers:
        return "prefetch_factor needs DataLoader workers (num_workers is 0)", None
    if name == "pin_memory" and value:
        try:
            accel = bool(torch.accelerator.is_available())
        except Exception:
            accel = bool(torch.cuda.is_available())
        if not accel:
            return "no accelerator here: torch ignores pin_memory (nothing to measure)", None
    try:
        batches = len(loader)
    except Exception:
        return "the DataLoader has no length: a trial alternates whole epochs and cannot plan them", None
    typical = typical_step_s()
    if typical is None or typical <= 0:
        return "no step measured yet", None
    epoch_s = batches * typical
    needed = 2 * req.min_pairs + 1
    if epoch_s * needed > req.max_s:
        return (f"an epoch of this DataLoader takes about {epoch_s:.0f} s ({batches} batches): a DataLoader "
                f"setting changes at a new iterator, and {needed} epochs do not fit in --max-s "
                f"{req.max_s:g} s"), None  # fmt: skip
    return None, old


class Trials:
    """The hook's live trials: at most one at a time; the last one's state is published.

    Args:
        torch: the imported torch module.
        changed: called after each change of the state (the hook republishes ``hook.json``).
        interrupt: runs the hook's signal handler in the main thread (the ``max_s`` timer).
        loader_for: ``key -> DataLoader or None``: a loader the hook has seen (weakly held).
        target_loader: the key of the DataLoader with the most batches, or ``None``.
        busy: why another measurement (a profiler burst) forbids a trial now, or ``None``.
        typical_step_s: the median of the last steps' durations, s (``None``: none yet).
        usable_cpus: the process's usable CPUs (``None``: unknown); bounds ``threads`` and
            ``num_workers`` (:func:`wire.cpu_bound`).
    """

    def __init__(
        self,
        torch: Any,
        changed: Callable[[], None],
        interrupt: Callable[[], bool],
        loader_for: Callable[[int], Any],
        target_loader: Callable[[], int | None],
        busy: Callable[[], str | None],
        typical_step_s: Callable[[], float | None],
        usable_cpus: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.torch = torch
        self._usable_cpus = usable_cpus
        self._changed = changed
        self._interrupt = interrupt
        self._loader_for = loader_for
        self._target_loader = target_loader
        self._busy = busy
        self._typical = typical_step_s
        self.state: wire.TrialState | None = None
        self.refused: wire.TrialState | None = None  # the last request refused while a trial ran
        self.req: wire.TrialRequest | None = None
        self.setting: wire.Setting | None = None
        self._knob: _Knob | None = None
        self._old: Any = None
        self._new: Any = None
        self._applied: Any = None  # the value written last (steps mode), None: never written
        self._loader_key: int | None = None
        self._blocks: list[wire.TrialBlock] = []
        self._block: _Block | None = None
        self._started = 0.0
        self._timer: threading.Timer | None = None
        # SIGCHLD's handler before torch set its own for the first iterator with workers, which
        # the trial made (the training had none): put back at the trial's end (_put_sigchld_back)
        self._sigchld: tuple[Any, Any] | None = None

    # -- public ---------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """A trial is waiting or running."""
        return self.state is not None and not self.state.finished

    def on_request(self, req: wire.TrialRequest | wire.TrialStop | wire.BadTrial, now: float, step: int) -> None:
        """A trial, the end of one, or a trial request that did not decode arrived (from the
        signal handler, main thread; :func:`wire.decode_request`). Never raises."""
        try:
            if isinstance(req, wire.TrialStop):
                if self.active and self.state is not None and req.id == self.state.id:
                    self._end("stopped", "torchwatch ended the trial (it was stopped)", now)
                return
            self._start(req, now, step)
        except Exception as exc:
            self._fail(f"trial request: {exc!r}", now)

    def on_step(self, now: float, duration: float | None, step: int) -> None:
        """A step boundary: ``duration`` s of the step that ended, ``step`` steps counted so far."""
        if not self.active:
            return
        try:
            self._on_step(now, duration, step)
        except Exception as exc:
            self._fail(f"trial at a step: {exc!r}", now)

    def on_interrupt(self, now: float) -> None:
        """The ``max_s`` timer fired (through the signal handler): end a trial past its time."""
        if self.active and self.req is not None and now - self._started >= self.req.max_s:
            self._end("done", f"ended after {self.req.max_s:g} s (its limit) with no step boundary since", now)

    def wants(self, loader: Any) -> bool:
        """Whether the trial makes ``loader``'s next iterator."""
        return self.active and self._loader_key is not None and id(loader) == self._loader_key

    def make_iterator(self, loader: Any, make: Callable[[Any], Any]) -> Any:
        """Make ``loader``'s iterator with ``make`` for an iterator-mode trial: a block ends and
        the next starts here; an "on" block's iterator is made with the trial's value."""
        now = time.monotonic()
        on = False
        try:
            on = self._next_iterator_block(now)
        except Exception as exc:
            self._fail(f"trial at a new iterator: {exc!r}", now)
        if not on:
            return make(loader)
        return self._with_loader_value(loader, make)

    def close(self) -> None:
        """At exit: end a running trial, the old value put back."""
        if self.active:
            with contextlib.suppress(Exception):
                self._end("stopped", "the training exited during the trial", time.monotonic())
        self._cancel_timer()

    # -- start ----------------------------------------------------------------------------------
    def _refuse(self, rid: int, setting: str, value: str, why: str, now: float) -> None:
        self.state = wire.TrialState(rid, setting, value, "refused", reason=clean_text(why, TEXT), ended=now)
        self._changed()

    def _start(self, req: wire.TrialRequest | wire.BadTrial, now: float, step: int) -> None:
        if isinstance(req, wire.BadTrial):
            self._refuse(req.id, req.setting, req.value, req.why, now)
            return
        name = clean_text(req.setting, 40)
        text = clean_text(req.value, wire.VALUE_TEXT)
        if self.active and self.state is not None:
            if self.state.id != req.id:  # answered apart: the running trial's state (and put-back) stays
                running = clean_text(f"trial {self.state.id} ({self.state.setting}) is running", TEXT)
                self.refused = wire.TrialState(req.id, name, text, "refused", reason=running, ended=now)
                self._changed()
            return
        why = self._busy()
        if why is not None:
            self._refuse(req.id, name, text, why, now)
            return
        try:
            checked = wire.check_trial(
                f"{req.setting}={req.value}", allow_numerics=req.allow_numerics, usable_cpus=self._usable_cpus()
            )
        except wire.NotTried as exc:
            self._refuse(req.id, exc.setting, exc.text, str(exc), now)
            return
        setting, value, text = checked.setting, checked.value, checked.text
        if setting.mode == wire.STEPS:
            why, old, new = self._prepare_knob(setting, value)
        else:
            why, old, new = self._prepare_loader(setting, value, req)
        if why is not None:
            self._refuse(req.id, setting.name, text, why, now)
            return
        self.req, self.setting, self._old, self._new = req, setting, old, new
        self._applied, self._blocks, self._block = None, [], None
        self._started = now
        self.state = wire.TrialState(
            req.id, setting.name, text, "waiting", old=self._show(old), mode=setting.mode,
            numerics=setting.numerics, started=now,
        )  # fmt: skip
        self._schedule(req.max_s + TIMER_GRACE_S)
        self._changed()

    def _show(self, value: Any) -> str:
        return self._knob.show(value) if self._knob is not None else wire.show_value(value)

    def _prepare_knob(self, setting: wire.Setting, value: Any) -> tuple[str | None, Any, Any]:
        try:
            knob = _knob(setting.name, self.torch)
            old = _quiet(knob.read)
        except Exception as exc:
            return f"cannot read {setting.name} in this torch: {exc!r}", None, None
        new = knob.complete(value, old)
        why = knob.check(new, old)
        if why is None and new == old:
            why = f"{setting.name} is already {knob.show(old)}: nothing to try"
        self._knob = knob
        return why, old, new

    def _prepare_loader(self, setting: wire.Setting, value: Any, req: wire.TrialRequest) -> tuple[str | None, Any, Any]:
        self._knob = None
        key = self._target_loader()
        loader = self._loader_for(key) if key is not None else None
        if loader is None:
            return "no DataLoader iterator seen yet in this training", None, None
        why, old = _loader_refusal(self.torch, loader, setting.name, value, req, self._typical)
        if why is not None:
            return why, None, None
        self._loader_key = key
        return None, old, value

    # -- steps mode -----------------------------------------------------------------------------
    def _apply(self, value: Any) -> None:
        if self._knob is not None and value != self._applied:
            knob = self._knob
            _quiet(lambda: knob.write(value))
            self._applied = value

    def _on_step(self, now: float, duration: float | None, step: int) -> None:
        req = self.req
        assert req is not None and self.state is not None
        if self.setting is not None and self.setting.mode == wire.ITERATOR:
            if self._block is not None and duration is not None:
                self._block.durations.append(duration)
            if now - self._started >= req.max_s:
                self._end("done", f"ended after {req.max_s:g} s (its limit)", now)
            return
        if self.state.state == "waiting":
            if req.start_step is not None and step < req.start_step:
                return
            self._open_block(0, step, now)
            return
        block = self._block
        assert block is not None
        if duration is not None:
            if block.dropped < req.warmup:
                block.dropped += 1
            else:
                block.durations.append(duration)
        if block.dropped + len(block.durations) < req.block_steps:
            if now - self._started >= req.max_s:
                self._end("done", f"ended after {req.max_s:g} s (its limit)", now)
            return
        self._seal(now)
        if not self._decide(now):
            self._open_block(len(self._blocks), step, now)

    def _open_block(self, index: int, step: int, now: float) -> None:
        on = wire.is_on(index)
        self._apply(self._new if on else self._old)
        self._block = _Block(on, step)
        if self.state is not None and self.state.state == "waiting":
            self._publish(state="running")

    def _seal(self, now: float) -> None:
        if self._block is not None:
            self._blocks.append(self._block.sealed())
            self._block = None
            self._publish()

    def _decide(self, now: float) -> bool:
        """After a block: end the trial when it is decided or out of time/blocks. True if ended."""
        req = self.req
        assert req is not None
        est = wire.estimate(self._blocks) if len(self._blocks) % 2 == 0 else None
        if est is not None and est.pairs >= req.min_pairs and est.half_width <= req.target:
            self._end("done", f"decided: the 95 % interval is within ±{est.half_width:.1%}", now)
            return True
        if len(self._blocks) >= req.max_blocks:
            self._end("done", f"ended after {req.max_blocks} blocks (its limit)", now)
            return True
        if now - self._started >= req.max_s:
            self._end("done", f"ended after {req.max_s:g} s (its limit)", now)
            return True
        return False

    # -- iterator mode --------------------------------------------------------------------------
    def _next_iterator_block(self, now: float) -> bool:
        """A new iterator of the target loader: seal the block that ends, decide, open the next.
        Returns whether the new iterator runs with the trial's value."""
        if self._block is not None:
            if self._block.durations:
                self._seal(now)
            else:
                self._block = None  # an iterator that gave no step: not a block
            if len(self._blocks) % 2 == 0 and self._blocks and self._decide(now):
                return False
        if not self.active:
            return False
        index = len(self._blocks)
        on = wire.is_on(index)
        self._block = _Block(on, 0)
        if self.state is not None and self.state.state == "waiting":
            self._publish(state="running")
        return on

    def _with_loader_value(self, loader: Any, make: Callable[[Any], Any]) -> Any:
        setting = self.setting
        assert setting is not None
        name = setting.name
        saved = {"num_workers": loader.num_workers, "prefetch_factor": loader.prefetch_factor,
                 "pin_memory": loader.pin_memory}  # fmt: skip
        handling = sys.modules.get("torch.utils.data._utils.signal_handling")
        first = handling is not None and getattr(handling, "_SIGCHLD_handler_set", True) is False
        before = signal.getsignal(signal.SIGCHLD) if first else None
        try:
            setattr(loader, name, self._new)
            if name == "num_workers" and self._new > 0 and loader.prefetch_factor is None:
                loader.prefetch_factor = 2  # what DataLoader() sets itself for workers
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return make(loader)
        finally:
            if first and self._sigchld is None and getattr(handling, "_SIGCHLD_handler_set", False) is True:
                self._sigchld = (before, signal.getsignal(signal.SIGCHLD))
            for attr, v in saved.items():
                if getattr(loader, attr) is not v:
                    setattr(loader, attr, v)

    # -- end ------------------------------------------------------------------------------------
    def _end(self, state: str, reason: str, now: float) -> None:
        """Put the old value back (or keep the new one), read it back, publish. Never raises."""
        self._cancel_timer()
        self._block = None  # an incomplete block is not counted: a pair needs both halves whole
        est = wire.estimate(self._blocks[: len(self._blocks) // 2 * 2])
        req = self.req
        keep = bool(req is not None and req.keep and est is not None and est.pairs >= 2 and est.lo > 1.0)
        restored: bool | None = None
        now_value = ""
        kept = False
        try:
            if self._knob is not None:
                target = self._new if keep else self._old
                if self._applied is not None:
                    self._apply(target)
                read = _quiet(self._knob.read)
                now_value = self._knob.show(read)
                kept = keep and read == self._new
                restored = None if self._applied is None else (not keep and read == self._old)
            elif self.setting is not None and self._loader_key is not None:
                loader = self._loader_for(self._loader_key)
                if keep and loader is not None:
                    setattr(loader, self.setting.name, self._new)
                    if self.setting.name == "num_workers" and self._new > 0 and loader.prefetch_factor is None:
                        loader.prefetch_factor = 2
                    kept = True
                current = getattr(loader, self.setting.name, None) if loader is not None else None
                now_value = "" if current is None else wire.show_value(current)
                restored = None if kept else (loader is None or current == self._old)
        except Exception as exc:
            state, reason = "failed", f"{reason}; putting the value back raised {exc!r}"
            restored = False
        if keep and not kept and state != "failed":
            reason += "; not kept: reading it back gave another value"
        elif req is not None and req.keep and not keep:
            reason += "; not kept: no speed-up measured"
        self._loader_key = None
        self._put_sigchld_back()
        self._publish(state=state, reason=clean_text(reason, TEXT), estimate=est, restored=restored, kept=kept,
                      now_value=now_value, ended=now)  # fmt: skip

    def _put_sigchld_back(self) -> None:
        """The trial made the process's first DataLoader iterator with workers, for which torch
        set its SIGCHLD handler (once per process, ``_set_SIGCHLD_handler``): put back the one
        before, and torch's flag, so that the training's own first iterator with workers sets it
        again. Left as is when the handler changed since (someone else's), or off the main
        thread (only it may set a handler). The trial's last iterator, if it has workers, then
        finds a dead worker by its own timeout check instead of by the signal."""
        saved, self._sigchld = self._sigchld, None
        if saved is None or threading.current_thread() is not threading.main_thread():
            return
        before, torchs = saved
        handling = sys.modules.get("torch.utils.data._utils.signal_handling")
        with contextlib.suppress(Exception):
            if handling is not None and signal.getsignal(signal.SIGCHLD) is torchs:
                signal.signal(signal.SIGCHLD, before if before is not None else signal.SIG_DFL)
                setattr(handling, "_SIGCHLD_handler_set", False)  # noqa: B010 (a module of torch's, typed)

    def _fail(self, why: str, now: float) -> None:
        if self.active:
            self._end("failed", why, now)

    def _publish(self, **changes: Any) -> None:
        st = self.state
        if st is None:
            return
        fields = {**st.__dict__, "blocks": tuple(self._blocks), **changes}
        if "estimate" not in changes:
            fields["estimate"] = wire.estimate(self._blocks[: len(self._blocks) // 2 * 2])
        state = wire.TrialState(**fields)
        try:  # what torchwatch would refuse is never published: the state goes without its estimate
            wire.TrialState.decode(json.loads(json.dumps(state.to_json())), "trial")
        except (WireError, ValueError):
            state = wire.TrialState(**{**fields, "estimate": None})
        self.state = state
        self._changed()

    # -- timer ----------------------------------------------------------------------------------
    def _schedule(self, seconds: float) -> None:
        self._cancel_timer()
        timer = threading.Timer(seconds, self._interrupt)
        timer.daemon = True
        timer.name = "torchwatch-trial"
        self._timer = timer
        timer.start()

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

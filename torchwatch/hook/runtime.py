"""The hook's machinery inside the training process. Standard library only; torch lazily.

What runs on the training's hot path, and its cost (measured by ``bench/hook_cost.py``):

- the optimizer step post hook (``torch.optim.optimizer.register_optimizer_step_post_hook``):
  one clock read and an in-place counter update, a few microseconds;
- a wrapper around ``_BaseDataLoaderIter.__next__``: two clock reads and two counter updates
  per batch;
- a wrapper around ``DataLoader._get_iterator``: reads the loader's settings once per iterator;
- a wrapper around ``DataLoader.__iter__``: a new epoch of that loader (:mod:`torchwatch.hook.progress`);
- a wrapper around ``torch.autograd.backward`` (``Tensor.backward`` calls it): two wall-clock
  and two thread-CPU-clock reads (``time.thread_time``) and two counter updates per backward
  pass of the main thread. The backward pass's wall time minus the main thread's CPU time in it
  is the time it was blocked: with DDP on the CPU, the reducer's wait for its gradient
  all-reduces (see :class:`wire.RankStep` for when that reading holds). It also gives step
  boundaries to loops without ``torch.optim`` (manual SGD): :data:`STEP_SOURCE_RULE`. At most
  every 0.25 s it also reads the loss the pass is called on, without a device sync
  (:class:`torchwatch.hook.progress.LossWatch`); in between, one comparison of two floats;
- wrappers around the blocking ``torch.distributed`` collectives (:data:`COLLECTIVES`) and
  ``Work.wait()``: two clock reads and two counter updates per call of the main thread outside
  backward;
- at most every 0.5 s, at a step boundary: the GPU settings and, once the training has
  initialised CUDA, its device memory (:mod:`torchwatch.hook.gpu`); torch.compile's counters
  (:mod:`torchwatch.hook.compiled`: a few microseconds unless something compiled).

Everything else (``hook.json`` rewrites, burst summaries) happens on rare events or in a
background thread. Every entry point catches its own errors and records them in the state:
the hook never raises into the user's code.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.abc
import importlib.machinery
import json
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from .. import wire
from . import ranks
from .burst import Burster, BurstParams
from .compiled import CompileWatch
from .cpus import read_threads
from .gpu import GpuWatch
from .oom import OomWatch
from .progress import EpochWatch, LossWatch, progress_info
from .trial import Trials

MAX_LOADERS = 8  # DataLoaders whose settings are kept (train, val, ...)
MAX_ERRORS = 10
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

# Blocking collectives of torch.distributed (distributed_c10d's names): time in them is time
# waiting on peers. isend/irecv and async_op=True calls return at once; their Work.wait() counts.
COLLECTIVES = (
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "monitored_barrier",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
)

_active = False  # module global: the cheapest check in the wrappers; False in forked children
_said: set[str] = set()


def _say(message: str) -> None:
    """One line on stderr, once per message: why the hook is off (it never raises instead)."""
    message = wire.clean_text(message, wire.TEXT)  # a 100 kB TORCHWATCH_DIR stays one short line
    if message in _said:
        return
    _said.add(message)
    with contextlib.suppress(Exception):
        sys.stderr.write(f"torchwatch hook: {message}\n")


def _monotonic() -> float:
    return time.monotonic()


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
    __slots__ = ("batch_bytes", "batches", "epochs", "key", "ref", "settings", "wait_s")

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

    def info(self) -> wire.LoaderInfo:
        return wire.LoaderInfo(
            **self.settings, batches=self.batches, wait_s=round(self.wait_s, 4), batch_bytes=_count(self.batch_bytes)
        )


class _TorchImportWatcher(importlib.abc.MetaPathFinder):
    """Calls back once the user's code has imported ``torch`` (never imports it itself)."""

    def __init__(self, callback: Any) -> None:
        self.callback = callback

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        try:
            return self._find(name, path, target)
        except Exception as exc:
            # A finder that raises here raises again when the import system asks it itself:
            # stepping aside changes nothing for the user's import.
            _say(f"cannot watch the import of torch: {exc!r}")
            return None

    def _find(self, name: str, path: Any, target: Any) -> importlib.machinery.ModuleSpec | None:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader: Any = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        watcher = self

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
                module: ModuleType | None = loader.create_module(spec)
                return module

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                try:
                    # put the real loader back, so nothing downstream sees ours
                    module.__loader__ = loader
                    if module.__spec__ is not None:
                        module.__spec__.loader = loader
                    with contextlib.suppress(ValueError):
                        sys.meta_path.remove(watcher)
                    watcher.callback(module)
                except Exception as exc:  # the user's import torch must succeed whatever the hook does
                    _say(f"off: {exc!r}")

        spec.loader = _Loader()
        return spec


class Hook:
    """The hook of one training process. Create through :func:`torchwatch.hook.install`.

    Args:
        directory: the per-user base directory (see :func:`wire.base_dir`); this process
            publishes in ``directory/<pid>-<start>-<pidns>`` (:attr:`wire.Instance.dir_name`).
        signum: the signal that asks for a burst (SIGUSR2 by default); 0: bursts off.
        burst_at: optimizer step counts at which to run a burst without a signal.
        signal_error: why ``signum`` is 0 (recorded in the hook's errors).
        spawned_by: the hook directory name of the process whose ``torch.multiprocessing.spawn``
            started this one (a rank), else ``None``.

    Raises:
        OSError: ``/proc`` is not mounted (the process instance cannot be told).
    """

    def __init__(
        self,
        directory: Path,
        signum: int,
        burst_at: tuple[int, ...],
        signal_error: str = "",
        spawned_by: str | None = None,
    ) -> None:
        self.instance = wire.self_instance()
        self.pid = self.instance.pid
        self.base = directory.absolute()  # fixed now: the training may chdir later
        self.dir = self.base / self.instance.dir_name
        self.signum = signum if wire.signal_allowed(signum) else 0
        self.signal_error = signal_error or (f"signal {signum} is not allowed: bursts are off" if signum else "")
        self.burst_at = tuple(sorted(set(burst_at)))
        self.started = _monotonic()
        self.torch: Any = None
        self.counters: wire.Counters | None = None
        self.burster: Burster | None = None
        self.trials: Trials | None = None
        self.errors: list[str] = []
        self.loaders: dict[int, _LoaderRecord] = {}
        self.amp = wire.AmpInfo()
        self.gpu = GpuWatch()
        self.compile = CompileWatch()  # torch.compile's counters, read with the GPU settings
        # CUDA out-of-memory errors: observed (never caught) once the training initialised CUDA
        self.oom = OomWatch(self._on_oom, self._oom_steps)
        self.threads: wire.ThreadSettings | None = None  # read with the GPU settings, every 0.5 s
        self.loss = LossWatch()  # the loss backward() is called on, a few times a second
        self._progress_due = 0.0
        self._progress_shown: tuple[int, int, int] = (0, 0, 0)  # (loader key, epoch, batch) published
        self.signal_owned = False
        self.usable_cpus: float | None = None
        self.shm_bytes: int | None = None
        self._handler_ref: Any = None
        self._previous_handler: Any = None
        self._step_opt: weakref.ref[Any] | None = None
        self._last_step_t = 0.0
        self._wait_since_step = 0.0
        self._last_check = 0.0
        self._unpatch: list[Any] = []
        self._hook_handle: Any = None
        # distributed: identity, ranks started here, step source, backward and collective times
        self.identity = ranks.Identity(spawned_by)
        self.spawned_ranks: list[int] = []
        self.step_source = ""
        self._main_ident = threading.main_thread().ident
        self._optimizer_made = False
        self._in_backward = False
        self._in_comm = False
        self._first_backward_t = 0.0
        self._undecided_calls = 0
        self._bw_since_step = 0.0
        self._bw_blocked_since_step = 0.0
        self._comm_since_step = 0.0
        self._identity_refreshed = False
        # Set by an install into a running training (hook/live.py): finds the record of an
        # iterator made before the install (its first batch only).
        self.adopt_iterator: Callable[[Any], _LoaderRecord] | None = None

    # -- activation -----------------------------------------------------------------------
    def on_torch(self, torch: Any) -> None:
        """``torch`` was imported: create the published files, patch torch, take the signal.

        Never raises: any failure leaves the hook off, with one line on stderr.
        """
        if self.torch is not None or os.getpid() != self.pid:
            return
        self.torch = torch
        try:
            self._activate(torch)
        except Exception as exc:
            self._deactivate()
            _say(f"off: {exc!r}")

    def _activate(self, torch: Any) -> None:
        global _active
        try:
            base_fd = wire.prepare_dir(self.base, parents=True)
        except OSError as exc:
            _say(f"off: cannot use {self.base} (TORCHWATCH_DIR): {exc.strerror or exc}")
            return
        try:
            wire.remove_stale(base_fd, self.instance)
            dir_fd = wire.private_subdir(base_fd, self.instance.dir_name)
            try:
                self.counters = wire.Counters(dir_fd, self.instance)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            _say(f"off: cannot write {self.dir}: {exc.strerror or exc}")
            return
        finally:
            os.close(base_fd)
        from ..wire import usable_cpus

        self.usable_cpus = usable_cpus()
        with contextlib.suppress(OSError):
            st = os.statvfs("/dev/shm")
            self.shm_bytes = st.f_frsize * st.f_blocks
        self.burster = Burster(
            torch, self.instance, self._interrupt_main, self.publish, self.step_durations, self._rank
        )
        self.trials = Trials(
            torch, self.publish, self._interrupt_main, self._loader_object, self._busiest_loader,
            self._trial_busy, self._typical_step_s, lambda: self.usable_cpus,
        )  # fmt: skip
        _active = True
        self._patch(torch)
        self._take_signal()
        os.register_at_fork(after_in_child=_after_fork_in_child)
        atexit.register(self.close)
        self.publish()

    def _deactivate(self) -> None:
        """Undo what :meth:`_activate` did (a failure half-way): wrappers off, files removed."""
        global _active
        _active = False
        with contextlib.suppress(Exception):
            self.close()

    def _patch(self, torch: Any) -> None:
        try:
            import torch.optim.optimizer as optim_mod

            self._hook_handle = optim_mod.register_optimizer_step_post_hook(self._on_step)
            self._patch_optimizer_init(optim_mod)
        except Exception as exc:
            self.error(f"no step hook: {exc!r}")
        try:
            self._patch_backward()
        except Exception as exc:
            self.error(f"no backward wrapper: {exc!r}")
        for what, patch in (
            ("collective", self._patch_collectives),
            ("rank identity", lambda: self._unpatch.extend(ranks.patch_init(self))),
            ("torch.multiprocessing.spawn", lambda: self._unpatch.extend(ranks.patch_spawn(self))),
        ):
            try:
                if getattr(torch, "distributed", None) is None or torch.distributed.is_available():
                    patch()
            except Exception as exc:
                self.error(f"no {what} wrapper: {exc!r}")
        try:
            self._patch_dataloader(torch)
        except Exception as exc:
            self.error(f"no DataLoader wrapper: {exc!r}")
        try:
            self._patch_amp(torch)
        except Exception as exc:
            self.error(f"no AMP detection: {exc!r}")

    def active(self) -> bool:
        """Whether the hook is on in this process (for the wrappers of :mod:`ranks`)."""
        return _active and os.getpid() == self.pid

    def _patch_optimizer_init(self, optim_mod: Any) -> None:
        """Note the first optimizer created (:data:`STEP_SOURCE_RULE`), then put ``__init__`` back."""
        cls = optim_mod.Optimizer
        orig = cls.__init__
        hook = self

        @functools.wraps(orig)
        def __init__(opt: Any, *args: Any, **kwargs: Any) -> None:
            orig(opt, *args, **kwargs)
            hook._optimizer_made = True
            if cls.__init__ is __init__:
                cls.__init__ = orig

        cls.__init__ = __init__
        self._unpatch.append((cls, "__init__", orig))

    def _patch_backward(self) -> None:
        """Time the main thread's backward passes (wall and thread CPU) and take step boundaries
        from them when there is no optimizer step (:data:`STEP_SOURCE_RULE`)."""
        import importlib

        ag: Any = importlib.import_module("torch.autograd")
        orig = ag.backward
        hook = self
        get_ident, monotonic, thread_time = threading.get_ident, time.monotonic, time.thread_time

        @functools.wraps(orig)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if not _active or hook._in_backward or get_ident() != hook._main_ident:
                return orig(*args, **kwargs)
            t0 = monotonic()
            c0 = thread_time()
            if t0 >= hook.loss.due:
                hook.read_loss(args, kwargs, t0)
            try:
                hook.backward_started(t0)
                result = orig(*args, **kwargs)
            except BaseException:
                hook.backward_aborted()
                raise
            hook.backward_ended(t0, monotonic(), thread_time() - c0)
            return result

        ag.backward = backward
        self._unpatch.append((ag, "backward", orig))

    def _patch_collectives(self) -> None:
        """Time the blocking collectives (:data:`COLLECTIVES`) and ``Work.wait()`` of the main
        thread, outside backward passes (DDP's own all-reduce is timed by the backward wrapper)
        and outside another collective (``all_gather_object`` calls ``all_gather``)."""
        import importlib

        dc: Any = importlib.import_module("torch.distributed.distributed_c10d")
        dist: Any = importlib.import_module("torch.distributed")
        hook = self
        get_ident, monotonic = threading.get_ident, time.monotonic

        def wrap(orig: Any) -> Any:
            @functools.wraps(orig)
            def collective(*args: Any, **kwargs: Any) -> Any:
                if not _active or hook._in_comm or hook._in_backward or get_ident() != hook._main_ident:
                    return orig(*args, **kwargs)
                t0 = monotonic()
                try:
                    hook.collective_started(t0)
                    return orig(*args, **kwargs)
                finally:
                    hook.collective_ended(monotonic() - t0)

            return collective

        for name in COLLECTIVES:
            orig = getattr(dc, name, None)
            if orig is None:
                continue
            wrapped = wrap(orig)
            setattr(dc, name, wrapped)
            self._unpatch.append((dc, name, orig))
            if getattr(dist, name, None) is orig:
                setattr(dist, name, wrapped)
                self._unpatch.append((dist, name, orig))
        work = getattr(dc, "Work", None)
        if work is not None and callable(getattr(work, "wait", None)):
            orig_wait = work.wait
            work.wait = wrap(orig_wait)
            self._unpatch.append((work, "wait", orig_wait))

    def _patch_dataloader(self, torch: Any) -> None:
        import importlib

        dl: Any = importlib.import_module("torch.utils.data.dataloader")
        base = dl._BaseDataLoaderIter
        orig_next = base.__next__
        orig_get = dl.DataLoader._get_iterator
        hook = self

        def __next__(it: Any) -> Any:
            if not _active:
                return orig_next(it)
            t0 = time.monotonic()
            counters = hook.counters
            if counters is not None:
                try:
                    counters.next_started(t0)
                except Exception:  # never into the user's loop (a closed mapping at exit)
                    counters = None
            try:
                batch = orig_next(it)
            except BaseException as exc:
                # StopIteration at the end of an epoch (or an error): no longer in __next__
                if counters is not None:
                    with contextlib.suppress(Exception):
                        counters.next_aborted()
                if isinstance(exc, StopIteration):
                    hook.epoch_ended()
                raise
            hook.on_batch(it, t0, time.monotonic(), batch)
            return batch

        def _get_iterator(loader: Any) -> Any:
            trials = hook.trials
            if _active and trials is not None and trials.wants(loader):
                it = trials.make_iterator(loader, orig_get)
            else:
                it = orig_get(loader)
            if _active:
                try:
                    it._torchwatch_loader = hook.loader_record(loader)
                except Exception as exc:
                    hook.error(f"DataLoader settings: {exc!r}")
            return it

        orig_iter = dl.DataLoader.__iter__

        def __iter__(loader: Any) -> Any:
            it = orig_iter(loader)
            if _active:
                hook.epoch_started(loader)
            return it

        __next__.__wrapped__ = orig_next  # type: ignore[attr-defined]
        _get_iterator.__wrapped__ = orig_get  # type: ignore[attr-defined]
        __iter__.__wrapped__ = orig_iter  # type: ignore[attr-defined]
        base.__next__ = __next__
        dl.DataLoader._get_iterator = _get_iterator
        dl.DataLoader.__iter__ = __iter__
        self._unpatch += [
            (base, "__next__", orig_next),
            (dl.DataLoader, "_get_iterator", orig_get),
            (dl.DataLoader, "__iter__", orig_iter),
        ]

    def _patch_amp(self, torch: Any) -> None:
        """Record the first enabled ``autocast`` (then put the original back) and ``GradScaler``;
        ``GradScaler.scale`` stays wrapped: the loss is read before it is scaled."""
        import importlib

        am: Any = importlib.import_module("torch.amp.autocast_mode")
        cls = am.autocast
        orig_enter = cls.__enter__
        hook = self

        def __enter__(ctx: Any) -> Any:
            result = orig_enter(ctx)
            if getattr(ctx, "_enabled", False) and _active:
                with contextlib.suppress(Exception):
                    hook.amp = wire.AmpInfo(
                        autocast=True,
                        dtype=_name(str(ctx.fast_dtype).replace("torch.", ""), 32),
                        device_type=_name(ctx.device, 32),
                        grad_scaler=hook.amp.grad_scaler,
                    )
                    cls.__enter__ = orig_enter
                    hook.publish()
            return result

        cls.__enter__ = __enter__
        self._unpatch.append((cls, "__enter__", orig_enter))
        try:
            gs: Any = importlib.import_module("torch.amp.grad_scaler")
        except ImportError:
            return
        scaler = gs.GradScaler
        orig_scale = scaler.scale

        def scale(sc: Any, outputs: Any) -> Any:
            result = orig_scale(sc, outputs)
            if _active and getattr(sc, "_enabled", False):
                with contextlib.suppress(Exception):
                    # the loss read is the one scale() was given, not loss x scale (LossWatch.scaled)
                    hook.loss.scaled(result, outputs)
                    if not hook.amp.grad_scaler:
                        hook.amp = wire.AmpInfo(hook.amp.autocast, hook.amp.dtype, hook.amp.device_type, True)
                        hook.publish()
            return result

        scaler.scale = scale
        self._unpatch.append((scaler, "scale", orig_scale))

    def _take_signal(self) -> None:
        """Install the burst signal handler, unless the training already handles that signal.

        Only SIGUSR1, SIGUSR2 and real-time signals (:func:`wire.burst_signals`); never raises.
        """
        try:
            if not self.signum:
                self.error(self.signal_error or "no burst signal: bursts are off")
                return
            if threading.current_thread() is not threading.main_thread():
                self.error("torch was imported outside the main thread: bursts are off")
                return
            name = wire.signal_name(self.signum)
            try:
                current = signal.getsignal(self.signum)
            except (ValueError, OSError) as exc:
                self.error(f"cannot read the handler of {name}: {exc}")
                return
            if current not in (signal.SIG_DFL, None):
                self.error(f"{name} is already handled by the training: bursts are off (set TORCHWATCH_SIGNAL)")
                return
            self._handler_ref = self._on_signal
            self._previous_handler = current
            signal.signal(self.signum, self._handler_ref)
            self.signal_owned = True
        except Exception as exc:
            self.error(f"cannot take the burst signal: {exc!r}")

    # -- hot path -------------------------------------------------------------------------
    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not _active:
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
            self._publish_progress()
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
        return progress_info(rec.epochs if rec is not None else None, self.loss)

    def _publish_progress(self) -> None:
        """Rewrite ``hook.json`` when the epoch, the batch or the loss moved (at most every
        :data:`PROGRESS_EVERY_S`, from the step boundary)."""
        key = self._busiest_loader()
        rec = self.loaders.get(key) if key is not None else None
        shown = (key or 0, rec.epochs.epoch, rec.epochs.batch) if rec is not None else (0, 0, 0)
        if shown != self._progress_shown or self.loss.changed:
            self._progress_shown = shown
            self.loss.changed = False
            self.publish()

    def collective_started(self, t0: float) -> None:
        """The main thread entered a collective at ``t0`` (monotonic s)."""
        self._in_comm = True
        self._write("collective", wire.Counters.collective_started, t0)

    def collective_ended(self, waited: float) -> None:
        """The collective returned (or raised) after ``waited`` s."""
        self._in_comm = False
        self._comm_since_step += waited
        self._write("collective", wire.Counters.collective_ended, waited)

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
            if len(self.loaders) >= MAX_LOADERS:
                oldest = min(self.loaders.values(), key=lambda r: r.batches)
                del self.loaders[oldest.key]
            self.loaders[key] = rec
            self.publish()
        return rec

    def _loader_object(self, key: int) -> Any:
        """The DataLoader recorded under ``key``, while it is alive (``None`` otherwise)."""
        rec = self.loaders.get(key)
        return rec.ref() if rec is not None else None

    def _busiest_loader(self) -> int | None:
        """The key of the DataLoader that gave the most batches (the training's), ``None`` before one."""
        if not self.loaders:
            return None
        return max(self.loaders.values(), key=lambda r: r.batches).key

    def _trial_busy(self) -> str | None:
        """Why a live trial cannot start now (a profiler burst would be timed with it)."""
        burster = self.burster
        if burster is not None and burster.state != "idle":
            return f"a profiler burst is {burster.state}: its cost would be timed as the setting's"
        if burster is not None and burster.wants_steps:
            return "the last burst's FLOP-counting mode has not left yet: its cost would be timed as the setting's"
        return None

    def _typical_step_s(self) -> float | None:
        """The median duration of the last 9 steps, s (``None`` before a step)."""
        recent = sorted(self.step_durations(9))
        return recent[len(recent) // 2] if recent else None

    def _oom_steps(self) -> tuple[int | None, list[float]]:
        counters = self.counters
        return (None if counters is None else counters.steps), self.step_durations(16)

    def _on_oom(self, rec: wire.OomRecord) -> None:
        """The allocator ran out of memory: publish the record now (the training may exit at
        once) and keep the hook's files at exit so torchwatch can read it afterwards."""
        self.publish()

    def step_durations(self, n: int) -> list[float]:
        """Durations of the last ``n`` steps, s (oldest first)."""
        snap = self.counters.snapshot() if self.counters is not None else None
        if snap is None or n <= 0:
            return []
        return [e[1] for e in snap.entries[-n:]]

    # -- signals and bursts ---------------------------------------------------------------
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """SIGUSR2 (or the configured signal): arm a burst, or advance one (timer callbacks)."""
        if not _active:
            return
        try:
            burster = self.burster
            trials = self.trials
            if burster is None or trials is None:
                return
            now = time.monotonic()
            steps = self.counters.steps if self.counters is not None else 0
            req = self._take_request()
            if burster.state in ("armed", "running"):
                if req is not None and not isinstance(req, wire.BurstRequest):
                    trials.on_request(req, now, steps)  # refused, with the reason: a burst runs
                elif req is not None:
                    burster.request(req, now, True, "signal")  # refused: one runs
                burster.on_interrupt(now)  # a timer's deadline, if one is due (a no-op otherwise)
                return
            if req is not None and not isinstance(req, wire.BurstRequest):
                trials.on_request(req, now, steps)
                return
            if trials.active:
                if req is None:
                    trials.on_interrupt(now)  # the trial's max_s timer
                else:
                    why = "a live trial is running: its steps are being timed"
                    burster.last_refusal = wire.Refusal(now, why, "signal")
                    self.publish()
                return
            params = req if req is not None else BurstParams()
            stepping = self._last_step_t > 0 and now - self._last_step_t < max(2.0, params.arm_timeout_s)
            burster.request(params, now, stepping, "signal")
        except Exception as exc:
            self.error(f"burst request: {exc!r}")

    def _take_request(self) -> wire.Request | None:
        """``request.json`` (torchwatch writes it before the signal) decoded once
        (:func:`wire.decode_request`), then removed; ``None`` without one (a timer's
        interrupt). Accepted only as a regular file of this user or root, at most 4 KB."""
        try:
            fd = wire.open_dir(self.dir, (os.geteuid(),), private=True)
        except OSError:
            return None
        try:
            req = wire.read_json(fd, wire.REQUEST_FILE, {0, os.geteuid()}, wire.REQUEST_MAX_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self.error(f"burst request ignored: {exc}")
            return None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(wire.REQUEST_FILE, dir_fd=fd)
            os.close(fd)
        return wire.decode_request(req)

    def _interrupt_main(self) -> bool:
        """From a timer thread: run our signal handler in the main thread, without a real signal.

        When the training has taken the signal for itself, :meth:`_on_timer` runs there instead
        as a pending call (``Py_AddPendingCall``, which the interpreter runs in the main thread
        between two bytecodes, whatever its signal handlers): a trial's ``max_s`` and a burst's
        deadline hold whatever the training does with the signal.
        """
        try:
            if not _active:
                return False
            if not self._check_signal():
                return _pending_call(self._on_timer)
            import _thread

            _thread.interrupt_main(self.signum)  # type: ignore[arg-type]  # an int works since 3.10
        except Exception:
            return False
        return True

    def _on_timer(self) -> None:
        """A timer's deadline, in the main thread without the signal: end a trial past its
        ``max_s``, a burst past its window or ``max_s``. Never raises."""
        if not _active or os.getpid() != self.pid:
            return
        try:
            now = time.monotonic()
            if self.trials is not None and self.trials.active:
                self.trials.on_interrupt(now)
            if self.burster is not None:
                self.burster.on_interrupt(now)
        except Exception as exc:
            self.error(f"timer: {exc!r}")

    def _check_signal(self) -> bool:
        """Whether our handler still owns the signal (the training may install its own later)."""
        if self._handler_ref is None:
            return False
        try:
            owned = bool(signal.getsignal(self.signum) == self._handler_ref)
        except (ValueError, OSError):
            owned = False
        if owned != self.signal_owned:
            self.signal_owned = owned
            if not owned:
                self.error("the training replaced the burst signal's handler: bursts are off")
            self.publish()
        return owned

    # -- publishing -----------------------------------------------------------------------
    def error(self, message: str) -> None:
        """Record an error of the hook (shown by torchwatch); never raises."""
        message = wire.clean_text(message, wire.TEXT)
        if len(self.errors) < MAX_ERRORS and message not in self.errors:
            self.errors.append(message)
            with contextlib.suppress(Exception):
                self.publish()

    def record(self) -> wire.HookRecord:
        """Everything ``hook.json`` holds (see :class:`wire.HookRecord`)."""
        loaders = sorted(self.loaders.values(), key=lambda r: r.batches, reverse=True)
        burster = self.burster
        version = getattr(self.torch, "__version__", None)
        return wire.HookRecord(
            instance=self.instance,
            python=sys.version.split()[0][:32],
            torch=None if version is None else _name(version, 64),
            started=self.started,
            signal=self.signum,
            signal_owned=self.signal_owned,
            burst_at=self.burst_at[:64],
            usable_cpus=self.usable_cpus,
            shm_bytes=_count(self.shm_bytes),
            cuda_initialized=self._cuda_initialized(),
            amp=self.amp,
            dataloaders=tuple(r.info() for r in loaders),
            burst=burster.public_state() if burster is not None else None,
            errors=tuple(self.errors),
            step_source=self.step_source,
            rank=self.identity.info(self.torch),
            spawned_ranks=tuple(self.spawned_ranks[: wire.MAX_SPAWNED]),
            device_memory=self.gpu.memory,
            devices=self.gpu.devices,
            gpu_settings=self.gpu.settings,
            threads=self.threads,
            compile=self.compile.info,
            trial=self.trials.state if self.trials is not None else None,
            oom=self.oom.record,
            progress=self.progress(),
        )

    def _rank(self) -> int | None:
        """This process's global rank, when known (bursts put it in the trace's file name)."""
        info = self.identity.info(self.torch)
        return None if info is None else info.rank

    def state(self) -> dict[str, Any]:
        """``hook.json`` as a dict (:meth:`record` in JSON form)."""
        return self.record().to_json()

    def _cuda_initialized(self) -> bool:
        with contextlib.suppress(Exception):
            return bool(self.torch.cuda.is_initialized())
        return False

    def publish(self) -> None:
        """Rewrite ``hook.json`` atomically; errors are swallowed (the training comes first).

        The record goes through torchwatch's own decoder first, so the hook never publishes
        what the reader would refuse.
        """
        if not _active or os.getpid() != self.pid:
            return
        with contextlib.suppress(Exception):
            data = self.record().to_json()
            try:
                wire.HookRecord.decode(json.loads(wire.encode_json(data)))
            except (wire.WireError, ValueError) as exc:
                self.errors = [*self.errors[: MAX_ERRORS - 1], wire.clean_text(f"hook.json: {exc}", wire.TEXT)]
                data = wire.HookRecord(
                    self.instance, data["python"], None, self.started, self.signum, self.signal_owned,
                    errors=tuple(self.errors),
                ).to_json()  # fmt: skip
            fd = wire.open_dir(self.dir, (os.geteuid(),), private=True)
            try:
                wire.write_atomic(fd, wire.STATE_FILE, wire.encode_json(data))
            finally:
                os.close(fd)

    def close(self) -> None:
        """At exit: stop a running burst, remove the published files (traces are kept).

        Only the files the hook and torchwatch make are removed, by name, then the directory.
        """
        global _active
        if os.getpid() != self.pid:
            return
        with contextlib.suppress(Exception):
            if self.trials is not None:
                self.trials.close()  # the old value back first
        with contextlib.suppress(Exception):
            if self.burster is not None:
                self.burster.close()
        self.compile.close()
        with contextlib.suppress(Exception):
            if self.oom.at_exit(getattr(sys, "last_value", None), self.torch) is not None:
                self.publish()  # _active is still set: the record reaches hook.json
        self.oom.close()
        _active = False
        if self.counters is not None:
            self.counters.close()
        if self.oom.record is not None:
            # The training ran out of device memory: hook.json keeps the record for torchwatch to
            # read after the exit (HookReader.last_words). The next hook of this user removes
            # the directory as a dead process's (wire.remove_stale), as after a SIGKILL.
            return
        with contextlib.suppress(OSError):
            base_fd = wire.open_dir(self.base, (os.geteuid(),), private=False)
            try:
                wire.remove_hook_dir(base_fd, self.instance.dir_name)
            finally:
                os.close(base_fd)


_HOOK: Hook | None = None
_PENDING: list[Any] = []  # the ctypes callbacks handed to Py_AddPendingCall, kept alive until they run


def _pending_call(function: Callable[[], None]) -> bool:
    """Have ``function()`` run in the main thread at its next bytecode (CPython's
    ``Py_AddPendingCall``), whatever the training did with its signal handlers. False when it
    cannot be queued (no ctypes, the queue full). The call never raises into the training."""
    try:
        import ctypes

        def run(_arg: Any) -> int:
            with contextlib.suppress(BaseException):  # never into the training's code
                function()
            with contextlib.suppress(ValueError):
                _PENDING.remove(callback)
            return 0

        callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(run)
        add = ctypes.pythonapi.Py_AddPendingCall
        add.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        add.restype = ctypes.c_int
        _PENDING.append(callback)
        if add(ctypes.cast(callback, ctypes.c_void_p), None) != 0:
            _PENDING.remove(callback)
            return False
    except Exception:
        return False
    return True


def _after_fork_in_child() -> None:
    """In a forked child (a DataLoader worker): the hook is off, the parent's files untouched."""
    global _active
    _active = False
    hook = _HOOK
    if hook is None:
        return
    hook.counters = None  # the mapping is shared with the parent: never write to it
    if hook._handler_ref is not None:
        with contextlib.suppress(Exception):
            if signal.getsignal(hook.signum) == hook._handler_ref:
                signal.signal(
                    hook.signum, hook._previous_handler if hook._previous_handler is not None else signal.SIG_DFL
                )
    with contextlib.suppress(Exception):
        if hook.burster is not None and hook.burster._timer is not None:
            hook.burster._timer = None


def current() -> Hook | None:
    """The hook of this process, or ``None`` (never installed, or this is a forked child)."""
    return _HOOK if _HOOK is not None and _HOOK.pid == os.getpid() else None


def installed_elsewhere() -> str:
    """Where a hook installed by another copy of this package in this process runs from: the
    training's own ``torchwatch.hook.install()`` under the name ``torchwatch``, or ``torchwatch
    run``'s loaded by path under :data:`torchwatch.wire.bypath.PRIVATE`, when the two are different
    installs. ``""`` when no other copy has a hook installed."""
    for name in ("torchwatch.hook.runtime", "_torchwatch_by_path.hook.runtime"):
        other = sys.modules.get(name)
        if other is None or other is sys.modules.get(__name__):
            continue
        try:
            if other.current() is not None:
                return str(getattr(other, "__file__", name))
        except Exception:
            continue
    return ""


def start(
    signum: int, burst_at: tuple[int, ...], directory: Path, signal_error: str = "", spawned_by: str | None = None
) -> Hook:
    """Create the hook and patch torch now or when it is imported (see ``install``).

    Raises:
        OSError: ``/proc`` is not mounted.
    """
    global _HOOK
    hook = Hook(directory, signum, burst_at, signal_error, spawned_by)
    _HOOK = hook
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "optim"):
        hook.on_torch(torch)
    else:
        sys.meta_path.insert(0, _TorchImportWatcher(hook.on_torch))
    return hook

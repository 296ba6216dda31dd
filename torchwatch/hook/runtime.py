"""The hook of one training process (:class:`Hook`): it starts once torch is imported, patches
torch, takes the burst signal and publishes ``hook.json``. Standard library only; torch lazily.

Its parts, by concern: :mod:`~torchwatch.hook.patches` (the wrappers put into torch, and the
switch they read), :mod:`~torchwatch.hook.steps` (step boundaries and DataLoader records: the hot
path), :mod:`~torchwatch.hook.requests` (the signal, ``request.json`` and the timers' interrupts);
this module creates, activates, publishes and closes the hook.

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
  boundaries to loops without ``torch.optim`` (manual SGD): :data:`~torchwatch.hook.steps.STEP_SOURCE_RULE`. At most
  every 0.25 s it also reads the loss the pass is called on, without a device sync
  (:class:`torchwatch.hook.progress.LossWatch`); in between, one comparison of two floats;
- wrappers around the blocking ``torch.distributed`` collectives (:data:`~torchwatch.hook.patches.COLLECTIVES`) and
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
import importlib.abc
import importlib.machinery
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from .. import wire
from . import patches, ranks
from .burst import Burster
from .compiled import CompileWatch
from .gpu import GpuWatch
from .oom import OomWatch
from .progress import LossWatch, UpdateWatch
from .requests import Requests
from .steps import LoaderWatch, StepClock, _count, _name
from .trial import Trials

MAX_ERRORS = 10
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


class Hook(StepClock, LoaderWatch, Requests):
    """The hook of one training process. Create through :func:`torchwatch.hook.install`.

    Its methods, by concern: this class creates, activates, publishes and closes;
    :class:`~torchwatch.hook.steps.StepClock` (step boundaries) and
    :class:`~torchwatch.hook.steps.LoaderWatch` (DataLoader records) are the hot path;
    :class:`~torchwatch.hook.requests.Requests` the burst signal and ``request.json``. Each sets
    its own state (``_init_steps``, ``_init_loaders``, ``_init_requests``).

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
        self.burst_at = tuple(sorted(set(burst_at)))
        self.started = _monotonic()
        self.torch: Any = None
        self.counters: wire.Counters | None = None
        self.burster: Burster | None = None
        self.trials: Trials | None = None
        self.errors: list[str] = []
        self.amp = wire.AmpInfo()
        self.gpu = GpuWatch()
        self.compile = CompileWatch()  # torch.compile's counters, read with the GPU settings
        # CUDA out-of-memory errors: observed (never caught) once the training initialised CUDA
        self.oom = OomWatch(self._on_oom, self._oom_steps)
        self.threads: wire.ThreadSettings | None = None  # read with the GPU settings, every 0.5 s
        self.loss = LossWatch()  # the loss backward() is called on, a few times a second
        self.updates = UpdateWatch()  # whether optimizer steps change the model, every 2 s
        self.usable_cpus: float | None = None
        self.shm_bytes: int | None = None
        self._unpatch: list[Any] = []  # (owner, name, original) of each patch (patches.patch_torch)
        self._hook_handle: Any = None
        # distributed: identity, ranks started here
        self.identity = ranks.Identity(spawned_by)
        self.spawned_ranks: list[int] = []
        self._init_requests(signum, signal_error)
        self._init_steps()
        self._init_loaders()

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
        patches._active = True
        patches.patch_torch(self, torch)
        self._take_signal()
        os.register_at_fork(after_in_child=_after_fork_in_child)
        atexit.register(self.close)
        self.publish()

    def _deactivate(self) -> None:
        """Undo what :meth:`_activate` did (a failure half-way): wrappers off, files removed."""
        patches._active = False
        with contextlib.suppress(Exception):
            self.close()

    def active(self) -> bool:
        """Whether the hook is on in this process (for the wrappers of :mod:`ranks`)."""
        return patches._active and os.getpid() == self.pid

    def _on_oom(self, rec: wire.OomRecord) -> None:
        """The allocator ran out of memory: publish the record now (the training may exit at
        once) and keep the hook's files at exit so torchwatch can read it afterwards."""
        self.publish()

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
            trial_refused=self.trials.refused if self.trials is not None else None,
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
        if not patches._active or os.getpid() != self.pid:
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
                self.publish()  # patches._active is still set: the record reaches hook.json
        self.oom.close()
        patches._active = False
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


def _after_fork_in_child() -> None:
    """In a forked child (a DataLoader worker): the hook is off, the parent's files untouched."""
    patches._active = False
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

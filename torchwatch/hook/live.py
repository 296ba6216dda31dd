"""Installing the hook in a training that is already running, and taking it out again.

``torchwatch attach PID`` injects :func:`install` (and ``torchwatch detach PID``, or quitting
attach, injects :func:`detach`) with :class:`torchwatch.inject.injector.Payload` and
``thread=False``: both run on the training's main thread while torchwatch holds it, because
a signal handler can only be set from there. Standard library only, like the rest of the hook.

:func:`install` does what :func:`torchwatch.hook.install` does when torch is imported after
it, with the same published directory, counters and wire format
(:mod:`torchwatch.wire.files`), so the reader cannot tell the two apart:

- torch already imported: the hook activates now. Optimizer steps are seen through torch's
  global optimizer step post hook, which applies to optimizers built before it; DataLoader
  iteration is wrapped on the iterator class, so an iterator created before the install
  registers on its next ``__next__``; the DataLoaders and iterators in the held main thread's
  frames are registered at once, so their settings do not wait for a (slow) batch. A
  DataLoader is found in the frames of the loop that iterates it (at most :data:`FRAMES`
  frames, :data:`NAMES` names each, one level of attributes, e.g. ``self.train_loader``; the
  locals of a function only from Python 3.13, see :data:`LOCALS_READABLE`); when it is not
  there, the settings are read from the iterator itself (which holds the loader's values,
  except that its ``pin_memory`` is already and-ed with "an accelerator is present"). No
  ``gc`` walk: ``gc.get_referrers`` visits every object on the heap while holding the GIL, an
  unbounded pause on a large training.
- torch not imported yet: the import watcher waits for it, as at launch.

:func:`detach` undoes it: the previous handler of the burst signal is put back (unless the
training has replaced ours since), the optimizer hook is removed, the wrapped torch methods
and the import watcher are taken out (each only if it is still ours), the exit handler is
unregistered, and the hook's files are removed (its directory, and the per-user base
directory when this install created it and it is empty). The training's own objects keep
nothing but a stale ``_torchwatch_loader`` attribute on live iterators, which a later
install replaces. The modules stay imported (a second attach reuses them).

Neither function raises: each returns a small JSON-able dict saying what it did.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import os
import signal
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import wire
from . import ranks, runtime, steps

FRAMES = 12  # frames above the DataLoader wrapper searched for the loader (the loop is usually 1-3 up)
# Frames of the main thread searched at install time: it may be held deep inside a batch's
# loading (dataset, transforms, collate), far below the training loop.
INSTALL_FRAMES = 64
# Reading a function frame's f_locals before 3.13 stores a snapshot dict in the frame that keeps
# its locals' values alive until the function returns (a whole batch, on the GPU too); PEP 667
# made f_locals a view without one. Before 3.13 only module-level frames (whose locals are the
# module's globals) are read, and an iterator's settings come from the iterator itself.
LOCALS_READABLE = sys.version_info >= (3, 13)
NAMES = 256  # names per frame (a module-level loop sees the script's globals) and attributes per object


class _Live:
    """What :func:`install` did, so that :func:`detach` undoes exactly that."""

    def __init__(self, hook: runtime.Hook, created_base: bool) -> None:
        self.hook = hook
        self.created_base = created_base
        self.views: list[types.SimpleNamespace] = []  # loader stand-ins built from iterators: kept alive


_LIVE: _Live | None = None


def _lazy_modules() -> None:
    """Import now what the hook imports later: the payload takes torchwatch's directory off
    ``sys.path`` again, so a later import would fail in a training without torchwatch."""
    from . import burst, cpus, summary  # noqa: F401


def _loader_classes() -> tuple[Any, Any] | None:
    """``(DataLoader, _BaseDataLoaderIter)`` when torch's dataloader module is imported."""
    dl = sys.modules.get("torch.utils.data.dataloader")
    loader, iterator = getattr(dl, "DataLoader", None), getattr(dl, "_BaseDataLoaderIter", None)
    return None if loader is None or iterator is None else (loader, iterator)


def _matches(loader: Any, it: Any) -> bool:
    """Whether ``it`` is an iterator of DataLoader ``loader`` (its persistent one, or over its dataset)."""
    try:
        return getattr(loader, "_iterator", None) is it or loader.dataset is getattr(it, "_dataset", None)
    except Exception:
        return False


def _values(namespace: Any) -> list[Any]:
    """Up to :data:`NAMES` values of a mapping (frame locals, an object's ``__dict__``)."""
    try:
        out = []
        for value in namespace.values():
            out.append(value)
            if len(out) >= NAMES:
                break
        return out
    except Exception:
        return []


def frame_objects(frame: types.FrameType | None, frames: int) -> Iterator[Any]:
    """The values of the names in ``frame`` and up to ``frames - 1`` of its callers, and one level
    of their attributes (``self.train_loader``), at most :data:`NAMES` of each; modules are not entered.

    Before Python 3.13 only module-level frames are read (see :data:`LOCALS_READABLE`).
    """
    for _ in range(frames):
        if frame is None:
            return
        if frame.f_code.co_flags & inspect.CO_OPTIMIZED and not LOCALS_READABLE:
            frame = frame.f_back  # a function's frame: its locals cannot be read without a snapshot
            continue
        values = _values(frame.f_locals)
        yield from values
        for value in values:
            attrs = getattr(value, "__dict__", None)
            if isinstance(attrs, dict) and not isinstance(value, (types.ModuleType, type)):
                yield from _values(attrs)
        frame = frame.f_back


def find_loader(it: Any, frame: types.FrameType | None, frames: int = FRAMES) -> Any:
    """The DataLoader that made iterator ``it``, looked for in ``frame`` and its callers.

    Args:
        it: a ``_BaseDataLoaderIter``.
        frame: where to start (the training loop is usually 1-3 frames up from the DataLoader wrapper).
        frames: how many frames to look in.

    Returns:
        The DataLoader whose iterator ``it`` is, or whose dataset ``it`` iterates; ``None``
        when none is within reach (see :func:`frame_objects`).
    """
    classes = _loader_classes()
    if classes is None:
        return None
    for value in frame_objects(frame, frames):
        if isinstance(value, classes[0]) and _matches(value, it):
            return value
    return None


def settings_view(it: Any) -> types.SimpleNamespace:
    """A stand-in for the DataLoader with the attribute names the hook reads, from the iterator.

    ``pin_memory`` is the iterator's, true only when pinning was asked for and an accelerator
    is present (torch's ``_BaseDataLoaderIter``); ``multiprocessing_context`` is unknown.
    """
    sampler = getattr(it, "_index_sampler", None)
    batch_size = getattr(sampler, "batch_size", None) if getattr(it, "_auto_collation", False) else None
    return types.SimpleNamespace(
        num_workers=getattr(it, "_num_workers", 0),
        batch_size=batch_size,
        pin_memory=getattr(it, "_pin_memory", False),
        prefetch_factor=getattr(it, "_prefetch_factor", None),
        persistent_workers=getattr(it, "_persistent_workers", False),
        drop_last=getattr(it, "_drop_last", False),
        multiprocessing_context=None,
        dataset=getattr(it, "_dataset", None),
        collate_fn=getattr(it, "_collate_fn", None),
    )


def _record(live: _Live, it: Any, loader: Any) -> Any:
    """Register iterator ``it`` with the hook under ``loader``, or a stand-in built from ``it``."""
    standin = loader is None
    if loader is None:
        if len(live.views) >= steps.MAX_LOADERS:
            gone = live.hook.loaders.get(id(live.views.pop(0)))
            if gone is not None:
                gone.standin_of = 0  # its dataset may die now: an id that may be reused
        loader = settings_view(it)
        live.views.append(loader)
    rec = live.hook.loader_record(loader)
    if standin and loader.dataset is not None:
        rec.standin_of = id(loader.dataset)  # the DataLoader's own record takes it over (LoaderWatch._take_standin)
    it._torchwatch_loader = rec
    return rec


def _adopter(live: _Live) -> Any:
    """The hook's callback for an iterator it has no record of (made before the install)."""

    def adopt(it: Any) -> Any:
        # from its caller up: Hook.on_batch, the DataLoader wrapper, the training loop
        return _record(live, it, find_loader(it, sys._getframe(1)))

    return adopt


def _adopt_now(live: _Live, frame: types.FrameType | None) -> int:
    """Register the DataLoaders and iterators in the held main thread's frames now, so their
    settings are published before the next batch arrives (on a slow loader, seconds later).

    Returns:
        How many were registered (at most :data:`steps.MAX_LOADERS`).
    """
    classes = _loader_classes()
    if classes is None or live.hook.counters is None:
        return 0
    loaders: dict[int, Any] = {}
    iterators: dict[int, Any] = {}
    for value in frame_objects(frame, INSTALL_FRAMES):
        if isinstance(value, classes[0]):
            loaders.setdefault(id(value), value)
        elif isinstance(value, classes[1]):
            iterators.setdefault(id(value), value)
    done = 0
    for it in list(iterators.values())[: steps.MAX_LOADERS]:
        loader = next((ld for ld in loaders.values() if _matches(ld, it)), None)
        _record(live, it, loader)
        loaders.pop(id(loader), None)
        done += 1
    for loader in list(loaders.values())[: max(0, steps.MAX_LOADERS - done)]:
        live.hook.loader_record(loader)
        done += 1
    return done


def prepare() -> dict[str, Any]:
    """Import what the hook needs, in any thread (attach runs it in a new thread of the training,
    before :func:`install` holds the main thread), so the install itself imports nothing. Never raises.

    Returns:
        ``{"prepared": bool, "torch": bool (already imported), "reason": str}``.
    """
    try:
        _lazy_modules()  # torchwatch.hook and this module are imported by now too
    except Exception as exc:
        return {"prepared": False, "torch": "torch" in sys.modules, "reason": f"{exc!r}"}
    return {"prepared": True, "torch": "torch" in sys.modules, "reason": ""}


def install() -> dict[str, Any]:
    """Install the hook in this (running) process as if torch were imported after it. Never raises.

    Run on the main thread (it takes the burst signal, SIGUSR2 or ``$TORCHWATCH_SIGNAL``). The
    hook publishes under :func:`torchwatch.wire.files.base_dir` of this process's
    environment, where ``torchwatch attach`` looks.

    Returns:
        ``{"installed": bool, "already": bool, "active": bool (torch is patched now),
        "lazy": bool (waiting for torch to be imported), "import_watcher": bool (the watcher
        that activates the hook when torch is imported is in ``sys.meta_path``),
        "signal_owned": bool, "dir": str,
        "errors": [str], "install_ms": float, "reason": str}``; ``reason`` says why not when
        ``installed`` is false, or what was already there.
    """
    global _LIVE
    started = time.monotonic()
    out: dict[str, Any] = {"installed": False, "already": False, "active": False, "lazy": False, "reason": ""}
    try:
        if runtime.current() is not None:
            how = "by torchwatch attach" if _LIVE is not None else "at start (torchwatch run or hook.install())"
            out.update(installed=True, already=True, reason=f"the hook is already installed {how}: nothing done")
            return out
        if other := runtime.installed_elsewhere():
            out.update(installed=True, already=True, reason=f"the hook is already installed from {other}: nothing done")
            return out
        from . import _env_signal, should_install

        ok, why = should_install()
        if not ok and ranks.spawn_index() is not None:
            # a spawned child running torch.multiprocessing.spawn's function is a rank, not a DataLoader worker
            ok = True
        if not ok:
            out["reason"] = f"this process is a {why}, not a training: attach to the training process"
            return out
        _lazy_modules()
        sig, sig_error = _env_signal()
        base = wire.base_dir().absolute()
        created_base = not os.path.lexists(base)
        hook = runtime.start(sig, (), base, sig_error)
        live = _LIVE = _Live(hook, created_base)
        if hook.torch is not None and hook.counters is None:  # torch is there, but the hook could not start
            said = "; ".join(sorted(runtime._said)) or "see the training's stderr"
            _undo()
            out["reason"] = wire.clean_text(f"the hook could not start: {said}", wire.TEXT)
            return out
        hook.adopt_iterator = _adopter(live)
        try:
            out["dataloaders_found"] = _adopt_now(live, sys._getframe(1))
        except Exception as exc:
            hook.error(f"DataLoaders at install: {exc!r}")
        out.update(
            installed=True,
            active=hook.counters is not None,
            lazy=hook.torch is None,
            signal_owned=hook.signal_owned,
            import_watcher=any(isinstance(f, runtime._TorchImportWatcher) for f in sys.meta_path),
            dir=str(hook.dir),
            errors=list(hook.errors),
        )
    except Exception as exc:  # the training comes first
        out["reason"] = wire.clean_text(f"cannot install the hook: {exc!r}", wire.TEXT)
        with contextlib.suppress(Exception):
            _undo()
    finally:
        out["install_ms"] = round((time.monotonic() - started) * 1e3, 2)
    return out


def _ours(value: Any, original: Any) -> bool:
    """Whether ``value`` (what ``owner.name`` holds now) is the hook's wrapper of ``original``:
    defined in the hook's package, or made with :func:`functools.wraps` around ``original``
    itself (the rank and collective wrappers of :mod:`ranks` and :mod:`runtime`; ``wraps``
    copies the original's ``__module__``). A wrapper someone put around ours wraps ours, not
    ``original``, so it is never taken for ours."""
    if getattr(value, "__wrapped__", None) is original:
        return True
    return str(getattr(value, "__module__", None)).startswith(f"{__package__}.")


def _undo() -> list[str]:
    """Take the live hook out (see the module docstring); what could not be undone, one line each."""
    global _LIVE
    live, _LIVE = _LIVE, None
    hook = runtime._HOOK
    left: list[str] = []
    if hook is None or live is None or live.hook is not hook:
        return left
    hook.adopt_iterator = None
    if hook._handler_ref is not None:
        try:
            if signal.getsignal(hook.signum) == hook._handler_ref:
                previous = hook._previous_handler
                signal.signal(hook.signum, previous if previous is not None else signal.SIG_DFL)
            else:
                left.append(f"{wire.signal_name(hook.signum)}: the training replaced the hook's handler; left as is")
        except Exception as exc:
            left.append(f"signal handler: {exc!r}")
    if hook._hook_handle is not None:
        with contextlib.suppress(Exception):
            hook._hook_handle.remove()
        hook._hook_handle = None
    for owner, name, original in reversed(hook._unpatch):
        current = owner.__dict__.get(name)
        if current is original:
            continue  # put back already (the AMP wrappers do it themselves)
        if _ours(current, original):
            setattr(owner, name, original)
        else:
            left.append(f"{owner.__name__}.{name} was wrapped again by someone else; left as is")
    hook._unpatch.clear()
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, runtime._TorchImportWatcher)]
    atexit.unregister(hook.close)
    burster, hook.burster = hook.burster, None
    if burster is not None:
        # Stop a burst in progress, but never wait for its summary (Burster.close joins the summary
        # thread for up to 10 s) while the training's main thread is held: it ends on its own.
        with contextlib.suppress(Exception):
            burster._cancel_timer()
            if burster._prof is not None:
                burster._finish(time.monotonic())
        with contextlib.suppress(Exception):
            if burster._flop is not None:
                burster._end_flop_count(time.monotonic())
        if burster._flop is not None:
            left.append(
                "torchwatch's FLOP-counting mode is beneath a dispatch mode of the training's: not popped "
                "(the training's would go instead); it runs every op unchanged"
            )
    hook.close()
    runtime._HOOK = None
    if live.created_base:
        with contextlib.suppress(OSError):
            os.rmdir(hook.base)  # only when empty; rmdir does not follow a link
    return left


def detach() -> dict[str, Any]:
    """Take out the hook :func:`install` put in this process. Never raises. Run on the main thread.

    Returns:
        ``{"detached": bool, "reason": str (why not, when not), "left": [str] (what was not
        undone because the training changed it since), "dir": str}``.
    """
    out: dict[str, Any] = {"detached": False, "reason": "", "left": []}
    try:
        hook = runtime.current()
        if hook is None:
            out["reason"] = "no torchwatch hook in this process"
            return out
        if _LIVE is None or _LIVE.hook is not hook:
            out["reason"] = "its hook was installed at start, not by torchwatch attach: it ends with the training"
            return out
        out["dir"] = str(hook.dir)
        out["left"] = _undo()
        out["detached"] = True
        out["gone"] = not os.path.lexists(Path(out["dir"]))
    except Exception as exc:
        out["reason"] = wire.clean_text(f"cannot detach: {exc!r}", wire.TEXT)
    return out

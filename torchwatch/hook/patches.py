"""The hook's patches of torch, and the switch every wrapper reads (:data:`_active`).

Each wrapper times one thing of the training's main thread and hands it to the hook (its
methods in :mod:`torchwatch.hook.steps`); what each costs is in :mod:`torchwatch.hook.runtime`'s
docstring (``bench/hook_cost.py`` measures it). Every original is kept in ``hook._unpatch``
(``(owner, name, original)``) so that :func:`torchwatch.hook.live.uninstall` puts it back.
A wrapper checks :data:`_active` first, and calls the original alone when the hook is off (in a
forked DataLoader worker, after ``close``, after a detach).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from typing import Any

from .. import wire
from . import ranks

__all__ = ["COLLECTIVES", "patch_torch"]

_active = False  # module global: the cheapest check in the wrappers; False in forked children

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


def patch_torch(hook: Any, torch: Any) -> None:
    """Wrap what the hook times in ``torch`` (the module docstring's list); a wrapper that cannot
    be put in place is an error of the hook (``hook.error``), never the training's."""
    try:
        import torch.optim.optimizer as optim_mod

        hook._hook_handle = optim_mod.register_optimizer_step_post_hook(hook._on_step)
        _patch_optimizer_init(hook, optim_mod)
    except Exception as exc:
        hook.error(f"no step hook: {exc!r}")
    try:
        _patch_backward(hook)
    except Exception as exc:
        hook.error(f"no backward wrapper: {exc!r}")
    for what, patch in (
        ("collective", lambda: _patch_collectives(hook)),
        ("rank identity", lambda: hook._unpatch.extend(ranks.patch_init(hook))),
        ("torch.multiprocessing.spawn", lambda: hook._unpatch.extend(ranks.patch_spawn(hook))),
    ):
        try:
            if getattr(torch, "distributed", None) is None or torch.distributed.is_available():
                patch()
        except Exception as exc:
            hook.error(f"no {what} wrapper: {exc!r}")
    try:
        _patch_dataloader(hook, torch)
    except Exception as exc:
        hook.error(f"no DataLoader wrapper: {exc!r}")
    try:
        _patch_amp(hook, torch)
    except Exception as exc:
        hook.error(f"no AMP detection: {exc!r}")


def _patch_optimizer_init(hook: Any, optim_mod: Any) -> None:
    """Note the first optimizer created (:data:`STEP_SOURCE_RULE`), then put ``__init__`` back."""
    cls = optim_mod.Optimizer
    orig = cls.__init__

    @functools.wraps(orig)
    def __init__(opt: Any, *args: Any, **kwargs: Any) -> None:
        orig(opt, *args, **kwargs)
        hook._optimizer_made = True
        if cls.__init__ is __init__:
            cls.__init__ = orig

    cls.__init__ = __init__
    hook._unpatch.append((cls, "__init__", orig))


def _patch_backward(hook: Any) -> None:
    """Time the main thread's backward passes (wall and thread CPU) and take step boundaries
    from them when there is no optimizer step (:data:`STEP_SOURCE_RULE`)."""
    import importlib

    ag: Any = importlib.import_module("torch.autograd")
    orig = ag.backward
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
    hook._unpatch.append((ag, "backward", orig))


def _patch_collectives(hook: Any) -> None:
    """Time the blocking collectives (:data:`COLLECTIVES`) and ``Work.wait()`` of the main
    thread, outside backward passes (DDP's own all-reduce is timed by the backward wrapper)
    and outside another collective (``all_gather_object`` calls ``all_gather``)."""
    import importlib

    dc: Any = importlib.import_module("torch.distributed.distributed_c10d")
    dist: Any = importlib.import_module("torch.distributed")
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
        hook._unpatch.append((dc, name, orig))
        if getattr(dist, name, None) is orig:
            setattr(dist, name, wrapped)
            hook._unpatch.append((dist, name, orig))
    work = getattr(dc, "Work", None)
    if work is not None and callable(getattr(work, "wait", None)):
        orig_wait = work.wait
        work.wait = wrap(orig_wait)
        hook._unpatch.append((work, "wait", orig_wait))


def _patch_dataloader(hook: Any, torch: Any) -> None:
    import importlib

    dl: Any = importlib.import_module("torch.utils.data.dataloader")
    base = dl._BaseDataLoaderIter
    orig_next = base.__next__
    orig_get = dl.DataLoader._get_iterator

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
    hook._unpatch += [
        (base, "__next__", orig_next),
        (dl.DataLoader, "_get_iterator", orig_get),
        (dl.DataLoader, "__iter__", orig_iter),
    ]


def _patch_amp(hook: Any, torch: Any) -> None:
    """Record the first enabled ``autocast`` (then put the original back) and ``GradScaler``;
    ``GradScaler.scale`` stays wrapped: the loss is read before it is scaled."""
    import importlib

    am: Any = importlib.import_module("torch.amp.autocast_mode")
    cls = am.autocast
    orig_enter = cls.__enter__

    def __enter__(ctx: Any) -> Any:
        result = orig_enter(ctx)
        if getattr(ctx, "_enabled", False) and _active:
            with contextlib.suppress(Exception):
                hook.amp = wire.AmpInfo(
                    autocast=True,
                    dtype=wire.clean_text(str(ctx.fast_dtype).replace("torch.", ""), 32),
                    device_type=wire.clean_text(str(ctx.device), 32),
                    grad_scaler=hook.amp.grad_scaler,
                )
                cls.__enter__ = orig_enter
                hook.publish()
        return result

    cls.__enter__ = __enter__
    hook._unpatch.append((cls, "__enter__", orig_enter))
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
    hook._unpatch.append((scaler, "scale", orig_scale))

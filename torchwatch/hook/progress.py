"""The training's loss and epoch, read inside the training without adding a device sync.

The loss is the scalar ``torch.autograd.backward`` is called on (``loss.backward()``), read at
most every :data:`wire.LOSS_EVERY_S` (the backward wrapper checks one clock reading against
:attr:`LossWatch.due` and does nothing else in between):

- on the CPU, ``item()`` of the tensor (its value is computed: backward needs it);
- on a CUDA device, a ``non_blocking`` copy into a pinned CPU scalar, with a CUDA event recorded
  after it on the tensor's stream; the value is read at a later reading once ``event.query()``
  says the copy is done (never ``synchronize()``, never a blocking ``item()``); while it is not
  done no other copy is made;
- on another device (MPS, XLA, ...): not read (a read there waits for the device), said once.

With a ``GradScaler``, ``scaler.scale(loss).backward()`` reads ``loss``, not ``loss`` times the
scale (``GradScaler.scale`` stays wrapped for that: two weak references per call). A
``backward()`` of a tensor of more than one element, or with ``gradient=``/``grad_tensors``, or
of several tensors, gives no loss, said once in :attr:`LossWatch.note`. With several losses each
backward'd on its own, the one read is the first ``backward()`` call after the reading is due.
The live ``tqdm`` bars of the training (:func:`read_bars`) are read when ``hook.json`` is
written: their own attributes (``n``, ``total``, ``desc``, ``start_t``, ``pos``) from each bar's
``__dict__``, no tqdm lock taken, no method of a bar called. Trainers that draw their bars with
tqdm (the HF ``Trainer``'s run bar, Lightning's epoch bar, ``tqdm(range(epochs))`` in a script)
so give the totals the hook cannot see otherwise.
Standard library only; torch comes in as an argument.
"""

from __future__ import annotations

import math
import sys
import time
import weakref
from collections import deque
from typing import Any

from .. import wire

NOT_SCALAR = "backward() of a tensor with {n} elements: no loss is read (a scalar loss.backward() gives one)"
GRADIENT = "backward() with gradient=/grad_tensors: no loss is read (the tensor is not a loss)"
SEVERAL = "backward() of several tensors at once: no loss is read"
OTHER_DEVICE = "the loss is on {device}: not read (reading it there would wait for the device)"


class LossWatch:
    """The loss readings of one training process (the main thread's ``backward()`` calls).

    Attributes:
        due: monotonic s at which the next reading may be taken (the wrapper's only check).
        samples: the last :data:`wire.LOSS_HISTORY` readings as ``(step, t, value)``, oldest
            first (made into :class:`wire.LossSample` only when published: cheaper per reading).
        first_nonfinite: the first NaN/±inf reading.
        note: why there is no loss ("" while there is one, or before the first backward).
        changed: a reading or the note came since :meth:`taken`.
    """

    def __init__(self) -> None:
        self.due = 0.0
        self.samples: deque[tuple[int, float, float]] = deque(maxlen=wire.LOSS_HISTORY)
        self.first_nonfinite: tuple[int, float, float] | None = None
        self.note = ""
        self.changed = False
        self._pending: tuple[Any, Any, int, float] | None = None  # (pinned scalar, event, step, t)
        self._pinned: Any = None
        self._scaled: tuple[Any, Any] | None = None  # weak refs: (GradScaler.scale's result, its input)

    def scaled(self, result: Any, loss: Any) -> None:
        """``GradScaler.scale(loss)`` returned ``result`` (loss x scale): a ``result.backward()``
        reads ``loss`` instead. Weak references: nothing of the training is kept alive."""
        try:
            self._scaled = (weakref.ref(result), weakref.ref(loss))
        except TypeError:  # scale() of a list of tensors: not a loss
            self._scaled = None

    def read(self, torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any], step: int, t: float) -> bool:
        """Take a reading of the loss ``torch.autograd.backward(*args, **kwargs)`` is called on,
        at ``t`` (monotonic s) for ``step`` (counted from 1). Returns whether the first non-finite
        value was just read (the caller publishes at once). Raises whatever torch raises: the
        caller catches it, outside the user's call."""
        self.due = t + wire.LOSS_EVERY_S
        first_bad = self._resolve()
        tensors = args[0] if args else kwargs.get("tensors")
        grads = args[1] if len(args) > 1 else kwargs.get("grad_tensors")
        if grads is not None:
            return self._say(GRADIENT) or first_bad
        if isinstance(tensors, (list, tuple)):
            if len(tensors) != 1:
                return self._say(SEVERAL) or first_bad
            tensors = tensors[0]
        scaled = self._scaled
        if scaled is not None and scaled[0]() is tensors:
            unscaled = scaled[1]()  # the loss GradScaler.scale() was given (never bool() a tensor: a sync)
            if unscaled is not None:
                tensors = unscaled
        if not isinstance(tensors, torch.Tensor):
            return first_bad
        n = tensors.numel()
        if n != 1:
            return self._say(NOT_SCALAR.format(n=n)) or first_bad
        if tensors.is_cpu:
            return self._add(step, t, tensors.detach().item()) or first_bad
        if not tensors.is_cuda:
            return self._say(OTHER_DEVICE.format(device=tensors.device.type)) or first_bad
        if self._pending is None:
            if self._pinned is None:
                self._pinned = torch.empty((), dtype=torch.float64, pin_memory=True)
            stream = torch.cuda.current_stream(tensors.device)
            with torch.cuda.stream(stream):
                self._pinned.copy_(tensors.detach(), non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            self._pending = (self._pinned, event, step, t)
        return first_bad

    def _resolve(self) -> bool:
        """The CUDA copy of an earlier reading, when its event says it is done."""
        pending = self._pending
        if pending is None:
            return False
        pinned, event, step, t = pending
        if not event.query():
            return False
        self._pending = None
        return self._add(step, t, float(pinned.item()))  # a CPU tensor: no device sync

    def _add(self, step: int, t: float, value: float) -> bool:
        if self.note:
            self.note = ""
        value = float(value)
        if math.isfinite(value) and abs(value) > wire.LOSS_MAX:
            value = math.copysign(math.inf, value)
        sample = (step, t, value)
        self.samples.append(sample)
        self.changed = True
        if not math.isfinite(value) and self.first_nonfinite is None:
            self.first_nonfinite = sample
            return True
        return False

    def _say(self, note: str) -> bool:
        if note != self.note:
            self.note = wire.clean_text(note, wire.TEXT)
            self.changed = True
        return False


class EpochWatch:
    """The epoch of each DataLoader: its ``__iter__`` calls, the batches taken since, its length."""

    __slots__ = ("batch", "epoch", "length")

    def __init__(self) -> None:
        self.epoch = 0
        self.batch = 0
        self.length: int | None = None

    def started(self, loader: Any) -> None:
        """A new iterator over ``loader``: a new epoch. ``len(loader)`` as the DataLoader gives it
        (``None`` when it has none: an ``IterableDataset`` without ``__len__``)."""
        self.epoch += 1
        self.batch = 0
        try:
            n = len(loader)
        except Exception:
            n = None
        self.length = n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


class UpdateWatch:
    """Whether the stepped optimizer's steps change the model (:class:`wire.UpdateInfo`), read at
    the progress records on the training's thread, right after an ``optimizer.step()`` (the step
    post hook ends the step), where the gradients the step used are still set.

    What is read, per parameter tensor of the optimizer's groups (at most
    :data:`wire.PARAMS_SCANNED`): ``.grad is None`` and ``._version`` (autograd's in-place write
    counter, kept on the CPU); per group, ``lr`` when it is a Python number. No value of a tensor
    is read (no device sync), no method of the optimizer is called. Costs ~0.2 us a tensor: a
    model of 1,000 tensors, 0.2 ms every 2 s.

    The version counter says "no parameter was written" only for torch's own optimizers: code
    that updates ``p.data`` in place (many hand-written optimizers) writes a tensor with its own
    counter, so for any other class only ``no-grad`` and ``lr-zero`` are said.

    Attributes:
        info: the last reading (``None`` before the first, or when the groups cannot be read).
    """

    def __init__(self) -> None:
        self.info: wire.UpdateInfo | None = None
        self.off = False  # set after an error: not read again in this process
        self._versions: list[int] | None = None
        self._still_since: tuple[int, float] | None = None  # (steps, t) at the first still record

    def sample(self, optimizer: Any, steps: int, now: float) -> bool:
        """Read ``optimizer`` after ``steps`` optimizer steps at ``now`` (monotonic s). Returns
        whether :attr:`info` changed. Raises whatever a hostile attribute raises: the caller
        catches it, outside the user's call (and sets :attr:`off`)."""
        if self.off:
            return False
        groups = getattr(optimizer, "param_groups", None)
        if not isinstance(groups, list):
            return False
        versions: list[int] = []
        with_grad = 0
        lr_max: float | None = None
        lr_known = True
        for group in groups:
            if not isinstance(group, dict):
                return False
            lr = group.get("lr")
            if isinstance(lr, (float, int)) and not isinstance(lr, bool):
                lr_max = float(lr) if lr_max is None else max(lr_max, float(lr))
            else:
                lr_known = False  # a tensor learning rate: reading a CUDA one would wait for the device
            params = group.get("params")
            if not isinstance(params, list):
                return False
            for p in params:
                if len(versions) >= wire.PARAMS_SCANNED:
                    return self._unknown()
                try:
                    versions.append(int(p._version))
                except Exception:  # an inference-mode or uninitialised (lazy) parameter
                    return self._unknown()
                if p.grad is not None:
                    with_grad += 1
        before, self._versions = self._versions, versions
        why = ""
        if versions and with_grad == 0:
            why = "no-grad"
        elif lr_known and lr_max == 0.0:
            why = "lr-zero"
        elif before == versions and type(optimizer).__module__.startswith("torch.optim"):
            why = "unchanged"
        if not why:
            self._still_since = None
        elif self._still_since is None:
            self._still_since = (steps, now)
        since = self._still_since
        still_steps, still_s = (steps - since[0], round(now - since[1], 3)) if since is not None else (0, 0.0)
        info = wire.UpdateInfo(len(versions), with_grad, None if not lr_known else lr_max, still_steps, still_s, why)
        changed, self.info = info != self.info, info
        return changed

    def _unknown(self) -> bool:
        changed = self.info is not None
        self.info, self._versions, self._still_since = None, None, None
        return changed


BARS_SCANNED = 64  # live bars looked at, at most (a leak of unclosed bars must not cost more)


def _count(value: object) -> float | None:
    """A bar's ``n`` or ``total`` as a float in the wire's range (``None``: not a count)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) and 0.0 <= v <= wire.BAR_MAX_COUNT else None


def read_bars(now_wall: float | None = None) -> tuple[wire.BarInfo, ...]:
    """The training's live ``tqdm`` bars, outermost first (by ``pos``, then the oldest), at
    most :data:`wire.BARS_MAX`; ``()`` when ``tqdm`` was never imported.

    Only attributes are read, from each bar's ``__dict__`` (no property, no lock, no method of
    the user's object runs); a bar whose attributes are not tqdm's is skipped. ``now_wall``:
    ``time.time()`` (tqdm's clock for ``start_t``). Never raises.
    """
    std = sys.modules.get("tqdm.std")
    cls = getattr(std, "tqdm", None) if std is not None else None
    try:
        live = list(vars(cls).get("_instances", ()))[:BARS_SCANNED] if cls is not None else []
    except Exception:  # the WeakSet changed while copied (another thread made a bar): next time
        return ()
    now = time.time() if now_wall is None else now_wall
    found: list[tuple[int, float, wire.BarInfo]] = []
    for bar in live:
        try:
            d = object.__getattribute__(bar, "__dict__")
            n, start, pos, desc = _count(d.get("n")), d.get("start_t"), d.get("pos", 0), d.get("desc", "")
            total = d.get("total")
            if n is None or isinstance(start, bool) or not isinstance(start, (int, float)):
                continue
            if total is not None and _count(total) is None:
                total = None
            where = abs(pos) if isinstance(pos, int) and not isinstance(pos, bool) else 0
            text = wire.clean_text(desc, wire.BAR_DESC).strip().rstrip(":") if isinstance(desc, str) else ""
            info = wire.BarInfo(
                n=n,
                total=_count(total),
                desc=text,
                elapsed_s=round(min(max(0.0, now - float(start)), 1e9), 3),
                pos=min(where, 1 << 16),
            )
            found.append((info.pos, float(start), info))
        except Exception:
            continue
    found.sort(key=lambda x: (x[0], x[1]))
    return tuple(info for _p, _s, info in found[: wire.BARS_MAX])


def progress_info(
    epochs: EpochWatch | None, loss: LossWatch, updates: UpdateWatch | None = None
) -> wire.ProgressInfo | None:
    """The record ``hook.json`` carries (``None`` before an epoch, a loss reading or a bar)."""
    bars = read_bars()
    if (epochs is None or not epochs.epoch) and not loss.samples and not loss.note and not bars:
        return None
    bad = loss.first_nonfinite
    return wire.ProgressInfo(
        epoch=epochs.epoch if epochs is not None and epochs.epoch else None,
        batch=epochs.batch if epochs is not None else 0,
        epoch_len=epochs.length if epochs is not None else None,
        loss=tuple(wire.LossSample(s, round(t, 6), v) for s, t, v in loss.samples),
        first_nonfinite=None if bad is None else wire.LossSample(bad[0], round(bad[1], 6), bad[2]),
        loss_note=loss.note,
        bars=bars,
        at=round(time.monotonic(), 3),
        updates=updates.info if updates is not None else None,
    )

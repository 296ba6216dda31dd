"""Classify one Python stack of the training loop's main thread into a phase.

Pure functions over :class:`~torchwatch.model.readings.Frame` tuples (outermost first). The phases:

- ``startup``: importing modules (``<frozen importlib._bootstrap>``); left out of the loop's shares.
- ``data``: inside a DataLoader iterator's ``__next__`` (or ``__iter__``, which starts workers),
  split by what the innermost frames do:
  ``queue`` (waiting on worker processes), ``fetch`` (the dataset and collate run in this
  thread, as with ``num_workers=0``), ``pin`` (pin-memory), ``start`` (workers starting) or ``other``.
- ``optimizer``, ``backward``, ``forward``: the innermost of these that the stack is in.
- ``other``: the rest: user code in the loop, tensor ops called directly, logging, ...
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from torchwatch.model.readings import Frame

_DATALOADER = "torch/utils/data/dataloader.py"
_QUEUE_FILES = (
    "multiprocessing/queues.py",
    "multiprocessing/connection.py",
    "/queue.py",
    "/threading.py",
    "/selectors.py",
)
_QUEUE_FUNCS = ("_try_get_data", "_get_data")


def _endswith(filename: str, suffix: str) -> bool:
    return filename.replace("\\", "/").endswith(suffix)


def _in_file(filename: str, part: str) -> bool:
    return part in filename.replace("\\", "/")


# Every analysis tick classifies every stack of the window again (each py-spy chunk is in ~3 windows
# at 1 s ticks, more in the steady cadence), and a training repeats a few hundred distinct stacks:
# the answers are kept per stack (the key is the frames themselves, so a stack seen again is looked
# up, never classified again). 4096 stacks of ~50 frames hold a few MB at most.
_CACHE_STACKS = 4096


def data_part(frames: Sequence[Frame]) -> str | None:
    """Which part of data loading the stack is in, or ``None`` when not in a DataLoader iterator."""
    return _data_part(tuple(frames))


def phase(frames: Sequence[Frame]) -> str:
    """Phase of one main-thread stack: startup, data, optimizer, backward, forward or other."""
    return _phase(tuple(frames))


@functools.lru_cache(maxsize=_CACHE_STACKS)
def _data_part(frames: tuple[Frame, ...]) -> str | None:
    start = None
    for i, f in enumerate(frames):
        if _endswith(f.filename, _DATALOADER) and f.name.endswith(("__next__", "__iter__", "_get_iterator")):
            start = i
            break
    if start is None:
        return None
    inner = frames[start:]
    if any(_endswith(f.filename, _DATALOADER) and f.name.endswith(_QUEUE_FUNCS) for f in inner):
        return "queue"
    if any(_in_file(f.filename, "torch/utils/data/_utils/pin_memory.py") for f in inner):
        return "pin"
    if any(
        _in_file(f.filename, "torch/utils/data/_utils/fetch.py") or f.name.endswith(("__getitem__", "__getitems__"))
        for f in inner
    ):
        return "fetch"
    if any(
        f.name.endswith(("_get_iterator", "__init__", "_reset")) and _endswith(f.filename, _DATALOADER) for f in inner
    ) or any(_in_file(f.filename, "multiprocessing/") for f in inner):
        return "start"
    if any(_in_file(f.filename, "torch/utils/data/_utils/collate.py") for f in inner):
        return "fetch"
    return "other"


@functools.lru_cache(maxsize=_CACHE_STACKS)
def _phase(frames: tuple[Frame, ...]) -> str:
    if any(f.filename.startswith("<frozen importlib") for f in frames):
        return "startup"
    if _data_part(frames) is not None:
        return "data"
    for f in reversed(frames):  # innermost first: backward inside an optimizer closure is backward
        fn = f.filename.replace("\\", "/")
        if "torch/optim/" in fn or f.name.endswith("zero_grad"):
            return "optimizer"
        if "torch/autograd/" in fn or (fn.endswith("torch/_tensor.py") and f.name.endswith("backward")):
            return "backward"
        if fn.endswith("torch/nn/modules/module.py") and f.name.endswith(("_call_impl", "_wrapped_call_impl")):
            return "forward"
    return "other"


def top_frame(frames: Sequence[Frame], skip_library: bool = True) -> Frame | None:
    """The innermost frame, or the innermost outside site-packages and the standard library."""
    if not frames:
        return None
    if skip_library:
        for f in reversed(frames):
            if "site-packages" not in f.filename and "/lib/python" not in f.filename and not f.filename.startswith("<"):
                return f
    return frames[-1]

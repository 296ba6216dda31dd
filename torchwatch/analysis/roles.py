"""What a child process of the training does, from one dump of its Python stacks: its role.

The process tree alone cannot tell a DataLoader worker from a trainer: a forked child runs the
parent's command line, and every child started by ``multiprocessing``'s spawn runs the same
``--multiprocessing-fork`` one. What the child runs tells them apart:

- a **DataLoader worker** runs torch's worker loop
  (``torch/utils/data/_utils/worker.py::_worker_loop``), in every one of its states (fetching,
  waiting on its index queue, exiting);
- a **trainer** (Hogwild-style training, a ``multiprocessing.Pool`` of trainers, a rank started by
  ``multiprocessing`` rather than ``torch.multiprocessing.spawn``) runs the training's phases
  itself: a module's forward, backward, an optimizer step (:func:`torchwatch.analysis.stacks.phase`).

A child that shows neither yet (still importing torch, building its model) is undecided: asked
again later. Pure functions over :class:`~torchwatch.model.hang.DumpedThread`.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchwatch.model.hang import DumpedThread
from torchwatch.model.readings import Frame

__all__ = ["TRAINER", "WORKER", "WORKER_LOOP", "classify", "in_training_step"]

WORKER = "worker"
TRAINER = "trainer"
WORKER_LOOP = ("torch/utils/data/_utils/worker.py", "_worker_loop")
"""File (suffix) and function of torch's DataLoader worker loop."""

_STEP_FRAMES = (
    ("torch/nn/modules/module.py", ("_call_impl", "_wrapped_call_impl")),  # a module's forward
    ("torch/autograd/__init__.py", ("backward",)),
    ("torch/autograd/graph.py", ("_engine_run_backward",)),
    ("torch/_tensor.py", ("backward",)),
)


def in_training_step(frame: Frame) -> bool:
    """Whether ``frame`` is a module's forward, a backward pass or an optimizer's method (any
    function in ``torch/optim/`` but a module's top level, which is an import)."""
    fn = frame.filename.replace("\\", "/")
    if "torch/optim/" in fn:
        return frame.name != "<module>"
    return any(fn.endswith(file) and frame.name.endswith(names) for file, names in _STEP_FRAMES)


def _runs_worker_loop(thread: DumpedThread) -> bool:
    file, func = WORKER_LOOP
    return any(f.filename.replace("\\", "/").endswith(file) and f.name.endswith(func) for f in thread.frames)


def classify(threads: Sequence[DumpedThread]) -> str | None:
    """The role of a process from one ``py-spy dump`` of its threads.

    Returns:
        :data:`WORKER` when any thread runs torch's DataLoader worker loop (that wins: a worker's
        dataset may itself call a model's forward, e.g. to precompute features); :data:`TRAINER`
        when a thread is in a forward, backward or optimizer step (:func:`in_training_step`), also
        while that step imports something (the first ``optimizer.step()`` imports parts of torch
        lazily: 8 s of a trainer's first 10 s on the loaded 2-core test machine); ``None`` when
        neither shows (undecided: importing, setting up, between steps in user code).
    """
    if any(_runs_worker_loop(t) for t in threads):
        return WORKER
    if any(in_training_step(f) for t in threads for f in t.frames):
        return TRAINER
    return None

"""Features: pure functions from a :class:`~torchwatch.analysis.store.Window` to named numbers.

Every feature is declared once in :data:`CATALOGUE` with its unit and source; a value that
cannot be computed (source unavailable, too few samples) is ``None``, never 0.

Shares are fractions of the training loop's wall time, 0..1. "The loop" is the main thread
of the first training process (rank). Stack shares come from py-spy; thread-state shares
come from ``/proc`` sampled independently at 10 Hz. The two are joined by attribution:
with ``num_workers=0`` the DataLoader runs in the main thread, so its disk, sleep and socket
waits are counted against the time the stacks show in the DataLoader first (see
:func:`~torchwatch.analysis.features.loop._attribute_fetch`).

One module per family (:mod:`.loop`: the loop's phases from stacks; :mod:`.threads`: ``/proc``
thread states; :mod:`.process`: the process tree and the machine; :mod:`.busy`: trainers on a
busy machine; :mod:`.gpu`; :mod:`.hook`: what the hook measured; :mod:`.compile`: torch.compile
and FLOPs; :mod:`.ranks`: collectives). Each declares its steps (:class:`~.steps.Step`: what
each makes and reads); :data:`ORDER` is computed from those declarations (:func:`~.steps.order`).
A new family: a module with its ``STEPS``, listed in :data:`FAMILIES`, its names in the catalogue.
"""

from __future__ import annotations

from torchwatch.analysis import producers
from torchwatch.analysis import progress as _progress
from torchwatch.analysis.features import busy, gpu, hook, loop, process, ranks, threads
from torchwatch.analysis.features import compile as compiled
from torchwatch.analysis.features.busy import trainer_features
from torchwatch.analysis.features.catalogue import (
    CATALOGUE,
    MIN_STACK_SAMPLES,
    MIN_THREAD_SAMPLES,
    PRODUCER_CATALOGUE,
    Features,
)
from torchwatch.analysis.features.compile import COMPILE_TEXTS, compile_texts, event_text
from torchwatch.analysis.features.gpu import gpus_in_use
from torchwatch.analysis.features.loop import loop_window
from torchwatch.analysis.features.ranks import _collective_wait, collective_cpu, rank_collective_wait
from torchwatch.analysis.features.steps import Step, order
from torchwatch.analysis.features.threads import thread_states
from torchwatch.analysis.store import Window

__all__ = [
    "CATALOGUE",
    "COMPILE_TEXTS",
    "FAMILIES",
    "MIN_STACK_SAMPLES",
    "MIN_THREAD_SAMPLES",
    "ORDER",
    "PRODUCER_CATALOGUE",
    "PROGRESS_FEATURES",
    "STEPS",
    "WATCH_FEATURES",
    "Features",
    "Step",
    "_collective_wait",
    "collective_cpu",
    "compile_texts",
    "compute",
    "event_text",
    "gpus_in_use",
    "loop_window",
    "rank_collective_wait",
    "texts",
    "thread_states",
    "trainer_features",
]

FAMILIES = (loop, hook, compiled, threads, ranks, process, busy, gpu)
"""The feature families, in the order their steps are listed (which :func:`~.steps.order` keeps
where the declarations leave it free)."""

STEPS: tuple[Step, ...] = tuple(s for family in FAMILIES for s in family.STEPS)
ORDER: tuple[Step, ...] = order(STEPS)
""":data:`STEPS` in the order :func:`compute` runs them (computed once, at import)."""


WATCH_FEATURES = frozenset(
    {
        "mem_limit_bytes", "mem_used_bytes", "mem_used_share", "mem_forecast_s", "mem_forecast_soonest_s",
        "mem_forecast_latest_s", "mem_growth_bytes_per_s", "mem_tree_growth_share", "cuda_mem_forecast_s",
        "cuda_mem_forecast_soonest_s", "cuda_mem_growth_bytes_per_s", "worker_private_growth_bytes",
        "worker_shared_drop_bytes", "worker_private_growth_bytes_per_s", "worker_cow_share", "oom_records",
    }
)  # fmt: skip
"""Features of the catalogue that :func:`compute` does not make: the memory watch makes them from
minutes of readings (:meth:`torchwatch.watch.memwatch.MemoryWatch.features`), and the session adds
them to every analysis."""


PROGRESS_FEATURES = frozenset(name for name, *_ in _progress.CATALOGUE)
"""Features of the catalogue that :func:`compute` does not make: the epoch and the loss's health,
from minutes of the hook's readings (:func:`torchwatch.analysis.progress.features`); the session
adds them to every analysis."""


def texts(window: Window, main_pid: int | None) -> dict[str, str]:
    """Settings fix templates quote verbatim, as the training's hook read them (none: no hook).

    Returns:
        ``optimizer_state`` (``AdamW(foreach=None, fused=None)``: ``None`` = left to torch),
        ``alloc_conf_state`` (``PYTORCH_CUDA_ALLOC_CONF='...'`` or ``PYTORCH_CUDA_ALLOC_CONF is not set``),
        ``thread_env`` (``OMP_NUM_THREADS=8`` or ``OMP_NUM_THREADS unset``), each only when read, and
        ``cpu_neighbours`` (``PID 812 python (alice) 1.0 cores, ...``: the largest CPU users outside
        the training and torchwatch in the window's last scan that saw any), only when there are,
        ``loader_settings`` (the most-used DataLoader's settings as passed:
        :meth:`~torchwatch.wire.LoaderInfo.settings_text`), once the hook has seen one,
        and the torch.compile events in words (:func:`compile_texts`), once something compiled.
    """
    out: dict[str, str] = {}
    neighbours = next((s.neighbours for s in reversed(window.system) if s.neighbours), ())
    if neighbours:
        out["cpu_neighbours"] = ", ".join(f"PID {n.pid} {n.name} ({n.user}) {n.cores:.1f} cores" for n in neighbours)
    reads = [h for h in window.hook if (main_pid is None or h.pid == main_pid) and h.record is not None]
    record = reads[-1].record if reads else None
    threads = record.threads if record is not None else None
    if threads is not None:
        out["thread_env"] = (
            f"OMP_NUM_THREADS={threads.omp_num_threads}"
            if threads.omp_num_threads is not None
            else "OMP_NUM_THREADS unset"
        )
    if record is not None and record.dataloaders:
        out["loader_settings"] = record.dataloaders[0].settings_text()  # the most-used loader first
    if record is not None and record.compile is not None:
        out.update(compile_texts(record.compile))
    out.update(producers.producer_texts(window, main_pid))
    settings = record.gpu_settings if record is not None else None
    if settings is None:
        return out
    out["alloc_conf_state"] = (
        "PYTORCH_CUDA_ALLOC_CONF is not set"
        if settings.alloc_conf is None
        else f"PYTORCH_CUDA_ALLOC_CONF={settings.alloc_conf!r}"
    )
    if settings.optimizer is not None:
        out["optimizer_state"] = (
            f"{settings.optimizer}(foreach={settings.optimizer_foreach}, fused={settings.optimizer_fused})"
        )
    return out


def compute(window: Window, main_pid: int | None) -> Features:
    """All features of :data:`CATALOGUE` for ``window``: each step of :data:`ORDER` in turn, on the
    window from the training's first step on (:func:`~.loop.loop_window`).

    Args:
        window: readings of the last few seconds.
        main_pid: the training process whose main thread is "the loop"; ``None`` takes any main.

    Returns:
        ``{name: value or None}`` with exactly the catalogue's keys.
    """
    window = loop_window(window, main_pid)
    f: Features = {}
    for s in ORDER:
        f.update(s.run(window, main_pid, f))
    return {name: f.get(name) for name in CATALOGUE}

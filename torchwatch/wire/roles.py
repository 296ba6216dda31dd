"""Which Python processes of a training's tree are not the training: launchers and helpers.

One list, read on both sides: the hook's :func:`torchwatch.hook.should_install`
matches it against its own command line (so the hook stays out of these processes), and
:func:`torchwatch.sources.proc.assign_roles` against every command line of the watched tree (so
torchwatch never diagnoses them as the training).
"""

from __future__ import annotations

import os

__all__ = [
    "HELPER_MODULE_PREFIXES",
    "HELPER_SCRIPT_DIRS",
    "LAUNCHER_MODULES",
    "LAUNCHER_SCRIPTS",
    "MP_HELPER_MARKERS",
    "SPAWN_MARKERS",
]

LAUNCHER_MODULES = (
    "torch.distributed.run",
    "torch.distributed.launch",
    "accelerate.commands.launch",
    "deepspeed.launcher.launch",
    "deepspeed.launcher.runner",
)
"""``python -m MODULE`` that starts ranks (torchrun's module, the older launcher, Accelerate's, DeepSpeed's:
``deepspeed`` runs ``python -m deepspeed.launcher.launch``, which starts the ranks; a hook there would take
the pre-load variables out of the environment before the ranks inherit it)."""

LAUNCHER_SCRIPTS = ("torchrun", "accelerate", "deepspeed")
"""Console scripts that start ranks."""

HELPER_MODULE_PREFIXES = ("torch._inductor.",)
"""``python -m`` modules of torch's helper processes (torch.compile's compile workers)."""

HELPER_SCRIPT_DIRS = (os.sep + os.path.join("torch", "_inductor", ""),)
"""... the same helpers started as a script path: ``python .../torch/_inductor/compile_worker/__main__.py``."""

MP_HELPER_MARKERS = ("resource_tracker", "semaphore_tracker", "multiprocessing.forkserver")
"""Command-line parts of multiprocessing's helper processes (resource tracker, forkserver)."""

SPAWN_MARKERS = ("multiprocessing.spawn", "spawn_main", "multiprocessing.popen_spawn")
"""Command-line parts of a process started by multiprocessing's spawn (a spawned DataLoader worker)."""

"""Run a demo script with every optimizer step's end time recorded: ``_stepclock.py OUT SCRIPT ARGS...``.

A global optimizer step post-hook appends ``time.monotonic()`` (CLOCK_MONOTONIC, comparable
across processes) to an array, written to OUT (float64, native order) when the script exits.
The script itself is unmodified: this is how ``bench/inject.py`` sees the pauses it causes.
``OUT.pid`` gets the training's PID at start and ``OUT.cpu`` its own CPU seconds at exit
(``bench/peers.py``; ``bench/_traceml_demo.py`` starts the same clock with :func:`start`).
"""

import array
import atexit
import importlib
import os
import resource
import runpy
import sys
import time


def start(out: str) -> None:
    """Record this process's PID to ``OUT.pid`` now, each optimizer step's end from now on, and,
    at exit, the steps to ``OUT`` and the training's own CPU to ``OUT.cpu``."""
    stamps = array.array("d")
    with open(out + ".pid", "w") as f:  # the training's PID (bench/peers.py tells its processes apart)
        f.write(str(os.getpid()))

    def save() -> None:
        with open(out, "wb") as f:
            f.write(stamps.tobytes())
        # the training's own CPU (user + system, s): this process and the children it reaped (its
        # DataLoader workers), for bench/peers.py's inside/outside split
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(out + ".cpu", "w") as f:
            f.write(repr(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime))

    atexit.register(save)
    importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook(
        lambda opt, args, kwargs: stamps.append(time.monotonic())
    )


if __name__ == "__main__":
    out, script = sys.argv[1], sys.argv[2]
    sys.argv = sys.argv[2:]
    start(out)
    runpy.run_path(script, run_name="__main__")

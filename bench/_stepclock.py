"""Run a demo script with every optimizer step's end time recorded: ``_stepclock.py OUT SCRIPT ARGS...``.

A global optimizer step post-hook appends ``time.monotonic()`` (CLOCK_MONOTONIC, comparable
across processes) to an array, written to OUT (float64, native order) when the script exits.
The script itself is unmodified: this is how ``bench/inject.py`` sees the pauses it causes.
"""

import array
import atexit
import importlib
import runpy
import sys
import time

out, script = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
stamps = array.array("d")


def _save() -> None:
    with open(out, "wb") as f:
        f.write(stamps.tobytes())


atexit.register(_save)
importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook(
    lambda opt, args, kwargs: stamps.append(time.monotonic())
)
runpy.run_path(script, run_name="__main__")

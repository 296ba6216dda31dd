"""Run a demo with TraceML's plain-PyTorch instrumentation added, for ``bench/peers.py``:
``_traceml_demo.py OUT SCRIPT ARGS...`` (started by ``traceml run``).

TraceML's quick start for a custom loop (traceml-ai 0.5, README "Plain PyTorch example") adds two
things to the script: ``traceml.init(mode="auto")`` before the loop, and ``with
traceml.trace_step(model):`` around each step's work. The demos' loop is ``demo/_common.py``'s
``Run.train(loader, step, seconds)``, where ``step`` is a closure over ``model``: this wrapper adds
exactly those two lines there (the DataLoader's fetch stays outside ``trace_step``, as in
TraceML's example), so the demo files stay as they are.

As ``bench/_stepclock.py`` does, it records every optimizer step's end (``time.monotonic()``,
float64) to OUT, and the training's own CPU (this process and the children it reaped, the
DataLoader workers: user + system, s) to ``OUT.cpu`` at exit.
"""

import array
import atexit
import importlib
import inspect
import resource
import runpy
import sys
import time
from pathlib import Path

out, script = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
stamps = array.array("d")
with open(out + ".pid", "w") as _f:  # the training's PID (bench/peers.py tells its processes apart)
    _f.write(str(__import__("os").getpid()))


def _save() -> None:
    with open(out, "wb") as f:
        f.write(stamps.tobytes())
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    Path(out + ".cpu").write_text(repr(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime))


atexit.register(_save)
importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook(
    lambda opt, args, kwargs: stamps.append(time.monotonic())
)

import traceml_ai as traceml  # noqa: E402  (after the step clock: its own patches come on top)

sys.path.insert(0, str(Path(script).resolve().parent))
_common = importlib.import_module("_common")
_train = _common.Run.train


def _traced_train(self, loader, step, seconds, steps=0):  # type: ignore[no-untyped-def]
    model = inspect.getclosurevars(step).nonlocals["model"]

    def traced(batch):  # type: ignore[no-untyped-def]
        with traceml.trace_step(model):
            return step(batch)

    return _train(self, loader, traced, seconds, steps)


traceml.init(mode="auto")
_common.Run.train = _traced_train
runpy.run_path(script, run_name="__main__")

"""Run a demo with TraceML's plain-PyTorch instrumentation added, for ``bench/peers.py``:
``_traceml_demo.py OUT SCRIPT ARGS...`` (started by ``traceml run``).

TraceML's quick start for a custom loop (traceml-ai 0.5, README "Plain PyTorch example") adds two
things to the script: ``traceml.init(mode="auto")`` before the loop, and ``with
traceml.trace_step(model):`` around each step's work. The demos' loop is ``demo/_common.py``'s
``Run.train(loader, step, seconds)``, where ``step`` is a closure over ``model``: this wrapper adds
exactly those two lines there (the DataLoader's fetch stays outside ``trace_step``, as in
TraceML's example), so the demo files stay as they are.

It starts ``bench/_stepclock.py``'s clock (every optimizer step's end to OUT, the training's PID
to ``OUT.pid``, its own CPU to ``OUT.cpu`` at exit) before TraceML's patches.
"""

import importlib
import importlib.util
import inspect
import runpy
import sys
from pathlib import Path

# the step clock by its path (bench/ itself on sys.path would put its scripts before the packages)
_spec = importlib.util.spec_from_file_location("_stepclock", Path(__file__).resolve().with_name("_stepclock.py"))
assert _spec is not None and _spec.loader is not None
_stepclock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_stepclock)

out, script = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
_stepclock.start(out)

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

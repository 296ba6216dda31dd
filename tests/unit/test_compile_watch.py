"""torch.compile's health read from what torch keeps (issue 33): torch's reasons in the user's words,
the wire record and its bounds, the hook's reader on real compiles (the ``eager`` backend: dynamo's
guards, recompiles, graph breaks and limit are the same, without inductor's seconds), the features,
texts and rules that name them, and the report's lines."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.hookrecords import hook_record
from torchwatch import wire
from torchwatch.analysis import features as feats
from torchwatch.analysis.diagnosis import Diagnoser
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.analysis.store import Window
from torchwatch.faces.compile import compile_lines, compile_summary, event_line
from torchwatch.hook import compiled
from torchwatch.model.readings import HookState

RULES = {r.id: r for r in load_rules()}


# -- words ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reason", "args", "cause", "words"),
    [
        # torch 2.13, a compiled nn.Module: its input is args[0], named from the call
        ("0/0: tensor 'args[0]' size mismatch at index 0. expected 32, actual 17", ("x",), "shape",
         "shape of x changed 32→17 (dim 0)"),
        # a compiled function, and the older L['x'] form (torch 2.1-2.5)
        ("0/0: tensor 'x' size mismatch at index 1. expected 64, actual 80", (), "shape",
         "shape of x changed 64→80 (dim 1)"),
        ("1/2: tensor 'L['x']' size mismatch at index 0. expected 8, actual 9", (), "shape",
         "shape of x changed 8→9 (dim 0)"),
        ("0/0: tensor 'x' dtype mismatch. expected Float, actual Half", (), "dtype", "dtype of x changed Float→Half"),
        ("0/0: tensor 'args[0]' requires_grad mismatch. expected requires_grad=0", ("batch",), "requires_grad",
         "requires_grad of batch changed"),
        # a Python value, with torch's "# source line  # file:line" tail
        ("0/3: k == 'm3'                                                # y = y * len(k)  # t/m.py:14 in forward",
         (), "value", "value of k changed (compiled for == 'm3')"),
        ("0/0: L['lr'] == 0.1", (), "value", "value of lr changed (compiled for == 0.1)"),
        ("0/0: L['self']._modules['fc'].training == True", (), "training",
         "self.fc.training changed (model.train() / model.eval() switch)"),
        ("0/1: len(L['xs']) == 3", (), "length", "length of xs changed (compiled for 3)"),
        ("0/0: ___check_type_id(L['y'], 94239)", (), "type", "type of y changed"),
        ("0/0: ___check_obj_id(L['cfg'], 140001)", (), "object", "cfg is another object than the one compiled for"),
        ("0/0: GLOBAL_STATE changed: grad_mode ", (), "global_state",
         "global state changed (grad mode, autocast, default dtype or a torch setting)"),
        ("0/0: ___stack0 == 26.5", (), "value",
         "value of a value carried over a graph break changed (compiled for == 26.5)"),
        # guards on a dynamic shape's range (after torch made the size symbolic)
        ("0/1: 2 <= L['x'].storage_offset()", (), "stride",
         "storage offset of x changed (compiled for 2 <= x.storage_offset())"),
        ("0/2: args[0].size()[0] <= 256", ("batch",), "shape",
         "size of batch changed (compiled for batch.size()[0] <= 256)"),
        ("something torch says one day", (), "other", "something torch says one day"),
    ],
)  # fmt: skip
def test_guard_reasons_become_the_users_words(reason: str, args: tuple[str, ...], cause: str, words: str) -> None:
    assert compiled.guard_words(reason, args) == (cause, words)


@pytest.mark.parametrize(
    ("reason", "cause", "words"),
    [
        ("Unsupported Tensor.item() call with capture_scalar_outputs=False\n  Explanation: ...\n  Hint: Set "
         "`torch._dynamo.config.capture_scalar_outputs = True`", "item", "Tensor.item() in the compiled code"),
        ("Failed to trace builtin operator\n  Explanation: Dynamo does not know how to trace builtin operator "
         "`print` with argument types ['str']", "print", "print() in the compiled code"),
        ("generic_jump TensorVariable()", "data_dependent",
         "a branch on a tensor's value (data-dependent control flow)"),
        ("Tensor.tolist() with non-integer tensor\n  Hint: Ensure the input is an integer type", "unsupported",
         "Tensor.tolist() with non-integer tensor"),
    ],
)  # fmt: skip
def test_graph_break_reasons_become_words_and_keep_torchs_hint(reason: str, cause: str, words: str) -> None:
    got_cause, got_words, hint = compiled.break_words(reason)
    assert (got_cause, got_words) == (cause, words)
    assert (hint is not None) == ("Hint:" in reason)


@pytest.mark.parametrize(
    ("code", "args"),
    [("model(x)", ("x",)), ("loss_fn(model(x), y)", ("model(x)", "y")), ("out = c(x); out.sum().backward()", ("x",)),
     ("self.net(batch['img'], t)", ("batch['img']", "t")), ("for i in range(", ())],
)  # fmt: skip
def test_the_calls_argument_expressions_name_args_i(code: str, args: tuple[str, ...]) -> None:
    assert compiled.call_args(code) == args


# -- the wire record -----------------------------------------------------------------------------
def _event(**kw: Any) -> dict[str, Any]:
    base = {"kind": "recompile", "cause": "shape", "words": "shape of x changed 32→17 (dim 0)", "count": 1, "t": 5.0}
    return {**base, **kw}


def _info(**kw: Any) -> dict[str, Any]:
    base = {"frames": 2, "graphs": 2, "recompiles": 1, "graph_breaks": 0, "cache_limit_hits": 0, "compile_s": 1.5,
            "spans": [[1.0, 2.0], [5.0, 6.2]], "events": [_event(file="/w/train.py", line=88, code="out = model(x)")],
            "recompile_limit": 8, "t": 7.0}  # fmt: skip
    return {**base, **kw}


def test_compile_info_round_trips_in_hook_json() -> None:
    rec = hook_record(compile=_info())
    assert rec.compile is not None and rec.compile.events[0].where == "train.py:88"
    again = wire.HookRecord.decode(json.loads(json.dumps(rec.to_json())))
    assert again.compile == rec.compile
    assert "compile" not in hook_record().to_json()  # absent before anything compiled (older readers)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (_info(spans=[[2.0, 1.0]]), "ends before it starts"),
        (_info(spans=[[1.0, 2.0]] * (wire.MAX_COMPILE_SPANS + 1)), "items, at most"),
        (_info(events=[_event()] * (wire.MAX_COMPILE_EVENTS + 1)), "items, at most"),
        (_info(events=[_event(kind="explosion")]), "is not one of"),
        (_info(events=[_event(words="w" * (wire.TEXT + 1))]), "characters, at most"),
        (_info(recompiles=-1), "outside"),
        (_info(events=[_event(count=0)]), "outside"),
    ],
)
def test_compile_info_bounds_are_enforced(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(wire.WireError, match=message):
        hook_record(compile=bad)


# -- the reader, on real compiles ------------------------------------------------------------------
@pytest.fixture
def torch() -> Any:
    """torch, with torch._dynamo's caches, counters and metrics fresh (and again after the test);
    the tests that take it are skipped without torch."""
    torch = pytest.importorskip("torch")
    du = pytest.importorskip("torch._dynamo.utils")

    def fresh() -> None:
        torch._dynamo.reset()
        du.counters.clear()
        du.clear_compilation_metrics()

    fresh()
    yield torch
    fresh()


def _read(watch: compiled.CompileWatch) -> wire.CompileInfo:
    watch.read(1.0)
    assert watch.error is None and watch.info is not None
    return watch.info


def test_a_shape_recompile_is_named_with_the_callers_line(torch: Any) -> None:
    watch = compiled.CompileWatch()
    model = torch.compile(torch.nn.Linear(4, 2), backend="eager")
    model(torch.randn(8, 4))
    _read(watch)  # the callback is registered at the first read (the hook's first step boundary)
    batch = torch.randn(5, 4)
    model(batch)  # CALL SITE
    info = _read(watch)
    assert (info.frames, info.recompiles, info.graph_breaks, info.cache_limit_hits) == (2, 1, 0, 0)
    (event,) = info.events
    assert (event.kind, event.cause, event.words) == ("recompile", "shape", "shape of batch changed 8→5 (dim 0)")
    assert event.file == __file__ and event.code == "model(batch)  # CALL SITE" and event.where is not None
    assert len(info.spans) == 2 and all(b >= a for a, b in info.spans) and info.compile_s > 0
    assert watch.read(2.0) is False  # nothing new: nothing re-read, nothing republished
    watch.close()


def test_a_graph_break_from_item_is_named_with_its_line(torch: Any) -> None:
    watch = compiled.CompileWatch()

    def forward(x: Any) -> Any:
        y = x * 2
        if y.sum().item() > 0:  # BREAK
            y = y + 1
        return y

    torch.compile(forward, backend="eager")(torch.ones(3))
    info = _read(watch)
    assert info.graph_breaks == 1
    event = next(e for e in info.events if e.kind == "graph_break")
    assert (event.cause, event.words) == ("item", "Tensor.item() in the compiled code")
    assert event.code is not None and event.code.endswith("# BREAK") and event.function == "forward"
    assert event.hint is not None and "capture_scalar_outputs" in event.hint
    watch.close()


def test_the_recompile_limit_is_named_with_the_last_reason(torch: Any) -> None:
    watch = compiled.CompileWatch()

    def scale(x: Any, mode: str) -> Any:
        return x * len(mode)

    fn = torch.compile(scale, backend="eager")
    fn(torch.ones(2), "m0")
    _read(watch)
    with torch._dynamo.config.patch(recompile_limit=2):
        for i in range(1, 5):
            fn(torch.ones(2), f"m{i}")  # LIMIT CALL
    info = _read(watch)
    assert info.cache_limit_hits == 1 and info.recompiles == 1
    hit = next(e for e in info.events if e.kind == "cache_limit")
    assert hit.words.startswith("hit the recompile limit (2): runs eagerly from now on; last recompile: value of mode")
    assert hit.code is not None and hit.code.endswith("# LIMIT CALL")
    watch.close()


def test_nothing_compiled_is_no_reading(torch: Any) -> None:
    watch = compiled.CompileWatch()
    assert watch.read(1.0) is False and watch.info is None  # torch._dynamo imported, nothing compiled


def test_events_are_bounded_and_merged() -> None:
    watch = compiled.CompileWatch()
    long = "x" * 5000  # a guard quoting a long string constant
    watch._add(wire.CompileEvent("recompile", "value", f"value of k changed (compiled for == '{long}')", long, t=1.0))
    (event,) = watch._events.values()
    assert len(event.words) == len(event.reason) == wire.TEXT
    hook_record(compile=wire.CompileInfo(events=(event,)).to_json())  # within the wire's bounds
    watch._events.clear()
    for i in range(3 * wire.MAX_COMPILE_EVENTS):
        watch._add(wire.CompileEvent("recompile", "shape", f"shape of x changed {i}→{i + 1} (dim 0)", t=float(i)))
        watch._add(wire.CompileEvent("graph_break", "other", f"reason {i}", line=i, t=float(i)))
    assert len(watch._events) == 1 + 3 * wire.MAX_COMPILE_EVENTS
    shape = next(e for e in watch._events.values() if e.cause == "shape")
    assert shape.count == 3 * wire.MAX_COMPILE_EVENTS and shape.words.endswith(f"{3 * wire.MAX_COMPILE_EVENTS} (dim 0)")


# -- features, texts, rules, faces ---------------------------------------------------------------
def _state(t: float, info: dict[str, Any] | None, steps: tuple[tuple[float, float, float], ...] = ()) -> HookState:
    rec = hook_record(**({} if info is None else {"compile": info}))
    return HookState(t=t, pid=7, steps=len(steps), batches=0, data_wait_s=0.0, in_next_since=0.0,
                     new_steps=steps, record=rec)  # fmt: skip


def _window(last: dict[str, Any], first: dict[str, Any] | None = None) -> Window:
    # steps of 0.1 s from t=10 to 20; the one ending at 15.5 ran 1.2 s (it compiled, 14.4-15.5)
    steps = tuple((round(10.0 + 0.1 * i, 1), 0.1, 0.0) for i in range(1, 101) if not 14.4 < 10.0 + 0.1 * i < 15.55)
    steps += ((15.5, 1.2, 0.0),)
    return Window(10.0, 20.0, hook=[_state(10.0, first), _state(20.0, last, tuple(sorted(steps)))])


def test_features_count_the_windows_recompiles_and_split_compiling_steps() -> None:
    last = _info(recompiles=3, spans=[[1.0, 2.0], [14.4, 15.5]], compile_s=2.1)
    f = feats.compute(_window(last, _info(recompiles=2)), 7)
    assert f["compile_recompiles"] == 1.0 and f["compile_recompiles_total"] == 3.0
    assert f["compile_time_share"] == pytest.approx(1.1 / 10.0)
    assert f["compiling_step_p50_ms"] == pytest.approx(1200.0) and f["compiled_step_p50_ms"] == pytest.approx(100.0)
    assert f["compile_recompile_shape"] == 1.0 and f["compile_recompile_limit"] == 8.0
    quiet = feats.compute(Window(10.0, 20.0, hook=[_state(10.0, None), _state(20.0, None)]), 7)
    assert all(quiet[name] is None for name in feats.CATALOGUE if name.startswith("compil"))


def _diagnose(last: dict[str, Any], first: dict[str, Any] | None = None) -> Any:
    window = _window(last, first)
    d = Diagnoser(list(RULES.values()))
    for t in (0.0, 5.0):
        a = d.evaluate(feats.compute(window, 7), t, feats.texts(window, 7))
    return a


def test_a_shape_recompile_is_a_finding_with_place_reason_and_mark_dynamic() -> None:
    a = _diagnose(_info(recompiles=3, spans=[[14.4, 15.5]]), _info(recompiles=2))
    f = next(x for x in a.findings if x.rule == "compile-recompiles")
    assert "shape of x changed 32→17 (dim 0) at train.py:88 (`out = model(x)`)" in f.summary
    assert any("torch._dynamo.mark_dynamic(x, 0)" in fx.detail for fx in f.fixes)
    assert not any(fx.title == "Keep what the guard checks constant" for fx in f.fixes)


def test_graph_breaks_and_the_limit_are_findings_and_a_clean_compile_is_none() -> None:
    brk = _event(
        kind="graph_break",
        cause="item",
        words="Tensor.item() in the compiled code",
        file="/w/m.py",
        line=23,
        code="if y.sum().item() > 0:",
        hint="Set torch._dynamo.config.capture_scalar_outputs = True",
    )
    hit = _event(kind="cache_limit", cause="other", words="hit the recompile limit (8): runs eagerly from now on",
                 file="/w/train.py", line=40)  # fmt: skip
    a = _diagnose(_info(recompiles=7, graph_breaks=1, cache_limit_hits=1, spans=[[1.0, 2.0]], events=[brk, hit]),
                  _info(recompiles=7, graph_breaks=1, cache_limit_hits=1))  # fmt: skip
    rules = {f.rule: f for f in a.findings}
    assert "compile-recompiles" not in rules  # no recompile in the window
    assert "m.py:23 (`if y.sum().item() > 0:`)" in rules["compile-graph-breaks"].summary
    assert "capture_scalar_outputs" in rules["compile-graph-breaks"].fixes[0].detail
    assert "train.py:40" in rules["compile-cache-limit"].summary
    clean = _diagnose(_info(recompiles=0, events=[], spans=[[1.0, 8.0]]), _info(recompiles=0, events=[]))
    assert not [f.rule for f in clean.findings if f.rule.startswith("compile-")]


def test_report_lines_say_what_compiled_and_each_event() -> None:
    info = hook_record(compile=_info(graph_breaks=1)).compile
    assert compile_summary(info) == "torch.compile: 2 frames, 1 recompile, 1 graph break, 1.5 s compiling"
    assert info is not None
    lines = compile_lines(info)
    assert lines[1].strip() == event_line(info.events[0])
    expected = "recompiled: shape of x changed 32→17 (dim 0) at train.py:88 (`out = model(x)`)"
    assert event_line(info.events[0]) == expected

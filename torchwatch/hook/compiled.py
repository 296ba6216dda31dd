"""What ``torch.compile`` did in the training, read from what torch keeps: no ``TORCH_LOGS``.

Standard library only; torch's modules are the training's own, found in ``sys.modules`` and
never imported here (``torch.compile`` imports ``torch._dynamo``: not imported means nothing was
compiled). Read in the training's main thread at a step boundary, at most every
:data:`torchwatch.hook.gpu.SAMPLE_EVERY_S`, with the GPU settings (``bench/hook_cost.py`` and
``bench/compile_flops.py`` print the cost per step). What is read:

- ``torch._dynamo.utils.counters``: frames compiled, graphs, graph breaks (``graph_break``),
  what dynamo refused (``unimplemented``: the recompile limit among them). A change of these
  few numbers is what makes the rest be read at all (a few microseconds when nothing changed).
- ``torch._dynamo.utils.get_compilation_metrics()``: one record per compile (the last 64), with
  its start, duration, frame, and ``recompile_reason``: the guard that failed, as torch words it
  (``tensor 'x' size mismatch at index 0. expected 32, actual 17``). Read only past the last
  record seen.
- ``torch._dynamo.utils.graph_break_reasons``: each graph break's reason and the user's stack.
- a compile-start callback (``torch._dynamo.callback.callback_handler``, the hook torch offers
  for this, run once per compile, never per step): it walks the stack to the first frame of the
  user's code, the call of the compiled model that recompiled (``train.py:88``). Registered at
  the first read after ``torch._dynamo`` appears, so the very first compile may not have it
  (a first compile is no recompile); ``torch._dynamo.reset()`` clears it and the next read
  registers it again.

Torch's reasons become the user's words (:func:`guard_words`, :func:`break_words`): ``shape of x
changed 32→17 (dim 0)``, where ``args[0]`` of a compiled module is named from the call's source
line. Sizes are bounded: :data:`wire.MAX_COMPILE_EVENTS` distinct events, the last
:data:`wire.MAX_COMPILE_SPANS` compile intervals, texts clipped.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import linecache
import os
import re
import sys
import sysconfig
import threading
import time
from collections import deque
from typing import Any, NamedTuple

from .. import wire

LIMIT_GB_TYPES = ("Dynamo recompile limit exceeded", "cache_size_limit", "recompile_limit")
"""Text in torch's reason for a frame that hit the recompile limit (``unimplemented`` counter key
and the compile's ``fail_reason``; torch 2.6+ says "recompile limit", older "cache_size_limit")."""

MAX_SITES = 32  # call sites kept from the compile-start callback (matched to compiles by id)

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # torchwatch/
_LIBS = [sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib")]
_STDLIB = tuple({d + os.sep for p in _LIBS if p for d in (p, os.path.realpath(p))})


class Site(NamedTuple):
    """Where the user's code called into a compile: file, line, the line's source, its call's
    argument expressions (``("x",)`` for ``model(x)``), the compile's id and when it started."""

    compile_id: str | None
    file: str
    line: int
    code: str
    args: tuple[str, ...]
    mono: float
    wall: float


# -- words --------------------------------------------------------------------------------------
_TENSOR = re.compile(
    r"tensor '(?P<name>.+?)' (?P<what>size|stride|dtype|device|requires_grad|dispatch key set|rank|ndim|"
    r"[a-z_ ]+?) ?mismatch(?: at index (?P<index>-?\d+))?\.?\s*(?P<tail>.*)$"
)
_EXPECTED = re.compile(r"expected (?P<exp>[^,]+?),? actual (?P<act>.+)$")
_COMPARE = re.compile(r"^(?P<lhs>.+?)\s*(?P<op>==|!=|<=|>=|<|>| is not | is )\s*(?P<rhs>.+)$")
_NAME_PART = re.compile(r"""\[['"]([^'"\]]+)['"]\]|\.([A-Za-z_][A-Za-z0-9_]*)""")
_ARG_INDEX = re.compile(r"^args\[(\d+)\]$")
_CAUSE_OF_TENSOR = {
    "size": "shape",
    "rank": "shape",
    "ndim": "shape",
    "stride": "stride",
    "dtype": "dtype",
    "device": "device",
    "requires_grad": "requires_grad",
}


def user_name(expr: str, args: tuple[str, ...] = ()) -> str:
    """A guard's source expression in the user's words: ``L['x']`` → ``x``,
    ``L['self']._modules['fc'].training`` → ``self.fc.training``, ``args[0]`` → the call's first
    argument's expression when ``args`` has it (``model(batch)`` → ``batch``)."""
    expr = expr.strip()
    if expr.startswith("___stack"):  # dynamo's name for a value live across a graph break
        return "a value carried over a graph break"
    m = _ARG_INDEX.match(expr)
    if m is not None:
        i = int(m.group(1))
        return args[i] if i < len(args) else expr
    head = re.match(r"^(?:L|G)\[['\"]([^'\"]+)['\"]\]", expr)
    if head is None:
        return expr
    parts = [head.group(1)]
    for key, attr in _NAME_PART.findall(expr[head.end() :]):
        if attr in ("_modules", "_parameters", "_buffers"):
            continue
        parts.append(key or attr)
    return ".".join(p for p in parts if p not in ("_modules", "_parameters", "_buffers"))


_SYMBOLIC = re.compile(
    r"(?P<name>(?:[LG]\[['\"][^'\"]+['\"]\]|args\[\d+\]|[A-Za-z_]\w*)(?:\.\w+|\[['\"][^'\"]+['\"]\])*?)"
    r"\.(?P<what>size|stride|storage_offset)\(\)"
)
_SOURCE = re.compile(r"(?:[LG]\[['\"][^'\"]+['\"]\]|args\[\d+\])(?:\.\w+\b(?!\()|\[['\"][^'\"]+['\"]\])*")


def clean_expr(expr: str, args: tuple[str, ...] = ()) -> str:
    """A guard expression with every source in the user's words (:func:`user_name`):
    ``2 <= L['x'].storage_offset()`` → ``2 <= x.storage_offset()``."""
    return _SOURCE.sub(lambda m: user_name(m.group(0), args), expr)


def _first_reason(reason: str) -> str:
    """The first failed guard of a recompile reason, without its compile id and trailing comment:
    ``0/0: tensor 'x' size mismatch ...; ...  # y = x * k  # t.py:9 in f`` → ``tensor 'x' size ...``."""
    first = reason.strip().splitlines()[0] if reason.strip() else ""
    first = re.sub(r"^\d+/\d+:\s*", "", first)  # the compile id
    first = first.split("; ")[0]  # several failed guards are joined by "; "
    return first.split(" #")[0].strip()  # torch appends "# <the source line>  # <file:line>"


def guard_words(reason: str, args: tuple[str, ...] = ()) -> tuple[str, str]:
    """``(cause, words)`` for a recompile's reason (the guard that failed, as torch words it).

    Args:
        reason: ``recompile_reason`` of torch's compilation metrics, e.g. ``0/0: tensor
            'args[0]' size mismatch at index 0. expected 32, actual 17``.
        args: the argument expressions of the call that recompiled (names ``args[i]``).

    Returns:
        a cause of :data:`wire.COMPILE_CAUSES` and one line, e.g. ``("shape", "shape of x
        changed 32→17 (dim 0)")``.
    """
    guard = _first_reason(reason)
    m = _TENSOR.search(guard)
    if m is not None:
        name = user_name(m.group("name"), args)
        what = m.group("what").strip()
        cause = _CAUSE_OF_TENSOR.get(what, "tensor")
        values = _EXPECTED.match(m.group("tail"))
        change = f" {values.group('exp').strip()}→{values.group('act').strip().rstrip('.')}" if values else ""
        label = "shape" if cause == "shape" else what
        dim = f" (dim {m.group('index')})" if m.group("index") is not None and cause in ("shape", "stride") else ""
        return cause, f"{label} of {name} changed{change}{dim}"
    sym = _SYMBOLIC.search(guard)
    if sym is not None:  # a guard on a dynamic shape's range: x.size()[0], x.stride()[1], ...
        what = sym.group("what").replace("_", " ")
        cause = "shape" if what == "size" else "stride"
        name = user_name(sym.group("name"), args)
        return cause, f"{what} of {name} changed (compiled for {clean_expr(guard, args)})"
    low = guard.lower()
    if "___check_global_state" in guard or "global_state" in low or "grad_mode" in low:
        return "global_state", "global state changed (grad mode, autocast, default dtype or a torch setting)"
    if "invalidated" in low or "deallocated" in low:
        return "freed", "an object the code was compiled for was freed"
    call = re.match(r"^(?:not\s+)?___check_(type_id|obj_id)\((?P<arg>.+?),\s*[0-9]+\)", guard)
    if call is not None:
        name = user_name(call.group("arg"), args)
        if call.group(1) == "type_id":
            return "type", f"type of {name} changed"
        return "object", f"{name} is another object than the one compiled for"
    length = re.match(r"^len\((?P<arg>.+?)\)\s*==\s*(?P<n>\d+)$", guard)
    if length is not None:
        return "length", f"length of {user_name(length.group('arg'), args)} changed (compiled for {length.group('n')})"
    cmp = _COMPARE.match(guard)
    if cmp is not None:
        name = user_name(cmp.group("lhs"), args)
        if name.endswith(".training") or name == "training":
            return "training", f"{name} changed (model.train() / model.eval() switch)"
        return "value", f"value of {name} changed (compiled for {cmp.group('op').strip()} {cmp.group('rhs').strip()})"
    return "other", wire.clean_text(guard or "unknown guard", wire.TEXT)


def break_words(reason: str) -> tuple[str, str, str | None]:
    """``(cause, words, hint)`` for a graph break's reason (torch's ``GraphCompileReason.reason``)."""
    lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()]
    first = lines[0] if lines else "unknown reason"
    hint = next((ln[len("Hint:") :].strip() for ln in lines if ln.startswith("Hint:")), None)
    low = reason.lower()
    if ".item()" in low or "tensor.item" in low or " item (" in low:
        cause, words = "item", "Tensor.item() in the compiled code"
    elif "`print`" in low or "builtin print" in low or "print(" in low:
        cause, words = "print", "print() in the compiled code"
    elif "generic_jump" in low or "data-dependent" in low or "data dependent" in low:
        cause, words = "data_dependent", "a branch on a tensor's value (data-dependent control flow)"
    else:
        cause, words = "unsupported", first
    return cause, wire.clean_text(words, wire.TEXT), None if hint is None else wire.clean_text(hint, wire.TEXT)


def call_args(code: str) -> tuple[str, ...]:
    """The argument expressions of a call: ``model(x, y)`` → ``("x", "y")``. Given a whole line
    (no exact position known), its first call with arguments (``out = model(x); loss = ...``);
    ``()`` when it does not parse on its own."""
    try:
        tree = ast.parse(code.strip(), mode="eval")
        if isinstance(tree.body, ast.Call):
            return tuple(wire.clean_text(ast.unparse(a), 64) for a in tree.body.args[:16])
    except (SyntaxError, ValueError):
        pass
    try:
        mod = ast.parse(code.strip())
    except (SyntaxError, ValueError):
        return ()
    calls = [n for n in ast.walk(mod) if isinstance(n, ast.Call) and n.args]
    return tuple(wire.clean_text(ast.unparse(a), 64) for a in calls[0].args[:16]) if calls else ()


def _call_source(frame: Any) -> str | None:
    """The source of the expression the frame is evaluating (the call into the compiled code),
    from the instruction's position (Python 3.11+); ``None`` before 3.11 or when not one line-range."""
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is None:
        return None
    pos = next(itertools.islice(positions(), frame.f_lasti // 2, None), None)
    if pos is None or None in pos:
        return None
    line0, line1, col0, col1 = pos
    lines = [linecache.getline(frame.f_code.co_filename, n) for n in range(line0, min(line1, line0 + 20) + 1)]
    if not lines or line1 - line0 >= 20:
        return None
    if len(lines) == 1:
        return lines[0][col0:col1]
    return lines[0][col0:] + "".join(lines[1:-1]) + lines[-1][:col1]


# -- the reader ---------------------------------------------------------------------------------
def _user_frame(frame: Any, torch_dir: str) -> Any:
    """The innermost frame outside torch, the standard library and torchwatch, or ``None``."""
    depth = 0
    while frame is not None and depth < 200:
        name = frame.f_code.co_filename
        if not (
            name.startswith(torch_dir)
            or name.startswith(_HERE)
            or name.startswith("<")
            or any(name.startswith(p) for p in _STDLIB)
        ):
            return frame
        frame = frame.f_back
        depth += 1
    return None


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class CompileWatch:
    """The hook's reading of ``torch.compile``: :meth:`read` at a step boundary, :attr:`info` for
    ``hook.json``. Not thread-safe but for the compile-start callback, which only appends.

    Attributes:
        info: what was read last (``None``: nothing compiled yet).
        error: the first failure of a read, if any (the hook records it once).
    """

    def __init__(self) -> None:
        self.info: wire.CompileInfo | None = None
        self.error: str | None = None
        self._sig: tuple[int, ...] = ()
        self._sites: deque[Site] = deque(maxlen=MAX_SITES)
        self._callback: Any = None
        self._handler: Any = None
        self._torch_dir = ""
        self._last_start_us = -1
        self._breaks_seen = 0
        self._events: dict[tuple[str, str, str | None, int | None, str], wire.CompileEvent] = {}
        self._spans: deque[tuple[float, float]] = deque(maxlen=wire.MAX_COMPILE_SPANS)
        self._recompiles = 0
        self._limit_hits = 0
        self._compile_s = 0.0
        self._lock = threading.Lock()

    # -- the compile-start callback (runs inside torch's compile, any thread) --------------------
    def _on_compile_start(self, *args: Any) -> None:
        """Note where the user's code called into this compile. Never raises into torch."""
        try:
            info = args[0] if args else None  # torch 2.6+: CallbackArgs(callback_trigger, compile_id)
            cid = getattr(info, "compile_id", None)
            if getattr(getattr(info, "callback_trigger", None), "name", "DYNAMO") != "DYNAMO":
                return  # a lazy backward compile: no call of the user's to name
            frame = _user_frame(sys._getframe(1), self._torch_dir)
            if frame is None:
                return
            file, line = frame.f_code.co_filename, frame.f_lineno
            code = linecache.getline(file, line).strip()
            exact = _call_source(frame)
            site = Site(
                None if cid is None else str(cid)[:32],
                wire.clean_text(file, wire.PATH),
                line,
                wire.clean_text(code, wire.NAME),
                call_args(exact) if exact else call_args(code),
                time.monotonic(),
                time.time(),
            )
            with self._lock:
                self._sites.append(site)
        except Exception:
            pass

    def _register(self, torch_dynamo: Any) -> None:
        """Register the compile-start callback (again after ``torch._dynamo.reset()`` cleared it)."""
        handler = getattr(torch_dynamo, "callback_handler", None)
        if handler is None:
            cb_mod = sys.modules.get("torch._dynamo.callback")
            handler = getattr(cb_mod, "callback_handler", None)
        starts = getattr(handler, "start_callbacks", None)
        if handler is None or not isinstance(starts, list):
            return
        if self._callback is None:
            self._callback = self._on_compile_start
            torch_mod = sys.modules.get("torch")
            self._torch_dir = os.path.dirname(getattr(torch_mod, "__file__", "") or "") + os.sep
        if self._callback not in starts:
            handler.register_start_callback(self._callback)
            self._handler = handler

    def close(self) -> None:
        """Remove the callback (at exit)."""
        with contextlib.suppress(Exception):
            if self._handler is not None and self._callback in self._handler.start_callbacks:
                self._handler.remove_start_callback(self._callback)

    # -- the read (main thread, at a step boundary) ----------------------------------------------
    def read(self, now: float) -> bool:
        """Read torch's compile records if they changed. Never raises.

        Args:
            now: monotonic s.

        Returns:
            whether :attr:`info` changed (the hook republishes ``hook.json`` then).
        """
        try:
            return self._read(now)
        except Exception as exc:
            if self.error is None:
                self.error = f"torch.compile readings: {exc!r}"
                return True
            return False

    def _read(self, now: float) -> bool:
        utils = sys.modules.get("torch._dynamo.utils")
        counters = getattr(utils, "counters", None)
        if utils is None or not isinstance(counters, dict):
            return False
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is not None:
            self._register(dynamo)
        frames = counters.get("frames") or {}
        stats = counters.get("stats") or {}
        breaks = counters.get("graph_break") or {}
        unimpl = counters.get("unimplemented") or {}
        reasons = getattr(utils, "graph_break_reasons", None)
        metrics_q = getattr(utils, "_compilation_metrics", None)
        last_metric = metrics_q[-1] if metrics_q else None
        sig = (
            _count(frames.get("total")),
            _count(frames.get("ok")),
            _count(stats.get("unique_graphs")),
            sum(_count(v) for v in breaks.values()),
            sum(_count(v) for v in unimpl.values()),
            len(reasons) if isinstance(reasons, list) else 0,
            id(last_metric),
        )
        if sig == self._sig:
            return False
        self._sig = sig
        if not sig[0] and self.info is None:
            return False  # torch._dynamo imported (the profiler does), nothing compiled
        offset = time.monotonic() - time.time()  # wall → monotonic for the metrics' start times
        with self._lock:
            sites = list(self._sites)
        self._read_metrics(utils, offset, sites)
        self._read_breaks(reasons, now)
        limit_hits = sum(_count(v) for k, v in unimpl.items() if any(t in str(k) for t in LIMIT_GB_TYPES))
        self._limit_hits = max(self._limit_hits, limit_hits)
        config = sys.modules.get("torch._dynamo.config")
        limit = getattr(config, "recompile_limit", None)
        limit = getattr(config, "cache_size_limit", None) if limit is None else limit
        events = sorted(self._events.values(), key=lambda e: e.t)[-wire.MAX_COMPILE_EVENTS :]
        self._events = {_key(e): e for e in events}
        self.info = wire.CompileInfo(
            frames=sig[1],
            graphs=sig[2],
            recompiles=self._recompiles,
            graph_breaks=sig[3],
            cache_limit_hits=self._limit_hits,
            compile_s=round(self._compile_s, 4),
            spans=tuple(self._spans),
            events=tuple(events),
            recompile_limit=limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0 else None,
            t=round(now, 4),
        )
        return True

    def _read_metrics(self, utils: Any, offset: float, sites: list[Site]) -> None:
        """Compiles since the last read: their spans, times, recompiles and limit hits."""
        get = getattr(utils, "get_compilation_metrics", None)
        if not callable(get):
            return
        for m in get():
            start_us = getattr(m, "start_time_us", None)
            if not isinstance(start_us, int):
                start_s = getattr(m, "start_time", None)
                start_us = int(start_s * 1e6) if isinstance(start_s, (int, float)) else None
            if start_us is None or start_us <= self._last_start_us:
                continue
            self._last_start_us = start_us
            dur_us = getattr(m, "duration_us", None)
            if not isinstance(dur_us, int):
                total = getattr(m, "entire_frame_compile_time_s", None)
                dur_us = int(total * 1e6) if isinstance(total, (int, float)) else 0
            t0 = max(0.0, start_us / 1e6 + offset)
            t1 = t0 + max(0, dur_us) / 1e6
            self._spans.append((round(t0, 4), round(t1, 4)))
            self._compile_s += max(0, dur_us) / 1e6
            reason = getattr(m, "recompile_reason", None)
            fail = str(getattr(m, "fail_reason", None) or "")
            cid = getattr(m, "compile_id", None)
            if isinstance(reason, str) and reason and not fail:
                self._recompiles += 1
                site = _site_for(sites, cid, start_us / 1e6)
                cause, words = guard_words(reason, site.args if site else ())
                used = _USER_STACK.findall(reason)
                if site is not None and used and cause not in ("shape", "stride", "dtype", "device"):
                    words += f" (used at {used[-1][0].rsplit('/', 1)[-1]}:{used[-1][1]})"
                self._add(wire.CompileEvent("recompile", cause, words, _clip(_first_reason(reason)), t=t0,
                                            **_place(m, site, reason)))  # fmt: skip
            if fail and any(t in fail for t in LIMIT_GB_TYPES):
                site = _site_for(sites, cid, start_us / 1e6)
                last = reason if isinstance(reason, str) else ""
                limit = re.search(r"currently set to (\d+)", fail)
                _, why = guard_words(last, site.args if site else ()) if last else ("other", "")
                words = f"hit the recompile limit{f' ({limit.group(1)})' if limit else ''}: runs eagerly from now on"
                words += f"; last recompile: {why}" if why else ""
                self._add(wire.CompileEvent("cache_limit", "other", _clip(words), _clip(_first_reason(last or fail)),
                                            t=t0, **_place(m, site, last)))  # fmt: skip

    def _read_breaks(self, reasons: Any, now: float) -> None:
        """Graph breaks met since the last read (``graph_break_reasons``: the reason and the user's stack)."""
        if not isinstance(reasons, list):
            return
        if len(reasons) < self._breaks_seen:  # torch._dynamo.reset() cleared them
            self._breaks_seen = 0
        for r in reasons[self._breaks_seen : self._breaks_seen + 64]:
            text = str(getattr(r, "reason", "") or "")
            stack = getattr(r, "user_stack", None) or []
            top = stack[-1] if stack else None
            cause, words, hint = break_words(text)
            self._add(
                wire.CompileEvent(
                    "graph_break",
                    cause,
                    words,
                    _clip(text.strip().splitlines()[0] if text.strip() else ""),
                    hint=hint,
                    file=None if top is None else wire.clean_text(str(top.filename), wire.PATH),
                    line=None if top is None else _line(top.lineno),
                    code=None if top is None or not top.line else wire.clean_text(top.line.strip(), wire.NAME),
                    function=None if top is None else wire.clean_text(str(top.name), wire.NAME),
                    t=round(now, 4),
                )
            )
        self._breaks_seen = len(reasons)

    def _add(self, event: wire.CompileEvent) -> None:
        """Keep ``event``, one with the previous of its kind, cause, place and subject (the words
        without the values: ``shape of x changed 32→17`` and ``... 17→9`` are one, counted twice)."""
        event = _bounded(event)
        key = _key(event)
        old = self._events.pop(key, None)
        if old is not None:
            event = wire.CompileEvent(**{**event.__dict__, "count": old.count + 1})
        self._events[key] = event


def _bounded(e: wire.CompileEvent) -> wire.CompileEvent:
    """``e`` with every text within the wire's bounds (a guard may quote a long value)."""

    def clip(text: str | None, limit: int) -> str | None:
        return None if text is None else wire.clean_text(text, limit)

    return wire.CompileEvent(
        e.kind, e.cause, wire.clean_text(e.words, wire.TEXT), wire.clean_text(e.reason, wire.TEXT),
        clip(e.hint, wire.TEXT), clip(e.file, wire.PATH), _line(e.line), clip(e.code, wire.NAME),
        clip(e.function, wire.NAME), e.count, max(0.0, e.t),
    )  # fmt: skip


_VALUES = re.compile(r"\(compiled for [^)]*\)|-?[0-9][0-9.e+-]*→-?[0-9][0-9.e+-]*|\w+→\w+")


def _key(event: wire.CompileEvent) -> tuple[str, str, str | None, int | None, str]:
    return (event.kind, event.cause, event.file, event.line, _VALUES.sub("", event.words))


def _clip(text: str) -> str:
    return wire.clean_text(text, wire.TEXT)


def _line(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31 else None


def _site_for(sites: list[Site], compile_id: object, start_s: float) -> Site | None:
    """The call site the callback noted for this compile: by compile id, else (torch without ids
    in its callback) the one that started within 1 s before it."""
    cid = None if compile_id is None else str(compile_id)
    for s in reversed(sites):
        if cid is not None and s.compile_id == cid:
            return s
    # a compile refused before it started (the recompile limit) ran no callback: the last call
    # site of the same frame ("0/7" for "0/8") is the same call
    frame = None if cid is None else cid.split("/")[0] + "/"
    for s in reversed(sites):
        if frame is not None and s.compile_id is not None and s.compile_id.startswith(frame):
            return s
    near = [s for s in sites if s.compile_id is None and -1.0 <= start_s - s.wall <= 1.0]
    return near[-1] if near else None


_USER_STACK = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def _place(metric: Any, site: Site | None, reason: str) -> dict[str, Any]:
    """File, line, code and function of an event: the call site when the callback saw it, else the
    guard's own place in the user's stack (torch adds ``User stack trace:`` to some reasons), else
    the compiled frame's first line."""
    function, home = getattr(metric, "co_name", None), getattr(metric, "co_filename", None)
    torch_dir = os.path.dirname(getattr(sys.modules.get("torch"), "__file__", None) or "/nonexistent") + os.sep
    if not isinstance(function, str) or (isinstance(home, str) and home.startswith(torch_dir)):
        function = None  # a compiled nn.Module's frame is torch's own wrapper ("inner")
    out: dict[str, Any] = {"function": None if function is None else wire.clean_text(function, wire.NAME)}
    if site is not None:
        out.update(file=site.file, line=site.line, code=site.code or None)
        return out
    found = _USER_STACK.findall(reason or "")
    if found:
        file, line = found[-1]
        source = wire.clean_text(linecache.getline(file, int(line)).strip(), wire.NAME)
        out.update(file=wire.clean_text(file, wire.PATH), line=_line(int(line)), code=source or None)
        return out
    file, line = home, getattr(metric, "co_firstlineno", None)
    if isinstance(file, str) and not file.startswith(torch_dir):
        out.update(file=wire.clean_text(file, wire.PATH), line=_line(line))
    return out

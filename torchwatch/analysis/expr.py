"""A tiny, safe expression language for rule conditions. Never ``eval``.

Grammar: Python's expression syntax parsed by :mod:`ast`, with only these nodes allowed:
numbers, ``True``/``False``, feature names, ``and``/``or``/``not``, comparisons
(``< <= > >= == !=``, chained), ``+ - * /``, unary ``-``, and calls of :data:`FUNCTIONS`.
Names are checked against the feature catalogue when a rule loads.

Missing values: a feature that is ``None`` makes the whole expression *not applicable*
(:class:`Missing` is raised and names the feature), except inside ``default(name, value)``
and ``known(name)``.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

_MAX_LENGTH = 2000
_MAX_NODES = 200

_BINOPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
FUNCTIONS: dict[str, int] = {"min": -2, "max": -2, "abs": 1, "default": 2, "known": 1, "clamp": 3}


class ExprError(ValueError):
    """An expression that does not parse or uses something not allowed; ``col`` is 1-based."""

    def __init__(self, message: str, col: int | None = None) -> None:
        super().__init__(message)
        self.col = col


class Missing(Exception):
    """A feature the expression needs is ``None``: the rule is not applicable."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


@dataclass(frozen=True)
class Expression:
    """A checked expression: its text, its AST and the feature names it reads."""

    text: str
    tree: ast.Expression
    names: frozenset[str]

    def evaluate(self, values: Mapping[str, float | None]) -> Any:
        """Value of the expression over ``values``.

        Raises:
            Missing: a needed feature is ``None`` or absent.
            ZeroDivisionError: never; division by zero gives ``inf`` (or ``nan`` for 0/0).
        """
        return _eval(self.tree.body, values)


def parse(text: str, known_names: AbstractSet[str] | Mapping[str, object] | None = None) -> Expression:
    """Parse and check ``text``.

    Args:
        text: the expression, e.g. ``"data_wait_share >= 0.2 and default(gpu_util_mean, 0) < 50"``.
        known_names: allowed feature names; ``None`` allows any name.

    Raises:
        ExprError: syntax error, a disallowed construct, an unknown name or function, wrong
            argument count, or an expression too long / too deep.
    """
    if not isinstance(text, str) or not text.strip():
        raise ExprError("empty expression")
    if len(text) > _MAX_LENGTH:
        raise ExprError(f"expression longer than {_MAX_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"syntax error: {exc.msg}", exc.offset) from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise ExprError(f"cannot parse: {exc}") from None
    names: set[str] = set()
    for count, node in enumerate(ast.walk(tree), start=1):
        if count > _MAX_NODES:
            raise ExprError(f"expression has more than {_MAX_NODES} parts")
        _check(node, names, known_names)
    return Expression(text, tree, frozenset(names))


def _check(node: ast.AST, names: set[str], known: Any) -> None:
    col = getattr(node, "col_offset", None)
    col = col + 1 if col is not None else None
    if isinstance(node, (ast.Expression, ast.Load, ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd)):
        return
    if isinstance(node, (ast.BoolOp, ast.UnaryOp)):
        if isinstance(node, ast.UnaryOp) and not isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
            raise ExprError("operator not allowed", col)
        return
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise ExprError(f"operator {type(node.op).__name__} not allowed (use + - * /)", col)
        return
    if type(node) in _BINOPS or type(node) in _CMPOPS:
        return
    if isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _CMPOPS:
                raise ExprError(f"comparison {type(op).__name__} not allowed", col)
        return
    if isinstance(node, ast.Constant):
        try:
            # ints are evaluated as floats: a huge literal must fail here, not at evaluation
            if isinstance(node.value, bool) or (
                isinstance(node.value, (int, float)) and math.isfinite(float(node.value))
            ):
                return
        except OverflowError:
            raise ExprError("number too large", col) from None
        raise ExprError(f"constant {node.value!r} not allowed (numbers and True/False only)", col)
    if isinstance(node, ast.Name):
        if node.id in ("True", "False"):
            return
        if known is not None and node.id not in known and node.id not in FUNCTIONS:
            raise ExprError(f"unknown feature {node.id!r}", col)
        if node.id not in FUNCTIONS:
            names.add(node.id)
        return
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise ExprError("only calls of " + ", ".join(sorted(FUNCTIONS)) + " are allowed", col)
        if node.keywords:
            raise ExprError("keyword arguments not allowed", col)
        want = FUNCTIONS[node.func.id]
        if (want >= 0 and len(node.args) != want) or (want < 0 and len(node.args) < -want):
            raise ExprError(f"{node.func.id}() takes {want if want >= 0 else f'{-want} or more'} arguments", col)
        if node.func.id in ("default", "known") and not isinstance(node.args[0], ast.Name):
            raise ExprError(f"{node.func.id}() needs a feature name as first argument", col)
        return
    raise ExprError(f"{type(node).__name__} not allowed in a rule expression", col)


def _eval(node: ast.AST, values: Mapping[str, float | None]) -> Any:
    if isinstance(node, ast.Constant):
        value = node.value
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(node, ast.Name):
        if node.id == "True":
            return True
        if node.id == "False":
            return False
        value = values.get(node.id)
        if value is None:
            raise Missing(node.id)
        return value
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_eval(v, values) for v in node.values)
        return any(_eval(v, values) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand, values)
        if isinstance(node.op, ast.Not):
            return not operand
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, values), _eval(node.right, values)
        if isinstance(node.op, ast.Div) and right == 0:
            return math.nan if left == 0 else math.copysign(math.inf, left)
        try:
            return _BINOPS[type(node.op)](left, right)
        except OverflowError:
            return math.copysign(math.inf, left) if left else math.inf
    if isinstance(node, ast.Compare):
        left = _eval(node.left, values)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = _eval(comp, values)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call):
        name = node.func.id  # type: ignore[attr-defined]
        if name == "known":
            return values.get(node.args[0].id) is not None  # type: ignore[attr-defined]
        if name == "default":
            value = values.get(node.args[0].id)  # type: ignore[attr-defined]
            return _eval(node.args[1], values) if value is None else value
        args = [_eval(a, values) for a in node.args]
        if name == "clamp":
            return min(max(args[0], args[1]), args[2])
        if name == "abs":
            return abs(args[0])
        return min(args) if name == "min" else max(args)
    raise ExprError(f"{type(node).__name__} not allowed")  # unreachable after _check

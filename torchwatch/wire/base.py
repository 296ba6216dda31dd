"""The strict decoder's parts and the hook channel's limits, shared by every record.

Every decode failure is a :class:`WireError` whose message is one line naming the field
(``hook.json.burst.last.steps: ...``). Strings read from a file lose every control, format and
separator character (:func:`clean_text`), so nothing read from the hook's files reaches a
terminal raw. Limits: PIDs below :data:`PID_MAX` (Linux ``PID_MAX_LIMIT``), error messages and
reasons cut at :data:`TEXT` characters, operator and kernel names at :data:`NAME`.

The names here that start with ``_`` are the package's own: its sections import them, nothing
outside ``torchwatch.wire`` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["NAME", "PID_MAX", "TEXT", "WireError", "clean_text"]


# Linux pid_max is at most 2**22 (PID_MAX_LIMIT, include/linux/threads.h).
PID_MAX = 1 << 22
_U63 = (1 << 63) - 1
_TIME_MAX = 1e10  # monotonic seconds (317 years of uptime): anything larger is not a clock reading


class WireError(ValueError):
    """A published file or request does not match the wire format; the message is one line."""


def clean_text(value: str, limit: int) -> str:
    """``value`` without control, format, surrogate and separator characters (but spaces),
    cut to ``limit`` characters: safe to print on a terminal."""
    if not value.isprintable():
        value = "".join(ch for ch in value if ch.isprintable())
    return value[:limit]


def _type(v: object) -> str:
    return "null" if v is None else type(v).__name__


class _Obj:
    """Typed access to one JSON object; every failure names the field (``where.key``)."""

    def __init__(self, value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise WireError(f"{where}: expected an object, got {_type(value)}")
        self.d: dict[str, Any] = value
        self.where = where

    def _get(self, key: str, optional: bool) -> Any:
        v = self.d.get(key)
        if v is None and not optional:
            raise WireError(f"{self.where}.{key}: missing")
        return v

    def integer(self, key: str, lo: int, hi: int, optional: bool = False) -> Any:
        v = self._get(key, optional)
        if v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool):
            raise WireError(f"{self.where}.{key}: expected an integer, got {_type(v)}")
        if not lo <= v <= hi:
            raise WireError(f"{self.where}.{key}: {v} is outside {lo}..{hi}")
        return v

    def number(self, key: str, lo: float, hi: float, optional: bool = False) -> Any:
        v = self._get(key, optional)
        if v is None:
            return None
        return _number(v, lo, hi, f"{self.where}.{key}")

    def flag(self, key: str, optional: bool = False) -> Any:
        v = self._get(key, optional)
        if v is None:
            return None if optional else False
        if not isinstance(v, bool):
            raise WireError(f"{self.where}.{key}: expected true or false, got {_type(v)}")
        return v

    def text(self, key: str, limit: int, optional: bool = False, choices: Sequence[str] = ()) -> Any:
        v = self._get(key, optional)
        if v is None:
            return None
        if not isinstance(v, str):
            raise WireError(f"{self.where}.{key}: expected a string, got {_type(v)}")
        if len(v) > limit:
            raise WireError(f"{self.where}.{key}: {len(v)} characters, at most {limit}")
        if choices and v not in choices:
            raise WireError(f"{self.where}.{key}: {clean_text(v, 20)!r} is not one of {', '.join(choices)}")
        return clean_text(v, limit)

    def items(self, key: str, limit: int) -> list[tuple[Any, str]]:
        v = self.d.get(key)
        if v is None:
            return []
        if not isinstance(v, list):
            raise WireError(f"{self.where}.{key}: expected a list, got {_type(v)}")
        if len(v) > limit:
            raise WireError(f"{self.where}.{key}: {len(v)} items, at most {limit}")
        return [(item, f"{self.where}.{key}[{i}]") for i, item in enumerate(v)]

    def floats(self, key: str, limit: int, lo: float, hi: float) -> tuple[float, ...]:
        return tuple(_number(v, lo, hi, w) for v, w in self.items(key, limit))

    def shares(self, key: str, names: Sequence[str], lo: float, hi: float) -> tuple[tuple[str, float], ...]:
        """A ``{name: number}`` object whose names are all in ``names`` (kept in that order)."""
        v = self.d.get(key)
        if v is None:
            return ()
        obj = _Obj(v, f"{self.where}.{key}")
        unknown = [k for k in obj.d if k not in names]
        if unknown:
            raise WireError(f"{obj.where}: unknown key {clean_text(str(unknown[0]), 40)!r}")
        return tuple((n, _number(obj.d[n], lo, hi, f"{obj.where}.{n}")) for n in names if n in obj.d)


def _number(v: object, lo: float, hi: float, where: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise WireError(f"{where}: expected a number, got {_type(v)}")
    f = float(v)
    if not math.isfinite(f) or not lo <= f <= hi:
        raise WireError(f"{where}: {f!r} is outside {lo:g}..{hi:g}")
    return f


_T = TypeVar("_T")


def _opt(v: object, where: str, decode: Callable[[object, str], _T]) -> _T | None:
    return None if v is None else decode(v, where)


TEXT = 300  # error messages, reasons, paths are cut here by the writer
NAME = 256  # operator and kernel names

_BIG = float(1 << 62)


def _pid_item(v: object, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v < PID_MAX:
        raise WireError(f"{where}: expected a PID, got {_type(v)}")
    return v


def _int_item(v: object, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _U63:
        raise WireError(f"{where}: expected a count, got {_type(v)}")
    return v


def _text_item(v: object, where: str) -> str:
    if not isinstance(v, str) or len(v) > TEXT:
        raise WireError(f"{where}: expected a string of at most {TEXT} characters")
    return clean_text(v, TEXT)

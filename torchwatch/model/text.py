"""Text that comes from a watched process, made safe to show.

torchwatch runs as root on other users' trainings: a process's name, its command line, a frame's
file or function name and a thread's name are the target's own text. Written raw, a newline in
one makes a line of its own in a log or a report, and an escape sequence (``ESC ]``, ``ESC [``)
reaches the operator's terminal. :func:`escape` writes every character that is not printable as
its Python escape (``\\n``, ``\\x1b``, ``\\u202e``), so the text stays visible and on one line.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["escape", "escape_all", "json_safe", "terminal_safe"]


def _escaped(ch: str) -> str:
    return ch if ch.isprintable() else repr(ch)[1:-1]


def escape(value: str, limit: int | None = None) -> str:
    """``value`` with every character that is not printable (control and format characters,
    line and paragraph separators, surrogates; the space is printable) written as its Python
    escape: ``"a\\nb\\x1b[2J"`` becomes ``a\\\\nb\\\\x1b[2J`` (one line, no escape sequence).

    Args:
        value: the target's text.
        limit: cut the result to this many characters (``None``: no cut).
    """
    out = value if value.isprintable() else "".join(_escaped(ch) for ch in value)
    return out if limit is None else out[:limit]


def escape_all(values: Iterable[str]) -> tuple[str, ...]:
    """:func:`escape` of each value (a command line's arguments)."""
    return tuple(escape(v) for v in values)


def terminal_safe(text: str) -> str:
    """``text`` (lines torchwatch wrote itself, holding the target's text) with every character
    that is not printable escaped as :func:`escape` does, except the newlines between lines and
    tabs: what torchwatch prints on a terminal can never carry an escape sequence."""
    if text.replace("\n", "").isprintable():
        return text
    return "\n".join("".join(ch if ch == "\t" else _escaped(ch) for ch in line) for line in text.split("\n"))


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_safe(text: str) -> str:
    """JSON text (``json.dumps(..., ensure_ascii=False)``) with every character that is not
    printable, but the newlines of its indentation, as a ``\\uXXXX`` escape: the same JSON value
    (outside strings JSON has only whitespace), nothing a terminal acts on (U+202E, C1 controls)."""
    if text.replace("\n", "").isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == "\n" else _json_escape(ch) for ch in text)

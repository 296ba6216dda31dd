"""A module that takes IMPORT_S seconds to import (tests/scenarios/slow_import.py imports it
before its first step): it reads files from storage (the page cache dropped for each first, as a
cold import of a large package reads its shared libraries) and builds a table in Python, in turns,
all at import time."""

from __future__ import annotations

import os
import time

IMPORT_S = 8.0


def _files(root: str) -> list[str]:
    out = []
    for where, _dirs, names in os.walk(root):
        out += [os.path.join(where, n) for n in names if n.endswith((".so", ".py"))]
    return sorted(out)


def _read_cold(path: str) -> int:
    """Bytes of ``path`` read after dropping it from the page cache (POSIX_FADV_DONTNEED)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        n = 0
        while chunk := os.read(fd, 1 << 20):
            n += len(chunk)
        return n
    finally:
        os.close(fd)


_start = time.monotonic()
_root = os.path.dirname(os.__file__)
_paths = _files(_root)
TABLE: dict[int, int] = {}
READ_BYTES = 0
_i = 0
while time.monotonic() - _start < IMPORT_S:
    READ_BYTES += _read_cold(_paths[_i % len(_paths)]) if _paths else 0
    for k in range(2000):  # Python work between the reads, as module-level set-up does
        TABLE[(k * 2654435761 + _i) % 100003] = k
    _i += 1

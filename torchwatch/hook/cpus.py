"""The CPU threads the training asks for, read from torch inside the training (the hook's part;
the usable CPUs and the record it fills are :mod:`torchwatch.wire.cpus`).
"""

from __future__ import annotations

import os
from typing import Any

from .. import wire


def read_threads(torch: Any) -> wire.ThreadSettings:
    """The CPU threads the training asks for (:class:`wire.ThreadSettings`), each ``None`` when it
    cannot be read. ``torch.get_num_interop_threads()`` reports the pool's size without starting
    it, so ``torch.set_num_interop_threads`` still works after this read. Never raises."""

    def count(name: str) -> int | None:
        try:
            n = int(getattr(torch, name)())
        except Exception:
            return None
        return n if 1 <= n <= wire.MAX_THREADS else None

    def env(name: str) -> str | None:
        value = os.environ.get(name)
        return None if value is None else wire.clean_text(value, 32)

    return wire.ThreadSettings(
        intra_op=count("get_num_threads"),
        inter_op=count("get_num_interop_threads"),
        omp_num_threads=env("OMP_NUM_THREADS"),
        mkl_num_threads=env("MKL_NUM_THREADS"),
    )

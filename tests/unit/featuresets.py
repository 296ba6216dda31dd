"""Feature sets for rule and report tests, consistent the way torchwatch.analysis.features derives them."""

from __future__ import annotations


def consistent(values: dict[str, float | None]) -> dict[str, float | None]:
    """Fill the features that the features layer derives together, as it would.

    A storage share given alone is the main thread's own disk wait; a data-loading share given
    alone stands beside no loop CPU work (analysis/features/loop.py computes them together).
    """
    out = dict(values)
    if out.get("storage_wait_share") is not None and "storage_wait_async_share" not in out:
        out.setdefault("main_disk_share", out["storage_wait_share"])
    if out.get("storage_wait_share") is not None or out.get("fetch_cpu_share") is not None:
        out.setdefault("loop_cpu_share", 0.0)
    return out

"""Which fix each model of :mod:`torchwatch.analysis.predict` predicts, and why the others are not.

Fixes are named by their rule's id and their title as the rule file writes it (before its fields
are filled); ``tests/unit/test_predict.py`` checks every name is a shipped rule's fix, so a renamed
rule or title fails there instead of going unpredicted.
"""

from __future__ import annotations

FIX_KINDS: dict[tuple[str, str], str] = {
    ("cpu-contention", "Give the training its CPUs"): "neighbour",
    ("cpu-quota-throttled", "Raise the quota, or drop it"): "quota",
    ("cpu-quota-throttled", "Run no more threads than the quota"): "threads",
    ("loader-cpu-in-main-thread", "Make each sample cheaper"): "cache",
    ("loader-cpu-in-workers", "Make each sample cheaper"): "cache",
    ("loader-cpu-contention", "Make each sample cheaper"): "cache",
    ("loop-sleeps", "Check for sleeps and rate limits"): "sleep",
}
"""Fixes without a live setting that a model predicts: ``(rule id, fix title template)`` -> kind
(``tests/unit/test_predict.py`` checks every key names a shipped rule's fix)."""

TRIAL_KINDS = {"num_workers": "num_workers", "threads": "threads", "pin_memory": "pin_memory"}
"""A fix's live setting (``trial``'s ``SETTING``) -> kind."""

WHY_NOT: tuple[tuple[str | tuple[str, ...], str], ...] = (
    ("gpu-", "a GPU-bound step: the model has no model of device kernels"),
    ("storage-", "storage: the gain depends on the device's queue depth and latency, not modelled"),
    ("input-waits-", "storage or remote waits: their concurrency limit is not modelled"),
    ("compile-", "a code change of unknown size: the compiler's output is not modelled"),
    (
        ("memory-", "host-swap", "loader-worker-memory", "dataloader-shm"),
        "a memory fix: it decides whether the training runs",
    ),
    ("ranks-", "collectives: the peers' time is not modelled"),
)
"""Rules whose fixes no model predicts (by id prefix) and why; any other fix is a code change of unknown size."""

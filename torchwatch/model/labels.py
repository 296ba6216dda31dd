"""The verdict labels, in the order they are checked, and what each one means.

The first label in :data:`LABELS` that a warning or critical finding argues for is the verdict;
``undetermined`` when none does (``docs/labels.md`` says what each label rests on).
"""

from __future__ import annotations

LABELS = ("gpu-bound", "io-bound", "dataloader-bound", "cpu-bound", "undetermined")
"""Every label, highest priority first."""

PRIORITY = {label: i for i, label in enumerate(LABELS)}
"""``{label: rank}``: lower decides first."""

MEANINGS = {
    "gpu-bound": "the GPU runs kernels most of the time with its SMs busy, and the loop does not wait on data",
    "io-bound": "a large part of the loop's time is lost to storage reads, in the loop's thread or in "
    "DataLoader workers",
    "dataloader-bound": "a large part of the loop's time waits on CPU work of the data pipeline (decode, augment, "
    "collate), in the loop's thread or in DataLoader workers",
    "cpu-bound": "the loop's own thread computes on the CPU most of the time outside data loading, or the GPU "
    "waits on the host to launch work",
    "undetermined": "no resource is seen limiting the loop (it sleeps, waits on a lock or a remote call), "
    "or there are too few samples yet",
}
"""One line per label: what it means (``torchwatch rules list`` and the docs say the same)."""

"""Scenario aug_two_workers (expected label: dataloader-bound).

Bottleneck: the same heavy per-sample CPU augmentation as aug_one_worker (about
10 ms of torch CPU work per sample, 16 samples a batch) in TWO DataLoader worker
processes, so both cores of a 2-core machine are busy in the workers while the
tiny CNN in the main process waits for batches.

--relieve: samples are augmented once, up front; __getitem__ returns the
precomputed tensor (still num_workers=2).
"""

from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc
import aug_one_worker

EXPECTED = "dataloader-bound"
NAME = "aug_two_workers"

if __name__ == "__main__":
    sc.main(NAME, __doc__, functools.partial(aug_one_worker.setup, workers=2))

"""Scenario sequential_reads_workers (expected label: io-bound; sub-cause: storage bandwidth).

Bottleneck: the training of sequential_reads (one 2 MiB O_DIRECT read per sample,
samples in file order, 1 GiB random-bytes file, a small MLP on top), but with
batches of 8 samples (16 MiB) and 3 DataLoader workers: three large reads are in flight at once and the block
device is busy nearly all the time, streaming at its bandwidth.  More workers add
requests to its queue, not bytes per second.

Data file: shared with sequential_reads,
$TORCHWATCH_DEMO_DIR (else $TMPDIR/torchwatch-demo)/scn_sequential.bin.

--relieve: as sequential_reads, the first 64 MiB are read once into RAM and the
workers serve slices of it (same bytes per sample, no disk reads in the loop).
"""

from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _scenario as sc
import sequential_reads

EXPECTED = "io-bound"
SUB_CAUSE = "storage-bandwidth"
NAME = "sequential_reads_workers"

if __name__ == "__main__":
    sc.main(NAME, __doc__, functools.partial(sequential_reads.setup, name=NAME, workers=3, batch=8))

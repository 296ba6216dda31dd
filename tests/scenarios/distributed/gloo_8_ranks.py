"""Distributed scenario gloo_8_ranks (expected: communication-bound, no straggler).

gloo_4_ranks with 8 ranks (DDP, gloo over loopback, one intra-op thread each) on a 2-core machine:
the same model and steps (``setup`` is gloo_4_ranks'), every step all-reducing 17 MB of gradients on
gloo's threads. 8 ranks x 1 thread on 2 CPUs: the ranks also queue for CPUs, but the queueing is
the all-reduce's.

--relieve: gradient accumulation, as in gloo_4_ranks (one all-reduce per 5 batches).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _dist
from gloo_4_ranks import setup

EXPECTED = "communication-bound"
STRAGGLER = None
NAME = "gloo_8_ranks"
RANKS = 8

if __name__ == "__main__":
    _dist.main(NAME, __doc__, setup, RANKS)

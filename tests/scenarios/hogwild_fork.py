"""Scenario hogwild_fork (expected: cpu-bound, the trainers oversubscribe the CPUs).

Hogwild-style training: the main process shares one model and starts 4 trainer processes with
``multiprocessing``'s fork start method; each
trainer runs forward, backward and an SGD step on the shared parameters with one intra-op thread
per usable CPU, and the main process only joins them: 4 x 2 threads on 2 CPUs. No DataLoader.

--relieve: each trainer calls ``torch.set_num_threads(max(1, usable_cpus // 4))``.
See tests/scenarios/_hogwild.py.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _hogwild

EXPECTED = "cpu-bound"
SUB_CAUSE = "cpu-oversubscribed-trainers"
NAME = "hogwild_fork"

if __name__ == "__main__":
    _hogwild.main(NAME, __doc__, "fork")

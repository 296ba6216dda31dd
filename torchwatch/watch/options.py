"""The tunables of a watch session (:class:`SessionOptions`) and the bounds of ``--window``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torchwatch.analysis.store import KEEP_S


@dataclass(frozen=True)
class SessionOptions:
    """Tunables of a session.

    Attributes:
        window_s: seconds of readings each verdict is computed over.
        analysis_interval_s: seconds between two evaluations of the rules.
        pyspy_rate: py-spy samples per second per thread.
        pyspy_chunk_s: seconds per py-spy recording.
        thread_interval_s: seconds between two rounds of thread-state sampling.
        nvml: whether to read GPUs through NVML at all.
        trace_path: append every analysis (features, findings, verdict) to this file as JSON lines.
        hook_expected: the training was started with the hook pre-loaded (``torchwatch run``).
        hook_boot_note: the file where the pre-loading boot says why the hook could not be loaded
            (:func:`torchwatch.watch.lifecycle.hook_env`); ``None``: none.
        hang_after: seconds without a step that count as a hang (``--hang-after``); ``None``:
            ``max(30 s, 20 x p95 step)`` per process (:mod:`torchwatch.analysis.hang`).
        adaptive: drop to the steady cadence once the verdict settles
            (:mod:`torchwatch.watch.cadence`); ``False`` samples at the rates above throughout.
        kernel_log: read the kernel's OOM-kill lines from ``/dev/kmsg`` (root; tests that must
            not see the host's kills turn it off).
    """

    window_s: float = 10.0
    analysis_interval_s: float = 1.0
    pyspy_rate: int = 20
    pyspy_chunk_s: float = 3.0
    thread_interval_s: float = 0.1
    nvml: bool = True
    trace_path: Path | None = None
    hook_expected: bool = False
    hook_boot_note: Path | None = None
    hang_after: float | None = None
    adaptive: bool = True
    kernel_log: bool = True


# The bounds of --window. py-spy's stack samples arrive a chunk at a time, all stamped at the
# chunk's end: a window shorter than a chunk may hold none and flip between a label and
# "undetermined". A window longer than the store keeps would silently be cut to what it holds.
WINDOW_MIN_S = SessionOptions.pyspy_chunk_s
WINDOW_MAX_S = KEEP_S

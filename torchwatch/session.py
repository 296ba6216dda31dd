"""A watch session: sampler threads feed the store; an analysis thread turns windows into verdicts.

One direction only: sources → store → features → diagnosis → (TUI | report). Neither the TUI
nor the report calls a source; they read :attr:`Session.latest` and :meth:`Session.statuses`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torchwatch import features as feats
from torchwatch.diagnosis import Analysis, Diagnoser
from torchwatch.readings import Role, SourceStatus, Status
from torchwatch.rules_engine import Rule
from torchwatch.sources import Source
from torchwatch.sources.nvml import NvmlSource
from torchwatch.sources.proc import ProcessTree, ProcSource, ThreadStateSource
from torchwatch.sources.pyspy import PySpySource
from torchwatch.store import Store


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
    """

    window_s: float = 10.0
    analysis_interval_s: float = 1.0
    pyspy_rate: int = 20
    pyspy_chunk_s: float = 3.0
    thread_interval_s: float = 0.1
    nvml: bool = True
    trace_path: Path | None = None


class Session:
    """Watches the process tree under ``root_pid`` until :meth:`stop`.

    Args:
        root_pid: the PID that was started (``run``) or named (``attach``).
        rules: loaded rules.
        options: see :class:`SessionOptions`.
        on_analysis: called from the analysis thread after every evaluation (the TUI posts a
            message from it; it must not block).

    Raises:
        psutil.NoSuchProcess: ``root_pid`` does not exist.
    """

    def __init__(
        self,
        root_pid: int,
        rules: list[Rule],
        options: SessionOptions | None = None,
        on_analysis: Callable[[Analysis], None] | None = None,
    ) -> None:
        self.options = options or SessionOptions()
        self.tree = ProcessTree(root_pid)
        self.store = Store()
        self.started = time.monotonic()
        self.on_analysis = on_analysis
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.latest: Analysis | None = None
        self.last_alive: Analysis | None = None  # the last analysis made while the target ran
        self.history: list[tuple[float, str]] = []  # (seconds since start, label) at each change
        self.ended_at: float | None = None
        self._chosen: int | None = None
        opts = self.options
        self.proc = ProcSource(self.tree)
        self.pyspy = PySpySource(
            self._main_pid, self._role_of, self.tree.root_alive, rate=opts.pyspy_rate, chunk=opts.pyspy_chunk_s
        )
        self.sources: list[Source] = [
            self.proc,
            ThreadStateSource(self.tree, interval=opts.thread_interval_s),
            self.pyspy,
        ]
        if opts.nvml:
            self.sources.append(NvmlSource(self.tree.pids))
        self.diagnoser = Diagnoser(rules, self.why_missing)

    # -- tree helpers handed to sources -------------------------------------------------------
    def _main_pid(self) -> int | None:
        """The training process to diagnose: the busiest main, kept until another is 2x busier.

        Under torchrun every rank is a main (ranks look alike, the first stays); when a Python
        wrapper starts the real training with subprocess, the training is the busy one.
        """
        mains = self.tree.mains()
        if not mains:
            return None
        cpu = self.proc.cpu_pct
        current = self._chosen if self._chosen in mains else mains[0]
        busiest = max(mains, key=lambda pid: cpu.get(pid, 0.0))
        if cpu.get(busiest, 0.0) > 2.0 * cpu.get(current, 0.0) + 5.0:
            current = busiest
        self._chosen = current
        return current

    def _role_of(self, pid: int) -> Role:
        node = self.tree.nodes().get(pid)
        return node.role if node else Role.OTHER

    @property
    def main_pid(self) -> int | None:
        """PID of the training process (first rank), once found."""
        return self._main_pid()

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start one sampler thread per source and the analysis thread."""
        for src in self.sources:
            t = threading.Thread(target=self._sample_loop, args=(src,), name=f"torchwatch-{src.name}", daemon=True)
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._analysis_loop, name="torchwatch-analysis", daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop sampling, close the sources and join the threads. Idempotent."""
        self._stop.set()
        for src in self.sources:
            # a source failing to close must not block the exit
            with contextlib.suppress(Exception):
                src.close()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    @property
    def target_gone(self) -> bool:
        """Whether the watched root process has exited."""
        return self.proc.status.status is Status.GONE

    def statuses(self) -> dict[str, SourceStatus]:
        """``{source name: status}`` for the report and the TUI."""
        return {src.name: src.status for src in self.sources}

    def own_usage(self) -> dict[str, float]:
        """What watching cost so far: torchwatch's CPU s (all its threads), py-spy's CPU s, wall s,
        and both together as % of one core."""
        me = resource.getrusage(resource.RUSAGE_SELF)
        own = me.ru_utime + me.ru_stime
        wall = max(1e-9, (self.ended_at or time.monotonic()) - self.started)
        return {
            "torchwatch_cpu_s": round(own, 3),
            "pyspy_cpu_s": round(self.pyspy.cpu_s, 3),
            "wall_s": round(wall, 2),
            "cpu_pct_of_core": round(100 * (own + self.pyspy.cpu_s) / wall, 2),
            "max_rss_bytes": me.ru_maxrss * 1024,
        }

    def why_missing(self, feature: str) -> str:
        """Why ``feature`` has no value: the status of its source, or too few samples."""
        spec = feats.CATALOGUE.get(feature)
        if spec is None:
            return "unknown feature"
        by_source = {"py-spy": "py-spy", "proc": "threads", "psutil": "psutil", "psi": "psutil", "nvml": "nvml"}
        names = [by_source.get(part, part) for part in spec.source.split("+")]
        statuses = self.statuses()
        for name in names:
            st = statuses.get(name)
            if st is not None and st.status is Status.UNAVAILABLE:
                return f"{name} unavailable: {st.reason}"
        if self.main_pid is None:
            return "no Python training process found in the tree yet"
        return "not enough samples in the window yet, or the loop never entered that state"

    def _sample_loop(self, src: Source) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                readings = src.sample(t0)
            except Exception as exc:
                src.status = SourceStatus.unavailable(
                    f"internal error in {src.name}: {exc!r}", "please report it; other sources keep running"
                )
                return
            self.store.add(readings)
            if src is self.proc and src.status.status is Status.GONE and self.ended_at is None:
                self.ended_at = time.monotonic()
            if self.ended_at is not None:
                return
            self._stop.wait(max(0.0, src.interval - (time.monotonic() - t0)))

    def analyze(self, now: float | None = None) -> Analysis:
        """Compute features and evaluate the rules over the last ``window_s`` seconds."""
        now = time.monotonic() if now is None else now
        end = self.ended_at if self.ended_at is not None else now
        window = self.store.window(end - self.options.window_s, end)
        analysis = self.diagnoser.evaluate(feats.compute(window, self.main_pid), now)
        with self._lock:
            self.latest = analysis
            if self.ended_at is None:
                self.last_alive = analysis
            label = analysis.verdict.label
            if not self.history or self.history[-1][1] != label:
                self.history.append((round(now - self.started, 1), label))
        if self.options.trace_path is not None:
            self._trace(analysis, now)
        return analysis

    def _trace(self, analysis: Analysis, now: float) -> None:
        record = {
            "t": round(now - self.started, 2),
            "main_pid": self.main_pid,
            "verdict": analysis.verdict.to_json(),
            "findings": [f.rule for f in analysis.findings],
            "features": {k: (None if v is None else round(v, 4)) for k, v in analysis.features.items()},
        }
        try:
            with open(self.options.trace_path, "a") as f:  # type: ignore[arg-type]
                f.write(json.dumps(record) + "\n")
        except OSError:
            self.options = dataclasses.replace(self.options, trace_path=None)

    def _analysis_loop(self) -> None:
        while not self._stop.wait(self.options.analysis_interval_s):
            self.store.trim(time.monotonic())
            if self.ended_at is not None:
                break
            try:
                analysis = self.analyze()
            except Exception:
                continue
            if self.on_analysis is not None:
                self.on_analysis(analysis)

    def final(self) -> Analysis:
        """The verdict to report: the last one made while the target ran (or a fresh one)."""
        with self._lock:
            if self.last_alive is not None:
                return self.last_alive
        return self.analyze()

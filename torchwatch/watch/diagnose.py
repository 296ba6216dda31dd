"""One analysis tick's verdict: the focus process's, or, with several ranks, the job's; and why a
feature the rules need has no value (:func:`why_missing`).

:class:`JobDiagnoser` keeps one :class:`~torchwatch.analysis.diagnosis.Diagnoser` per rank (each
rank's rules hold and release on their own) and each rank's last analysis; it builds every
:class:`~torchwatch.analysis.diagnosis.Analysis` complete and never changes one afterwards (the
rules of :mod:`torchwatch.analysis.ranks` make the job's). No thread, no clock, no source: the
window, the focus and the time come in as arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from torchwatch.analysis import features as feats
from torchwatch.analysis import ranks, startup
from torchwatch.analysis.diagnosis import Analysis, Diagnoser
from torchwatch.analysis.rules_engine import Rule
from torchwatch.analysis.store import Store, Window
from torchwatch.model.readings import OTHER_RANKS_EVERY, GpuSample, HookState, SourceStatus, Status
from torchwatch.sources.registry import feature_sources
from torchwatch.watch.observe import device_memory
from torchwatch.wire import RankInfo


class JobDiagnoser:
    """Evaluates the rules over a window, for the focus process or for every rank of a job.

    Args:
        rules: loaded rules.
        why_missing: ``feature name -> why it has no value`` (one line), for the rules that
            cannot be evaluated.

    Attributes:
        first: the diagnoser of a single process, and of the first rank seen (a training of one
            process keeps its hold times when its hook later names it a rank).
    """

    def __init__(self, rules: list[Rule], why_missing: Callable[[str], str]) -> None:
        self.first = Diagnoser(rules, why_missing)
        self._why_missing = why_missing
        self._diagnosers: dict[int, Diagnoser] = {}
        self._analyses: dict[int, Analysis] = {}  # {pid: its last analysis}
        self._tick = 0

    def evaluate(
        self,
        window: Window,
        focus: int | None,
        now: float,
        extra: Mapping[str, float | None] | None = None,
        extra_texts: Mapping[str, str] | None = None,
        hook_pending: bool = False,
        stacks_pending: bool = False,
    ) -> Analysis:
        """The analysis of ``window`` at ``now`` (monotonic s).

        With fewer than two ranks in the window (processes whose hook names a rank; one that exited
        during the window keeps its readings in it, so the last verdict still compares every rank):
        the analysis of ``focus`` (``None``: of any main). With several: every rank's own (the
        focus each tick, the others every :data:`OTHER_RANKS_EVERY` ticks, each costs a pass over
        the window; in between their last analysis stands), their readings, the straggler and the
        job's verdict (:func:`torchwatch.analysis.ranks.job_analysis`), shown for ``focus`` when it
        is a rank, else for the lowest rank. ``extra`` / ``extra_texts``: features and texts made
        outside the window (the memory forecast: :mod:`torchwatch.watch.memwatch`), added to every
        process's. ``hook_pending``: the hook was pre-loaded and has published nothing yet;
        ``stacks_pending``: py-spy has read no chunk yet: with them, each process's rules know
        whether it has reached its first step (:func:`torchwatch.analysis.startup.waiting_for`;
        before it, no label).
        """
        more, more_texts = dict(extra or {}), dict(extra_texts or {})

        def compute(pid: int | None) -> tuple[dict[str, float | None], dict[str, str]]:
            return {**feats.compute(window, pid), **more}, {**feats.texts(window, pid), **more_texts}

        def judge(pid: int | None) -> Analysis:
            f, t = compute(pid)
            waiting = startup.waiting_for(window, pid, f, hook_pending, stacks_pending)
            return self._diagnoser(pid).evaluate(f, now, t, waiting)

        pids = list(dict.fromkeys(h.pid for h in window.hook if h.record is not None and _is_rank(h.record.rank)))
        if len(pids) < 2:
            return judge(focus)
        self._tick += 1
        per_rank = {}
        for pid in pids:
            last = self._analyses.get(pid)
            if pid == focus or last is None or self._tick % OTHER_RANKS_EVERY == 0:
                last = self._analyses[pid] = judge(pid)
            per_rank[pid] = last
        for gone in [p for p in self._analyses if p not in pids]:
            del self._analyses[gone]
        for gone in [p for p in self._diagnosers if p not in pids and self._diagnosers[p] is not self.first]:
            del self._diagnosers[gone]
        readings = ranks.rank_readings(window, per_rank)
        shown = focus if focus in per_rank else (readings[0].pid if readings else pids[0])
        # the rank shown, with the job around it: a new analysis, so that the rank's own (kept for
        # the next ticks and in per_rank) stays as its rules made it
        job = dataclasses.replace(per_rank[shown], per_rank=per_rank, ranks=readings)
        return ranks.job_analysis(job, per_rank, ranks.straggler(readings))

    def _diagnoser(self, pid: int | None) -> Diagnoser:
        """Each rank's rules hold and release on their own; the first process keeps :attr:`first`'s."""
        if pid is None:
            return self.first
        if pid not in self._diagnosers:
            first = not self._diagnosers
            self._diagnosers[pid] = self.first if first else Diagnoser(self.first.rules, self._why_missing)
        return self._diagnosers[pid]


def why_missing(feature: str, statuses: Mapping[str, SourceStatus], store: Store, focus: int | None) -> str:
    """Why ``feature`` has no value, one line: its source's status when unavailable (the source
    whose :attr:`~torchwatch.sources.SourceSpec.words` hold the feature's source word), the reason
    its last reading gives, no training process yet, or what the window lacks.

    Args:
        feature: a name of :data:`torchwatch.analysis.features.CATALOGUE`.
        statuses: ``{source name: status}`` (the session's, ``gpm`` included).
        store: the readings.
        focus: the PID of the process diagnosed (``None``: none found yet).
    """
    spec = feats.CATALOGUE.get(feature)
    if spec is None:
        return "unknown feature"
    by_source = feature_sources()  # each source's words (its SourceSpec); another word names a status
    names = [by_source.get(part, part) for part in spec.source.split("+")]
    for name in names:
        st = statuses.get(name)
        if st is not None and st.status is Status.UNAVAILABLE:
            return f"{name} unavailable: {st.reason}"
    if feature == "gpu_proc_sm_pct":
        last = store.latest(GpuSample)
        if isinstance(last, GpuSample) and last.proc_util_reason:
            return last.proc_util_reason
    if spec.source == "gpm":
        last = store.latest(GpuSample)
        if isinstance(last, GpuSample) and last.gpm_reason:
            return last.gpm_reason
    if focus is None:
        return "no Python training process found in the tree yet"
    if "diskstats" in spec.source:
        return (
            "no block device served enough reads in the window "
            "(data in the page cache or RAM, or on a network file system)"
        )
    if spec.source == "burst":
        return "no profiler burst has completed yet (press b, or torchwatch burst PID)"
    if spec.source == "cgroup":
        return "no cgroup CPU quota binds the training (cpu.max / cpu.cfs_quota_us unset): nothing throttles it"
    if feature in ("intra_op_threads", "interop_threads", "cpu_threads_wanted"):
        return "the training's hook has not read its threads yet (it reads them at its steps)"
    if spec.source == "hook" and feature.startswith("dl_"):
        return "no DataLoader iterated in the training yet"
    if spec.source == "hook" and feature.startswith("cuda_"):
        reading = store.latest(HookState, lambda h: h.pid == focus)
        why = device_memory(reading.record if reading is not None else None).why
        return why or "the hook's device memory readings do not cover the window yet"
    return "not enough samples in the window yet, or the loop never entered that state"


def _is_rank(info: RankInfo | None) -> bool:
    """The hook names a rank (a launcher's record may carry the job's key but no rank)."""
    return info is not None and info.rank is not None

"""Memory over minutes: the forecast to the limit, who grows, and the out-of-memory black box.

The store keeps :data:`torchwatch.analysis.store.KEEP_S` of readings; a memory trend needs longer.
:class:`MemoryWatch` keeps its own bounded series (:data:`KEEP_S`), fed once per analysis round
from the store's new readings, and gives:

- **features** for the rules (:meth:`MemoryWatch.features`): the host forecast (``mem_forecast_s``
  and its interval), the device forecast (``cuda_mem_forecast_s``), the DataLoader workers'
  private growth and shared loss (the copy-on-write signature), the out-of-memory records;
- the **view** the faces show (:class:`torchwatch.model.memory.MemoryView`);
- the **black box** (:class:`torchwatch.model.memory.MemoryRecord`), made when a process of the
  tree is ended by the kernel's OOM killer (its "Killed process PID" line in ``/dev/kmsg``, or,
  where the kernel log is not readable, the cgroup's ``oom_kill`` count rising as a PID of the
  tree vanishes) or when the hook records ``torch.cuda.OutOfMemoryError``.

How a trend is called real: :mod:`torchwatch.model.forecast`.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from torchwatch.analysis.store import Store
from torchwatch.model import forecast as fc
from torchwatch.model.memory import (
    LimitReading,
    MemoryForecastView,
    MemoryRecord,
    MemorySample,
    MemoryView,
    ProcMemory,
    ProcSeries,
)
from torchwatch.model.readings import HookState, ProcessSample, Role, StackSample
from torchwatch.model.units import fmt_mib_rate
from torchwatch.sources.hook import HookReader
from torchwatch.wire import HookRecord, OomRecord

__all__ = ["KEEP_S", "RECORD_S", "MemoryWatch"]

KEEP_S = 1200.0
"""Seconds of memory history kept (20 min): the forecast's window and the record's minutes."""
RECORD_S = 300.0
"""Seconds of every process's memory the black box keeps (the last 5 minutes)."""
FORECAST_EVERY_S = 5.0
"""Seconds between two fits (one envelope bucket: a fit between two buckets sees the same points)."""
KILL_MATCH_S = 5.0
"""A PID that vanished within this many seconds of the cgroup's oom_kill count rising is the one
killed (one round of the process source plus the memory source's)."""
MAX_RECORDS = 8
_MIB = float(1 << 20)


@dataclass
class _Proc:
    role: str
    name: str
    points: deque[tuple[float, int, int]]
    last: ProcMemory | None = None
    ended: bool = False
    gone_t: float | None = None


class MemoryWatch:
    """Bounded memory history of one watched tree (module docstring). Thread-safe.

    Args:
        keep_s: seconds of history kept.
        kernel_log: the memory source reads ``/dev/kmsg`` (then a kill is matched to the cgroup's
            count only when the kernel's own line did not come within :data:`KILL_MATCH_S`).
    """

    def __init__(self, keep_s: float = KEEP_S, kernel_log: bool = False) -> None:
        self.keep_s = keep_s
        self.kernel_log = kernel_log
        self._lock = threading.Lock()
        self._last_t = -math.inf
        self._host: deque[tuple[float, float]] = deque()
        self._tree_pss: deque[tuple[float, float]] = deque()
        self._device: deque[tuple[float, float]] = deque()
        self._device_cap: float | None = None
        self._device_pid: int | None = None
        self._procs: dict[int, _Proc] = {}
        self._limit: LimitReading | None = None
        self._prev_kills: int | None = None
        self._kill_rise_t: float | None = None
        self._rise_from = self._rise_to = 0
        self._kmsg_seen = False
        self._steps: deque[float] = deque(maxlen=32)
        self._records: list[MemoryRecord] = []
        self._recorded: set[tuple[str, int, int]] = set()
        self._next_fit = -math.inf
        self._host_fc: MemoryForecastView | None = None
        self._device_fc: MemoryForecastView | None = None
        self._why_not = "collecting memory readings"
        self._grower = ""
        self._tree_share: float | None = None
        self._workers: tuple[ProcMemory, ...] = ()
        self._worker_growth: float | None = None
        self._worker_trend_real = False
        self._cuda_readers: dict[int, HookReader] = {}  # processes with CUDA: read once more after they exit
        self._ended_cuda: list[int] = []

    # -- input --------------------------------------------------------------------------------
    def update(self, store: Store, now: float, focus: int | None) -> None:
        """Take the store's readings newer than the last update, detect out-of-memory events and
        refit the forecasts every :data:`FORECAST_EVERY_S`. Never raises for odd readings."""
        with self._lock:
            w = store.window(self._last_t + 1e-9, now, kinds=("memory", "processes", "hook"))
            self._last_t = max(self._last_t, now)
            self._ended_cuda = []
            self._take_processes(w.processes, now)
            for hs in w.hook:
                self._take_hook(hs, focus, store)
            for pid in self._ended_cuda:
                self._last_words(pid, store, now)
            for ms in w.memory:
                self._take_memory(ms, store, focus)
            self._match_count_kills(now, store, focus)
            self._trim(now)
            if now >= self._next_fit:
                self._next_fit = now + FORECAST_EVERY_S
                self._fit()

    def post_mortem(self, rec: HookRecord | None, pid: int, store: Store, now: float) -> None:
        """A training process that exited left ``rec`` (its ``hook.json`` read after the exit):
        record its CUDA out-of-memory error, if it had one."""
        with self._lock:
            self._post_mortem(rec, pid, store, now)

    def _post_mortem(self, rec: HookRecord | None, pid: int, store: Store, now: float) -> None:
        if rec is not None and rec.oom is not None:
            self._cuda_record(rec.oom, pid, store, now)

    def _last_words(self, pid: int, store: Store, now: float) -> None:
        reader = self._cuda_readers.pop(pid, None)
        if reader is not None:
            self._post_mortem(reader.last_words(), pid, store, now)

    def finish(self, store: Store, now: float) -> None:
        """The watched tree is gone: read the hooks of the processes that used CUDA once more
        (the hook keeps ``hook.json`` after a CUDA out-of-memory error). Never raises."""
        with self._lock:
            for pid in list(self._cuda_readers):
                try:
                    self._last_words(pid, store, now)
                except Exception:
                    continue

    def _take_processes(self, samples: Sequence[ProcessSample], now: float) -> None:
        if not samples:
            return
        last_t = samples[-1].t
        live = {p.pid for p in samples if p.t == last_t}
        for p in samples:
            proc = self._procs.get(p.pid)
            if proc is None:
                proc = self._procs[p.pid] = _Proc(p.role.value, p.name, deque())
            proc.role, proc.name = p.role.value, p.name
            if proc.ended and p.pid in live:
                proc.ended, proc.gone_t = False, None  # a reused PID: a new process
        for pid, proc in self._procs.items():
            if pid not in live and not proc.ended:
                proc.ended, proc.gone_t = True, last_t
                if pid in self._cuda_readers:
                    self._ended_cuda.append(pid)

    def _take_hook(self, hs: HookState, focus: int | None, store: Store) -> None:
        rec = hs.record
        if rec is not None and rec.cuda_initialized and hs.pid not in self._cuda_readers:
            self._cuda_readers[hs.pid] = HookReader(hs.pid)
        if rec is not None and rec.oom is not None:
            self._cuda_record(rec.oom, hs.pid, store, hs.t)  # any rank's
        if focus is not None and hs.pid != focus:
            return
        for entry in hs.new_steps:
            self._steps.append(entry[1] * 1000.0)
        rec = hs.record
        if rec is None:
            return
        mem = rec.device_memory
        if mem is not None:
            if self._device_pid != hs.pid:
                self._device.clear()
                self._device_pid = hs.pid
            # The peak allocated, not reserved: reserved swings as the allocator frees its cache
            # and retries (an H100 run: 40-78 GiB from one step to the next while the peak rose
            # 0.63 GiB/s in a straight line), so its saw-tooth hides the trend.
            level = mem.peak_bytes if mem.peak_bytes is not None else mem.reserved_bytes
            self._device.append((hs.t, float(level)))
            self._device_cap = float(mem.capacity_bytes) if mem.capacity_bytes else None

    def _take_memory(self, ms: MemorySample, store: Store, focus: int | None) -> None:
        if ms.limit is not None:
            self._limit = ms.limit
            self._host.append((ms.t, float(ms.limit.used)))
            kills = ms.limit.oom_kills
            if kills is not None:
                if self._prev_kills is not None and kills > self._prev_kills:
                    self._kill_rise_t = ms.t
                    self._rise_from = self._prev_kills
                    self._rise_to = kills
                self._prev_kills = kills
        if ms.procs:
            self._tree_pss.append((ms.t, float(sum(p.pss for p in ms.procs))))
            for p in ms.procs:
                proc = self._procs.get(p.pid)
                if proc is None:
                    proc = self._procs[p.pid] = _Proc("other", "", deque())
                proc.points.append((ms.t, p.rss, p.uss))
                proc.last = p
        for k in ms.kills:
            proc = self._procs.get(k.pid)
            if proc is None:
                continue  # not a process of the watched tree
            anon = f", anon-rss {k.anon_bytes / _MIB:.0f} MiB" if k.anon_bytes else ""
            self._host_record(k.pid, proc, f"/dev/kmsg: Killed process {k.pid} ({k.name}){anon}", store, focus, k.t)
            self._kill_rise_t = None  # the kernel named it: the count's rise is explained
            self._kmsg_seen = True

    def _match_count_kills(self, now: float, store: Store, focus: int | None) -> None:
        """Without the kernel log: a PID of the tree that vanished within :data:`KILL_MATCH_S`
        of the cgroup's ``oom_kill`` count rising was killed (the largest consumer first, as the
        OOM killer chooses by ``oom_score``: resident memory)."""
        rise = self._kill_rise_t
        if rise is None or self._kmsg_seen or (self.kernel_log and now - rise < KILL_MATCH_S):
            return  # the kernel log names the killed processes itself when it is read: wait for its line
        vanished = [
            (pid, p) for pid, p in self._procs.items()
            if p.ended and p.gone_t is not None and abs(p.gone_t - rise) <= KILL_MATCH_S
            and ("host", pid, 0) not in self._recorded
        ]  # fmt: skip
        if vanished:
            vanished.sort(key=lambda kv: -(kv[1].last.rss if kv[1].last else 0))
            pid, proc = vanished[0]
            how = (
                f"the cgroup's oom_kill count rose from {self._rise_from} to {self._rise_to} as PID {pid} "
                "vanished (the kernel log is not readable: run torchwatch as root to read the kernel's own line)"
            )
            self._host_record(pid, proc, how, store, focus, rise)
            self._kill_rise_t = None
        elif now - rise > 2 * KILL_MATCH_S:
            self._kill_rise_t = None  # a kill of another process of the cgroup, not of the tree

    def _trim(self, now: float) -> None:
        cut = now - self.keep_s
        for series in (self._host, self._tree_pss, self._device):
            while series and series[0][0] < cut:
                series.popleft()
        rec_cut = now - RECORD_S
        for pid in list(self._procs):
            proc = self._procs[pid]
            while proc.points and proc.points[0][0] < rec_cut:
                proc.points.popleft()
            if proc.ended and proc.gone_t is not None and proc.gone_t < rec_cut:
                del self._procs[pid]

    # -- the black box ------------------------------------------------------------------------
    def _series(self) -> tuple[ProcSeries, ...]:
        return tuple(
            ProcSeries(pid, p.role, p.name, tuple(p.points), p.ended)
            for pid, p in sorted(self._procs.items())
            if p.points
        )

    def _stack(self, store: Store, pid: int) -> tuple[str, ...]:
        st = store.latest(StackSample, lambda s: s.pid == pid and s.is_main_thread)
        if st is None:
            return ()
        return tuple(f"{f.filename}:{f.line} {f.name}" for f in st.frames)[-16:]

    def _host_record(self, pid: int, proc: _Proc, how: str, store: Store, focus: int | None, t: float) -> None:
        key = ("host", pid, 0)  # one record a process
        if key in self._recorded or len(self._records) >= MAX_RECORDS:
            return
        self._recorded.add(key)
        stacks = self._stack(store, pid) or (self._stack(store, focus) if focus is not None else ())
        self._records.append(
            MemoryRecord(
                t=t, kind="host", pid=pid, role=proc.role, name=proc.name, how=how, limit=self._limit,
                forecast=self._host_fc, processes=self._series(), steps_ms=tuple(self._steps), stacks=stacks,
            )
        )  # fmt: skip

    def _cuda_record(self, oom: OomRecord, pid: int, store: Store, t: float) -> None:
        key = ("cuda", pid, oom.count)
        if key in self._recorded or len(self._records) >= MAX_RECORDS:
            return
        self._recorded.add(key)
        proc = self._procs.get(pid)
        self._records.append(
            MemoryRecord(
                t=t, kind="cuda", pid=pid, role=proc.role if proc else Role.MAIN.value, name=proc.name if proc else "",
                how="the hook's out-of-memory observer (torch.cuda.OutOfMemoryError)", limit=self._limit,
                forecast=self._device_fc, processes=self._series(),
                steps_ms=oom.step_ms or tuple(self._steps), stacks=oom.stack or self._stack(store, pid), cuda=oom,
            )
        )  # fmt: skip

    # -- the forecasts ------------------------------------------------------------------------
    def _fit(self) -> None:
        lim = self._limit
        host = list(self._host)
        self._host_fc = None
        if lim is not None and host:
            tr = fc.best_trend(host, float(lim.limit))
            f = fc.forecast(host, float(lim.limit))
            self._why_not = "" if f is not None else (tr.why if tr is not None else "collecting memory readings")
            if f is not None and tr is not None:
                self._tree_share = self._share(tr)
                self._grower = self._who_grows(tr.start)
                self._host_fc = MemoryForecastView(
                    "host", f.seconds, f.soonest, f.latest, f.level, f.limit, f.slope, tr.end - tr.start,
                    lim.source, self._grower, self._tree_share,
                )  # fmt: skip
            elif f is None and tr is not None and tr.real:
                self._why_not = "the limit is more than 24 h away at this pace"
        dev = list(self._device)
        self._device_fc = None
        if dev and self._device_cap:
            f = fc.forecast(dev, self._device_cap)
            if f is not None:
                self._device_fc = MemoryForecastView(
                    "device", f.seconds, f.soonest, f.latest, f.level, f.limit, f.slope,
                    f.trend.end - f.trend.start,
                    "the GPU's memory (get_device_properties().total_memory): the latest the error can come; "
                    "a fragmented cache (allocation retries) ends it sooner",
                    "the caching allocator's peak allocated",
                )  # fmt: skip
        self._fit_workers()

    def _share(self, tr: fc.Trend) -> float | None:
        pts = [p for p in self._tree_pss if p[0] >= tr.start]
        if len(pts) < 3 or tr.slope <= 0:
            return None
        slope = fc.theil_sen(pts)[0]
        return max(0.0, min(1.0, slope / tr.slope))

    @staticmethod
    def _rates(p: _Proc) -> tuple[float, float] | None:
        """``(private bytes/s since the process's first read, private bytes/s between its last two
        reads)``; ``None`` before two reads. ``smaps_rollup`` walks the page tables (~16 ms of CPU a
        GiB resident, measured here), so a large tree is read every tens of seconds
        (:data:`torchwatch.sources.memory.SMAPS_BUDGET`): rates over whatever reads there are, not
        a fit over many points."""
        last = p.last
        if last is None or last.age_s <= 0 or len(p.points) < 2:
            return None
        (t0, _, u0), (t1, _, u1) = p.points[-2], p.points[-1]
        recent = (u1 - u0) / (t1 - t0) if t1 > t0 else 0.0
        return (last.uss - last.uss_start) / last.age_s, recent

    def _who_grows(self, since: float) -> str:
        best: tuple[float, int, _Proc] | None = None
        for pid, p in self._procs.items():
            rates = self._rates(p)
            if rates is None or p.ended:
                continue
            if best is None or rates[0] > best[0]:
                best = (rates[0], pid, p)
        if best is None or best[0] <= 0:
            return ""
        slope, pid, p = best
        line = f"{p.role} {pid}: private {fmt_mib_rate(slope)}"
        last = p.last
        if last is not None and p.role == Role.WORKER.value and last.shared_start > last.shared:
            lost = (last.shared_start - last.shared) / max(1.0, last.age_s)
            line += (
                f", shared {fmt_mib_rate(-lost)} (copy-on-write: pages it shared with the main process turn private)"
            )
        return line

    def _fit_workers(self) -> None:
        """The workers' private growth is real when, summed, it reached :data:`fc.MIN_RISE_BYTES`
        (and 1 % of the limit) over at least :data:`fc.MIN_SPAN_S` since they started, and the
        last interval still grows at half that pace or more (copy-on-write never turns a page
        shared again: private memory that stops growing has finished copying)."""
        workers = [p for p in self._procs.values() if p.role == Role.WORKER.value and not p.ended and p.last]
        self._workers = tuple(p.last for p in workers if p.last is not None)
        rates = [r for r in (self._rates(p) for p in workers) if r is not None]
        self._worker_growth, self._worker_trend_real = None, False
        if not workers or len(rates) < len(workers):
            return
        growth = sum(max(0, w.uss - w.uss_start) for w in self._workers)
        age = min(w.age_s for w in self._workers)
        since, recent = sum(r[0] for r in rates), sum(r[1] for r in rates)
        need = max(float(fc.MIN_RISE_BYTES), fc.MIN_RISE_SHARE * self._limit.limit if self._limit else 0.0)
        self._worker_growth = since
        self._worker_trend_real = age >= fc.MIN_SPAN_S and growth >= need and since > 0 and recent >= 0.5 * since

    # -- output -------------------------------------------------------------------------------
    def features(self) -> dict[str, float | None]:
        """Features for the rules (names in :data:`torchwatch.analysis.features` catalogue):
        seconds, bytes, bytes/s and shares (0-1); ``None`` where not known."""
        with self._lock:
            host, dev, lim = self._host_fc, self._device_fc, self._limit
            workers = self._workers
            cow = sum(max(0, w.uss - w.uss_start) for w in workers) if workers else None
            shared_drop = sum(max(0, w.shared_start - w.shared) for w in workers) if workers else None
            return {
                "mem_limit_bytes": float(lim.limit) if lim else None,
                "mem_used_bytes": float(lim.used) if lim else None,
                "mem_used_share": lim.used / lim.limit if lim and lim.limit else None,
                "mem_forecast_s": host.seconds if host else None,
                "mem_forecast_soonest_s": host.soonest if host else None,
                "mem_forecast_latest_s": host.latest if host and math.isfinite(host.latest) else None,
                "mem_growth_bytes_per_s": host.slope if host else None,
                "mem_tree_growth_share": host.tree_share if host else None,
                "cuda_mem_forecast_s": dev.seconds if dev else None,
                "cuda_mem_forecast_soonest_s": dev.soonest if dev else None,
                "cuda_mem_growth_bytes_per_s": dev.slope if dev else None,
                "worker_private_growth_bytes": float(cow) if cow is not None else None,
                "worker_shared_drop_bytes": float(shared_drop) if shared_drop is not None else None,
                "worker_private_growth_bytes_per_s": self._worker_growth if self._worker_trend_real else None,
                "worker_cow_share": (shared_drop / cow) if cow and shared_drop is not None else None,
                "oom_records": float(len(self._records)),
            }

    def texts(self) -> dict[str, str]:
        """Text features: where the limit comes from, who grows."""
        with self._lock:
            return {
                "mem_limit_source": self._limit.source if self._limit else "not readable",
                "mem_grower": self._grower or "no single process",
            }

    def view(self) -> MemoryView:
        """What the faces show (see :class:`MemoryView`)."""
        with self._lock:
            forecasts = tuple(f for f in (self._host_fc, self._device_fc) if f is not None)
            return MemoryView(self._limit, forecasts, self._why_not, self._workers, tuple(self._records))

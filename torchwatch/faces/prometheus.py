"""The Prometheus exporter: ``/metrics`` rendered from the latest Observation at scrape time.

The metrics are a pure function of the Observations (:func:`metric_families`); the HTTP side is
``prometheus_client``'s WSGI application behind a server that idle, slow or many clients cannot
blind (:class:`torchwatch.exposition.MetricsServer`, outside the faces), with a custom collector
(:class:`ObservationCollector`) that asks for the latest Observations when Prometheus scrapes, so
nothing is computed between scrapes.

Naming follows the Prometheus conventions (prometheus.io/docs/practices/naming): base units in the
name (``_seconds``, ``_bytes``, ``_ratio`` for 0..1, ``_watts``), counters end in ``_total``.
Help texts are the feature catalogue's where a metric is a feature. Labels (docs/fleet.md has the
table, and how Prometheus compares the ranks of a job across nodes with them):

- per rank (:data:`RANK_LABELS`): ``training_job``, ``uid``, ``container_id``, ``pod_uid``, ``host``,
  ``rank``, ``local_rank``, ``world_size``. ``uid``, ``container_id`` and ``pod_uid`` are the
  training's owner as the kernel says (:class:`~torchwatch.model.origin.Origin`), which its
  environment cannot claim; a job key that claims another's is refused (:func:`job_keys`).
  ``training_job`` is the key every rank of the job shares on every node
  (:func:`torchwatch.hook.ranks.job_from_env`: ``TORCHWATCH_JOB``, ``TORCHELASTIC_RUN_ID``, the
  rendezvous endpoint ``MASTER_ADDR:MASTER_PORT``, ``slurm:JOB.STEP``; else the hook's spawn or
  ``init_method`` key; else ``pid:PID`` for a training with no job identity at all). It is not
  ``job``: Prometheus sets ``job`` to the scrape job's name and renames a scraped ``job`` label
  to ``exported_job``. ``host`` is the node (:func:`torchwatch.cli.serve.node_name`);
- per training (:data:`TARGET_LABELS`): ``training_job``, ``uid``, ``container_id``, ``pod_uid``, ``host``;
- per GPU: ``gpu`` (NVML index), ``uuid``, ``name``, ``host``; the OpenTelemetry-named copies
  (``hw_gpu_*``, ``hw_power_watts``) carry ``hw_id`` (the UUID), ``hw_name``, ``hw_type``, ``host``;
- bounded enumerations: ``label`` (the verdict labels), ``top_finding`` (rule ids), ``state``
  (the hang recorder's states), ``part``.

Cardinality: no PID or path is a label value but ``pid:PID`` for a training that has no job
key, and a node holds at most ``--max-trainings`` (16) of those at once, one per training as a
job id would be. A node exports at most ``--max-trainings`` trainings x their ranks
(:data:`~torchwatch.wire.MAX_RANKS`) rank label sets.

A value torchwatch did not measure has no sample (never 0), as in the report.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from torchwatch.model.hang import HangView
from torchwatch.model.observation import FeatureSpec, GpuRow, Observation, ProcessRow, RankView
from torchwatch.model.origin import Origin

__all__ = [
    "HANG_STATES",
    "OWNER_LABELS",
    "PREFIX",
    "RANK_LABELS",
    "TARGET_LABELS",
    "ObservationCollector",
    "feature_metric",
    "job_keys",
    "metric_families",
    "training_job",
]

log = logging.getLogger(__name__)

PREFIX = "torchwatch"

# Catalogue unit -> (name suffix, factor to the Prometheus base unit), and the suffixes of feature
# names that already say the unit (taken off before the base unit's suffix goes on).
_UNITS: dict[str, tuple[str, float]] = {
    "share": ("_ratio", 1.0),
    "%": ("_ratio", 0.01),
    "bytes": ("_bytes", 1.0),
    "bytes/s": ("_bytes_per_second", 1.0),
    "ms": ("_seconds", 0.001),
    "s": ("_seconds", 1.0),
    "steps/s": ("_per_second", 1.0),
    "CPUs": ("", 1.0),
    "cores": ("", 1.0),
    "count": ("", 1.0),
    "flag": ("", 1.0),
}
_NAME_UNITS = ("_bytes_per_s", "_per_s", "_share", "_pct", "_bytes", "_ratio", "_ms", "_s")


def feature_metric(spec: FeatureSpec) -> tuple[str, float]:
    """The Prometheus name of one catalogue feature and the factor from its unit to the name's.

    ``data_wait_share`` (share) -> ``torchwatch_feature_data_wait_ratio``; ``main_cpu_pct`` (%)
    -> ``torchwatch_feature_main_cpu_ratio`` (x 0.01); ``step_time_p50_ms`` (ms) ->
    ``torchwatch_feature_step_time_p50_seconds`` (x 0.001); ``read_bytes_per_s`` ->
    ``torchwatch_feature_read_bytes_per_second``. A unit the table does not know keeps the name as is.
    """
    suffix, factor = _UNITS.get(spec.unit, ("", 1.0))
    base = spec.name
    if suffix:
        for tail in _NAME_UNITS:
            if base.endswith(tail):
                base = base[: -len(tail)]
                break
    return f"{PREFIX}_feature_{base}{suffix}", factor


OWNER_LABELS = ("training_job", "uid", "container_id", "pod_uid")
"""Whose training a series is of: the job key, and what the kernel says of the training's owner
(:class:`~torchwatch.model.origin.Origin`: real uid, container, pod), which its environment cannot claim."""
RANK_LABELS = (*OWNER_LABELS, "host", "rank", "local_rank", "world_size")
"""The labels of every per-rank series: what a rule compares across the nodes of a job."""
TARGET_LABELS = (*OWNER_LABELS, "host")
"""The labels of every per-training series (one node's view of the job)."""
_GPU_LABELS = ("gpu", "uuid", "name", "host")
_HW_LABELS = ("hw_id", "hw_name", "hw_type", "host")
# The hang recorder's states of a rank (torchwatch.model.hang.HangProcess.state) exported per
# rank; a DataLoader worker's (idle, busy) are not a rank's.
HANG_STATES = ("collective", "backward", "dataloader", "elsewhere", "unknown")


def _help(obs: Sequence[Observation], feature: str, fallback: str, unit_note: str = "") -> str:
    """The catalogue's text for ``feature`` (the first Observation that has it), else ``fallback``."""
    for o in obs:
        spec = o.catalogue.get(feature)
        if spec is not None:
            return spec.doc + unit_note
    return fallback + unit_note


def _job(view: RankView) -> str:
    info = view.rank_info
    return info.job if info is not None and info.job else ""


def training_job(o: Observation) -> str:
    """The job key ``o``'s ranks' hooks published (the first rank that says), else ``pid:PID`` of
    the process watched (a training with no job identity; see the module docstring for why that
    stays bounded). What is exported is checked first: :func:`job_keys`."""
    return next((_job(v) for _, v in sorted(o.ranks.items()) if _job(v)), "") or f"pid:{o.target.pid}"


def job_keys(
    observations: Sequence[Observation], origins: Mapping[int, Origin]
) -> tuple[dict[int, str], list[tuple[int, str, str]]]:
    """The ``training_job`` label of each training, and the job keys refused.

    A key is the training's own to publish (``TORCHWATCH_JOB`` and the launchers' variables are its
    environment), so two checks hold it to what the kernel says:

    - a ``pid:`` key is torchwatch's own (a training with no job key); published by a hook it
      claims another process's label set: refused;
    - a key another training on this node already exports under another uid (``origins``; the
      trainings in the order given, the order serve started watching them) is refused: one user
      cannot join another's job on the node. Ranks of one job under one user in several
      containers (one pod per rank) share it.

    A refused key is exported as ``pid:PID`` of the training.

    Returns:
        ``({training's PID: training_job}, [(training's PID, the key refused, why)])``.
    """
    keys: dict[int, str] = {}
    refused: list[tuple[int, str, str]] = []
    owner: dict[str, int | None] = {}
    for o in observations:
        pid = o.target.pid
        own = f"pid:{pid}"
        key = training_job(o)
        uid = origins.get(pid, Origin()).uid
        if key != own and key.startswith("pid:"):
            refused.append((pid, key, "a pid: key is torchwatch's own, for a training with no job key"))
            key = own
        elif key in owner and owner[key] != uid:
            refused.append((pid, key, f"a training of uid {owner[key]} on this node exports that job key"))
            key = own
        owner.setdefault(key, uid)
        keys[pid] = key
    return keys, refused


def _processes(o: Observation) -> dict[int, ProcessRow]:
    return {p.pid: p for p in o.processes}


class _Families:
    """Gauges and counters by name, created on first use with their labels and help."""

    def __init__(self) -> None:
        self.by_name: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        self._seen: set[tuple[str, tuple[str, ...]]] = set()

    def add(
        self,
        name: str,
        doc: str,
        labels: Sequence[str],
        values: Sequence[str],
        value: float | None,
        counter: bool = False,
    ) -> None:
        """Add one sample; ``None`` adds nothing, and so does a label set already given (the first wins)."""
        if value is None or (name, tuple(values)) in self._seen:
            return
        self._seen.add((name, tuple(values)))
        family = self.by_name.get(name)
        if family is None:
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            # CounterMetricFamily takes the name without _total and adds it to the sample
            family = kind(name.removesuffix("_total") if counter else name, doc, labels=list(labels))
            self.by_name[name] = family
        family.add_metric(list(values), float(value))


def _ms(value: float | None) -> float | None:
    return None if value is None else value / 1000.0


def _pct(value: float | None) -> float | None:
    return None if value is None else value / 100.0


def _rank_labels(o: Observation, rank: int, view: RankView, who: tuple[str, ...], host: str) -> tuple[str, ...]:
    """The :data:`RANK_LABELS` values of one rank (a process shown alone keeps the rank its hook
    knows: a rank watched by itself is not rank 0 of its job); ``who``: the training's
    :data:`OWNER_LABELS` values, the same for each of its ranks."""
    info = view.rank_info
    if len(o.ranks) == 1 and info is not None and info.rank is not None:
        rank = info.rank
    local = "" if info is None or info.local_rank is None else str(info.local_rank)
    world = info.world_size if info is not None and info.world_size is not None else None
    if world is None and view.reading is not None:
        world = view.reading.world_size
    return (*who, host, str(rank), local, str(world if world is not None else len(o.ranks)))


def _live_hang(o: Observation) -> HangView | None:
    """The hang record while the training has not stepped out of it (``None`` otherwise)."""
    return o.hang if o.hang is not None and o.hang.state in ("hang", "dumping") else None


def _rank_metrics(
    out: _Families, obs: Sequence[Observation], o: Observation, who: tuple[str, ...], host: str
) -> dict[int, tuple[str, ...]]:
    """Per rank: the step's parts (medians over the window), steps, CPU, RSS, device memory, the
    focus rank's loss, epoch and time left in it, and the rank's own verdict: the series a rule
    compares across the nodes of a job.

    Returns:
        ``{rank's PID: its label values}`` of the ranks exported.
    """
    procs = _processes(o)
    exported: dict[int, tuple[str, ...]] = {}
    for rank, view in sorted(o.ranks.items()):
        if view.pid is None and view.reading is None and view.steps.steps is None:
            continue  # nothing known of it yet
        labels = _rank_labels(o, rank, view, who, host)
        steps, reading = view.steps, view.reading
        proc = procs.get(view.pid) if view.pid is not None else None

        def gauge(
            name: str, doc: str, value: float | None, counter: bool = False, labels: tuple[str, ...] = labels
        ) -> None:
            out.add(f"{PREFIX}_{name}", doc, RANK_LABELS, labels, value, counter)

        step_ms = reading.step_ms if reading is not None else steps.p50_ms
        gauge("step_time_seconds", _help(obs, "step_time_p50_ms", "median step time", ", seconds"), _ms(step_ms))
        gauge(
            "step_time_p95_seconds",
            _help(obs, "step_time_p95_ms", "95th percentile step time", ", seconds"),
            _ms(steps.p95_ms),
        )
        gauge("steps_per_second", _help(obs, "hook_steps_per_s", "steps per second"), steps.steps_per_s)
        gauge("steps_total", "optimizer steps the rank made since its hook started", steps.steps, counter=True)
        gauge(
            "data_wait_ratio",
            _help(obs, "data_wait_fraction", "share of the loop blocked on the DataLoader"),
            steps.data_wait,
        )
        if reading is not None:
            note = " (median over the window's steps), seconds"
            gauge(
                "window_steps",
                "steps of the rank in the verdict window: what the per-step medians are of (ranks are "
                "compared from 3 on, torchwatch.analysis.ranks.MIN_STEPS)",
                reading.steps,
            )
            gauge("data_wait_seconds", "time per step blocked in DataLoader __next__" + note, _ms(reading.data_wait_ms))
            gauge(
                "collective_wait_seconds",
                "time per step blocked on the other ranks: explicit collectives, and for DDP on the CPU the "
                "blocked part of backward (the gradient all-reduce)" + note,
                _ms(reading.collective_wait_ms),
            )
            gauge(
                "compute_seconds",
                "time per step before the gradient all-reduce other than data wait (forward, optimizer, "
                "other host work)" + note,
                _ms(reading.compute_ms),
            )
            gauge(
                "time_to_backward_seconds",
                "time per step the rank takes to reach its backward pass (data wait + compute): the rank "
                "with the longest paces a synchronous job" + note,
                _ms(reading.arrive_ms),
            )
        cpu = reading.cpu_pct if reading is not None and reading.cpu_pct is not None else None
        if cpu is None and proc is not None:
            cpu = proc.cpu_pct
        gauge("cpu_ratio", _help(obs, "main_cpu_pct", "the rank's CPU", " (1 = one core)"), _pct(cpu))
        gauge(
            "resident_memory_bytes",
            "resident memory of the rank's process (DataLoader workers not included), bytes",
            None if proc is None else proc.rss_bytes,
        )
        mem = view.device_memory
        gauge(
            "cuda_memory_allocated_bytes",
            _help(obs, "cuda_mem_allocated_bytes", "device memory in tensors"),
            mem.allocated_bytes,
        )
        gauge(
            "cuda_memory_reserved_bytes",
            "device memory the caching allocator holds (torch.cuda.memory_reserved)",
            mem.reserved_bytes,
        )
        prog = view.progress
        if prog is not None:
            gauge(
                "loss",
                "the last loss the rank's hook read (the scalar backward() was called on, read a few times a "
                "second without a device sync); NaN or +Inf when it is not finite",
                prog.loss,
            )
            gauge("loss_step", "the step of that loss reading, from 1", prog.loss_step)
            gauge("epoch", "the epoch of the rank's busiest DataLoader (iterators made over it), from 1", prog.epoch)
            gauge("epoch_batches", "batches taken in that epoch", prog.batch if prog.epoch is not None else None)
            gauge("epoch_length_batches", "len(loader): batches in an epoch", prog.epoch_len)
            gauge(
                "eta_seconds",
                "time left in the current epoch: batches to come over batches taken per second in the last "
                "30 s; no sample when the epoch's length or the rate is not known",
                prog.eta_s,
            )
            gauge(
                "progress_bar_done_ratio",
                "the share done of the rank's outermost tqdm bar with a total (its n over its total, with "
                "the bar nested in it), 0-1",
                prog.bar_share,
            )
            gauge(
                "progress_bar_eta_seconds",
                "time left on that tqdm bar at its pace of the last 30 s (the run's time left where the bar "
                "counts epochs or the run's steps)",
                prog.bar_eta_s,
            )
        verdict = view.verdict
        if verdict is not None and (len(o.ranks) > 1 or labels[-1] not in ("", "1")):
            top = view.findings[0].rule if view.findings else ""
            out.add(
                f"{PREFIX}_rank_verdict",
                "the rank's own verdict: 1 for its label and first finding",
                (*RANK_LABELS, "label", "top_finding"),
                (*labels, verdict.label, top),
                1.0,
            )
        if view.pid is not None:
            exported[view.pid] = labels
    return exported


def _rank_hang_metrics(
    out: _Families,
    o: Observation,
    who: tuple[str, ...],
    host: str,
    exported: Mapping[int, tuple[str, ...]],
    seen: dict[int, tuple[str, ...]],
) -> None:
    """Per rank, the stall / hang recorder's state: ``torchwatch_rank_hang`` (0 or 1, there for every
    rank exported, so an alert has a series), ``torchwatch_stall_seconds`` of the rank whose step
    clock ran out and, while the hang lasts, ``torchwatch_rank_hang_state`` of every rank dumped.

    A rank that stops stepping leaves the Observation's ranks (they are the ranks compared over the
    window), but its hang state keeps the labels it was exported with: ``seen`` (``{PID: label
    values}``, updated here) holds them for the ranks the live hang names, and nothing more.
    """
    hang = o.hang
    live = _live_hang(o)
    rows = {r.pid: r for r in live.processes if r.role in ("rank", "training")} if live is not None else {}
    kept = {pid: labels for pid, labels in seen.items() if pid in rows or (hang is not None and pid == hang.pid)}
    seen.clear()
    seen.update(kept)
    seen.update(exported)
    world = next((labels[-1] for labels in exported.values()), str(len(o.ranks)))

    def labels_of(pid: int, rank: int | None) -> tuple[str, ...]:
        got = seen.get(pid)
        return got if got is not None else (*who, host, str(rank if rank is not None else 0), "", world)

    for pid, labels in exported.items():
        own = live is not None and pid == live.pid
        out.add(f"{PREFIX}_rank_hang", _RANK_HANG_HELP, RANK_LABELS, labels, 1.0 if own else 0.0)
    if live is not None and live.pid not in exported:
        out.add(f"{PREFIX}_rank_hang", _RANK_HANG_HELP, RANK_LABELS, labels_of(live.pid, live.rank), 1.0)
    if hang is not None:
        out.add(
            f"{PREFIX}_stall_seconds",
            "seconds without a step in the rank's last recorded hang: until now, or until the training stepped "
            "again (state: hang, dumping, stall)",
            (*RANK_LABELS, "state"),
            (*labels_of(hang.pid, hang.rank), hang.state),
            hang.stalled_s,
        )
    for pid, row in sorted(rows.items()):
        if row.state in HANG_STATES:
            out.add(
                f"{PREFIX}_rank_hang_state",
                "1 for what the rank's main thread does in the live hang's thread dump (collective, backward: "
                "waits on its peers; dataloader; elsewhere: neither, the likely cause when it is the only one; "
                "unknown: not dumped)",
                (*RANK_LABELS, "state"),
                (*labels_of(pid, row.rank), row.state),
                1.0,
            )


_RANK_HANG_HELP = (
    "1 while this rank has made no step for longer than the hang threshold (max(30 s, 20 x its p95 step) or "
    "--hang-after) and the stall / hang recorder holds it as the hang, else 0"
)


def _gpu_metrics(out: _Families, obs: Sequence[Observation], o: Observation, host: str) -> None:
    """Per GPU: utilization, power, memory, and GPM activity when read; the quantities that
    OpenTelemetry's hardware conventions name also under their names (:func:`_hw_gpu_metrics`)."""
    for row in o.gpus:
        last = row.last
        labels = (str(row.index), (last.uuid or "") if last is not None else "", row.name, host)

        def gauge(name: str, doc: str, value: float | None, labels: tuple[str, ...] = labels) -> None:
            out.add(f"{PREFIX}_gpu_{name}", doc, _GPU_LABELS, labels, value)

        gauge("utilization_ratio", "time with at least one kernel running (NVML utilization)", _pct(row.util_pct))
        gauge("power_watts", "board power draw, W", row.power_w)
        gauge("power_limit_watts", "enforced power limit, W", row.power_limit_w)
        gauge("memory_used_bytes", "device memory used, bytes", row.mem_used_bytes)
        gauge("memory_total_bytes", "device memory, bytes", row.mem_total_bytes)
        _hw_gpu_metrics(out, row, labels[1] or f"gpu{row.index}", host)
        if last is None:
            continue
        gpm = (
            ("sm_active_ratio", "gpu_sm_active_mean", "share of SMs busy (GPM)", last.sm_active_pct),
            ("sm_occupancy_ratio", "gpu_sm_occupancy_mean", "resident warps / maximum (GPM)", last.sm_occupancy_pct),
            ("tensor_active_ratio", "gpu_tensor_active_mean", "tensor-core activity (GPM)", last.tensor_active_pct),
            ("dram_bandwidth_ratio", "gpu_dram_bw_mean", "DRAM bandwidth used / peak (GPM)", last.dram_bw_pct),
            ("training_sm_ratio", "gpu_proc_sm_pct", "the training's own SM utilization", last.proc_sm_pct),
        )
        for name, feature, fallback, pct in gpm:
            gauge(name, _help(obs, feature, fallback), _pct(pct))


def _hw_gpu_metrics(out: _Families, row: GpuRow, hw_id: str, host: str) -> None:
    """The NVML readings under the names OpenTelemetry's hardware semantic conventions give them
    (``hw.gpu.utilization``, ``hw.gpu.memory.usage``, ``hw.gpu.memory.limit``,
    ``hw.gpu.memory.utilization``, ``hw.power`` with ``hw.type=gpu``), as the OpenTelemetry to
    Prometheus translation writes them: dots to underscores, the unit as a suffix (``By`` ->
    ``_bytes``, ``W`` -> ``_watts``, a ``1`` gauge -> ``_ratio``), attributes as labels
    (``hw.id`` -> ``hw_id``: the GPU's UUID, else ``gpuN``). docs/fleet.md has the table."""
    labels = (hw_id, row.name, "gpu", host)
    util = _pct(row.util_pct)
    out.add(
        "hw_gpu_utilization_ratio",
        "OpenTelemetry hw.gpu.utilization (hw.gpu.task=general): fraction of time a kernel ran (NVML)",
        (*_HW_LABELS, "hw_gpu_task"),
        (*labels, "general"),
        util,
    )
    used, total = row.mem_used_bytes, row.mem_total_bytes
    out.add("hw_gpu_memory_usage_bytes", "OpenTelemetry hw.gpu.memory.usage: GPU memory used", _HW_LABELS, labels, used)
    out.add(
        "hw_gpu_memory_limit_bytes",
        "OpenTelemetry hw.gpu.memory.limit: size of the GPU memory",
        _HW_LABELS,
        labels,
        total,
    )
    out.add(
        "hw_gpu_memory_utilization_ratio",
        "OpenTelemetry hw.gpu.memory.utilization: fraction of GPU memory used",
        _HW_LABELS,
        labels,
        used / total if used is not None and total else None,
    )
    out.add("hw_power_watts", "OpenTelemetry hw.power (hw.type=gpu): board power draw", _HW_LABELS, labels, row.power_w)


def _verdict_metrics(out: _Families, o: Observation, who: tuple[str, ...], host: str) -> None:
    """The verdict as a labelled gauge, its confidence, the straggler's score, and every feature."""
    labels = (*who, host)
    if o.verdict is not None:
        top = o.findings[0].rule if o.findings else ""
        out.add(
            f"{PREFIX}_verdict",
            "torchwatch's verdict on the training (the job's, for several ranks): 1 for its label and first finding",
            (*TARGET_LABELS, "label", "top_finding"),
            (*labels, o.verdict.label, top),
            1.0,
        )
        out.add(
            f"{PREFIX}_verdict_confidence",
            "confidence of the verdict, 0..1",
            TARGET_LABELS,
            labels,
            o.verdict.confidence,
        )
    if o.straggler is not None:
        st = o.straggler
        out.add(
            f"{PREFIX}_straggler_score",
            "this node's straggler among its own ranks, and its score: (the victim's collective wait - the "
            "straggler's) / step time (TraceML's); across nodes, the rule torchwatch:rank_straggler_score:ratio",
            (*TARGET_LABELS, "rank"),
            (*labels, str(st.rank)),
            st.score,
        )
    _hang_metrics(out, o, labels)
    feature_labels = (*TARGET_LABELS, "rank")
    for name, value in sorted(o.features.items()):
        spec = o.catalogue.get(name)
        if spec is None or value is None:
            continue
        metric, factor = feature_metric(spec)
        out.add(
            metric,
            f"{spec.doc} (focus rank's window; source {spec.source})",
            feature_labels,
            (*labels, str(o.focus_rank)),
            value * factor,
        )


def _hang_metrics(out: _Families, o: Observation, labels: tuple[str, ...]) -> None:
    """The stall / hang recorder's state for the training: what an alert on a stuck job reads.

    ``torchwatch_hang`` is 1 while the last record is a hang the training has not stepped out of
    (0 otherwise, also before any record, so an alert has a series to watch);
    ``torchwatch_hangs_total`` counts the records (one per stall). The rank the record is of
    carries ``torchwatch_rank_hang`` and ``torchwatch_stall_seconds`` (:func:`_rank_hang_metrics`).
    """
    hang = o.hang
    out.add(
        f"{PREFIX}_hang",
        "1 while the training (or one rank) has made no step for longer than the hang threshold, else 0",
        TARGET_LABELS,
        labels,
        1.0 if _live_hang(o) is not None else 0.0,
    )
    out.add(
        f"{PREFIX}_hangs_total",
        "hangs the stall / hang recorder recorded while watching (one per stall)",
        TARGET_LABELS,
        labels,
        float(hang.number) if hang is not None else 0.0,
        counter=True,
    )


def _self_metrics(out: _Families, obs: Sequence[Observation], host: str) -> None:
    """torchwatch's own cost: CPU seconds (torchwatch, py-spy), CPU share of a core, peak RSS."""
    usage = [o.own_usage for o in obs]
    labels = ("host",)
    tw = max(u.torchwatch_cpu_s for u in usage)
    spy = sum(u.pyspy_cpu_s for u in usage)
    doc = "CPU time torchwatch spent watching, seconds: its own process (all threads) and py-spy"
    out.add(f"{PREFIX}_self_cpu_seconds_total", doc, ("host", "part"), (host, "torchwatch"), tw, counter=True)
    out.add(f"{PREFIX}_self_cpu_seconds_total", doc, ("host", "part"), (host, "py-spy"), spy, counter=True)
    wall = max(u.wall_s for u in usage)
    if wall > 0:
        out.add(
            f"{PREFIX}_self_cpu_ratio",
            "torchwatch's and py-spy's CPU since watching started / wall time (1 = one core)",
            labels,
            (host,),
            (tw + spy) / wall,
        )
    out.add(
        f"{PREFIX}_self_resident_memory_max_bytes",
        "torchwatch's peak resident memory, bytes",
        labels,
        (host,),
        max(u.max_rss_bytes for u in usage),
    )


def metric_families(
    observations: Iterable[Observation],
    host: str,
    seen: dict[int, dict[int, tuple[str, ...]]] | None = None,
    origins: Mapping[int, Origin] | None = None,
    refused: list[tuple[int, str, str]] | None = None,
) -> list[Metric]:
    """Every metric of ``observations`` (one per watched training), as Prometheus metric families.

    The same Observations and ``seen`` give the same metrics. A GPU seen by several trainings is
    exported once (the first Observation's reading); so is a rank label set.

    Args:
        observations: the latest Observation of each training watched (may be empty).
        host: the ``host`` label (this machine's name).
        seen: ``{training's PID: {rank's PID: label values}}`` kept from one scrape to the next
            (:class:`ObservationCollector` holds it): the labels of a rank the live hang names after
            it left the Observation's ranks. Trainings no longer watched are dropped from it.
        origins: ``{training's PID: its Origin}`` (uid, container, pod; read when it was first
            watched); a training not in it has its owner labels empty.
        refused: when given, the job keys refused (:func:`job_keys`) are appended to it.

    Returns:
        Gauge and counter families; ``torchwatch_targets`` (trainings watched) is always there.
    """
    obs = list(observations)
    out = _Families()
    out.add(f"{PREFIX}_targets", "trainings torchwatch watches now", ("host",), (host,), float(len(obs)))
    memo = {} if seen is None else seen
    for gone in set(memo) - {o.target.pid for o in obs}:
        del memo[gone]
    owners = origins or {}
    keys, bad = job_keys(obs, owners)
    if refused is not None:
        refused.extend(bad)
    for o in obs:
        who = (keys[o.target.pid], *owners.get(o.target.pid, Origin()).labels())
        _verdict_metrics(out, o, who, host)
        exported = _rank_metrics(out, obs, o, who, host)
        _rank_hang_metrics(out, o, who, host, exported, memo.setdefault(o.target.pid, {}))
        _gpu_metrics(out, obs, o, host)
    if obs:
        _self_metrics(out, obs, host)
    return list(out.by_name.values())


class ObservationCollector(Collector):
    """A ``prometheus_client`` collector that renders :func:`metric_families` at each scrape.

    Args:
        latest: returns the latest Observations (cheap: a session's ``latest_observation``).
        host: the ``host`` label.
        origins: returns ``{training's PID: Origin}`` of the trainings watched (read once each, when
            first watched: serve's :class:`~torchwatch.watch.fleet.Fleet`); ``None``: owners unknown.

    A job key refused (:func:`job_keys`) is logged once per training and key, as a warning.
    """

    def __init__(
        self,
        latest: Callable[[], Iterable[Observation | None]],
        host: str,
        origins: Callable[[], Mapping[int, Origin]] | None = None,
    ) -> None:
        self._latest = latest
        self._host = host
        self._origins = origins
        self._seen: dict[int, dict[int, tuple[str, ...]]] = {}
        self._said: set[tuple[int, str]] = set()
        self._lock = threading.Lock()  # two scrapes at once (an HA pair) share the labels seen

    def collect(self) -> Iterator[Metric]:
        """The metrics of the Observations there are now (a training not analysed yet has none)."""
        refused: list[tuple[int, str, str]] = []
        with self._lock:
            obs = [o for o in self._latest() if o is not None]
            origins = self._origins() if self._origins is not None else {}
            families = metric_families(obs, self._host, self._seen, origins, refused)
            live = {o.target.pid for o in obs}
            self._said = {said for said in self._said if said[0] in live}
            for pid, key, why in refused:
                if (pid, key) not in self._said:
                    self._said.add((pid, key))
                    log.warning(
                        "training PID %d publishes job key %r: refused (%s); exported as training_job=pid:%d",
                        pid,
                        key,
                        why,
                        pid,
                    )
        yield from families

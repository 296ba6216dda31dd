"""The Observation: everything torchwatch knows at one analysis tick, typed and frozen.

The watch session builds one per analysis tick (:mod:`torchwatch.watch.observe`); every face is
a function of it: the JSON and text report, the headless status line, the TUI, ``torchwatch
burst`` (its :class:`~torchwatch.wire.BurstResult`) and any exporter. No face reads the
readings store, a source or a file of the hook.

Per rank: a training of one process is rank 0. :attr:`Observation.ranks` maps each rank watched
to its :class:`RankView`; :attr:`Observation.focus_rank` is the one the verdict is about and the
panels show. Times are monotonic seconds unless named otherwise; sizes in bytes; shares 0..1;
percentages 0..100. A value that was not measured is ``None``, with a reason beside it where one
is known.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from torchwatch.model.findings import Finding, NotApplicable, Verdict
from torchwatch.model.hang import HangView
from torchwatch.model.memory import MemoryView
from torchwatch.model.peaks import FlopRate
from torchwatch.model.progress import ProgressView
from torchwatch.model.readings import Frame, GpuSample, SourceStatus
from torchwatch.wire import AmpInfo, BurstResult, CompileInfo, GpuSettings, LoaderInfo, RankInfo, Refusal, TrialState

__all__ = [
    "BurstView",
    "ChildProcess",
    "DeviceMemory",
    "FeatureSpec",
    "GpuRow",
    "MemoryTrend",
    "Observation",
    "ProcessRow",
    "RankReading",
    "RankView",
    "SamplingChange",
    "SamplingView",
    "SelfUsage",
    "StackRow",
    "StepsView",
    "Straggler",
    "TargetView",
    "VerdictChange",
]


@dataclass(frozen=True)
class FeatureSpec:
    """Declaration of one feature: its name, unit (``share``, ``%``, ``count``, ``bytes``, ``bytes/s``,
    ``CPUs``, ``steps/s``, ``ms``, ``s``, ``flag``, ``TFLOP/s``, ``number``: a plain number),
    source (``py-spy``, ``proc``, ``psutil``, ``psi``,
    ``diskstats``, ``vmstat``, ``nvml``, ``gpm``, ``hook``, ``burst``, joined by ``+``) and what it
    measures (one line)."""

    name: str
    unit: str
    source: str
    doc: str


class ChildProcess(Protocol):
    """A command torchwatch launched (``run``), as the watch loop, the Observation and the TUI read it."""

    @property
    def pid(self) -> int:
        """PID of the command."""
        ...

    @property
    def args(self) -> Sequence[str]:
        """The command line."""
        ...

    def poll(self) -> int | None:
        """The exit status once ended (as :attr:`subprocess.Popen.returncode`), else ``None``."""
        ...


@dataclass(frozen=True)
class TargetView:
    """The process torchwatch was given.

    Attributes:
        pid: the PID started (``run``) or named (``attach``).
        cmdline: its command line.
        exited: one line saying it exited, with its exit status, or ``None`` while it runs.
        exit_code: its shell-style exit status (128+N for signal N) when known.
        gone: it has exited (``attach`` knows that, not the status).
        ns_pid: its PID inside its own PID namespace (a container: 1 when it is the container's
            first process) when that namespace is not torchwatch's, else ``None``. Every other
            PID torchwatch shows, ``pid`` too, is torchwatch's own (the host's, on the node).
    """

    pid: int
    cmdline: tuple[str, ...] = ()
    exited: str | None = None
    exit_code: int | None = None
    gone: bool = False
    ns_pid: int | None = None


@dataclass(frozen=True)
class DeviceMemory:
    """The CUDA caching allocator of a rank's device, as its hook publishes it, bytes.

    Attributes:
        allocated_bytes / reserved_bytes / peak_bytes: ``torch.cuda.memory_allocated``,
            ``memory_reserved`` and ``max_memory_allocated``; ``None`` when not published.
        why: why they are ``None`` (no hook, CUDA not initialised, not published yet).
        device: the CUDA device they are of (the training's current device).
        capacity_bytes: that device's memory (``get_device_properties().total_memory``).
        alloc_retries: ``cudaMalloc`` failures the allocator retried after freeing its cache.
        devices: how many devices the process holds memory on.
        allocated_series / reserved_series: bytes, one value per analysis tick, oldest first.
    """

    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    peak_bytes: int | None = None
    why: str | None = None
    device: int | None = None
    capacity_bytes: int | None = None
    alloc_retries: int | None = None
    devices: int = 0
    allocated_series: tuple[float, ...] = ()
    reserved_series: tuple[float, ...] = ()


@dataclass(frozen=True)
class StepsView:
    """The training loop of one rank as its in-process hook measures it.

    Attributes:
        status: the hook source's status (``ok``, ``starting``, ``unavailable``, ``gone``), ``None``
            when the session reads no hook; reason: why it is not ``ok``.
        pid: the process the hook runs in. torch: its torch version.
        steps: optimizer steps so far. first_step_after_s: seconds from the start of watching to the
            first optimizer step. steps_per_s: steps/s over the verdict window.
        p50_ms / p95_ms: step time percentiles over the window, ms.
        data_wait: share of the loop's time blocked in ``next()`` on a DataLoader, 0..1;
            data_wait_source: ``hook`` (measured in the process) or ``py-spy`` (stack estimate).
        loader: the most-used DataLoader's settings; loaders: every DataLoader seen.
        usable_cpus: CPUs the training may use (affinity, cgroup quota). shm_bytes: ``/dev/shm`` size.
        amp: autocast and GradScaler as seen; amp_text: the same in words.
        cuda_initialized: the training initialised CUDA. signal / signal_owned: the burst signal
            and whether the hook holds its handler. errors: the hook's own errors.
        steps_series: steps/s, one value per analysis tick, oldest first; wait_series: data wait, %.
    """

    status: str | None = None
    reason: str | None = None
    pid: int | None = None
    torch: str | None = None
    steps: int | None = None
    first_step_after_s: float | None = None
    steps_per_s: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    data_wait: float | None = None
    data_wait_source: str | None = None
    loader: LoaderInfo | None = None
    loaders: tuple[LoaderInfo, ...] = ()
    usable_cpus: float | None = None
    shm_bytes: int | None = None
    amp: AmpInfo | None = None
    amp_text: str | None = None
    cuda_initialized: bool | None = None
    signal: int | None = None
    signal_owned: bool | None = None
    errors: tuple[str, ...] = ()
    steps_series: tuple[float, ...] = ()
    wait_series: tuple[float, ...] = ()


@dataclass(frozen=True)
class BurstView:
    """Profiler bursts of one rank: whether one can be asked for, the state, the last result.

    Attributes:
        possible: a burst may be requested now; reason: why not (or what a request does).
        state: ``idle``, ``armed``, ``running``, ``summarizing``; ``None`` without a hook reading.
        mode: ``steps`` or ``window`` (of the burst running or last run). count: bursts asked so far.
        last_refusal: the last request the hook refused, and why.
        last: the last burst's result as the hook published it (a failed one has ``error``);
        error: ``last.error``, the message of a failed last burst.
    """

    possible: bool = False
    reason: str = ""
    state: str | None = None
    mode: str | None = None
    count: int | None = None
    last_refusal: Refusal | None = None
    error: str | None = None
    last: BurstResult | None = None


@dataclass(frozen=True)
class ProcessRow:
    """One process of the watched tree at the last round.

    Attributes:
        role: ``main``, ``worker`` (a DataLoader worker), ``trainer`` (a child of a training
            process that runs training steps itself, Hogwild-style), ``launcher``, ``helper`` or
            ``other``.
        cpu_pct: CPU, % of one core, mean over the last few seconds.
        rss_bytes: resident memory, bytes.
        read_bytes_per_s: storage reads, bytes/s (``None`` when ``/proc/PID/io`` is unreadable).
        threads: thread states at the last round, e.g. ``R1 W3`` (letters of
            :data:`torchwatch.model.units.WAIT_LETTERS`).
    """

    pid: int
    role: str
    name: str
    cpu_pct: float | None
    rss_bytes: int | None
    read_bytes_per_s: float | None
    threads: str
    num_threads: int


@dataclass(frozen=True)
class StackRow:
    """py-spy samples of one hot frame in one category, for the loop's thread or the workers.

    Attributes:
        who: ``main`` (the training loop's thread) or ``worker`` (DataLoader workers' main threads).
        category: for the loop its phase (``data/queue`` waiting on workers, ``data/fetch``
            computing samples itself, ``forward``, ...), for workers ``fetch``, ``idle``, ``send``
            or ``other``.
        function / location: the innermost frame outside the standard library and site-packages
            (``dl.py:7``), else the leaf.
        samples: py-spy samples; share: of that thread group's samples in the window, 0..1.
        frames: one full stack of the row (outermost first), for the drill-down.
    """

    who: str
    category: str
    function: str
    location: str
    samples: int
    share: float
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class GpuRow:
    """One GPU: the last reading and its series over the history.

    Attributes:
        util_pct: time with a kernel running, %; power_w / power_limit_w: W;
        mem_used_bytes / mem_total_bytes: device memory, bytes;
        used_by_target: a process of the watched tree holds a context on it;
        util_series: util %, one value per reading, oldest first;
        mem_series: memory used, bytes, one value per reading;
        last: the last reading itself, for its GPM fields (``sm_active_pct`` ... or ``gpm_reason``)
            and the training's own SM % (``proc_sm_pct``);
        sm_series: GPM SM activity %, one value per reading that had one.
    """

    index: int
    name: str
    util_pct: float | None
    power_w: float | None
    power_limit_w: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    used_by_target: bool
    util_series: tuple[float, ...]
    mem_series: tuple[float, ...]
    last: GpuSample | None = None
    sm_series: tuple[float, ...] = ()


@dataclass(frozen=True)
class MemoryTrend:
    """Host and device memory of the watched tree.

    Attributes:
        rss_series: the tree's total resident memory, bytes, one value per process round.
        rss_bytes / rss_peak_bytes: the last and the highest of them.
        rss_by_role: last round's resident memory by role (main, worker, ...), bytes.
        device_series: device memory used on the GPUs the tree uses (all GPUs when it uses
            none yet), bytes, one value per NVML round; empty without NVML.
        device_used_bytes / device_total_bytes: the last round.
        view: the limit, the forecasts, the workers' memory and the out-of-memory records
            (:mod:`torchwatch.watch.memwatch`).
    """

    rss_series: tuple[float, ...] = ()
    rss_bytes: float | None = None
    rss_peak_bytes: float | None = None
    rss_by_role: tuple[tuple[str, int], ...] = ()
    device_series: tuple[float, ...] = ()
    device_used_bytes: float | None = None
    device_total_bytes: float | None = None
    view: MemoryView = field(default_factory=MemoryView)


@dataclass(frozen=True)
class RankReading:
    """One rank's step over the verdict window, medians of its steps, ms (see
    :class:`~torchwatch.wire.RankStep`).

    Attributes:
        rank: its rank (``RANK``, ``torch.distributed``, the spawn index; else its place among
            the tree's training processes). pid: its process. world_size: ranks in the job.
        steps: steps in the window the medians are of.
        step_ms: step time. data_wait_ms: blocked in DataLoader ``__next__``.
        compute_ms: the rest of what it does before the gradient all-reduce (forward,
            optimizer, other host work): step minus data wait, backward and collectives.
        collective_wait_ms: blocked on its peers (explicit collectives, and backward's blocked
            part for DDP on the CPU).
        cpu_pct: the process's CPU, % of one core. runqueue_share: its main thread's time
            ready to run but waiting for a CPU, 0..1 (schedstat).
        label / summary: its own verdict. top_finding: the rule id of its first finding.
    """

    rank: int
    pid: int
    world_size: int | None
    steps: int
    step_ms: float
    data_wait_ms: float
    compute_ms: float
    collective_wait_ms: float
    cpu_pct: float | None = None
    runqueue_share: float | None = None
    label: str = "undetermined"
    summary: str = ""
    top_finding: str | None = None

    @property
    def arrive_ms(self) -> float:
        """How long the rank takes to reach its backward pass (data wait + compute), ms."""
        return self.data_wait_ms + self.compute_ms


@dataclass(frozen=True)
class Straggler:
    """The rank that makes the others wait.

    Attributes:
        rank / pid: the straggler (the rank that reaches the all-reduce last).
        victim_rank: the rank that waits longest for it.
        score: (victim's collective wait - straggler's collective wait) / step time: the share
            of the others' step the straggler costs them (TraceML's straggler score).
        severity: ``warning`` (score >= 0.10) or ``critical`` (>= 0.20), TraceML's thresholds.
        part: where the straggler's extra time goes: ``data`` (its DataLoader wait) or
            ``compute`` (forward and other host work).
        extra_ms: how much longer than the victim it takes to reach backward, ms.
        label / summary / top_finding: its own verdict and first finding (the cause).
    """

    rank: int
    pid: int
    victim_rank: int
    score: float
    severity: str
    part: str
    extra_ms: float
    label: str
    summary: str
    top_finding: str | None


@dataclass(frozen=True)
class RankView:
    """What torchwatch knows of one rank (one training process).

    Attributes:
        rank: its rank (a training of one process is rank 0). pid: its process.
        steps: its loop as its hook measures it. burst: its profiler bursts.
        device_memory: its device's caching allocator, or why not known.
        gpu_settings: TF32, cuDNN, compile, optimizer and allocator settings its hook read
            (``None``: no hook, or not read yet).
        stacks: the hottest frames of its loop thread and of the DataLoader workers, hottest first.
        main_states / worker_states: ``(state, share)`` of its loop thread's and its workers' main
            threads over the window (running, disk, sleep, sync, net, other), largest first:
            the same shares the rules read (storage reads' kernel time counts as disk).
        reading: its step over the window (step, data wait, compute, collective wait, CPU),
            ``None`` before it has steps. verdict / findings: its own diagnosis.
        rank_info: who it says it is in its job (rank, local rank, job key), as its hook
            published it; ``None`` without a hook reading.
        compile: what ``torch.compile`` did in it (frames, recompiles and why, graph breaks,
            recompile-limit hits, compile time), ``None`` before it compiled.
        flop_rate: its achieved FLOP/s and MFU from its last burst's FLOP count over its median
            step time (:func:`torchwatch.model.peaks.flop_rate`), ``None`` without a count.
        progress: its epoch, the time left in it and its loss (:class:`ProgressView`), ``None``
            without a hook reading that carries them (the focus rank's only).
    """

    rank: int
    pid: int | None
    steps: StepsView = field(default_factory=StepsView)
    burst: BurstView = field(default_factory=BurstView)
    device_memory: DeviceMemory = field(default_factory=DeviceMemory)
    gpu_settings: GpuSettings | None = None
    stacks: tuple[StackRow, ...] = ()
    main_states: tuple[tuple[str, float], ...] = ()
    worker_states: tuple[tuple[str, float], ...] = ()
    reading: RankReading | None = None
    verdict: Verdict | None = None
    findings: tuple[Finding, ...] = ()
    rank_info: RankInfo | None = None
    compile: CompileInfo | None = None
    flop_rate: FlopRate | None = None
    progress: ProgressView | None = None


@dataclass(frozen=True)
class VerdictChange:
    """The verdict changed to ``label`` ``t`` seconds after watching started."""

    t: float
    label: str


@dataclass(frozen=True)
class SelfUsage:
    """What watching cost so far: torchwatch's CPU s (all its threads), py-spy's CPU s, wall s,
    both CPUs together as % of one core, and torchwatch's peak resident memory, bytes.

    ``by_part`` splits ``torchwatch_cpu_s`` (CPU s, summing to it): ``start`` (torchwatch's own
    CPU before the session began: Python's start, its imports, the rules, the launch), one key
    per source read (``psutil``, ``threads``, ``hook``, ``py-spy``: reading its output, its own
    CPU is ``pyspy_cpu_s``; ``memory``, ``nvml``), ``analysis`` (features, rules, the
    Observation and what each tick hands to the faces), ``roles`` (the role probe's thread) and
    ``other`` (the rest: the main thread's faces, the TUI, the exit). ``None`` (no key) in
    reports written before it."""

    torchwatch_cpu_s: float = 0.0
    pyspy_cpu_s: float = 0.0
    wall_s: float = 0.0
    cpu_pct_of_core: float = 0.0
    max_rss_bytes: int = 0
    by_part: Mapping[str, float] | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class SamplingChange:
    """The cadence became ``mode`` ``t`` seconds after watching started, because of ``reason``."""

    t: float
    mode: str
    reason: str


@dataclass(frozen=True)
class SamplingView:
    """How fast the samplers run (:mod:`torchwatch.watch.cadence`).

    Attributes:
        mode: ``fast`` (the rates the first verdict needs) or ``steady`` (the verdict settled:
            a fraction of the cost). reason: why, one line.
        steady_s: seconds spent steady so far. returns_to_fast: times something sent the
            cadence back to fast after it settled. changes: the last changes, oldest first.
    """

    mode: str = "fast"
    reason: str = ""
    steady_s: float = 0.0
    returns_to_fast: int = 0
    changes: tuple[SamplingChange, ...] = ()


@dataclass(frozen=True)
class Observation:
    """Everything one analysis tick knows, for every face.

    Attributes:
        t: when it was built, monotonic s. elapsed_s: seconds since watching started.
        window_s: seconds of readings each verdict is computed over.
        sampling: how fast the samplers run (``fast`` or ``steady``) and why.
        target: the process torchwatch was given.
        verdict / findings / not_applicable: the diagnosis of the focus rank (``None`` verdict:
            no analysis yet).
        features: ``{name: value}`` of every feature (``None``: not measured).
        catalogue: ``{name: FeatureSpec}``: each feature's unit, source and meaning.
        statuses: ``(source name, status)`` of every source, in a stable order.
        ranks: ``{rank: RankView}``; focus_rank: the rank the panels show (the straggler unless
            one was chosen). straggler: the rank that paces the job, ``None`` when none does
            (or one process); the verdict is then the job's: the straggler's own.
        processes: every process of the watched tree at the last round.
        gpus: one row per GPU seen; gpu_note: why there is none (``n/a: ...``), or ``None``.
        memory: host and device memory trends.
        history: the verdict's changes since watching started.
        own_usage: what watching cost so far.
        hang: the last hang the stall / hang recorder made (a stall once the training stepped
            again); ``None`` when none.
        trials: the live trials of a setting seen on the focus rank while watching
            (:class:`torchwatch.wire.TrialState`, oldest first, at most 16).
    """

    t: float
    elapsed_s: float
    window_s: float
    target: TargetView
    verdict: Verdict | None = None
    findings: tuple[Finding, ...] = ()
    not_applicable: tuple[NotApplicable, ...] = ()
    features: Mapping[str, float | None] = field(default_factory=dict)
    catalogue: Mapping[str, FeatureSpec] = field(default_factory=dict)
    statuses: tuple[tuple[str, SourceStatus], ...] = ()
    ranks: Mapping[int, RankView] = field(default_factory=dict)
    focus_rank: int = 0
    straggler: Straggler | None = None
    processes: tuple[ProcessRow, ...] = ()
    gpus: tuple[GpuRow, ...] = ()
    gpu_note: str | None = None
    memory: MemoryTrend = field(default_factory=MemoryTrend)
    history: tuple[VerdictChange, ...] = ()
    own_usage: SelfUsage = field(default_factory=SelfUsage)
    sampling: SamplingView = field(default_factory=SamplingView)
    hang: HangView | None = None
    trials: tuple[TrialState, ...] = ()

    @property
    def focus(self) -> RankView:
        """The :class:`RankView` of :attr:`focus_rank` (an empty one before any rank is found)."""
        return self.ranks.get(self.focus_rank) or RankView(self.focus_rank, None)

    def unit(self, feature: str) -> str:
        """The unit of ``feature`` (``""`` when the catalogue does not know it)."""
        spec = self.catalogue.get(feature)
        return spec.unit if spec is not None else ""

    def status(self, source: str) -> SourceStatus | None:
        """The status of one source, or ``None`` when the session has no such source."""
        return dict(self.statuses).get(source)

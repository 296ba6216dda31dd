"""Typed readings that sources produce and features consume.

Every reading carries a monotonic timestamp ``t`` in seconds (``time.monotonic()``).
A value that could not be read is ``None``, never ``0``: absence is not zero. Each source
also reports a :class:`SourceStatus` so the report can say *why* a value is missing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar

from torchwatch.wire import HookRecord, RankStep


class Status(str, enum.Enum):
    """State of one source (psutil, nvml, py-spy, hook)."""

    OK = "ok"
    UNAVAILABLE = "unavailable"
    GONE = "gone"
    STARTING = "starting"


@dataclass(frozen=True)
class SourceStatus:
    """What a source can tell right now.

    Attributes:
        status: ``ok``, ``unavailable`` (``reason`` and ``hint`` say why and what to do),
            ``gone`` (the target exited) or ``starting`` (no reading yet).
        reason: one sentence, e.g. ``"NVML library not found (no NVIDIA driver)"``.
        hint: the fix, e.g. ``"install the NVIDIA driver, or ignore on a CPU-only machine"``.
    """

    status: Status
    reason: str | None = None
    hint: str | None = None

    @classmethod
    def ok(cls) -> SourceStatus:
        """A working source."""
        return cls(Status.OK)

    @classmethod
    def unavailable(cls, reason: str, hint: str | None = None) -> SourceStatus:
        """A source that cannot read: why, and what would fix it."""
        return cls(Status.UNAVAILABLE, reason, hint)

    @classmethod
    def gone(cls, reason: str = "the target process exited") -> SourceStatus:
        """The target exited."""
        return cls(Status.GONE, reason)

    def to_json(self) -> dict[str, Any]:
        """``{"status", "reason"?, "hint"?}`` for the report."""
        out: dict[str, Any] = {"status": self.status.value}
        if self.reason:
            out["reason"] = self.reason
        if self.hint:
            out["hint"] = self.hint
        return out


class Role(str, enum.Enum):
    """Part a process plays in the watched tree."""

    MAIN = "main"  # the training process (rank)
    WORKER = "worker"  # a DataLoader worker (forked or spawned)
    LAUNCHER = "launcher"  # a shell, pyenv shim or torchrun parent
    HELPER = "helper"  # multiprocessing resource tracker, compile workers, ...
    OTHER = "other"


class Wait(str, enum.Enum):
    """Why a thread that is not running is blocked, from its state and current syscall."""

    RUNNING = "running"  # state R: on a CPU or runnable
    DISK = "disk"  # state D: uninterruptible, almost always block IO
    SLEEP = "sleep"  # nanosleep / clock_nanosleep: a timer
    SYNC = "sync"  # futex / poll / select / epoll / pipe read: waiting on a thread or process
    NET = "net"  # blocked reading a socket
    FILE = "file"  # blocked in a read of a regular file (network file systems)
    OTHER = "other"  # anything else (stopped, zombie, unknown syscall)


@dataclass(frozen=True)
class ProcessSample:
    """One process of the watched tree at time ``t`` (psutil).

    Attributes:
        cpu_pct: CPU use since the previous sample, % of one core (200 = two cores busy).
        rss_bytes: resident set size, bytes.
        read_bytes_per_s / write_bytes_per_s: storage bytes (``/proc/PID/io`` read_bytes,
            write_bytes) per second since the previous sample; ``None`` when unreadable.
        trainer: a child of a training process that runs training steps itself (a Hogwild
            trainer, a ``multiprocessing.Pool`` of trainers); its role is ``main``.
    """

    STORE_KIND: ClassVar[str] = "processes"  # its list in the store (:class:`~torchwatch.analysis.store.Window`)

    t: float
    pid: int
    ppid: int
    role: Role
    name: str
    cmdline: tuple[str, ...]
    cpu_pct: float | None
    rss_bytes: int | None
    read_bytes_per_s: float | None
    write_bytes_per_s: float | None
    num_threads: int
    trainer: bool = False


@dataclass(frozen=True)
class ThreadSample:
    """State of one thread at time ``t`` (``/proc/PID/task/TID/{stat,syscall}``).

    Attributes:
        cpu_s / sys_s: the thread's cumulative CPU time (user + system) and system time, s,
            from ``utime`` and ``stime``; ``None`` when unreadable.
        runq_s: cumulative time the thread was ready to run but waited for a CPU, s
            (``/proc/PID/task/TID/schedstat``, second field); read every round for main and
            autograd threads, and for every other thread in the rounds that read them all (1 Hz).
        run_s: cumulative time the thread ran on a CPU, s (``schedstat``, first field: the
            scheduler's own nanosecond count, not ticks); read as ``runq_s`` is.
        autograd: the thread is the autograd engine's thread for a device (its name is
            ``pt_autograd_N``): it runs the backward of CUDA (and other accelerator) tensors while
            the thread that called ``backward()`` waits for it, so its time on a CPU is the loop's.
            Sampled every round, with ``run_s`` and ``runq_s``, like a main thread.
        collective: the thread runs CPU collectives (gloo's: ``pt_gloo_runloop``,
            ``gloo_tcp_loop``): its CPU is communication, not the step's compute.
    """

    STORE_KIND: ClassVar[str] = "threads"  # its list in the store (:class:`~torchwatch.analysis.store.Window`)

    t: float
    pid: int
    tid: int
    role: Role
    is_main_thread: bool
    state: str  # one letter from /proc stat: R, S, D, T, Z, I, ...
    wait: Wait
    cpu_s: float | None = None
    sys_s: float | None = None
    runq_s: float | None = None
    run_s: float | None = None
    autograd: bool = False
    collective: bool = False


@dataclass(frozen=True)
class CpuConsumer:
    """A process outside the training and outside torchwatch that used CPU (a neighbour).

    Attributes:
        pid: its PID (in torchwatch's PID namespace). name: its ``comm`` (15 characters at
            most, control characters removed: it is the process's own text). user: its owner's
            name, or the UID as digits. cores: its CPU over the last scan interval, cores
            (1.0 = one CPU busy all the time).
    """

    pid: int
    name: str
    user: str
    cores: float


@dataclass(frozen=True)
class SystemSample:
    """Machine-wide readings at time ``t``.

    Attributes:
        cpu_pct: all CPUs busy, % of the machine (100 = every CPU busy).
        io_some_pct: share of wall time in which at least one task stalled on IO, %, from
            ``/proc/pressure/io`` (PSI ``some``) since the previous sample; ``None`` without PSI.
        usable_cpus: CPUs the target may use: affinity, capped by the cgroup CPU quota.
        disk: the whole block device (``/sys/block`` name) that served the most bytes of
            reads since the previous sample; ``None`` when no device served any, or without
            ``/proc/diskstats``. The four readings after it describe that device alone
            (machine-wide, as iostat(1) shows it), and are ``None`` with it, except
            ``disk_read_bytes_per_s`` which is 0.0 when the counters were read but no device
            read anything.
        disk_read_bytes_per_s: bytes read from the device per second (iostat ``rkB/s``).
        disk_reads_per_s: read requests completed per second (iostat ``r/s``).
        disk_read_inflight: read requests in flight on average, from the time reads spent
            queued and in service per second of wall time (Little's law; iostat's read part
            of ``aqu-sz``).
        disk_busy: share of wall time, 0..1, with at least one request in flight on the
            device (iostat ``%util`` / 100).
        swap_in_bytes_per_s: bytes swapped in from swap per second, machine-wide
            (``/proc/vmstat`` pswpin); ``None`` when unreadable.
        mem_some_pct: share of wall time in which at least one task stalled on memory
            (reclaim, swap-in, thrashing), %, from ``/proc/pressure/memory`` (PSI ``some``).
        mem_available_bytes: memory available for new allocations without swapping, bytes
            (``MemAvailable``).
        cpu_some_pct: share of wall time in which at least one runnable task waited for a CPU, %
            (PSI ``some`` of ``cpu.pressure`` in the training's cgroup v2 group where readable,
            else ``/proc/pressure/cpu``, machine-wide).
        foreign_cpu_cores: CPU used by processes outside the training's tree and outside
            torchwatch (and what it started: py-spy), cores, over the last scan (every
            :data:`~torchwatch.sources.proc.NEIGHBOUR_SCAN_S` s): what the visible processes used
            plus what no visible process explains (the host's processes seen from a container,
            processes that came and went between scans, interrupts).
        own_cpu_cores: CPU used by torchwatch and its children (py-spy), cores, same interval.
        neighbours: the largest visible consumers of ``foreign_cpu_cores``, at most 3, largest
            first.
        cpu_quota_cpus: the cgroup CPU quota that binds the training, CPUs (``None``: none).
        throttled_periods_share: of the quota's enforcement periods since the previous sample,
            the share in which the group was throttled (``nr_throttled / nr_periods``, 0..1);
            ``None`` without a quota or without a period.
        throttled_share: wall time the group spent throttled per second since the previous
            sample, 0..1: the growth of ``throttled_usec`` / ``throttled_time``, which the kernel
            sums over the group's run queue on each CPU, divided by the CPUs the training may
            run on (its affinity).
    """

    STORE_KIND: ClassVar[str] = "system"  # its list in the store (:class:`~torchwatch.analysis.store.Window`)

    t: float
    cpu_pct: float | None
    io_some_pct: float | None
    usable_cpus: float | None
    disk: str | None = None
    disk_read_bytes_per_s: float | None = None
    disk_reads_per_s: float | None = None
    disk_read_inflight: float | None = None
    disk_busy: float | None = None
    swap_in_bytes_per_s: float | None = None
    mem_some_pct: float | None = None
    mem_available_bytes: int | None = None
    cpu_some_pct: float | None = None
    foreign_cpu_cores: float | None = None
    own_cpu_cores: float | None = None
    neighbours: tuple[CpuConsumer, ...] = ()
    cpu_quota_cpus: float | None = None
    throttled_periods_share: float | None = None
    throttled_share: float | None = None


@dataclass(frozen=True)
class GpuSample:
    """One GPU at time ``t`` (NVML). Units as NVML gives them, converted where named.

    Attributes:
        util_pct: % of the last sample period in which at least one kernel ran
            (``nvmlDeviceGetUtilizationRates().gpu``); not "how busy the SMs are".
        mem_used_bytes / mem_total_bytes: device memory, bytes.
        power_w / power_limit_w: board power draw and enforced limit, W.
        sm_clock_mhz: current SM clock, MHz.
        pcie_tx_bytes_per_s / pcie_rx_bytes_per_s: PCIe throughput, bytes/s.
        target_pids: PIDs of the watched tree that hold a context on this GPU.
        sm_active_pct: GPM ``SM_UTIL`` between the previous sample and this one, %: the share
            of SMs busy, averaged over the interval (DCGM calls the same counter SM activity). This,
            unlike ``util_pct``, is low when a stream of tiny kernels keeps the GPU "utilized".
        sm_occupancy_pct: GPM ``SM_OCCUPANCY``, %: resident warps over the SMs' maximum.
        tensor_active_pct: GPM ``ANY_TENSOR_UTIL``, %: SM time spent in tensor-core instructions.
        dram_bw_pct: GPM ``DRAM_BW_UTIL``, %: device-memory bandwidth used over its peak.
        gpm_reason: why the four GPM fields are ``None`` (``"GPM needs a Hopper or newer GPU
            (this is NVIDIA A100-SXM4-40GB)"``, ``"the GPU is in MIG mode ..."``, the first sample
            of two); ``None`` when they were read.
        proc_sm_pct: SM utilization of the watched tree's processes, %, from NVML's per-process
            samples (``nvmlDeviceGetProcessUtilization``: the share of time the process had a kernel
            on the SMs, summed over the tree's PIDs, averaged over the samples since the last read).
        uuid: the GPU's UUID (``nvmlDeviceGetUUID``, ``GPU-...``), ``None`` when NVML does not say.
        proc_util_reason: why ``proc_sm_pct`` is ``None`` (not supported, no sample for the tree's
            PIDs, ...); ``None`` when it was read.
    """

    STORE_KIND: ClassVar[str] = "gpus"  # its list in the store (:class:`~torchwatch.analysis.store.Window`)

    t: float
    index: int
    name: str
    util_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: float | None
    pcie_tx_bytes_per_s: float | None
    pcie_rx_bytes_per_s: float | None
    target_pids: tuple[int, ...] = ()
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_bw_pct: float | None = None
    gpm_reason: str | None = None
    proc_sm_pct: float | None = None
    proc_util_reason: str | None = None
    uuid: str | None = None


@dataclass(frozen=True)
class Frame:
    """One Python frame: function name, file path and line."""

    name: str
    filename: str
    line: int


@dataclass(frozen=True)
class StackSample:
    """``count`` py-spy samples of one thread with the same stack, taken over a chunk.

    ``frames`` run from the outermost call to the leaf. ``t`` is the end of the chunk.
    """

    STORE_KIND: ClassVar[str] = "stacks"  # its list in the store (:class:`~torchwatch.analysis.store.Window`)

    t: float
    pid: int
    tid: int
    thread_name: str
    role: Role
    is_main_thread: bool
    frames: tuple[Frame, ...]
    count: int


OTHER_RANKS_EVERY = 2
"""Rounds of the hook source between two reads of a rank that is not the focus (the focus is read
every round): at the default 0.5 s a round, the others once a second. The job's diagnosis re-analyses
those ranks at the same pace (:class:`torchwatch.watch.diagnose.JobDiagnoser`)."""


@dataclass(frozen=True)
class HookState:
    """One read of what the in-process hook published (:mod:`torchwatch.wire.files`).

    Attributes:
        t: when torchwatch read it, monotonic s (the hook's clock is the same).
        pid: the training process.
        steps: optimizer steps since the hook started.
        batches: batches taken from DataLoader iterators.
        data_wait_s: total time blocked in DataLoader ``__next__``, s.
        in_next_since: start of the ``__next__`` running at ``t`` (0.0: none), monotonic s.
        new_steps: steps that ended since the previous read: ``(end s, duration s, data wait s)``.
        first_step_t: when the first optimizer step ended, monotonic s (0.0: none yet).
        record: ``hook.json`` as its checked, typed record (settings, AMP, burst state and
            results, errors); ``None`` in readings made without one (tests).
        rank_steps: the same steps as ``new_steps`` with their backward and collective times
            (:class:`~torchwatch.wire.RankStep`, s), for the per-rank readings.
    """

    STORE_KIND: ClassVar[str] = "hook"  # its list in the store (:class:`~torchwatch.analysis.store.Window`)

    t: float
    pid: int
    steps: int
    batches: int
    data_wait_s: float
    in_next_since: float
    new_steps: tuple[tuple[float, float, float], ...] = ()
    first_step_t: float = 0.0
    record: HookRecord | None = None
    rank_steps: tuple[RankStep, ...] = ()

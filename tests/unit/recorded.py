"""A recorded watch for the TUI and report tests: the readings of a DataLoader-bound training (py-spy
raw output and a hook.json from tests/fixtures) in a Store, analysed, and a RecordedWatch that serves
them as a Session would."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchwatch import wire
from torchwatch.analysis import features as feats
from torchwatch.analysis.diagnosis import Analysis, Diagnoser
from torchwatch.analysis.rules_engine import load_rules
from torchwatch.analysis.store import Store
from torchwatch.model.observation import Observation, SamplingView, SelfUsage, TargetView, VerdictChange
from torchwatch.model.readings import (
    GpuSample,
    HookState,
    ProcessSample,
    Role,
    SourceStatus,
    SystemSample,
    ThreadSample,
    Wait,
)
from torchwatch.model.trials import Outcome, Plan
from torchwatch.sources.pyspy import parse_raw
from torchwatch.watch.observe import NO_HOOK, Tick, Trends, observe, target_view

MAIN, WORKERS, HELPER = 4236, (4279, 4280), 4250


NOW = 60.0


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


PYSPY = FIXTURES / "pyspy" / "dataloader_nw2_subprocesses.raw"


HOOK_JSON = FIXTURES / "hook" / "dataloader_nw2.hook.json"


A100_NO_GPM = "GPM needs a Hopper or newer GPU (this is NVIDIA A100-SXM4-40GB)"


NVML_MISSING = SourceStatus.unavailable(
    "NVML library not found (no NVIDIA driver)", "install the NVIDIA driver, or ignore on a CPU-only machine"
)


def _role(pid: int) -> Role:
    return Role.MAIN if pid == MAIN else Role.HELPER if pid == HELPER else Role.WORKER


def recorded_store(gpus: bool = False) -> Store:
    """Sixty seconds of readings of a DataLoader-bound training with two workers."""
    store = Store(keep=1e9)
    out: list[object] = []
    for i in range(1, int(NOW) + 1):
        t = float(i)
        wobble = (i * 37) % 11  # deterministic variation, no randomness
        out.append(SystemSample(t, 97.0, 0.5, 2.0))
        out.append(
            ProcessSample(
                t,
                MAIN,
                4230,
                Role.MAIN,
                "python",
                ("python", "train.py"),
                38.0 + wobble,
                900_000_000 + i * 1_000_000,
                0.0,
                0.0,
                9,
            )
        )
        for k, pid in enumerate(WORKERS):
            out.append(
                ProcessSample(
                    t,
                    pid,
                    MAIN,
                    Role.WORKER,
                    "python",
                    ("python", "train.py"),
                    78.0 + wobble + k,
                    410_000_000 + k * 5_000_000,
                    2_000_000.0 + 100_000 * wobble,
                    0.0,
                    3,
                )
            )
        out.append(
            ProcessSample(
                t,
                HELPER,
                MAIN,
                Role.HELPER,
                "python",
                ("python", "-c", "resource_tracker"),
                0.0,
                12_000_000,
                None,
                0.0,
                1,
            )
        )
        if gpus:
            util = 30.0 + 25.0 * (0.5 + 0.5 * math.sin(i / 4.0))
            out.append(
                GpuSample(
                    t,
                    0,
                    "NVIDIA A100-SXM4-40GB",
                    util,
                    12_000_000_000 + i * 10_000_000,
                    40_000_000_000,
                    120.0 + util,
                    400.0,
                    1410.0,
                    1e9,
                    2e8,
                    (MAIN,),
                    gpm_reason=A100_NO_GPM,
                    proc_sm_pct=util,
                )
            )
            out.append(
                GpuSample(
                    t,
                    1,
                    "NVIDIA A100-SXM4-40GB",
                    0.0,
                    500_000_000,
                    40_000_000_000,
                    58.0,
                    400.0,
                    210.0,
                    0.0,
                    0.0,
                    (),
                    gpm_reason=A100_NO_GPM,
                )
            )
    for r in range(0, 41):  # thread states at 4 Hz over the last 10 s
        t = NOW - 10.0 + r * 0.25
        out.append(
            ThreadSample(
                t,
                MAIN,
                MAIN,
                Role.MAIN,
                True,
                "S" if r % 10 < 7 else "R",
                Wait.SYNC if r % 10 < 7 else Wait.RUNNING,
                0.3 * t,
                0.01 * t,
                0.0,
            )
        )
        out.append(ThreadSample(t, MAIN, MAIN + 1, Role.MAIN, False, "S", Wait.SYNC))
        out.append(ThreadSample(t, MAIN, MAIN + 2, Role.MAIN, False, "S", Wait.NET))
        for pid in WORKERS:
            busy = r % 10 != 0
            out.append(
                ThreadSample(
                    t,
                    pid,
                    pid,
                    Role.WORKER,
                    True,
                    "R" if busy else "S",
                    Wait.RUNNING if busy else Wait.SYNC,
                    0.8 * t,
                    0.02 * t,
                )
            )
            out.append(ThreadSample(t, pid, pid + 1, Role.WORKER, False, "S", Wait.SYNC))
    text = PYSPY.read_text()
    # The recording named the workers' PIDs the other way round; the main training is 4236.
    for t in (NOW - 9.0, NOW - 6.0, NOW - 3.0, NOW):
        out.extend(parse_raw(text, t, MAIN, _role))
    store.add(out)
    return store


def analyse(store: Store) -> Analysis:
    """Features and rules over the store's last 10 s, evaluated twice so hold times pass."""
    window = store.window(NOW - 10.0, NOW)
    f = feats.compute(window, MAIN)
    d = Diagnoser(load_rules())
    d.evaluate(f, NOW - 20.0)
    return d.evaluate(f, NOW)


def _sources(gpus: bool) -> dict[str, SourceStatus]:
    return {
        "psutil": SourceStatus.ok(),
        "threads": SourceStatus.ok(),
        "py-spy": SourceStatus.ok(),
        "nvml": SourceStatus.ok() if gpus else NVML_MISSING,
        "gpm": SourceStatus.unavailable(A100_NO_GPM if gpus else "needs NVML: NVML library not found"),
    }


def hook_readings(record: wire.HookRecord) -> list[HookState]:
    """The hook's readings of the last ten seconds (1 Hz): 3.2 steps/s, 62 % of the time in
    DataLoader ``__next__``, 32 steps of 290 ms (the last four of 340 ms), ``record`` published."""
    durations = [0.29] * 28 + [0.34] * 4
    ends = [NOW - 10.0 + (j + 1) * 10.0 / len(durations) for j in range(len(durations))]
    reads = []
    for k, t in enumerate(range(int(NOW) - 10, int(NOW) + 1)):
        new = tuple((e, d, 0.62 * d) for e, d in zip(ends, durations, strict=True) if t - 1 < e <= t)
        reads.append(
            HookState(
                t=float(t),
                pid=MAIN,
                steps=1202 + round(3.2 * k),
                batches=1204 + round(3.2 * k),
                data_wait_s=0.62 * k,
                in_next_since=0.0,
                new_steps=new,
                first_step_t=3.5,
                record=record,
            )
        )
    return reads


def recorded_record() -> wire.HookRecord:
    """The hook's ``hook.json`` of the recorded training (tests/fixtures/hook), checked by the reader's decoder."""
    return wire.HookRecord.decode(json.loads(HOOK_JSON.read_text()))


@dataclass
class RecordedWatch:
    """A watched training replayed from recorded readings: every :meth:`observe` runs the real
    Observation builder (:func:`torchwatch.watch.observe.observe`) over the store, as the session does.

    Attributes besides the readings are what a session knows: its sources' statuses, the hook
    source's status (``None``: no hook source), whether a burst may be asked for, the launched
    command, whether the target is gone and when its readings end.
    """

    store: Store = field(default_factory=recorded_store)
    analysis: Analysis | None = None
    sources: dict[str, SourceStatus] = field(default_factory=lambda: _sources(False))
    hook_status: SourceStatus | None = None
    can_burst: tuple[bool, str] = (False, NO_HOOK)
    child: Any = None
    gone: bool = False
    ended_at: float | None = None
    history: tuple[VerdictChange, ...] = (VerdictChange(2.0, "undetermined"), VerdictChange(8.0, "dataloader-bound"))
    trends: Trends = field(default_factory=Trends)
    burst_requests: int = 0
    trials: list[str] = field(default_factory=list)
    now: float = NOW
    sampling: SamplingView = field(default_factory=SamplingView)
    wakes: list[str] = field(default_factory=list)

    def observe(self) -> Observation:
        target = target_view(MAIN, ("python", "train.py"), self.child, self.gone)
        tick = Tick(
            now=self.now,
            end=self.ended_at if self.ended_at is not None else self.now,
            started=0.0,
            window_s=10.0,
            analysis=self.analysis,
            statuses=tuple(self.sources.items()),
            focus_pid=MAIN,
            target=target,
            hook_status=self.hook_status,
            burst_possible=(False, "the training has exited") if target.exited else self.can_burst,
            history=self.history,
            own_usage=SelfUsage(torchwatch_cpu_s=1.0, pyspy_cpu_s=0.5, wall_s=60.0, cpu_pct_of_core=2.5),
            sampling=self.sampling,
        )
        return observe(self.store, tick, self.trends)

    def choose_rank(self, rank: int | None) -> None:
        """One process: there is no other rank to show."""

    def wake(self, why: str) -> None:
        """As the session does: back to the fast cadence."""
        self.wakes.append(why)
        self.sampling = SamplingView(mode="fast", reason=why)

    def request_burst(self) -> tuple[bool, str]:
        self.burst_requests += 1
        return True, "burst requested: SIGUSR2 sent to PID 4236"

    def try_setting(self, assignment: str, stopped: Callable[[], int | None]) -> Outcome:
        """As the session does, without a training: a trial whose "on" blocks are 1.5x faster."""
        self.trials.append(assignment)
        name, _, value = assignment.partition("=")
        blocks = tuple(
            wire.TrialBlock(wire.is_on(i), 10 * i, 8, 2, 0.2 if wire.is_on(i) else 0.3, 0.2) for i in range(6)
        )
        state = wire.TrialState(1, name, value, "done", old="0", reason="decided", blocks=blocks,
                              estimate=wire.estimate(blocks), restored=True, now_value="0")  # fmt: skip
        return Outcome(Plan(wire.TrialRequest(1, name, value), 0.25), states={4236: state})


def recorded_session(gpus: bool = False, hooked: bool = False) -> RecordedWatch:
    """The recorded training, its analysis computed from its readings (with the hook's when ``hooked``)."""
    store = recorded_store(gpus=gpus)
    if hooked:
        store.add(hook_readings(recorded_record()))
    return RecordedWatch(
        store=store,
        analysis=analyse(store),
        sources=_sources(gpus),
        hook_status=SourceStatus.ok() if hooked else None,
        can_burst=(True, "SIGUSR2 to PID 4236") if hooked else (False, NO_HOOK),
    )


def recorded_observation(gpus: bool = False, hooked: bool = False) -> Observation:
    """One Observation of the recorded training, built by the real builder."""
    return recorded_session(gpus=gpus, hooked=hooked).observe()


def observation_of(
    features: dict[str, float | None], reading: HookState | None = None, hook: SourceStatus | None = None
) -> Observation:
    """The Observation the real builder makes of one analysis' features and, maybe, one hook reading."""
    store = Store()
    if reading is not None:
        store.add([reading])
    tick = Tick(
        now=1.0,
        end=1.0,
        started=0.0,
        window_s=10.0,
        analysis=Analysis(t=1.0, features=features),
        statuses=(),
        focus_pid=reading.pid if reading is not None else None,
        target=TargetView(1),
        hook_status=hook,
    )
    return observe(store, tick, Trends())

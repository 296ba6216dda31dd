"""Rank test helpers: a rank's hook reading with given step parts, and a watch over a job's ranks."""

from __future__ import annotations

from tests.unit.hookrecords import hook_record
from torchwatch.model.observation import Observation
from torchwatch.model.readings import HookState
from torchwatch.wire import RankStep

ALLREDUCE_MS = 3.0


def rank_state(pid: int, rank: int, data_ms: float, compute_ms: float, step_ms: float, cuda: bool = False) -> HookState:
    """Twenty steps of one rank of a 2-rank CPU DDP job: data wait, forward, then backward whose
    blocked part is the wait for the slowest rank's all-reduce."""
    rec = hook_record(pid, rank={"rank": rank, "world_size": 2}, cuda_initialized=cuda)
    blocked = step_ms - data_ms - compute_ms - ALLREDUCE_MS
    steps = tuple(
        RankStep(
            end=1.0 + i * step_ms / 1000,
            duration=step_ms / 1000,
            data_wait=data_ms / 1000,
            backward=(blocked + ALLREDUCE_MS) / 1000,
            backward_blocked=blocked / 1000,
            collective=0.0,
        )
        for i in range(20)
    )
    return HookState(
        t=3.0, pid=pid, steps=20, batches=20, data_wait_s=0.0, in_next_since=0.0, record=rec, rank_steps=steps
    )


class JobWatch:
    """A watch session as the TUI sees it, showing one Observation; remembers the rank chosen."""

    def __init__(self, obs: Observation) -> None:
        self.obs = obs
        self.chosen: list[int | None] = []

    def observe(self) -> Observation:
        return self.obs

    def request_burst(self) -> tuple[bool, str]:
        return False, "no"

    def choose_rank(self, rank: int | None) -> None:
        self.chosen.append(rank)

    def wake(self, why: str) -> None:
        """A key was pressed: nothing samples here."""

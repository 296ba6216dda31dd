"""Hang test helpers: a hang reading and a HangView."""

from __future__ import annotations

from pathlib import Path

from torchwatch.analysis import hang
from torchwatch.model.hang import HangView, ProcessDump
from torchwatch.model.readings import HookState
from torchwatch.sources.pyspy import parse_dump
from torchwatch.wire import HookRecord, Instance, ProgressInfo, RankInfo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pyspy"


def _dump(name: str, pid: int, role: str, rank: int | None = None, parent: int | None = None) -> ProcessDump:
    threads = parse_dump((FIXTURES / f"{name}.json").read_text())
    main = [t for t in threads if t.tid == pid]
    return ProcessDump(pid, role, rank, parent, (*main, *(t for t in threads if t.tid != pid)))


def _reading(
    pid: int, rank: int, steps: tuple[tuple[float, float, float], ...], progress: ProgressInfo | None = None
) -> HookState:
    record = HookRecord(
        Instance(pid, 1, 1), "3.11", "2.13", 0.0, 0, False, rank=RankInfo(rank=rank, world_size=2), progress=progress
    )
    return HookState(
        t=0.0, pid=pid, steps=len(steps), batches=0, data_wait_s=0.0, in_next_since=0.0, new_steps=steps, record=record
    )


def _view() -> HangView:
    rows = (
        hang.classify(_dump("dump_ddp_rank0_in_backward", 13957, "rank", 0)),
        hang.classify(_dump("dump_ddp_rank1_on_queue", 13958, "rank", 1)),
    )
    odd = hang.odd_one_out(rows)
    return HangView(
        state="hang",
        pid=13957,
        rank=0,
        threshold_s=5.0,
        threshold_from="--hang-after 5 s",
        last_step_s=12.0,
        fired_s=17.4,
        detected_after_s=5.4,
        stalled_s=9.0,
        processes=rows,
        odd_one_out=odd,
        summary=hang.summary_line(rows, odd),
        dump_s=0.06,
        dumps=(_dump("dump_ddp_rank1_on_queue", 13958, "rank", 1),),
    )
